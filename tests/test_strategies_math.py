"""The algorithms' mathematics on tiny deterministic problems, against values computed here.

Every expected value is computed in this file (numpy, or plain torch autograd on a copy of the
model), never by calling the strategy code under test. Servers are driven through fedsim's own
``LocalGrid`` with a stand-in executor playing the clients, as fedsim's round loop does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedYogi
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedsim import wire
from fedsim.arrays import array_view, to_array_record
from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, TrainResult, train_local
from fedsim.data.batches import BatchStream
from fedsim.engines.local import LocalGrid, node_id_of
from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm
from fedsim.server.sampling import ClientSampler
from fedsim.strategies import STRATEGIES
from fedsim.strategies.fedprox import PROXIMAL_MU
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from fedsim.strategies.scaffold import SCAFFOLD_C, SCAFFOLD_C_I, SCAFFOLD_DELTA_C
from fedsim.strategies.server_half import ServerSetup
from tests.tiny_model import TinyLinear

Respond = Callable[[Message, int, RecordDict], RecordDict]



@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def train_one(model, stream, optimizer, hooks, info) -> TrainResult:  # type: ignore[no-untyped-def]
    """One client's round through the one training loop."""
    return train_local([ClientRound(model, hooks, stream, info)], optimizer)[0]


# --- harness -----------------------------------------------------------------------------------


class Clients:
    """A LocalGrid executor whose "ClientApp" is ``respond(message, partition id, its state)``."""

    def __init__(self, respond: Respond, num_clients: int) -> None:
        self.respond = respond
        self.states = {p: RecordDict() for p in range(num_clients)}

    def node_ids(self) -> list[int]:
        return [node_id_of(p) for p in self.states]

    def execute(self, messages: list[Message], timeout: float | None = None) -> list[Message]:
        replies = []
        for m in messages:
            pid = m.metadata.dst_node_id - 1
            replies.append(Message(self.respond(m, pid, self.states[pid]), reply_to=m))
        return replies

    def shutdown(self) -> None:
        pass


def server(name: str, num_clients: int, parameter_keys: set[str], **options):  # type: ignore[no-untyped-def]
    """The strategy's server half, as fedsim's round loop builds it."""
    s = STRATEGIES.get(name)
    return s(s.Params(**options)).server(ServerSetup(num_clients, frozenset(parameter_keys)))


def play_round(strategy, grid: LocalGrid, server_round: int, arrays: ArrayRecord, sampler=None) -> ArrayRecord:  # type: ignore[no-untyped-def]
    """One round as fedsim's loop plays it: the sampled nodes' messages, replies sorted by partition."""
    messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
    if sampler is not None:
        chosen = {node_id_of(p) for p in sampler.sample(server_round)}
        messages = [m for m in messages if m.metadata.dst_node_id in chosen]
    replies = sorted(grid.send_and_receive(messages), key=wire.partition_of)
    new, _ = strategy.aggregate_train(server_round, replies)
    return new


def client_round(  # type: ignore[no-untyped-def]
    net, hooks: ClientHooks, msg: Message, state: RecordDict, info: RoundInfo, stream, weight_decay: float
) -> tuple[ArrayRecord, RecordDict | None]:
    """One client's round as a worker runs it: the strategy's hooks around the one training loop, SGD at the
    round's learning rate and momentum; the arrays it sends and the record beside them."""
    hooks.load_global(net, msg.content[wire.ARRAYS], state)
    hooks.begin_round(net, msg.content, state, info)
    sgd = LocalSgd(net.parameters(), lr=info.lr, momentum=info.momentum, weight_decay=weight_decay)
    result = train_one(net, stream, sgd, hooks, info)
    extra = hooks.end_round(net, state, info, result.steps)
    return hooks.reply_arrays(net, state), extra


