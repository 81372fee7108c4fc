"""simulation.vmap_clients: a worker's clients trained together (torch.func.vmap over their stacked
parameters) give the per-client loop's results, behind the same client hooks, inline and on Ray
actors; what cannot train together is refused before anything runs."""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import torch
from flwr.app import ConfigRecord, Message, RecordDict

from fedsim import wire
from fedsim.client.app import app
from fedsim.client.vectorized import StackedForward
from fedsim.config_file import parse_config
from fedsim.deploy.launcher import deploy
from fedsim.engines.local import InlineExecutor, LocalGrid
from fedsim.engines.runner import run
from fedsim.errors import ConfigError
from fedsim.server.reporter import ClientsLeftOut
from tests import strategy_rows
from tests.conftest import small_config
from tests.test_golden import images_behind, one_image

ACCURACIES = ("client_mean_acc", "global_acc", "client_acc")
# float32's unit roundoff, and the local steps of a small_config run (4 rounds x 3 steps)
U, STEPS = 2.0**-24, 4 * 3


def loss_rtol(forward: Sequence[int], weight_grads: Sequence[int]) -> float:
    """How far a training loss may move when the run's float32 sums are taken in another order.

    vmap runs each layer as one batched kernel over the stacked clients, which orders its sums otherwise
    than the per-client kernel (and the order depends on the CPU's kernels). A sum of n float32 terms in
    another order moves by about sqrt(n)*u relative (u = 2^-24, Higham's probabilistic bound). One local
    step takes the ``forward`` sums (lengths), as many again in the backward pass and the weights'
    gradients over the batch (``weight_grads``); to first order their errors add, and so do those of the
    run's ``STEPS`` steps (SGD at lr 0.05 neither damps nor amplifies a perturbation much in 12 steps).
    The hooks' own terms (FedProx's distance, FedDecorr's correlations) sum no more than these. A lane
    mixed up or a hook applied to the wrong model moves a loss by 1e-2 or more (the MLP tests' mutants).
    """
    return STEPS * (2 * sum(map(math.sqrt, forward)) + sum(map(math.sqrt, weight_grads))) * U


# small_config's MLP (784 -> 64, LayerNorm, -> 10) at batch 16: the hidden layer's dot products, the
# LayerNorm's mean and variance, the logits', cross-entropy's log-sum-exp over 10 and mean over 16: 9.0e-5
MLP_LOSS_RTOL = loss_rtol(forward=(784, 64, 64, 64, 10, 16), weight_grads=(16, 16))
# the paper CNN on 28x28 MNIST, hidden [64]: conv1 (1x5x5), GroupNorm(1) over conv1's 64x24x24 outputs,
# conv2 (64x5x5), GroupNorm over 64x8x8, the dense layers as the MLP's (1024 -> 64 -> 10); the convs'
# weight gradients sum over the batch's positions: 9.9e-4. Max pooling adds to it: it routes a gradient
# to the other of two near-tied inputs (one CPU measured 1.04e-4 on a loss)
CNN_LOSS_RTOL = loss_rtol(
    forward=(25, 64 * 24 * 24, 64 * 24 * 24, 64 * 25, 64 * 8 * 8, 64 * 8 * 8, 1024, 64, 64, 64, 10, 16),
    weight_grads=(16 * 24 * 24, 16 * 8 * 8, 16, 16),
)


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


def run_width(tmp_path: Path, vmap_clients: int, **sections: Any) -> tuple[list[dict], dict, Path]:
    """A small_config run training ``vmap_clients`` clients at a time: its metrics lines, final model, run dir."""
    simulation = {**sections.get("simulation", {}), "vmap_clients": vmap_clients}
    cfg = small_config(tmp_path / f"w{vmap_clients}", **{**sections, "simulation": simulation})
    run_dir = Path(run(parse_config(cfg))["run_dir"])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return lines, torch.load(run_dir / "model.pt"), run_dir


