"""FedNova (strategies/fednova.py) against a reference written here in numpy float64.

Each client trains through fedsim's one loop (``train_local``, ``LocalSgd`` with momentum) and FedNova's
client hooks, and the server half runs through the harness of tests/strategy_harness.py (fedsim's
``LocalGrid``, replies sorted by partition) for one full round. The reference takes the same batches (an
identically seeded stream), runs heavy-ball SGD u ← ρu + g, w ← w − ηu by hand, gets a_i by summing, for each
step's gradient, the momentum coefficients of the steps it is applied in (never the paper's closed form, which
is checked against it), and computes the server update by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Message, RecordDict

from fedsim import wire
from fedsim.arrays import to_array_record
from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, train_local
from fedsim.config_file import parse_config
from fedsim.engines.local import LocalGrid
from fedsim.engines.runner import run
from fedsim.errors import ProtocolError
from fedsim.strategies.fednova import A_NORM, FEDNOVA_A_NORM
from fedsim.strategies.hooks import RoundInfo
from tests.conftest import small_config
from tests.strategy_harness import Clients, numpy_of, play_round, reply, server, softmax, spec, stream
from tests.tiny_model import TinyLinear

DATA = {  # client -> (uint8 inputs, labels): 6, 2 and 4 samples, so local epochs take unequal step counts
    0: ([[200, 10], [30, 250], [120, 90], [255, 0], [60, 60], [10, 200]], [0, 1, 1, 0, 0, 1]),
    1: ([[5, 180], [240, 60]], [1, 1]),
    2: ([[90, 90], [10, 20], [220, 230], [140, 30]], [0, 1, 0, 1]),
}
B, LR = 2, 0.5
W0 = [[0.3, -0.2], [-0.1, 0.4]]
KEYS = {"classifier.weight"}


def a_vector(tau: int, rho: float) -> np.ndarray:
    """a_i: entry s is what gradient s weighs in y_i − x = −η·Σ_s a_s·g_s, the sum over the steps t ≥ s that
    apply it (u_t = Σ_{s≤t} ρ^{t−s}·g_s, w_t = w_{t−1} − η·u_t), coefficient by coefficient."""
    return np.array([sum(rho ** (t - s) for t in range(s, tau + 1)) for s in range(1, tau + 1)])


def paper_a_norm(tau: int, rho: float) -> float:
    """The paper's closed form of ‖a_i‖₁ under momentum ρ > 0 (FedNova, section 4 / appendix)."""
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


def reference_client(W, buf, batches, rho, wd):  # type: ignore[no-untyped-def]
    """Heavy-ball SGD from u = 0 on mean cross-entropy (+ L2 weight decay in the gradient), by hand."""
    x, u, grads = W, np.zeros_like(W), []
    for X, y in batches:
        g = (softmax(X @ W.T) - np.eye(2)[y]).T @ X / len(X) + wd * W
        grads.append(g)
        u = rho * u + g
        W = W - LR * u
        buf = 0.5 * buf + 0.5 * X.mean(0)
    a = a_vector(len(grads), rho)
    # the paper's decomposition Δ_i = y_i − x = −η·G_i·a_i holds with this a_i, weight decay or not
    np.testing.assert_allclose(W - x, -LR * sum(a_s * g for a_s, g in zip(a, grads, strict=True)), atol=1e-12)
    return W, buf, a


def run_round(name: str, rho: float, wd: float, steps: int | None, epochs: int | None):  # type: ignore[no-untyped-def]
    """One round of strategy ``name`` over the three clients; what each sent and the new global model."""
    model = TinyLinear(2, bias=False)
    hooks = spec(name).client()
    sent: dict[int, tuple[np.ndarray, np.ndarray, RecordDict]] = {}

    def client(msg: Message, pid: int, state: RecordDict) -> RecordDict:
        x_u8, y = torch.tensor(DATA[pid][0], dtype=torch.uint8).view(-1, 1, 1, 2), torch.tensor(DATA[pid][1])
        info = RoundInfo(1, pid, steps, epochs, LR, rho, torch.bincount(y, minlength=2))
        hooks.load_global(model, msg.content[wire.ARRAYS], state)
        hooks.begin_round(model, msg.content, state, info)
        sgd = LocalSgd(model.parameters(), lr=LR, momentum=rho, weight_decay=wd)
        (result,) = train_local([ClientRound(model, hooks, stream(x_u8, y, B), info)], sgd)
        extra = hooks.end_round(model, state, info, result.steps)
        out = hooks.reply_arrays(model, state)
        got = numpy_of(out)
        sent[pid] = (got["classifier.weight"], got["running"], RecordDict(dict(extra)))
        return reply(out, pid, len(y), extra)

    strategy = server(name, len(DATA), KEYS)
    with torch.no_grad():
        model.classifier.weight.copy_(torch.tensor(W0))
    arrays = play_round(strategy, LocalGrid(Clients(client, len(DATA))), 1, to_array_record(model.state_dict()))
    return sent, numpy_of(arrays)


def reference_round(rho: float, wd: float, steps: int | None, epochs: int | None):  # type: ignore[no-untyped-def]
    """Each client's (y_i, buffer_i, a_i, n_i) by hand, on the batches fedsim's stream draws."""
    out = {}
    for pid, (x, y) in DATA.items():
        s = stream(torch.tensor(x, dtype=torch.uint8).view(-1, 1, 1, 2), torch.tensor(y), B)
        drawn = s.epochs(epochs) if epochs else s.batches(steps)  # type: ignore[arg-type]
        batches = [(xb.double().flatten(1).numpy(), yb.numpy()) for xb, yb in drawn]
        W, buf, a = reference_client(np.array(W0), np.zeros(2), batches, rho, wd)
        out[pid] = (W, buf, a, len(y))
    return out


