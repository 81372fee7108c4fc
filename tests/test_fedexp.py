"""FedExP (Jhunjhunwala et al., ICLR 2023): its server step against a float64 reference written here, the
average of the last two models as the model a run scores (fedsim's ``ScoredModel`` contract), its state across
a checkpoint, and its options' ranges."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from fedsim.arrays import ndarray_to_array
from fedsim.config_file import parse_config
from fedsim.engines.local import LocalGrid
from fedsim.engines.runner import run
from fedsim.errors import ConfigError
from fedsim.experiment.resolve import resolve
from fedsim.record.checkpoint import Checkpoint
from fedsim.server.contract import CheckedStrategy
from fedsim.server.loop import RoundLoop
from fedsim.server.reporter import GlobalEvaluator
from fedsim.strategies.server_half import ScoredModel
from tests.conftest import small_config
from tests.strategy_harness import Clients, numpy_of, play_round, reply, server

PARAMS = {"w": (2, 3), "b": (3,)}  # trainable parameters; "stat" and "count" are buffers
X = {"w": [[0.5, -1.0, 2.0], [0.0, 0.25, -0.5]], "b": [1.0, -2.0, 0.5], "stat": [0.0, 1.0], "count": 3}


def reference_step(x: dict[str, np.ndarray], ys: list[dict[str, np.ndarray]], eps: float) -> tuple[dict, float]:
    """Algorithm 1 on the flattened parameter vector, float64: x − η_g·Δ̄ and η_g."""
    flat_x = np.concatenate([x[k].ravel() for k in PARAMS])
    deltas = [flat_x - np.concatenate([y[k].ravel() for k in PARAMS]) for y in ys]
    m = len(deltas)
    delta_bar = sum(deltas) / m
    eta_g = max(1.0, sum(d @ d for d in deltas) / (2 * m * (delta_bar @ delta_bar + eps)))
    flat = flat_x - eta_g * delta_bar
    out, start = {}, 0
    for k, shape in PARAMS.items():
        size = int(np.prod(shape))
        out[k] = flat[start : start + size].reshape(shape)
        start += size
    return out, eta_g


def record(values: dict[str, Any]) -> ArrayRecord:
    return ArrayRecord(
        {k: ndarray_to_array(np.asarray(v, dtype=np.int64 if k == "count" else np.float32)) for k, v in values.items()}
    )


def client_models(moves: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Client i's model: x moved by moves[i] = (a, c) as w + a·1, b + c·1, with buffers of its own."""
    x = {k: np.asarray(v, dtype=np.float64) for k, v in X.items()}
    return [
        {"w": x["w"] + a, "b": x["b"] + c, "stat": x["stat"] + 2 * i + 1, "count": x["count"] + i}
        for i, (a, c) in enumerate(moves)
    ]


def one_round(ys: list[dict[str, Any]], sizes: list[int], **options: Any):  # type: ignore[no-untyped-def]
    """One round of the fedexp server half from x = X with these client replies, as fedsim's loop plays it."""
    grid = LocalGrid(Clients(lambda m, pid, s: reply(record(ys[pid]), pid, sizes[pid]), len(ys)))
    strategy = server("fedexp", len(ys), set(PARAMS), **options)
    return strategy, play_round(strategy, grid, 1, record(X))