def run_both(tmp_path: Path, vmap_clients: int, **sections: Any) -> tuple[list[dict], list[dict], dict, dict, dict]:
    """The same config one client at a time and ``vmap_clients`` at a time: metrics lines and final models,
    and the test images behind each accuracy (the split is the same in both)."""
    one, model_one, run_dir = run_width(tmp_path, 1, **sections)
    together, model_together, _ = run_width(tmp_path, vmap_clients, **sections)
    return one, together, model_one, model_together, images_behind(run_dir)


def assert_same_training(
    one: list[dict], together: list[dict], model_one: dict, model_together: dict, images: dict, loss_rtol: float
) -> None:
    """Losses within float rounding (``loss_rtol``), each accuracy within one image of the images behind it.

    An accuracy counts whole images: float rounding moves it only where an image's top two logits are closer
    than the rounding (``loss_rtol``, relative), and then by one image of its set; so an ``abs=`` tolerance
    smaller than one image (1/1000 of the global accuracy, 1/194 to 1/310 of a client's) fails on the first
    such image, where one image per set holds (measured here: no image moved, plain and under AVX2)."""
    assert [m["round"] for m in together] == [m["round"] for m in one]
    for a, b in zip(one, together, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=loss_rtol), a["round"]
        for key in ACCURACIES:
            pairs = zip(a[key], b[key], strict=True) if isinstance(a[key], list) else [(a[key], b[key])]
            for i, (x, y) in enumerate(pairs):
                where = (a["round"], key, i)
                assert (x is None) == (y is None), where
                if x is not None:  # + 1e-12: one image's 1/n, read back from two float quotients
                    index = i if isinstance(a[key], list) else None
                    assert abs(y - x) <= one_image(key, index, images) + 1e-12, where
    assert model_together.keys() == model_one.keys()
    # the whole model as one vector (a shift that starts at 0 is all float noise on its own): its weights
    # come out of the same sums as the losses, with a margin of 10; a lane mixed up, or a hook applied to the
    # wrong model, would be off by O(1)
    a, b = (np.concatenate([m[k].double().numpy().ravel() for k in model_one]) for m in (model_one, model_together))
    assert np.linalg.norm(b - a) <= 10 * loss_rtol * np.linalg.norm(a)
    # the runs trained: the comparison is between models that moved, not two initial ones
    assert one[-1]["train_loss"] < one[0]["train_loss"]


# every strategy's hooks on its clients' own models (FedBN's BN model is not vmapped)
VMAPPED = [n for n, row in strategy_rows.ROWS.items() if row.get("model", {}).get("norm") != "bn"]


@pytest.mark.parametrize("name", VMAPPED)
def test_clients_trained_together_match_one_at_a_time(tmp_path: Path, name: str, stacked_steps: list[int]) -> None:
    # weight decay strong enough to matter: 0.05 x lr 0.05 x 3 steps moves weights ~1e-2 a round
    sections = {**strategy_rows.sections(name), "train": {"momentum": 0.9, "weight_decay": 0.05}}
    one, together, m1, m4, images = run_both(tmp_path, 4, **sections)
    assert stacked_steps == [4] * (4 * 3)  # 4 rounds x 3 steps, all 4 clients in one vmapped step
    # measured on an AMD EPYC (Zen 4), AVX512 and forced AVX2: losses at most 6e-8 apart (one float32 ulp),
    # no accuracy moved; another CPU measured transient spikes to ~1e-5 (FedDecorr's normalised features)
    assert_same_training(one, together, m1, m4, images, MLP_LOSS_RTOL)


def test_each_client_of_a_group_clips_its_own_gradient(tmp_path: Path, stacked_steps: list[int]) -> None:
    """``train.max_grad_norm`` under vmap: each client's gradient scaled by its own norm, as one at a time (a norm
    taken over the group's gradients together scales every client's step by the group's: O(1) off). FedDyn's
    correction included, as the authors' code clips it; 0.1 binds on every step here (norms of 0.5 to 3)."""
    sections = {**strategy_rows.sections("feddyn"), "train": {"max_grad_norm": 0.1}}
    one, together, m1, m4, images = run_both(tmp_path, 4, **sections)
    assert stacked_steps == [4] * (4 * 3)
    # the clip's factor adds to each step one sum over the MLP's parameters, whose squares it adds up
    parameters = 784 * 64 + 64 + 2 * 64 + 64 * 10 + 10
    rtol = loss_rtol(forward=(784, 64, 64, 64, 10, 16), weight_grads=(16, 16, parameters))
    assert_same_training(one, together, m1, m4, images, rtol)