def reply(arrays: ArrayRecord, pid: int, n: int, extra: RecordDict | None = None) -> RecordDict:
    content = RecordDict(dict(extra or {}))
    content[wire.ARRAYS] = arrays
    content[wire.METRICS] = MetricRecord({wire.NUM_EXAMPLES: n, wire.PARTITION_ID: pid, wire.TRAIN_LOSS: 0.0})
    return content


def numpy_of(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: np.array(array_view(a), dtype=np.float64) for k, a in record.items()}


def spec(name: str, **options):  # type: ignore[no-untyped-def]
    """The strategy spec, built from its options as the config does."""
    s = STRATEGIES.get(name)
    return s(s.Params(**options))


def info(counts: list[int], lr: float = 0.1, steps: int = 1, pid: int = 0, server_round: int = 1) -> RoundInfo:
    return RoundInfo(server_round, pid, steps, None, lr, 0.0, torch.tensor(counts))


def stream(x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None) -> BatchStream:
    return BatchStream(x, y, batch_size or len(y), torch.Generator().manual_seed(0))


def mlp(norm: str = "ln", in_shape=(1, 2, 2), classes: int = 3, **args) -> FedsimModel:
    return create_model("mlp", classes, in_shape, create_norm(norm), {"hidden": [4], **args})


def images(n: int, in_shape=(1, 2, 2)) -> torch.Tensor:
    return torch.randint(0, 256, (n, *in_shape), dtype=torch.uint8)


# --- FedProx -----------------------------------------------------------------------------------


def test_fedprox_gradient_is_grad_f_plus_mu_w_minus_x_on_parameters_only() -> None:
    mu, lr = 0.5, 0.1
    model = mlp("bn")  # BatchNorm brings buffers, which the proximal term must ignore
    spec_ = spec("fedprox", mu=mu)
    hooks = spec_.client()
    x = {k: v.clone() for k, v in model.state_dict().items()}
    content = RecordDict({wire.CONFIG: ConfigRecord({PROXIMAL_MU: mu})})
    hooks.begin_round(model, content, RecordDict(), info([1, 1, 1], lr))
    with torch.no_grad():  # local weights w != x, buffers moved far away too
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
        for b in model.buffers():
            if b.is_floating_point():
                b.add_(5.0)
    w = {k: v.clone() for k, v in model.state_dict().items()}
    param_names = {n for n, _ in model.named_parameters()}

    prox = hooks.extra_loss(model, torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1))
    expected = 0.5 * mu * sum(float(((w[n] - x[n]).double() ** 2).sum()) for n in param_names)
    assert float(prox.detach()) == pytest.approx(expected, rel=1e-6)
    assert expected > 0

    data_x, data_y = images(6), torch.tensor([0, 1, 2, 0, 1, 2])
    # grad f(w) on a copy with plain cross-entropy on the same (whole-client) batch
    plain = copy.deepcopy(model)
    plain.train()
    F.cross_entropy(plain(data_x.float() / 255), data_y).backward()
    grad_f = {n: p.grad.clone() for n, p in plain.named_parameters()}

    opt = LocalSgd(model.parameters(), lr=lr)
    train_one(model, stream(data_x, data_y), opt, hooks, info([2, 2, 2], lr))
    for n, p in model.named_parameters():
        expected_grad = grad_f[n] + mu * (w[n] - x[n])
        torch.testing.assert_close(p.detach(), w[n] - lr * expected_grad, rtol=1e-5, atol=1e-6)


# --- SCAFFOLD ----------------------------------------------------------------------------------




def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def scaffold_reference(W, buf, X, Y, K, lr, c, c_i):
    """K full-batch steps of w <- w - lr (grad f - c_i + c) on mean cross-entropy, by hand."""
    onehot = np.eye(2)[Y]
    W0, W = W, W.copy()
    for _ in range(K):
        grad = (softmax(X @ W.T) - onehot).T @ X / len(X)
        W = W - lr * (grad - c_i + c)
        buf = 0.5 * buf + 0.5 * X.mean(0)
    c_plus = c_i - c + (W0 - W) / (K * lr)
    return W, buf, c_plus, c_plus - c_i