@pytest.mark.parametrize(
    ("moves", "sizes", "extrapolates"),
    [
        ([(0.3, -0.1), (-0.2, 0.4), (0.05, -0.2)], [5, 1, 2], True),  # disagreeing clients: η_g > 1
        ([(0.3, -0.1), (0.3, -0.1), (0.3, -0.1)], [5, 1, 2], False),  # identical Δ_i: the bound is 1/2, η_g = 1
        ([(0.3, -0.1)], [4], False),  # one client: Σ‖Δ_i‖²/(2‖Δ̄‖²) = 1/2, η_g = 1
    ],
    ids=["eta-above-1", "clients-agree", "one-client"],
)
def test_server_step_matches_the_float64_reference(moves: list, sizes: list[int], extrapolates: bool) -> None:
    eps = 1e-3
    ys = client_models(moves)
    strategy, got = one_round(ys, sizes, epsilon=eps)
    x = {k: np.asarray(v, dtype=np.float64) for k, v in X.items()}
    want, eta_g = reference_step(x, ys, eps)
    assert (eta_g > 1.5) if extrapolates else (eta_g == 1.0)
    new = numpy_of(got)
    assert list(new) == list(X)
    for k in PARAMS:
        np.testing.assert_allclose(new[k], want[k], rtol=1e-6, atol=1e-7)
        assert got[k].dtype == "float32"  # the model's dtype, not the float64 of the step
        if not extrapolates:  # η_g = 1: the step is the uniform (not FedAvg's sample-weighted) mean of the y_i
            np.testing.assert_allclose(new[k], np.mean([y[k] for y in ys], axis=0), rtol=1e-6)
    w = np.asarray(sizes) / sum(sizes)  # the buffers: FedAvg's sample-weighted average, never extrapolated
    for k in ("stat", "count"):
        np.testing.assert_allclose(new[k], sum(wi * y[k] for wi, y in zip(w, ys, strict=True)), rtol=1e-6)

    # what a run scores: the average of the last two models, (x^1 + x^0)/2, every tensor
    scored = numpy_of(strategy.scored_arrays(got))
    for k in X:
        np.testing.assert_allclose(scored[k], (new[k] + x[k]) / 2, rtol=1e-6)
    last, _ = one_round(ys, sizes, epsilon=eps, evaluate="last")
    assert last.scored_arrays(got) is got


def test_epsilon_bounds_eta_g_where_the_clients_cancel() -> None:
    ys = client_models([(0.3, -0.1), (-0.3, 0.1)])  # Δ̄ = 0: with ε = 0 this is Σ‖Δ_i‖² / 0
    eps = 1e-2
    _, got = one_round(ys, [1, 1], epsilon=eps)
    x = {k: np.asarray(v, dtype=np.float64) for k, v in X.items()}
    want, eta_g = reference_step(x, ys, eps)
    assert eta_g == pytest.approx((6 * 0.09 + 3 * 0.01) * 2 / (4 * eps))  # finite: Σ‖Δ_i‖²/(2Mε)
    for k in PARAMS:
        np.testing.assert_allclose(numpy_of(got)[k], want[k], rtol=1e-6)  # = x: Δ̄ = 0


def test_server_state_restores_the_model_scored_after_a_checkpoint() -> None:
    ys = client_models([(0.3, -0.1), (-0.2, 0.4)])
    strategy, got = one_round(ys, [1, 3])
    fresh = server("fedexp", 2, set(PARAMS))
    assert fresh.scored_arrays(got) is got  # no previous model yet: the model itself
    fresh.load_server_state(strategy.server_state())
    assert {k: a.data for k, a in fresh.scored_arrays(got).items()} == {
        k: a.data for k, a in strategy.scored_arrays(got).items()}  # fmt: skip
    assert {k: a.data for k, a in fresh.x.items()} == {k: a.data for k, a in record(X).items()}


class BrokenScore:
    """A ScoredModel that drops a tensor."""

    def scored_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        return ArrayRecord({k: a for k, a in arrays.items() if k != "b"})


def test_the_round_loop_checks_the_scored_model_and_passes_other_strategies_through() -> None:
    model = record(X)
    assert isinstance(server("fedexp", 2, set(PARAMS)), ScoredModel)
    assert not isinstance(server("fedavg", 2, set(PARAMS)), ScoredModel)
    plain = CheckedStrategy(server("fedavg", 2, set(PARAMS)), "fedavg", model, 10.0)
    assert plain.scored_arrays(model) is model
    broken = CheckedStrategy(BrokenScore(), "mine:BrokenScore", model, 10.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"BrokenScore\.scored_arrays\b.*\b3\b.*\b4 tensors\b"):
        broken.scored_arrays(model)


