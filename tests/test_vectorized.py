"""simulation.vmap_clients: a worker's clients trained together (torch.func.vmap over their stacked
parameters) give the per-client loop's results, behind the same client hooks, inline and on Ray
actors; what cannot train together is refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.config import parse_config
from fedsim.deploy.launcher import deploy
from fedsim.errors import ConfigError
from fedsim.runner import run
from tests.conftest import small_config

COMPARED = ("train_loss", "client_mean_acc", "global_acc")


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
def test_clients_trained_together_match_one_at_a_time(tmp_path: Path, strategy: dict) -> None:
    sections = {"strategy": strategy, "train": {"momentum": 0.9, "weight_decay": 1e-3}}
    one, together, m1, m4 = run_both(tmp_path, 4, **sections)
    # float32 sums in another order: rounds agree to ~1e-7, with transient spikes to ~1e-5 where a
    # loss is sensitive (FedDecorr's normalised features); a wrong lane would be off by 1e-2 or more
    assert_same_training(one, together, m1, m4, tol=1e-4)


def test_paper_cnn_groups_of_three_and_a_client_alone_match(tmp_path: Path) -> None:
    # 4 clients, vmap_clients 3: one vmapped group of three (convolutions under vmap) and one client alone
    one, together, m1, m3 = run_both(tmp_path, 3, model={"name": "cnn", "norm": "ln", "args": {}})
    assert_same_training(one, together, m1, m3, tol=1e-4)


def test_ray_actors_each_train_their_clients_together(tmp_path: Path) -> None:
    # two actors of one CPU each, each with two of the four clients: a vmapped pair per actor
    sim = {"backend": "ray", "client_resources": {"num_cpus": 1}}
    one, together, m1, m2 = run_both(tmp_path, 2, simulation=sim)
    assert_same_training(one, together, m1, m2, tol=1e-4)


def test_a_failing_client_of_a_group_is_skipped_alone(tmp_path: Path) -> None:
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
