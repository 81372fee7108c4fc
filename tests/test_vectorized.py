"""simulation.vmap_clients: a worker's clients trained together (torch.func.vmap over their stacked
parameters) give the per-client loop's results, behind the same client hooks, inline and on Ray
actors; what cannot train together is refused before anything runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, RecordDict

from fedsim import wire
from fedsim.client.app import app
from fedsim.client.vectorized import StackedForward
from fedsim.config import parse_config
from fedsim.deploy.launcher import deploy
from fedsim.engines.local import InlineExecutor, LocalGrid
from fedsim.errors import ConfigError
from fedsim.runner import run
from tests.conftest import small_config

COMPARED = ("train_loss", "client_mean_acc", "global_acc")


@pytest.fixture
def stacked_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of clients of each vmapped step run in this process, in order."""
    calls: list[int] = []
    original = StackedForward.__call__

    def counted(self: StackedForward, xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(len(xs))
        return original(self, xs)

    monkeypatch.setattr(StackedForward, "__call__", counted)
    return calls


def run_both(tmp_path: Path, vmap_clients: int, **sections: Any) -> tuple[list[dict], list[dict], dict, dict]:
    """The same config one client at a time and ``vmap_clients`` at a time: metrics lines and final models."""
    out = []
    for width in (1, vmap_clients):
        simulation = {**sections.get("simulation", {}), "vmap_clients": width}
        cfg = small_config(tmp_path / f"w{width}", **{**sections, "simulation": simulation})
        summary = run(parse_config(cfg))
        run_dir = Path(summary["run_dir"])
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        out.append((lines, torch.load(run_dir / "model.pt")))
    (one, model_one), (together, model_together) = out
    return one, together, model_one, model_together


def assert_same_training(one: list[dict], together: list[dict], model_one: dict, model_together: dict, tol: float):
    assert [m["round"] for m in together] == [m["round"] for m in one]
    for a, b in zip(one, together, strict=True):
        for key in COMPARED:
            assert b[key] == pytest.approx(a[key], rel=tol), (a["round"], key)
        assert b["client_acc"] == pytest.approx(a["client_acc"], abs=tol)
    assert model_together.keys() == model_one.keys()
    # the whole model as one vector (a shift that starts at 0 is all float noise on its own): a lane
    # mixed up, or a hook applied to the wrong model, would be off by O(1)
    a, b = (np.concatenate([m[k].double().numpy().ravel() for k in model_one]) for m in (model_one, model_together))
    assert np.linalg.norm(b - a) <= 10 * tol * np.linalg.norm(a)
    # the runs trained: the comparison is between models that moved, not two initial ones
    assert one[-1]["train_loss"] < one[0]["train_loss"]


@pytest.mark.parametrize(
    "strategy",
    [
        {"name": "fedavg"},
        {"name": "fedprox", "mu": 0.1},  # extra_loss over the client's own parameters
        {"name": "scaffold"},  # correct_gradients on the client's own .grad, state across rounds
        {"name": "fedlc"},  # adjust_logits from the client's own label counts
        {"name": "fedrs"},
        {"name": "feddecorr"},  # extra_loss on the client's own features
        {"name": "fedyogi"},  # server-side only: the clients are FedAvg's
    ],
    ids=lambda s: s["name"],
)
def test_clients_trained_together_match_one_at_a_time(
    tmp_path: Path, strategy: dict, stacked_steps: list[int]
) -> None:
    # weight decay strong enough to matter: 0.05 x lr 0.05 x 3 steps moves weights ~1e-2 a round
    sections = {"strategy": strategy, "train": {"momentum": 0.9, "weight_decay": 0.05}}
    one, together, m1, m4 = run_both(tmp_path, 4, **sections)
    assert stacked_steps == [4] * (4 * 3)  # 4 rounds x 3 steps, all 4 clients in one vmapped step
    # float32 sums in another order: rounds agree to ~1e-7, with transient spikes to ~1e-5 where a
    # loss is sensitive (FedDecorr's normalised features); a wrong lane would be off by 1e-2 or more
    assert_same_training(one, together, m1, m4, tol=1e-4)


def test_paper_cnn_groups_of_three_and_a_client_alone_match(tmp_path: Path, stacked_steps: list[int]) -> None:
    # 4 clients, vmap_clients 3: one vmapped group of three (convolutions under vmap) and one client alone
    one, together, m1, m3 = run_both(tmp_path, 3, model={"name": "cnn", "norm": "ln"})
    assert stacked_steps == [3] * (4 * 3)
    # Convolutions under vmap sum in another order than the CPU's channels-last kernels, and 2x2 max
    # pooling picks between near-ties, which amplifies that: one CPU measured 1.04e-4 relative on a
    # loss. A lane mixed up or a hook on the wrong model is off by 1e-2 or more (the MLP tests' mutants),
    # so 1e-3 still tells them apart, on any CPU.
    assert_same_training(one, together, m1, m3, tol=1e-3)


@pytest.mark.slow
def test_ray_actors_each_train_their_clients_together(tmp_path: Path) -> None:
    # exactly two actors on any machine (Ray starts with every CPU), each with two of the four clients
    sim = {"backend": "ray", "client_resources": {"num_cpus": (os.cpu_count() or 2) / 2}}
    one, together, m1, m2 = run_both(tmp_path, 2, simulation=sim)
    assert_same_training(one, together, m1, m2, tol=1e-4)
    # the vmapped pairs ran in the actors: their float sums run in another order, so the bits differ
    assert [m["train_loss"] for m in together] != [m["train_loss"] for m in one]


def test_a_failing_client_of_a_group_is_skipped_alone(tmp_path: Path, stacked_steps: list[int]) -> None:
    flaky = {"name": "tests.plugins.flaky_client:Flaky", "fail_partition": 1, "fail_from": 2}
    cfg = small_config(
        tmp_path, strategy=flaky, train={"on_client_failure": "skip"}, eval={"every": 1},
        simulation={"vmap_clients": 4},
    )
    summary = run(parse_config(cfg))
    lines = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert "failed_clients" not in lines[0]
    for m in lines[1:]:  # only partition 1 is left out; its three group mates trained and were averaged
        assert m["failed_clients"] == {str(m["round"]): [1]}
    assert stacked_steps == [4] * 3 + [3] * (3 * 3)  # round 1 with all four, then three together
    assert lines[-1]["train_loss"] < lines[0]["train_loss"]


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({"model": {"norm": "bn"}}, ["simulation.vmap_clients = 4", "model.norm 'bn'", "running statistics"]),
        ({"model": {"norm": "ln_randomized"}}, ["model.norm 'ln_randomized'", "noise", "vmap_clients: 1"]),
        ({"engine": "flower"}, ["simulation.vmap_clients = 4 needs engine: local"]),
        ({"train": {"local_epochs": 1}}, ["needs train.local_steps", "unset train.local_epochs"]),
    ],
)
def test_what_cannot_train_together_is_refused_before_anything_runs(
    tmp_path: Path, sections: dict, expected: list[str]
) -> None:
    cfg = small_config(tmp_path, **sections, simulation={"vmap_clients": 4})
    if "local_epochs" in cfg["train"]:  # epochs instead of steps, not both
        del cfg["train"]["local_steps"]
    with pytest.raises(ConfigError) as err:
        run(parse_config(cfg))
    for fragment in expected:
        assert fragment in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_deploy_refuses_vmap_clients(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, simulation={"vmap_clients": 2}))
    with pytest.raises(ConfigError, match="each SuperNode trains its one client"):
        deploy(cfg)
    assert not (tmp_path / "runs").exists()


def test_a_train_message_no_runtime_can_serve_gets_an_error_reply() -> None:
    # grouping reads each train message's config first: what it cannot read is the ClientApp's to report
    grid = LocalGrid(InlineExecutor(app, run_id=1, num_partitions=2, state_memory_mb=64))
    content = RecordDict({wire.CONFIG: ConfigRecord({wire.RUN_CONFIG: "{not a config"})})
    (reply,) = grid.send_and_receive([Message(content, dst_node_id=1, message_type="train")])
    assert reply.has_error() and "ValidationError" in reply.error.reason