def average(a: ArrayRecord, b: ArrayRecord) -> dict[str, torch.Tensor]:
    """(a + b)/2 of every tensor, in float64 (exact for float32) rounded once to ``a``'s dtype."""
    other = b.to_torch_state_dict()
    return {k: ((t.double() + other[k].double()) / 2).to(t.dtype) for k, t in a.to_torch_state_dict().items()}


@pytest.mark.slow
def test_a_run_scores_and_saves_the_average_of_the_last_two_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained: list[ArrayRecord] = []
    evaluated: dict[int, ArrayRecord] = {}
    train, evaluate = RoundLoop.train, RoundLoop.evaluate

    def spy_train(self: RoundLoop, server_round: int, arrays: ArrayRecord) -> Any:
        if not trained:
            trained.append(arrays)  # x^0
        new, loss = train(self, server_round, arrays)
        trained.append(new)
        return new, loss

    def spy_evaluate(self: RoundLoop, server_round: int, arrays: ArrayRecord) -> Any:
        evaluated[server_round] = arrays
        return evaluate(self, server_round, arrays)

    monkeypatch.setattr(RoundLoop, "train", spy_train)
    monkeypatch.setattr(RoundLoop, "evaluate", spy_evaluate)
    raw = small_config(tmp_path, strategy={"name": "fedexp"}, output={"checkpoint_every": 2})
    cfg = parse_config(raw)
    summary = run(cfg)
    run_dir = Path(summary["run_dir"])
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [2, 4] and len(trained) == 5
    scorer = GlobalEvaluator(resolve(cfg))
    for line in lines:
        r = line["round"]
        hand = average(trained[r], trained[r - 1])
        # the clients scored the average (the hook, directly) ...
        assert all(torch.equal(t, hand[k]) for k, t in evaluated[r].to_torch_state_dict().items())
        # ... and the global evaluation recorded is that of the average scored by hand, not of x^r
        by_hand = scorer(ArrayRecord(hand))
        assert (line["global_acc"], line["global_loss"]) == (by_hand["global_acc"], by_hand["global_loss"])
        assert line["global_loss"] != scorer(trained[r])["global_loss"]
    model = torch.load(run_dir / "model.pt")  # the model the metrics scored
    assert all(torch.equal(model[k], t) for k, t in average(trained[4], trained[3]).items())
    # the checkpoint goes on from the trained x^4, with x^3 as the server's state
    checkpoint = Checkpoint.load(run_dir, cfg)
    assert checkpoint is not None and checkpoint.round == 4
    assert {k: a.data for k, a in checkpoint.arrays.items()} == {k: a.data for k, a in trained[4].items()}
    assert {k.removeprefix("x/"): a.data for k, a in checkpoint.server_state.items()} == {
        k: a.data for k, a in trained[3].items()}  # fmt: skip


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"epsilon": 0}, r"strategy\.epsilon = 0\b.*'fedexp'"),
        ({"epsilon": -1e-3}, r"strategy\.epsilon = -0\.001\b"),
        ({"epsilon": float("nan")}, r"\bepsilon = nan\b"),
        ({"evaluate": "best"}, r"strategy\.evaluate = 'best'.*'average'.*'last'"),
        ({"eta_g": 2.0}, r"\beta_g\b"),  # FedExP's η_g is computed, not an option
    ],
)
def test_bad_options_are_refused_naming_the_field(tmp_path: Path, options: dict[str, Any], named: str) -> None:
    """The field, its value and what is allowed (the wording: tests/test_bad_inputs.py)."""
    with pytest.raises(ConfigError, match=named):
        resolve(parse_config(small_config(tmp_path, strategy={"name": "fedexp", **options})))


def test_defaults() -> None:
    strategy = server("fedexp", 2, set(PARAMS))
    assert (strategy.epsilon, strategy.evaluate) == (1e-3, "average")