@pytest.mark.slow
def test_paper_cnn_groups_of_three_and_a_client_alone_match(tmp_path: Path, stacked_steps: list[int]) -> None:
    # 4 clients, vmap_clients 3: one vmapped group of three (convolutions under vmap) and one client alone
    one, together, m1, m3, images = run_both(tmp_path, 3, model={"name": "cnn", "norm": "ln"})
    assert stacked_steps == [3] * (4 * 3)
    # Convolutions under vmap sum in another order than the CPU's channels-last kernels: one CPU measured
    # 1.04e-4 relative on a loss, an AMD EPYC (Zen 4) 5e-8 (AVX512 and forced AVX2), within CNN_LOSS_RTOL
    assert_same_training(one, together, m1, m3, images, CNN_LOSS_RTOL)


def step_order(record_dir: Path) -> dict[int, dict[int, list[int]]]:
    """tests.plugins.step_order's records: per process, per round, the partition of each local step in order."""
    order: dict[int, dict[int, list[int]]] = {}
    for path in record_dir.iterdir():
        for line in path.read_text().splitlines():
            server_round, partition = map(int, line.split())
            order.setdefault(int(path.name), {}).setdefault(server_round, []).append(partition)
    return order


@pytest.mark.slow
def test_ray_actors_each_train_their_clients_together(tmp_path: Path) -> None:
    # A Ray of two CPUs whatever the machine's cores (the pool joins it instead of starting one with every
    # CPU), workers of one CPU: exactly two actors, each with two of the four clients, on any machine
    sim = {"backend": "ray", "client_resources": {"num_cpus": 1}}
    runs, steps = {}, {}
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:  # one Ray session for both runs: started once, not once per run
        for width in (1, 2):
            (record_dir := tmp_path / f"steps{width}").mkdir()
            strategy = {"name": "tests.plugins.step_order:StepOrder", "record_dir": str(record_dir)}  # FedAvg
            runs[width] = run_width(tmp_path, width, strategy=strategy, simulation=sim)
            steps[width] = step_order(record_dir)
    finally:
        ray.shutdown()
    (one, m1, run_dir), (together, m2, _) = runs[1], runs[2]
    assert_same_training(one, together, m1, m2, images_behind(run_dir), MLP_LOSS_RTOL)
    # where and how the clients trained, from each process's record of its local steps (3 per client and
    # round): two processes, neither of them this one, each training the same two clients every round, one
    # client's steps after the other's at vmap_clients 1 and interleaved (trained together) at 2
    for width, runs_of_steps in ((1, [3, 3]), (2, [1] * 6)):
        processes = steps[width]
        assert len(processes) == 2 and os.getpid() not in processes, width
        owned = [sorted({p for order in rounds.values() for p in order}) for rounds in processes.values()]
        assert sorted(p for clients in owned for p in clients) == [0, 1, 2, 3] and all(len(c) == 2 for c in owned)
        for rounds in processes.values():
            assert sorted(rounds) == [1, 2, 3, 4], width
            for order in rounds.values():
                assert [len(list(run)) for _, run in itertools.groupby(order)] == runs_of_steps, (width, order)


def test_a_failing_client_of_a_group_is_skipped_alone(tmp_path: Path, stacked_steps: list[int]) -> None:
    flaky = {"name": "tests.plugins.flaky_client:Flaky", "fail_partition": 1, "fail_from": 2}
    cfg = small_config(
        tmp_path, strategy=flaky, train={"on_client_failure": "skip"}, eval={"every": 1},
        simulation={"vmap_clients": 4},
    )
    with pytest.warns(ClientsLeftOut, match=r"round 2: 1; round 3: 1; round 4: 1\Z"):  # said once, at the end
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
