"""FedETF (Li et al., ICCV 2023) against its equations as the authors' code (ZexiLee/ICCV-2023-FedETF) runs them.

The reference never calls fedsim's strategy or its ETF classifier: each client is the model's body plus its own
projection P (weight, bias), temperature β and the ETF M read once as a fixed input, with logits
β·(P(z)/‖P(z)‖)ᵀM, the balanced softmax CE(logits + log n, y) and ``torch.optim.SGD`` (momentum, weight decay);
the server is Σ n_i/n·θ_i in float64 over everything but M. fedsim's clients train through ``train_local``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Message, RecordDict

from fedsim.app.cli import main
from fedsim.arrays import to_array_record
from fedsim.client.personal import Personaliser
from fedsim.config_file import parse_config
from fedsim.data.batches import BatchStream
from fedsim.engines.local import LocalGrid
from fedsim.engines.runner import run
from fedsim.errors import ConfigError
from fedsim.experiment.resolve import resolve
from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm
from fedsim.strategies.fedetf import ETF_KEY, simplex_etf
from fedsim.strategies.hooks import RoundInfo
from tests import strategy_rows
from tests.conftest import small_config, write_config
from tests.strategy_harness import Clients, client_round, numpy_of, play_round, reply, server, spec
from tests.test_resume import check_resume, metrics

LR, MOMENTUM, WD, STEPS, BATCH, CLASSES, SHAPE, DIM, SEED = 0.1, 0.9, 0.01, 3, 4, 4, (1, 4, 4), 6, 7
SIZES = {0: 12, 1: 8, 2: 5}
LABELS = {0: [0, 1, 2, 3], 1: [0, 0, 1], 2: [2, 3, 3]}  # per client: the classes it draws from, skewed, some absent


def model() -> FedsimModel:
    torch.manual_seed(0)
    net = create_model("mlp", CLASSES, SHAPE, create_norm("ln"), {"hidden": [6, 5]})
    return spec("fedetf", etf_dim=DIM, scale=2.0).adapt_model(net, SEED)


def data(pid: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + pid)
    x = torch.randint(0, 256, (SIZES[pid], *SHAPE), dtype=torch.uint8, generator=g)
    choice = torch.tensor(LABELS[pid])[torch.randint(0, len(LABELS[pid]), (SIZES[pid],), generator=g)]
    return x, choice


def counts(pid: int) -> torch.Tensor:
    return torch.bincount(data(pid)[1], minlength=CLASSES)


def stream(pid: int, server_round: int) -> BatchStream:
    x, y = data(pid)
    return BatchStream(x, y, BATCH, torch.Generator().manual_seed(10 * server_round + pid))


def reference_logits(net: FedsimModel, etf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """β·Mᵀμ, μ = P(z)/‖P(z)‖ (the authors' clamp at 1e-12), written from the equations on the raw tensors."""
    z = net.project(net.forward_features(x))
    head = net.classifier
    p = z @ head.projection.weight.T + head.projection.bias
    mu = p / p.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return head.scale * (mu @ etf)


def reference_client(net: FedsimModel, weights: dict[str, torch.Tensor], pid: int, server_round: int):  # type: ignore[no-untyped-def]
    w = copy.deepcopy(net)
    w.load_state_dict(weights)
    w.train()
    etf = weights[ETF_KEY].clone()  # the fixed input
    trained = [p for k, p in w.named_parameters() if k != ETF_KEY]
    sgd = torch.optim.SGD(trained, lr=LR, momentum=MOMENTUM, weight_decay=WD)
    n = counts(pid).float()
    log_prior = torch.where(n > 0, n.clamp(min=1).log(), -torch.inf)  # the authors' spc.log(): −∞ for n = 0
    for x, y in stream(pid, server_round).batches(STEPS):
        sgd.zero_grad()
        F.cross_entropy(reference_logits(w, etf, x) + log_prior, y).backward()
        sgd.step()
    return {k: v.detach().clone() for k, v in w.state_dict().items()}


def reference_round(net: FedsimModel, weights: dict[str, torch.Tensor], server_round: int) -> dict[str, np.ndarray]:
    trained = {pid: reference_client(net, weights, pid, server_round) for pid in SIZES}
    n = sum(SIZES.values())
    return {
        k: v.double().numpy() if k == ETF_KEY else sum(SIZES[p] / n * trained[p][k].double().numpy() for p in SIZES)
        for k, v in weights.items()
    }


def fedsim_round(net: FedsimModel, weights: dict[str, torch.Tensor], server_round: int):  # type: ignore[no-untyped-def]
    hooks = spec("fedetf", etf_dim=DIM, scale=2.0).client()
    sent_keys: dict[int, set[str]] = {}

    def client(msg: Message, pid: int, state: RecordDict) -> RecordDict:
        info = RoundInfo(server_round, pid, STEPS, None, LR, MOMENTUM, counts(pid))
        sent, extra = client_round(net, hooks, msg, state, info, stream(pid, server_round), WD)
        sent_keys[pid] = set(sent)
        return reply(sent, pid, SIZES[pid], extra)

    strategy = server("fedetf", len(SIZES), {k for k, _ in net.named_parameters()})
    arrays = play_round(strategy, LocalGrid(Clients(client, len(SIZES))), server_round, to_array_record(weights))
    return sent_keys, numpy_of(arrays)


def test_two_rounds_match_the_equations_with_the_etf_fixed() -> None:
    net = model()
    x0 = {k: v.detach().clone() for k, v in net.state_dict().items()}
    weights = x0
    for server_round in (1, 2):
        ref = reference_round(net, weights, server_round)
        sent, got = fedsim_round(net, weights, server_round)
        assert got.keys() == ref.keys() == x0.keys()
        assert all(keys == set(x0) - {ETF_KEY} for keys in sent.values())  # M never leaves a client
        assert np.array_equal(got[ETF_KEY], x0[ETF_KEY].double().numpy())  # M bit for bit, every round
        for k, v in got.items():
            # the same SGD on the same batches in float32, then a float32 weighted sum of three terms against float64
            np.testing.assert_allclose(v, ref[k], rtol=1e-5, atol=1e-6, err_msg=k)
        moved = {k: np.abs(got[k] - weights[k].double().numpy()).max() for k in got}
        assert moved["classifier.scale"] > 1e-4 and moved["classifier.projection.weight"] > 1e-3  # β and P train
        weights = {k: torch.from_numpy(v).float() for k, v in got.items()}


ALTERNATIONS, EPOCHS, ETF_LR, PROJECTION_LR = 2, 2, 0.1, 0.05


def reference_adaptation(net: FedsimModel, weights: dict[str, torch.Tensor], pid: int, batches: BatchStream):  # type: ignore[no-untyped-def]
    """The authors' ``Client_personalization`` for FedETF: one more round of the balanced softmax from the global
    model (``Client_update``), then ALTERNATIONS times EPOCHS epochs of plain CE on the ETF alone
    (``SGD([proto], lr=0.1)``), then EPOCHS epochs on the projection alone (``SGD(lr=0.05, momentum, weight_decay)``);
    the model in train mode throughout. Its state dict, M the adapted one."""
    w = copy.deepcopy(net)
    w.load_state_dict(weights)
    w.train()
    etf = weights[ETF_KEY].clone()
    body = [p for k, p in w.named_parameters() if k != ETF_KEY]
    sgd = torch.optim.SGD(body, lr=LR, momentum=MOMENTUM, weight_decay=WD)
    n = counts(pid).float()
    log_prior = torch.where(n > 0, n.clamp(min=1).log(), -torch.inf)
    for x, y in batches.batches(STEPS):
        sgd.zero_grad()
        F.cross_entropy(reference_logits(w, etf, x) + log_prior, y).backward()
        sgd.step()
    etf.requires_grad_(True)
    projection = [w.classifier.projection.weight, w.classifier.projection.bias]
    for _ in range(ALTERNATIONS):
        for params, opt in (
            ([etf], torch.optim.SGD([etf], lr=ETF_LR)),
            (projection, torch.optim.SGD(projection, lr=PROJECTION_LR, momentum=MOMENTUM, weight_decay=WD)),
        ):
            for x, y in batches.epochs(EPOCHS):
                for p in [*w.parameters(), etf]:
                    p.grad = None
                F.cross_entropy(reference_logits(w, etf, x), y).backward()
                opt.step()
            assert all(p.grad is not None for p in params)
    state = {k: v.detach().clone() for k, v in w.state_dict().items()}
    state[ETF_KEY] = etf.detach().clone()
    return state


def test_the_local_adaptation_is_the_authors_one_client_after_another_on_one_model(tmp_path: Path) -> None:
    net = model()
    weights = {k: v.detach().clone() for k, v in net.state_dict().items()}
    options = {"adapt_alternations": ALTERNATIONS, "adapt_epochs": EPOCHS}
    hooks = spec("fedetf", etf_dim=DIM, scale=2.0, **options).client()
    train = {"lr": LR, "momentum": MOMENTUM, "weight_decay": WD, "local_steps": STEPS}
    tuner = Personaliser(net, parse_config(small_config(tmp_path, train=train, eval={"personal": {"steps": 0}})))
    for pid in (0, 1):  # a worker's one copy, personalised for one client, then reloaded for the next
        training = RoundInfo(5, pid, STEPS, None, LR, MOMENTUM, counts(pid))
        hooks.load_global(tuner.model, to_array_record(weights), RecordDict())
        adapted = hooks.personalize(tuner.model, RecordDict(), tuner.fine_tune(stream(pid, 5), training, seed=0))
        ref = reference_adaptation(net, weights, pid, stream(pid, 5))
        got = adapted.state_dict()
        assert got.keys() == ref.keys()
        for k in ref:
            # float32 SGD on the same batches in another order of operations, over 27 steps: a few ulps a step
            torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-5, msg=k)
        assert (got[ETF_KEY] - weights[ETF_KEY]).abs().max() > 1e-3  # M adapted, on this copy only
        assert not adapted.classifier.etf.requires_grad  # frozen again for the next client's training
    assert torch.equal(net.classifier.etf, weights[ETF_KEY])


