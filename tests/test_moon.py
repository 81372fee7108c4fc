"""MOON (Li, He, Song, CVPR 2021) against the paper's equations, written here from the paper and the authors' code.

The reference never calls fedsim's strategy: ℓ_con with ``F.cosine_similarity`` against two frozen deep copies
(the round's global model and the client's previous local model), SGD steps by autograd on a deepcopy of the
model. fedsim's client trains through the one training loop (``train_local``) with its hooks.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord, RecordDict

from fedsim import wire
from fedsim.app.cli import main
from fedsim.arrays import array_view, to_array_record
from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, train_local
from fedsim.data.batches import BatchStream
from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm
from fedsim.strategies import STRATEGIES, ClientHooks, RoundInfo
from fedsim.strategies.moon import MOON_PREVIOUS
from tests.conftest import small_config, write_config

LR, STEPS, BATCH, CLASSES, SHAPE = 0.1, 3, 8, 3, (1, 4, 4)


def model(projection: int | None = None) -> FedsimModel:
    torch.manual_seed(0)
    return create_model("mlp", CLASSES, SHAPE, create_norm("ln"), {"hidden": [6, 5], "projection": projection})


def representation(m: FedsimModel, x: torch.Tensor) -> torch.Tensor:
    """The paper's z: the base encoder's output through the projection head (l1, ReLU, l2; MOON Sec. 3.2) when
    the model has one, else the base encoder's output."""
    h = m.forward_features(x)
    if m.params.projection is None:
        return h
    l1, _, l2 = m.projector  # type: ignore[misc]
    return l2(F.relu(l1(h)))


def data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (20, *SHAPE), dtype=torch.uint8, generator=g)
    return x, torch.randint(0, CLASSES, (20,), generator=g)


def stream(seed: int) -> BatchStream:
    x, y = data(seed)
    return BatchStream(x, y, BATCH, torch.Generator().manual_seed(seed))


def hooks(**options: float) -> ClientHooks:
    spec = STRATEGIES.get("moon")
    return spec(spec.Params(**options)).client()


def fedsim_round(
    net: FedsimModel, client: ClientHooks, weights: dict[str, torch.Tensor], state: RecordDict, seed: int
) -> float:
    """One round of fedsim's client from the global ``weights``: its hooks around ``train_local``."""
    info = RoundInfo(seed, 0, STEPS, None, LR, 0.0, torch.ones(CLASSES))
    client.load_global(net, to_array_record(weights), state)
    client.begin_round(net, RecordDict({wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: seed})}), state, info)
    work = ClientRound(net, client, stream(seed), info)
    (result,) = train_local([work], LocalSgd(net.parameters(), lr=LR))
    client.end_round(net, state, info, result.steps)
    return result.mean_loss


def frozen(net: FedsimModel, weights: dict[str, torch.Tensor]) -> FedsimModel:
    f = copy.deepcopy(net)
    f.load_state_dict(weights)
    return f.eval().requires_grad_(False)


def reference_round(
    net: FedsimModel, weights: dict[str, torch.Tensor], previous: dict[str, torch.Tensor] | None, seed: int,
    mu: float, tau: float,
) -> tuple[dict[str, torch.Tensor], float]:  # fmt: skip
    """The paper's local round: ℓ = CE + μ·ℓ_con (MOON Eqs. 2-3), plain SGD; ``previous`` None: the authors'
    first round, whose contrastive logits hold the positive pair alone."""
    w = copy.deepcopy(net)
    w.load_state_dict(weights)
    w.train()
    glob = frozen(net, weights)
    prev = frozen(net, previous) if previous is not None else None
    losses = []
    for x, y in stream(seed).batches(STEPS):
        z = representation(w, x)
        sup = F.cross_entropy(w.classifier(z), y)  # the output layer on the representation
        pos = torch.exp(F.cosine_similarity(z, representation(glob, x), dim=-1) / tau)
        if prev is None:  # the authors' CE over the one column [sim(z, z_glob)/τ]: 0
            con = -torch.log(pos / pos)
        else:
            neg = torch.exp(F.cosine_similarity(z, representation(prev, x), dim=-1) / tau)
            con = -torch.log(pos / (pos + neg))
        loss = sup + mu * con.mean()
        w.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in w.parameters():
                p -= LR * p.grad
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in w.state_dict().items()}, sum(losses) / len(losses)


def weights_of(record_or_model: object) -> dict[str, torch.Tensor]:
    if isinstance(record_or_model, torch.nn.Module):
        return {k: v.detach().clone() for k, v in record_or_model.state_dict().items()}
    return {k: torch.from_numpy(array_view(a).copy()) for k, a in record_or_model.items()}  # type: ignore[attr-defined]


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        # float32 rounding: the reference's exp/log form and fedsim's log-sum-exp part at ~4e-6 after three steps
        # that move the weights by ~0.1-0.25; a wrong τ, μ, pair or frozen model is off by > 1e-3
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=2e-5, msg=k)