@pytest.mark.parametrize(("rho", "wd"), [(0.9, 0.0), (0.9, 0.01), (0.0, 0.0)])
def test_unequal_local_steps_match_the_hand_computation(rho: float, wd: float) -> None:
    ref = reference_round(rho, wd, None, 2)  # two local epochs of batch 2: τ = 6, 2, 4
    assert [len(a) for *_, a, _ in ref.values()] == [6, 2, 4]
    sent, got = run_round("fednova", rho, wd, None, 2)
    x = np.array(W0)
    n = np.array([ref[pid][3] for pid in DATA], dtype=np.float64)
    p = n / n.sum()
    norms = np.array([ref[pid][2].sum() for pid in DATA])  # ‖a_i‖₁ summed coefficient by coefficient
    for pid, (W, buf, a, _) in ref.items():
        y_i, buf_i, extra = sent[pid]
        np.testing.assert_allclose(y_i, W, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(buf_i, buf, rtol=1e-5, atol=1e-7)
        assert extra[FEDNOVA_A_NORM][A_NORM] == pytest.approx(a.sum(), rel=1e-12)
        assert a.sum() == (len(a) if rho == 0 else pytest.approx(paper_a_norm(len(a), rho), rel=1e-12))
    d = [(ref[pid][0] - x) / norms[i] for i, pid in enumerate(DATA)]  # d_i = Δ_i/‖a_i‖₁
    tau_eff = float(p @ norms)
    expected = x + tau_eff * sum(p_i * d_i for p_i, d_i in zip(p, d, strict=True))
    np.testing.assert_allclose(got["classifier.weight"], expected, rtol=1e-5, atol=1e-6)
    # buffers: FedAvg's sample-weighted average, no normalisation
    np.testing.assert_allclose(got["running"], sum(p[i] * ref[pid][1] for i, pid in enumerate(DATA)), rtol=1e-5)

    # FedAvg on the same clients: x + Σ p_i·Δ_i = x + τ_eff·Σ w_i·d_i with w_i = p_i·‖a_i‖₁/τ_eff, the weights
    # of the inconsistent objective the paper shows FedAvg converges to (more local steps, more weight)
    _, fedavg = run_round("fedavg", rho, wd, None, 2)
    w = p * norms / tau_eff
    assert not np.allclose(w, p)
    np.testing.assert_allclose(
        fedavg["classifier.weight"],
        x + tau_eff * sum(w_i * d_i for w_i, d_i in zip(w, d, strict=True)),
        rtol=1e-5,
        atol=1e-6,
    )
    gap = np.abs(fedavg["classifier.weight"] - got["classifier.weight"]).max()
    assert gap > 1e-3  # FedNova is not FedAvg here
    np.testing.assert_array_equal(fedavg["running"], got["running"])


@pytest.mark.parametrize("rho", [0.9, 0.0])
def test_equal_local_steps_are_exactly_fedavg(rho: float) -> None:
    sent, got = run_round("fednova", rho, 0.0, 3, None)  # train.local_steps: τ_i = 3 for every client
    assert {float(extra[FEDNOVA_A_NORM][A_NORM]) for *_, extra in sent.values()} == {a_vector(3, rho).sum()}
    _, fedavg = run_round("fedavg", rho, 0.0, 3, None)
    for k in got:  # bit for bit, any momentum
        np.testing.assert_array_equal(got[k], fedavg[k])
    ref = reference_round(rho, 0.0, 3, None)  # and the formula agrees: τ_eff/‖a_i‖₁ = 1
    p = np.array([ref[pid][3] for pid in DATA]) / sum(ref[pid][3] for pid in DATA)
    x = np.array(W0)
    expected = x + sum(p[i] * (ref[pid][0] - x) for i, pid in enumerate(DATA))
    np.testing.assert_allclose(got["classifier.weight"], expected, rtol=1e-5, atol=1e-6)


def test_a_norm_of_no_step_is_zero_and_plain_sgd_counts_steps() -> None:
    from fedsim.strategies.fednova import a_norm

    assert a_norm(0, 0.9) == 0.0
    assert a_norm(7, 0.0) == 7.0
    for tau, rho in [(1, 0.5), (10, 0.9), (100, 0.99)]:
        assert a_norm(tau, rho) == pytest.approx(a_vector(tau, rho).sum(), rel=1e-12)


def test_a_reply_without_the_a_norm_is_named() -> None:
    strategy = server("fednova", 1, KEYS)
    model = TinyLinear(2, bias=False)
    arrays = to_array_record(model.state_dict())
    grid = LocalGrid(Clients(lambda m, pid, s: reply(arrays, pid, 3), 1))
    with pytest.raises(ProtocolError, match=FEDNOVA_A_NORM):
        play_round(strategy, grid, 1, arrays)


@pytest.mark.slow
def test_a_run_with_local_epochs_on_unequal_clients_is_not_fedavg(tmp_path: Path) -> None:
    # the real ClientRuntime (RoundInfo.momentum from train.momentum) and server loop; Dirichlet 0.5 splits give
    # the four clients unequal sizes, so one local epoch is an unequal number of steps
    train = {"local_steps": None, "local_epochs": 1, "momentum": 0.9, "rounds": 2}
    runs = {}
    for name in ("fedavg", "fednova"):
        cfg = parse_config(small_config(tmp_path / name, strategy={"name": name}, train=train))
        run_dir = Path(run(cfg)["run_dir"])
        runs[name] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in runs["fednova"]] == [2]
    assert math.isfinite(runs["fednova"][-1]["train_loss"])
    assert runs["fednova"][-1]["train_loss"] != runs["fedavg"][-1]["train_loss"]