SCAFFOLD_DATA = {  # client -> (uint8 inputs N x 1 x 1 x 2, labels)
    0: (torch.tensor([[200, 10], [30, 250], [120, 90], [255, 0]], dtype=torch.uint8), [0, 1, 1, 0]),
    1: (torch.tensor([[5, 180], [240, 60]], dtype=torch.uint8), [1, 1]),
    2: (torch.tensor([[90, 90], [10, 20], [220, 230]], dtype=torch.uint8), [0, 1, 0]),
}


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_scaffold_two_rounds_match_the_hand_computation(weighting: str) -> None:
    K, lr, eta_g, N = 3, 0.5, 2.0, 3
    model = TinyLinear(2, bias=False)
    spec_ = spec("scaffold", eta_g=eta_g, weighting=weighting)
    hooks = spec_.client()
    seen: dict[int, dict[str, np.ndarray]] = {}

    def client(msg: Message, pid: int, state: RecordDict) -> RecordDict:
        x_u8, y = SCAFFOLD_DATA[pid]
        x_u8, y = x_u8.view(-1, 1, 1, 2), torch.tensor(y)
        rinfo = info([int((y == k).sum()) for k in range(2)], lr, K, pid)
        hooks.load_global(model, msg.content[wire.ARRAYS], state)
        hooks.begin_round(model, msg.content, state, rinfo)
        result = train_one(model, stream(x_u8, y), LocalSgd(model.parameters(), lr=lr), hooks, rinfo)
        extra = hooks.end_round(model, state, rinfo, result.steps)
        out = hooks.reply_arrays(model, state)
        seen[pid] = {
            "y": numpy_of(out)["classifier.weight"],
            "delta_c": numpy_of(extra[SCAFFOLD_DELTA_C])["classifier.weight"],
            "c_i": numpy_of(state[SCAFFOLD_C_I])["classifier.weight"],
        }
        return reply(out, pid, len(y), extra)

    clients = Clients(client, N)
    grid = LocalGrid(clients)
    strategy = server("scaffold", N, {"classifier.weight"}, eta_g=eta_g, weighting=weighting)
    sampler = ClientSampler(N, 2, seed=0)
    with torch.no_grad():
        model.classifier.weight.copy_(torch.tensor([[0.3, -0.2], [-0.1, 0.4]]))
    arrays = to_array_record(model.state_dict())

    W, buf = numpy_of(arrays)["classifier.weight"], np.zeros(2)
    c, c_i = np.zeros((2, 2)), {p: np.zeros((2, 2)) for p in range(N)}  # c_i starts at zero
    for server_round in (1, 2):
        seen.clear()
        arrays = play_round(strategy, grid, server_round, arrays, sampler)
        sampled = sampler.sample(server_round)
        assert sorted(seen) == sampled and len(sampled) == 2
        ys, bufs, deltas, weights = [], [], [], []
        for pid in sampled:
            x_u8, y = SCAFFOLD_DATA[pid]
            X = x_u8.double().numpy() / 255
            y_i, buf_i, c_plus, delta = scaffold_reference(W, buf, X, np.array(y), K, lr, c, c_i[pid])
            np.testing.assert_allclose(seen[pid]["y"], y_i, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(seen[pid]["c_i"], c_plus, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(seen[pid]["delta_c"], delta, rtol=1e-5, atol=1e-6)
            c_i[pid] = c_plus
            ys.append(y_i)
            bufs.append(buf_i)
            deltas.append(delta)
            weights.append(len(y))
        w = np.array(weights) / sum(weights)
        u = w if weighting == "samples" else np.full(len(ys), 1 / len(ys))
        W = W + eta_g * sum(ui * (yi - W) for ui, yi in zip(u, ys, strict=True))
        buf = sum(wi * b for wi, b in zip(w, bufs, strict=True))  # FedAvg's average: no η_g, no correction
        c = c + (len(sampled) / N) * np.mean(deltas, axis=0)
        got = numpy_of(arrays)
        np.testing.assert_allclose(got["classifier.weight"], W, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["running"], buf, rtol=1e-6)
        np.testing.assert_allclose(numpy_of(strategy.server_state())["c/classifier.weight"], c, rtol=1e-5, atol=1e-7)
        assert not np.allclose(c, 0)
    # a checkpoint of the server state restores c
    fresh = server("scaffold", N, {"classifier.weight"}, eta_g=eta_g, weighting=weighting)
    fresh.load_server_state(strategy.server_state())
    np.testing.assert_array_equal(numpy_of(fresh.server_state())["c/classifier.weight"], numpy_of(
        strategy.server_state())["c/classifier.weight"])
    # round 2 reused the c_i each sampled client kept in its own state from round 1
    assert set(sampler.sample(1)) & set(sampler.sample(2))
    for pid in range(N):
        if pid in sampler.sample(1) or pid in sampler.sample(2):
            kept = numpy_of(clients.states[pid][SCAFFOLD_C_I])["classifier.weight"]
            np.testing.assert_allclose(kept, c_i[pid], rtol=1e-5, atol=1e-6)
        else:
            assert SCAFFOLD_C_I not in clients.states[pid]


def test_scaffold_with_zero_control_variates_steps_like_fedavg() -> None:
    model = mlp("bn")
    x_u8, y = images(8), torch.randint(0, 3, (8,))
    start = copy.deepcopy(model.state_dict())
    spec_ = spec("scaffold")
    scaffold = spec_.client()
    c_zero = to_array_record({n: torch.zeros_like(p) for n, p in model.named_parameters()})
    scaffold.begin_round(model, RecordDict({SCAFFOLD_C: c_zero}), RecordDict(), info([3, 3, 2]))
    train_one(model, stream(x_u8, y, 4), LocalSgd(model.parameters(), lr=0.1), scaffold, info([3, 3, 2]))
    after_scaffold = model.state_dict()

    fedavg = copy.deepcopy(model)
    fedavg.load_state_dict(start)
    plain = ClientHooks(None)
    train_one(fedavg, stream(x_u8, y, 4), LocalSgd(fedavg.parameters(), lr=0.1), plain, info([3, 3, 2]))
    for k, v in fedavg.state_dict().items():
        assert torch.equal(after_scaffold[k], v), k
    assert not torch.equal(after_scaffold["classifier.weight"], start["classifier.weight"])


def test_scaffold_control_variates_cover_parameters_not_buffers() -> None:
    model = mlp("bn")
    spec_ = spec("scaffold")
    hooks = spec_.client()
    c = to_array_record({n: torch.full_like(p, 0.01) for n, p in model.named_parameters()})
    state = RecordDict()
    rinfo = info([3, 3, 2], steps=2)
    hooks.begin_round(model, RecordDict({SCAFFOLD_C: c}), state, rinfo)
    train_one(model, stream(images(8), torch.randint(0, 3, (8,)), 4), LocalSgd(model.parameters(), lr=0.1),
                hooks, rinfo)
    extra = hooks.end_round(model, state, rinfo, 2)
    params = {n for n, _ in model.named_parameters()}
    buffers = {n for n, _ in model.named_buffers()}
    assert buffers  # running statistics exist ...
    assert set(extra[SCAFFOLD_DELTA_C]) == set(state[SCAFFOLD_C_I]) == params  # ... and are not covered


# --- FedYogi -----------------------------------------------------------------------------------

YOGI_KEYS = {"w": (3, 2), "b": (4,), "stat": (3,)}  # "stat" is a buffer (not a parameter)


def yogi_replies(server_round: int, pid: int) -> ArrayRecord:
    g = torch.Generator().manual_seed(100 * server_round + pid)
    tensors = {k: torch.randn(shape, generator=g) for k, shape in YOGI_KEYS.items()}
    tensors["count"] = torch.tensor(server_round * 10 + pid)  # an integer buffer, like num_batches_tracked
    return to_array_record(tensors)


def drive(strategy, rounds: int = 3) -> list[dict[str, np.ndarray]]:
    sizes = [5, 2, 9]
    grid = LocalGrid(Clients(lambda m, pid, s: reply(yogi_replies(r[0], pid), pid, sizes[pid]), 3))
    r = [0]
    arrays = yogi_replies(0, 7)
    out = []
    for server_round in range(1, rounds + 1):
        r[0] = server_round
        arrays = play_round(strategy, grid, server_round, arrays)
        out.append(numpy_of(arrays))
    return out


def test_fedyogi_with_flower_choices_equals_flowers_fedyogi() -> None:
    hp = {"eta": 0.05, "beta_1": 0.8, "beta_2": 0.95, "tau": 1e-2}
    ours = server("fedyogi", 3, {"w", "b"}, v0=0.0, scope="all", **hp)
    flower = FedYogi(**hp)
    for a, b in zip(drive(ours), drive(flower), strict=True):
        assert set(a) == set(b)
        for k in a:  # Flower's float operations in Flower's order: the same bits
            np.testing.assert_array_equal(a[k], b[k])


def test_fedyogi_paper_choices_follow_the_formula() -> None:
    eta, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    params = spec("fedyogi", eta=eta).params  # defaults: v0 = tau², parameters only
    assert (params.beta_1, params.beta_2, params.tau) == (b1, b2, tau)
    strategy = server("fedyogi", 3, {"w", "b"}, eta=eta)
    got = drive(strategy)

    sizes = np.array([5, 2, 9]) / 16
    x = numpy_of(yogi_replies(0, 7))
    m = {k: np.zeros(YOGI_KEYS[k]) for k in ("w", "b")}
    v = {k: np.full(YOGI_KEYS[k], tau**2) for k in ("w", "b")}
    for server_round, result in enumerate(got, start=1):
        ys = [numpy_of(yogi_replies(server_round, pid)) for pid in range(3)]
        avg = {k: sum(s * y[k] for s, y in zip(sizes, ys, strict=True)) for k in x}
        for k in ("w", "b"):
            delta = avg[k] - x[k]
            m[k] = b1 * m[k] + (1 - b1) * delta
            v[k] = v[k] - (1 - b2) * delta**2 * np.sign(v[k] - delta**2)
            x[k] = x[k] + eta * m[k] / (np.sqrt(v[k]) + tau)
        x["stat"], x["count"] = avg["stat"], avg["count"]  # buffers: plain weighted average
        for k in x:
            np.testing.assert_allclose(result[k], x[k], rtol=1e-4, atol=1e-6)
    state = numpy_of(strategy.server_state())
    assert set(state) == {"m_t/w", "m_t/b", "v_t/w", "v_t/b"}
    np.testing.assert_allclose(state["v_t/w"], v["w"], rtol=1e-4)
    np.testing.assert_allclose(state["m_t/b"], m["b"], rtol=1e-4, atol=1e-8)
    fresh = server("fedyogi", 3, {"w", "b"}, eta=eta)
    fresh.load_server_state(strategy.server_state())
    assert {k: v.tolist() for k, v in numpy_of(fresh.server_state()).items()} == {
        k: v.tolist() for k, v in state.items()}


# --- FedLC -------------------------------------------------------------------------------------


def test_fedlc_calibrated_logits() -> None:
    tau = 0.7
    spec_ = spec("fedlc", tau=tau)
    hooks = spec_.client()
    model = mlp(classes=4)
    counts = [0, 1, 16, 81]
    hooks.begin_round(model, RecordDict(), RecordDict(), info(counts))
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.0, 2.0]])
    out = hooks.adjust_logits(logits, info(counts))
    expected = logits.clone()
    expected[:, 1] -= tau * 1.0
    expected[:, 2] -= tau * 0.5  # 16^(-1/4)
    expected[:, 3] -= tau / 3  # 81^(-1/4)
    assert torch.isneginf(out[:, 0]).all()
    torch.testing.assert_close(out[:, 1:], expected[:, 1:])