@pytest.mark.parametrize(("dim", "classes"), [(4, 4), (10, 4), (64, 10)])
def test_the_etf_is_a_simplex_etf_drawn_from_the_seed(dim: int, classes: int) -> None:
    m = simplex_etf(dim, classes, SEED)
    gram = m.T @ m
    off = gram[~torch.eye(classes, dtype=torch.bool)]
    torch.testing.assert_close(gram.diagonal(), torch.ones(classes, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(off, torch.full_like(off, -1 / (classes - 1)), rtol=0, atol=1e-12)
    assert torch.equal(m, simplex_etf(dim, classes, SEED))  # every process draws the same M
    assert not torch.equal(m, simplex_etf(dim, classes, SEED + 1))


def test_the_model_gets_the_seeds_etf_whatever_the_global_rng() -> None:
    a = model()
    torch.manual_seed(123)
    net = create_model("mlp", CLASSES, SHAPE, create_norm("ln"), {"hidden": [6, 5]})
    b = spec("fedetf", etf_dim=DIM).adapt_model(net, SEED)
    assert torch.equal(a.classifier.etf, b.classifier.etf)
    assert not a.classifier.etf.requires_grad


def test_an_etf_narrower_than_the_classes_is_refused_in_one_line() -> None:
    net = create_model("mlp", CLASSES, SHAPE, create_norm("ln"), {"hidden": [6, 5]})
    with pytest.raises(ConfigError) as err:
        spec("fedetf", etf_dim=CLASSES - 1).adapt_model(net, SEED)
    assert "\n" not in str(err.value) and "strategy.etf_dim = 3" in str(err.value)


def test_a_run_learns_and_keeps_the_initial_etf(tmp_path: Path, one_thread: None) -> None:
    sections = strategy_rows.sections("fedetf")
    summary = run(parse_config(small_config(tmp_path, **sections)))
    initial = resolve(parse_config(small_config(tmp_path, **sections))).initial_model().state_dict()
    final = torch.load(Path(summary["run_dir"]) / "model.pt", weights_only=True)
    assert torch.equal(final[ETF_KEY], initial[ETF_KEY])
    assert not torch.equal(final["classifier.scale"], initial["classifier.scale"])
    assert metrics(Path(summary["run_dir"]))[-1]["client_mean_acc"] > 0.3  # 10 classes


@pytest.mark.parametrize("adaptation", [True, False])
def test_personalised_accuracy_is_the_local_adaptations(tmp_path: Path, one_thread: None, adaptation: bool) -> None:
    sections = strategy_rows.sections("fedetf")  # eval.personal.steps: 0, a shortened local adaptation
    if not adaptation:  # the adaptation's options are refused without it (test_unread_options_are_refused)
        sections["strategy"] = {"name": "fedetf", "etf_dim": 12, "adaptation": False}
    summary = run(parse_config(small_config(tmp_path, **sections)))
    scores = [(m["client_mean_acc"], m["personal_acc"]) for m in metrics(Path(summary["run_dir"]))]
    assert len(scores) == 2
    if adaptation:  # each client's M and P fitted to its own classes: far above the global model on skewed clients
        assert all(personal > global_ + 0.1 for global_, personal in scores), scores
    else:  # the generic fine-tuning of 0 steps: the global model
        assert all(personal == global_ for global_, personal in scores), scores


@pytest.mark.slow
def test_a_killed_fedetf_run_resumes_to_the_uninterrupted_one(tmp_path: Path) -> None:
    sections = strategy_rows.sections("fedetf")
    train = {**sections.pop("train"), "clients_per_round": 2}
    check_resume(tmp_path, stateful=False, train=train, **sections)


def test_an_option_is_refused_in_one_line_before_training(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(write_config(tmp_path, small_config(tmp_path)))
    code = main(["run", config, "--set", "strategy={name: fedetf, etf_dim: 4}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fedsim: error: "), lines
    assert "strategy.etf_dim = 4" in lines[0], lines[0]
