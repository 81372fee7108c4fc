"""FedDyn (Acar et al., ICLR 2021, Algorithm 1) against an independent reference computed here.

The reference trains a float64 deepcopy of the model by hand (autograd on the paper's local objective
L_k(θ) − ⟨g_k, θ⟩ + (α/2)‖θ − θ^{t−1}‖², torch's SGD update written out) and applies the paper's g_k, h and θ^t
updates in numpy; fedsim's client runs through ``train_local`` and its server half through the harness of
tests/strategy_harness.py (``LocalGrid`` with stand-in clients), over rounds with partial participation.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from pydantic import ValidationError
from torch import nn

from fedsim import wire
from fedsim.arrays import to_array_record
from fedsim.client.sgd import LocalSgd
from fedsim.engines.local import LocalGrid
from fedsim.errors import TrainingError
from fedsim.server.sampling import ClientSampler
from fedsim.strategies.feddyn import FEDDYN_GRAD
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from fedsim.strategies.server_half import Checkpointable, ServerSetup
from tests.strategy_harness import (
    Clients,
    images,
    info,
    mlp,
    numpy_of,
    play_round,
    reply,
    server,
    spec,
    stream,
    train_one,
)
from tests.tiny_model import TinyLinear


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)




PARAMS = ("classifier.weight", "classifier.bias")
DATA = {  # client -> (uint8 inputs N x 2, labels): different sizes, so FedAvg's and the uniform mean differ
    0: (torch.tensor([[200, 10], [30, 250], [120, 90], [255, 0], [60, 60]], dtype=torch.uint8), [0, 1, 2, 0, 2]),
    1: (torch.tensor([[5, 180], [240, 60]], dtype=torch.uint8), [1, 0]),
    2: (torch.tensor([[90, 90], [10, 20], [220, 230]], dtype=torch.uint8), [2, 1, 0]),
    3: (torch.tensor([[15, 200], [100, 5], [250, 250], [40, 140]], dtype=torch.uint8), [1, 0, 2, 1]),
}


def local_reference(
    template: nn.Module,
    start: dict[str, np.ndarray],
    g: dict[str, np.ndarray],
    X: np.ndarray,
    Y: np.ndarray,
    K: int,
    lr: float,
    alpha: float,
    momentum: float,
    weight_decay: float,
) -> tuple[dict[str, np.ndarray], list[float]]:
    """K full-batch SGD steps on the paper's local objective, in float64; the final state dict and each step's CE."""
    model = copy.deepcopy(template).double()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in start.items()})
    model.train()
    params = dict(model.named_parameters())
    theta_prev = {n: torch.from_numpy(start[n]) for n in params}
    g_t = {n: torch.from_numpy(g[n]) for n in params}
    x, y = torch.from_numpy(X), torch.from_numpy(Y)
    buffers: dict[str, torch.Tensor] = {}
    ce_values = []
    for _ in range(K):
        ce = F.cross_entropy(model.forward_head(model.forward_features(x)), y)
        linear = sum((g_t[n] * p).sum() for n, p in params.items())
        quadratic = sum((p - theta_prev[n]).pow(2).sum() for n, p in params.items())
        loss = ce - linear + 0.5 * alpha * quadratic
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():  # torch.optim.SGD's update (dampening 0, no Nesterov), by hand
            for (n, p), grad in zip(params.items(), grads, strict=True):
                d = grad + weight_decay * p
                if momentum:
                    buffers[n] = d.clone() if n not in buffers else momentum * buffers[n] + d
                    d = buffers[n]
                p -= lr * d
        ce_values.append(float(ce.detach()))
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, ce_values


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.0, 0.0), (0.9, 0.05)])
def test_feddyn_rounds_with_partial_participation_match_the_paper(momentum: float, weight_decay: float) -> None:
    K, lr, alpha, N = 3, 0.5, 0.3, 4
    model = TinyLinear(3, bias=True)
    template = copy.deepcopy(model)
    hooks = spec("feddyn", alpha=alpha).client()
    seen: dict[int, dict[str, object]] = {}

    def client(msg: Message, pid: int, state: RecordDict) -> RecordDict:
        x_u8, labels = DATA[pid]
        x_u8, y = x_u8.view(-1, 1, 1, 2), torch.tensor(labels)
        rinfo = RoundInfo(1, pid, K, None, lr, momentum, torch.tensor([labels.count(c) for c in range(3)]))
        hooks.load_global(model, msg.content[wire.ARRAYS], state)
        hooks.begin_round(model, msg.content, state, rinfo)
        optimizer = LocalSgd(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
        result = train_one(model, stream(x_u8, y), optimizer, hooks, rinfo)
        extra = hooks.end_round(model, state, rinfo, result.steps)
        out = hooks.reply_arrays(model, state)
        seen[pid] = {"theta": numpy_of(out), "g": numpy_of(state[FEDDYN_GRAD]), "loss": result.mean_loss}
        assert not extra  # FedDyn sends the model only: the server needs nothing else
        return reply(out, pid, len(labels))

    clients = Clients(client, N)
    grid = LocalGrid(clients)
    strategy = server("feddyn", N, set(PARAMS), alpha=alpha)
    assert isinstance(strategy, Checkpointable)
    sampler = ClientSampler(N, 2, seed=0)
    arrays = to_array_record(model.state_dict())

    theta = numpy_of(arrays)  # θ^0: parameters and the buffer
    g = {k: {n: np.zeros_like(theta[n]) for n in PARAMS} for k in range(N)}  # g_k starts at 0
    h = {n: np.zeros_like(theta[n]) for n in PARAMS}  # h starts at 0
    for server_round in (1, 2, 3):
        seen.clear()
        arrays = play_round(strategy, grid, server_round, arrays, sampler)
        sampled = sampler.sample(server_round)
        assert sorted(seen) == sampled and len(sampled) == 2 < N  # |P_t| = 2, m = 4
        locals_, sizes = [], []
        for k in sampled:
            x_u8, labels = DATA[k]
            X, Y = x_u8.double().numpy() / 255, np.array(labels)
            theta_k, ce = local_reference(template, theta, g[k], X, Y, K, lr, alpha, momentum, weight_decay)
            for name, value in theta_k.items():
                np.testing.assert_allclose(seen[k]["theta"][name], value, rtol=1e-5, atol=1e-6, err_msg=name)
            g[k] = {n: g[k][n] - alpha * (theta_k[n] - theta[n]) for n in PARAMS}  # g_k ← g_k − α(θ_k^t − θ^{t−1})
            for n in PARAMS:
                np.testing.assert_allclose(seen[k]["g"][n], g[k][n], rtol=1e-5, atol=1e-6, err_msg=n)
            # the reported loss is the cross-entropy: the regulariser enters the gradient only
            assert seen[k]["loss"] == pytest.approx(np.mean(ce), rel=1e-5)
            locals_.append(theta_k)
            sizes.append(len(labels))
        new = {}
        for n in PARAMS:
            h[n] = h[n] - alpha * (1 / N) * sum(t[n] - theta[n] for t in locals_)  # m = N, all clients
            new[n] = np.mean([t[n] for t in locals_], axis=0) - h[n] / alpha
        new["running"] = sum(s * t["running"] for s, t in zip(sizes, locals_, strict=True)) / sum(sizes)  # FedAvg's
        theta = new
        got = numpy_of(arrays)
        assert set(got) == set(theta)
        for name in theta:
            np.testing.assert_allclose(got[name], theta[name], rtol=1e-5, atol=1e-6, err_msg=name)
        state = numpy_of(strategy.server_state())
        assert set(state) == {f"h/{n}" for n in PARAMS}
        for n in PARAMS:
            np.testing.assert_allclose(state[f"h/{n}"], h[n], rtol=1e-5, atol=1e-7)
        assert not np.allclose(h["classifier.weight"], 0)
    # some client trained in two rounds, so its round-2 objective used the g_k it kept from round 1
    assert set(sampler.sample(1)) & set(sampler.sample(2)) and set(sampler.sample(1)) & set(sampler.sample(3))
    for k in range(N):
        kept = clients.states[k]
        if any(k in sampler.sample(r) for r in (1, 2, 3)):
            for n in PARAMS:
                np.testing.assert_allclose(numpy_of(kept[FEDDYN_GRAD])[n], g[k][n], rtol=1e-5, atol=1e-6)
        else:
            assert FEDDYN_GRAD not in kept


def test_feddyn_server_state_survives_a_checkpoint() -> None:
    alpha, N = 0.2, 5
    keys = {"w": (3, 2), "b": (3,)}
    x = {k: torch.randn(shape) for k, shape in keys.items()} | {"stat": torch.randn(4)}  # "stat" is a buffer

    def replies_of(strategy, server_round: int, offset: float) -> list[Message]:  # type: ignore[no-untyped-def]
        messages = list(strategy.configure_train(server_round, to_array_record(x), ConfigRecord(), grid))[:3]
        g = torch.Generator().manual_seed(server_round)
        return [
            Message(
                reply(
                    to_array_record({k: v + offset + torch.randn(v.shape, generator=g) for k, v in x.items()}),
                    pid,
                    pid + 1,
                ),
                reply_to=m,
            )
            for pid, m in enumerate(messages)
        ]

    grid = LocalGrid(Clients(lambda m, p, s: RecordDict(), N))
    strategy = server("feddyn", N, set(keys), alpha=alpha)
    assert numpy_of(strategy.server_state()) == {}  # nothing before the first aggregation
    for server_round in (1, 2):
        strategy.aggregate_train(server_round, replies_of(strategy, server_round, 0.5))
    state = strategy.server_state()
    fresh = server("feddyn", N, set(keys), alpha=alpha)
    fresh.load_server_state(state)
    assert {k: v.tolist() for k, v in numpy_of(fresh.server_state()).items()} == {
        k: v.tolist() for k, v in numpy_of(state).items()
    }
    assert set(numpy_of(state)) == {"h/w", "h/b"} and not np.allclose(numpy_of(state)["h/w"], 0)
    # the restored server takes the same next step as the one that never stopped
    a, _ = strategy.aggregate_train(3, replies_of(strategy, 3, -0.25))
    b, _ = fresh.aggregate_train(3, replies_of(fresh, 3, -0.25))
    assert isinstance(a, ArrayRecord) and isinstance(b, ArrayRecord)
    assert {k: v.tolist() for k, v in numpy_of(a).items()} == {k: v.tolist() for k, v in numpy_of(b).items()}
    # without the restored h it would differ
    bare = server("feddyn", N, set(keys), alpha=alpha)
    c, _ = bare.aggregate_train(3, replies_of(bare, 3, -0.25))
    assert not np.allclose(numpy_of(c)["w"], numpy_of(a)["w"])


def test_feddyn_state_covers_parameters_not_buffers_and_a_zero_step_round_keeps_it() -> None:
    model = mlp("bn")
    hooks = spec("feddyn").client()
    state = RecordDict()
    rinfo = info([3, 3, 2], steps=2)
    hooks.begin_round(model, RecordDict(), state, rinfo)
    train_one(
        model, stream(images(8), torch.randint(0, 3, (8,)), 4), LocalSgd(model.parameters(), lr=0.1), hooks, rinfo
    )
    hooks.end_round(model, state, rinfo, 2)
    params = {n for n, _ in model.named_parameters()}
    assert {n for n, _ in model.named_buffers()}  # running statistics exist ...
    assert set(state[FEDDYN_GRAD]) == params  # ... and g_k does not cover them
    before = numpy_of(state[FEDDYN_GRAD])
    assert any(np.any(v != 0) for v in before.values())
    hooks.begin_round(model, RecordDict(), state, rinfo)  # no step: θ_k = θ^{t−1}, g_k unchanged
    hooks.end_round(model, state, rinfo, 0)
    assert {k: v.tolist() for k, v in numpy_of(state[FEDDYN_GRAD]).items()} == {
        k: v.tolist() for k, v in before.items()
    }


def test_feddyn_first_round_client_is_fedprox_with_mu_alpha() -> None:
    # g_k = 0 before a client's first round: its objective is FedProx's with μ = α
    alpha = 0.4
    model = mlp("ln")
    x_u8, y = images(8), torch.randint(0, 3, (8,))
    start = copy.deepcopy(model.state_dict())
    dyn = spec("feddyn", alpha=alpha).client()
    dyn.begin_round(model, RecordDict(), RecordDict(), info([3, 3, 2], steps=3))
    train_one(model, stream(x_u8, y, 4), LocalSgd(model.parameters(), lr=0.1), dyn, info([3, 3, 2], steps=3))
    prox_model = copy.deepcopy(model)
    prox_model.load_state_dict(start)
    prox = spec("fedprox", mu=alpha).client()
    prox.begin_round(
        prox_model,
        RecordDict({wire.CONFIG: ConfigRecord({"proximal-mu": alpha})}),
        RecordDict(),
        info([3, 3, 2], steps=3),
    )
    train_one(prox_model, stream(x_u8, y, 4), LocalSgd(prox_model.parameters(), lr=0.1), prox, info([3, 3, 2], steps=3))
    for k, v in prox_model.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=1e-5, atol=1e-6)
    plain = copy.deepcopy(model)
    plain.load_state_dict(start)
    train_one(
        plain, stream(x_u8, y, 4), LocalSgd(plain.parameters(), lr=0.1), ClientHooks(None), info([3, 3, 2], steps=3)
    )
    assert not torch.equal(plain.classifier.weight, model.classifier.weight)  # α does change the step


@pytest.mark.parametrize("options", [{"alpha": 0}, {"alpha": -0.1}, {"alpha": "big"}, {"weighting": "samples"}])
def test_feddyn_refuses_bad_options(options: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        spec("feddyn", **options)


def test_feddyn_server_needs_the_parameter_names() -> None:
    s = spec("feddyn")
    with pytest.raises(TrainingError, match="parameter names"):
        s.server(ServerSetup(3, frozenset()))