def test_fedlc_one_class_client_has_zero_loss_and_learns_nothing() -> None:
    spec_ = spec("fedlc")
    hooks = spec_.client()
    model = mlp(classes=3)
    start = copy.deepcopy(model.state_dict())
    y = torch.full((6,), 2)
    rinfo = info([0, 0, 6], lr=0.5, steps=3)
    hooks.begin_round(model, RecordDict(), RecordDict(), rinfo)
    result = train_one(model, stream(images(6), y, 3), LocalSgd(model.parameters(), lr=0.5), hooks, rinfo)
    assert result.steps == 3 and result.mean_loss == 0.0
    assert all(p.grad is not None and torch.count_nonzero(p.grad) == 0 for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, start[k]), k


# --- FedRS -------------------------------------------------------------------------------------


def test_fedrs_binary_scales_only_absent_classes() -> None:
    alpha = 0.3
    spec_ = spec("fedrs", alpha=alpha)
    hooks = spec_.client()
    counts = [4, 0, 2, 0]
    hooks.begin_round(mlp(classes=4, bias=True), RecordDict(), RecordDict(), info(counts))
    logits = torch.tensor([[1.0, 2.0, -3.0, 4.0], [0.5, -1.5, 2.5, 0.25]])
    out = hooks.adjust_logits(logits, info(counts))
    expected = torch.stack([logits[:, 0], alpha * logits[:, 1], logits[:, 2], alpha * logits[:, 3]], 1)
    torch.testing.assert_close(out, expected)