@pytest.mark.parametrize("projection", [None, 4])  # the features as z, and the paper's projection head
def test_two_rounds_match_the_papers_loss_with_the_previous_model_from_state(projection: int | None) -> None:
    mu, tau = 5.0, 0.5
    net, client, state = model(projection), hooks(mu=mu, temperature=tau), RecordDict()
    x0 = weights_of(net)
    # round 1: no previous local model, so CE alone (the authors' code); the trained model is kept in state
    ref1, ref_loss1 = reference_round(net, x0, None, 1, mu, tau)
    loss1 = fedsim_round(net, client, x0, state, 1)
    assert_close(weights_of(net), ref1)
    assert loss1 == pytest.approx(ref_loss1, rel=1e-5)
    assert_close(weights_of(state[MOON_PREVIOUS]), ref1)
    # round 2: a new global model (another client moved it) and the previous local model from state
    x1 = {k: v + 0.3 * torch.randn_like(v) for k, v in x0.items()}
    ref2, ref_loss2 = reference_round(net, x1, ref1, 2, mu, tau)
    loss2 = fedsim_round(net, client, x1, state, 2)
    assert_close(weights_of(net), ref2)
    assert loss2 == pytest.approx(ref_loss2, rel=1e-5)
    assert_close(weights_of(state[MOON_PREVIOUS]), ref2)
    # the contrastive term mattered: plain CE from x1 lands elsewhere, with another loss
    plain, plain_loss = reference_round(net, x1, ref1, 2, 0.0, tau)
    assert max((plain[k] - ref2[k]).abs().max().item() for k in ref2) > 1e-3
    assert abs(plain_loss - ref_loss2) > 1e-2


def test_frozen_models_match_the_model_and_take_no_gradient() -> None:
    net, client, state = model(), hooks(), RecordDict()
    x0 = weights_of(net)
    fedsim_round(net, client, x0, state, 1)
    previous = weights_of(net)
    x1 = {k: v + 0.1 for k, v in x0.items()}
    ref, _ = reference_round(net, x1, previous, 2, 5.0, 0.5)
    fedsim_round(net, client, x1, state, 2)
    assert_close(weights_of(net), ref)
    global_model, previous_model = client.frozen  # type: ignore[attr-defined]
    for f, expected in ((global_model, x1), (previous_model, previous)):
        assert not f.training
        assert_close(weights_of(f), expected)  # training moved the client's model only
        for p in f.parameters():
            assert (p.dtype, p.device) == (next(net.parameters()).dtype, next(net.parameters()).device)
            assert not p.requires_grad and p.grad is None


def test_mu_zero_is_fedavg_bit_for_bit() -> None:
    spec = STRATEGIES.get("fedavg")
    runs = []
    moon = hooks(mu=0.0)
    for client in (moon, spec(spec.Params()).client()):
        net, state = model(), RecordDict()
        x = weights_of(net)
        losses = [fedsim_round(net, client, x, state, r) for r in (1, 2, 3)]
        runs.append((losses, weights_of(net), state))
    (moon_losses, moon_weights, moon_state), (avg_losses, avg_weights, _) = runs
    assert len(moon_state) == 0 and moon.frozen is None  # no term: no models kept, no state held
    assert moon_losses == avg_losses
    assert all(torch.equal(moon_weights[k], avg_weights[k]) for k in avg_weights)


def test_mu_zero_runs_as_fedavg_end_to_end(tmp_path: Path) -> None:
    lines = {}
    for name, strategy in (("fedavg", {"name": "fedavg"}), ("moon", {"name": "moon", "mu": 0})):
        (tmp_path / name).mkdir()
        cfg = small_config(tmp_path / name, name=name, strategy=strategy, train={"rounds": 2})
        assert main(["run", str(write_config(tmp_path / name, cfg))]) == 0
        (metrics,) = (tmp_path / name / "runs").glob("*/metrics.jsonl")
        lines[name] = [
            {k: v for k, v in json.loads(line).items() if k in ("round", "train_loss", "client_acc", "global_acc")}
            for line in metrics.read_text().splitlines()
        ]
    assert lines["moon"] == lines["fedavg"] and lines["fedavg"]


@pytest.mark.parametrize(
    ("option", "expect"),
    [
        ("mu: -1", ("strategy.mu = -1", "greater than or equal to 0")),
        ("temperature: 0", ("strategy.temperature = 0", "greater than 0")),
        ("temperature: -0.5", ("strategy.temperature = -0.5", "greater than 0")),
        ("tau: 0.5", ("strategy.tau",)),
    ],
)
def test_bad_options_are_refused_in_one_line_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, expect: tuple[str, ...]
) -> None:
    cfg_path = write_config(tmp_path, small_config(tmp_path))
    code = main(["run", str(cfg_path), "--set", f"strategy={{name: moon, {option}}}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fedsim: error: "), lines
    assert all(fragment in lines[0] for fragment in expect), lines[0]
    assert not (tmp_path / "runs").exists()
