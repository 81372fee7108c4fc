"""FedNTD (Lee et al., NeurIPS 2022): L_NTD against a reference written from the paper's Eq. 5, one client round
against a hand-written autograd SGD, clients trained together each against their own global model, β = 0 as
FedAvg, and bad options refused."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, train_local
from fedsim.client.vectorized import StackedForward
from fedsim.config_file import parse_config
from fedsim.data.batches import BatchStream
from fedsim.errors import ConfigError
from fedsim.experiment.resolve import resolve
from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm
from fedsim.strategies import STRATEGIES, ServerSetup
from fedsim.strategies.fedntd import not_true_distillation
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from tests.conftest import small_config

# hand-made logits: 4 samples, 5 classes; labels cover the first, a middle and the last class
LOCAL = [
    [2.0, -1.0, 0.5, 3.0, 0.0],
    [0.1, 0.2, -0.3, 1.5, -2.0],
    [-1.0, 4.0, 0.0, 0.5, 1.0],
    [0.0, 0.0, 1.0, -1.0, 2.5],
]
GLOBAL = [
    [1.0, 0.5, -0.5, 2.0, 1.0],
    [0.3, -0.2, 0.7, 0.0, -1.0],
    [2.0, 1.0, -1.0, 0.0, 0.5],
    [-0.5, 1.5, 0.0, 1.0, 0.2],
]
LABELS = [0, 3, 4, 2]


def reference_ntd(local: list[list[float]], global_: list[list[float]], labels: list[int], tau: float) -> float:
    """Eq. 5, term by term: the batch mean of −Σ_{c≠y} q̃_τ^g(c)·log(q̃_τ(c) / q̃_τ^g(c)), the q̃ being softmaxes at τ
    over the not-true classes only."""
    total = 0.0
    for z, z_g, y in zip(local, global_, labels, strict=True):
        others = [c for c in range(len(z)) if c != y]
        norm = sum(math.exp(z[c] / tau) for c in others)
        norm_g = sum(math.exp(z_g[c] / tau) for c in others)
        for c in others:
            q, q_g = math.exp(z[c] / tau) / norm, math.exp(z_g[c] / tau) / norm_g
            total -= q_g * math.log(q / q_g)
    return total / len(labels)


def double(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("tau", [1.0, 0.5, 3.0])
def test_ntd_loss_matches_the_papers_equation(tau: float) -> None:
    expected = reference_ntd(LOCAL, GLOBAL, LABELS, tau)
    got = not_true_distillation(double(LOCAL), double(GLOBAL), torch.tensor(LABELS), tau)
    assert got.dtype == torch.float64 and expected > 0
    assert float(got) == pytest.approx(expected, rel=1e-12)
    # the global model's own predictions: nothing to distil
    assert float(not_true_distillation(double(GLOBAL), double(GLOBAL), torch.tensor(LABELS), tau)) == pytest.approx(
        0.0, abs=1e-15
    )


def test_the_true_class_logit_has_no_effect() -> None:
    y = torch.tensor(LABELS)
    rows = torch.arange(len(LABELS))
    local = double(LOCAL).requires_grad_(True)
    loss = not_true_distillation(local, double(GLOBAL), y, 2.0)
    (grad,) = torch.autograd.grad(loss, local)
    assert torch.all(grad[rows, y] == 0) and torch.all(grad.abs().sum(1) > 0)
    for shift in (-50.0, 7.0, 1e3):  # either model's true-class logit, moved anywhere
        moved_local, moved_global = double(LOCAL), double(GLOBAL)
        moved_local[rows, y] += shift
        moved_global[rows, y] -= shift
        assert torch.equal(not_true_distillation(moved_local, moved_global, y, 2.0), loss.detach())
    # CE alone does feel it: the term is what excludes it, not the hand-made numbers
    assert float(F.cross_entropy(double(LOCAL), y)) != float(F.cross_entropy(moved_local, y))


# --- one client round --------------------------------------------------------------------------


def spec(name: str, **options):  # type: ignore[no-untyped-def]
    s = STRATEGIES.get(name)
    return s(s.Params(**options))


def info(steps: int, lr: float) -> RoundInfo:
    return RoundInfo(1, 0, steps, None, lr, 0.0, torch.tensor([4, 4, 4]))


def model(norm: str = "ln", seed: int = 0) -> FedsimModel:
    torch.manual_seed(seed)
    return create_model("mlp", 3, (1, 4, 4), create_norm(norm), {"hidden": [8]})


def data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (12, 1, 4, 4), dtype=torch.uint8, generator=g), torch.arange(12) % 3


def stream(x: torch.Tensor, y: torch.Tensor, seed: int = 0) -> BatchStream:
    return BatchStream(x, y, 4, torch.Generator().manual_seed(seed))


def begin(hooks: ClientHooks, m: FedsimModel, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> ClientRound:
    rinfo = info(steps, lr)
    hooks.begin_round(m, RecordDict(), RecordDict(), rinfo)
    return ClientRound(m, hooks, stream(x, y), rinfo)


def test_one_client_round_matches_hand_written_sgd() -> None:
    beta, tau, lr, steps = 0.7, 2.0, 0.5, 4
    # BN: the frozen global copy predicts in eval mode (running statistics), the local model trains in train mode
    m = model("bn")
    x, y = data()
    local, frozen = copy.deepcopy(m), copy.deepcopy(m).eval()
    batches = list(stream(x, y).batches(steps))

    losses = []
    for bx, by in batches:
        logits = local(bx)
        with torch.no_grad():
            global_logits = frozen(bx)
        ntd = 0.0
        for z, z_g, label in zip(logits, global_logits, by.tolist(), strict=True):
            keep = [c for c in range(3) if c != label]
            log_q = F.log_softmax(z[keep] / tau, dim=0)
            q_g = F.softmax(z_g[keep] / tau, dim=0)
            ntd = ntd + (q_g * (q_g.log() - log_q)).sum()
        loss = F.cross_entropy(logits, by) + beta * ntd / len(by)
        grads = torch.autograd.grad(loss, list(local.parameters()))
        with torch.no_grad():
            for p, g in zip(local.parameters(), grads, strict=True):
                p -= lr * g
        losses.append(float(loss.detach()))

    work = begin(spec("fedntd", beta=beta, tau=tau).client(), m, x, y, steps, lr)
    (result,) = train_local([work], LocalSgd(m.parameters(), lr=lr))
    assert result.steps == steps
    assert result.mean_loss == pytest.approx(sum(losses) / steps, rel=1e-5)
    for (name, got), want in zip(m.state_dict().items(), local.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    # the term changed the round: plain CE ends elsewhere
    plain = copy.deepcopy(frozen).train()
    train_local([begin(spec("fedavg").client(), plain, x, y, steps, lr)], LocalSgd(plain.parameters(), lr=lr))
    assert not torch.allclose(plain.classifier.weight, m.classifier.weight)


def test_clients_trained_together_each_distil_their_own_global_model() -> None:
    beta, lr, steps = 1.5, 0.5, 3
    starts = [model(seed=0), model(seed=1)]  # two different global models, as two rounds' clients would have
    x, y = data()

    alone = [copy.deepcopy(m) for m in starts]
    for m in alone:
        train_local([begin(spec("fedntd", beta=beta).client(), m, x, y, steps, lr)], LocalSgd(m.parameters(), lr=lr))

    together = [copy.deepcopy(m) for m in starts]
    works = [begin(spec("fedntd", beta=beta).client(), m, x, y, steps, lr) for m in together]
    params = [p for m in together for p in m.parameters()]
    train_local(works, LocalSgd(params, lr=lr), StackedForward(together))
    for a, t in zip(alone, together, strict=True):
        for (name, got), want in zip(t.state_dict().items(), a.state_dict().values(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.allclose(together[0].classifier.weight, together[1].classifier.weight)


# --- β = 0 is FedAvg -----------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["ln", "bn"])
def test_beta_zero_is_fedavg_exactly(norm: str) -> None:
    x, y = data()
    fedavg, ntd = model(norm), model(norm)
    results = [
        train_local([begin(spec(name, **options).client(), m, x, y, 3, 0.5)], LocalSgd(m.parameters(), lr=0.5))
        for name, options, m in (("fedavg", {}, fedavg), ("fedntd", {"beta": 0.0, "tau": 4.0}, ntd))
    ]
    assert results[0] == results[1]
    for (name, a), b in zip(fedavg.state_dict().items(), ntd.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    setup = ServerSetup(4, parameter_keys=frozenset({"w"}))
    assert type(spec("fedntd", beta=0.0).server(setup)) is type(spec("fedavg").server(setup))


def test_defaults_are_the_authors() -> None:
    params = STRATEGIES.get("fedntd").Params()
    assert (params.beta, params.tau) == (1.0, 1.0)


# --- bad options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"beta": -0.1}, "strategy.beta", "greater than or equal to 0"),
        ({"tau": 0}, "strategy.tau", "greater than 0"),
        ({"tau": -1.0}, "strategy.tau", "greater than 0"),
        ({"beta": "big"}, "strategy.beta", "number"),
        ({"temperature": 2.0}, "temperature", "tau"),
    ],
)
def test_bad_options_are_refused(tmp_path: Path, options: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(parse_config(small_config(tmp_path, strategy={"name": "fedntd", **options})))
    assert field in str(err.value) and words in str(err.value)