def test_fedrs_soft_follows_the_authors_form() -> None:
    alpha = 0.4
    spec_ = spec("fedrs", alpha=alpha, mode="soft")
    hooks = spec_.client()
    counts = [8, 0, 2, 6]
    model = mlp(classes=4, bias=True)
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0]))
    hooks.begin_round(model, RecordDict(), RecordDict(), info(counts))
    z = torch.randn(5, model.feature_dim)
    out = hooks.adjust_logits(model.forward_head(z), info(counts))
    # FedRS code: logits = cdist * (h @ W^T), cdist = alpha + (1 - alpha) * n / n.max(), no bias
    cdist = torch.tensor([alpha + (1 - alpha) * n / 8 for n in counts])
    expected = cdist * (z @ model.classifier.weight.T)
    torch.testing.assert_close(out, expected)


# --- FedDecorr ---------------------------------------------------------------------------------


def decorr_reference(z: np.ndarray) -> float:
    b, d = z.shape
    if b == 1:
        return 0.0
    z = z - z.mean(0)
    z = z / np.sqrt(1e-8 + z.var(0, ddof=1))
    m = z.T @ z
    off = [m[i, j] for i in range(d) for j in range(d) if i != j]
    return float(np.mean(np.square(off)) / b)


def test_feddecorr_regulariser_matches_the_reference() -> None:
    from fedsim.strategies.feddecorr import decorrelation_loss

    z = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 2.0], [3.0, 0.5, -0.5], [1.5, 1.5, 1.0], [-2.0, 0.0, 0.25]])
    expected = decorr_reference(z)
    assert expected > 0
    assert float(decorrelation_loss(torch.tensor(z))) == pytest.approx(expected, rel=1e-9)
    assert float(decorrelation_loss(torch.tensor(z[:1]))) == 0.0


def test_feddecorr_uses_the_features_entering_the_classifier() -> None:
    beta = 0.3
    spec_ = spec("feddecorr", beta=beta)
    inputs: list[torch.Tensor] = []
    given: list[tuple[torch.Tensor, float]] = []
    base = spec_.client()

    class Recording(type(base)):  # records what the loop hands the hook, and what it returns
        def extra_loss(self, model, x, features, logits, y):
            out = super().extra_loss(model, x, features, logits, y)
            given.append((features.detach().clone(), float(out.detach())))
            return out

    model = mlp("fn", in_shape=(1, 4, 4), classes=3, hidden=[6])  # FN normalises the classifier input
    model.classifier.register_forward_pre_hook(lambda m, args: inputs.append(args[0].detach().clone()))
    hooks = Recording(spec_.params)
    rinfo = info([3, 3, 2], steps=2)
    train_one(model, stream(images(8, (1, 4, 4)), torch.randint(0, 3, (8,)), 4),
                LocalSgd(model.parameters(), lr=0.1), hooks, rinfo)
    assert len(given) == len(inputs) == 2
    for (features, value), classifier_input in zip(given, inputs, strict=True):
        assert torch.equal(features, classifier_input)
        norms = classifier_input.norm(dim=1)
        torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(6)))  # after FN
        assert value == pytest.approx(beta * decorr_reference(classifier_input.double().numpy()), rel=1e-5)


# --- FedBN -------------------------------------------------------------------------------------


def bn_keys(model: nn.Module) -> set[str]:
    """Independently of fedsim: every state-dict key of a torch BatchNorm module."""
    return {f"{n}.{k}" for n, m in model.named_modules() if isinstance(m, _BatchNorm) for k in m.state_dict()}


def test_fedbn_client_keeps_bn_weights_and_statistics() -> None:
    spec_ = spec("fedbn")
    hooks = spec_.client()
    model = mlp("bn")
    local = bn_keys(model)
    assert {k.rsplit(".", 1)[1] for k in local} >= {"weight", "bias", "running_mean", "running_var"}
    state = RecordDict()
    global_arrays = to_array_record(model.state_dict())
    rinfo = info([3, 3, 2])
    hooks.load_global(model, global_arrays, state)
    hooks.begin_round(model, RecordDict(), state, rinfo)
    train_one(model, stream(images(8), torch.randint(0, 3, (8,)), 4), LocalSgd(model.parameters(), lr=0.1),
                hooks, rinfo)
    hooks.end_round(model, state, rinfo, 1)
    sent = hooks.reply_arrays(model, state)
    assert set(sent) == set(model.state_dict()) - local  # never leave the client
    mine = {k: v.clone() for k, v in model.state_dict().items() if k in local}
    assert not torch.equal(mine[next(k for k in local if k.endswith("running_mean"))], torch.zeros(4))

    with torch.no_grad():  # another client trains on the shared model object meanwhile
        for k in local:
            model.state_dict()[k].fill_(-3)
    # the server sends garbage for every tensor: BN comes back as the client's own, the rest as sent
    garbage = to_array_record({k: torch.full_like(v, 7) for k, v in model.state_dict().items()})
    hooks.load_global(model, garbage, state)
    for k, v in model.state_dict().items():
        assert torch.equal(v, mine[k]) if k in local else bool((v == 7).all()), k


def test_fedbn_server_keeps_its_own_bn_tensors() -> None:
    model = mlp("bn")
    local = bn_keys(model)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = server("fedbn", 2, {n for n, _ in model.named_parameters()})
    sizes = [1, 3]

    def client(msg: Message, pid: int, state: RecordDict) -> RecordDict:
        sent = {k: torch.full_like(v, pid + 1.0) for k, v in start.items() if k not in local}
        return reply(to_array_record(sent), pid, sizes[pid])

    grid = LocalGrid(Clients(client, 2))
    arrays = to_array_record(start)
    for server_round in (1, 2):
        arrays = play_round(strategy, grid, server_round, arrays)
    got = numpy_of(arrays)
    assert list(got) == list(start)
    for k, v in got.items():
        expected = start[k].double().numpy() if k in local else np.full(v.shape, (1 * 1 + 3 * 2) / 4)
        np.testing.assert_allclose(v, expected, rtol=1e-6)
