"""FedRoD (Chen and Chao, ICLR 2022) against the paper's local training, written here from the paper.

The reference never calls fedsim's strategy: per batch, the balanced-softmax loss of the generic logits gives the
gradient of the model's parameters (θ, ψ), the cross-entropy of the generic plus personal logits, on the detached
features and generic logits, gives the personal head's (φ), and both take a plain SGD step, by autograd on a
deepcopy of the model and a tensor φ of its own. fedsim's client trains through the one training loop
(``train_local``) with its hooks, the head stepped through ``own_parameters``.
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
from fedsim.arrays import to_array_record
from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, train_local
from fedsim.config_file import parse_config
from fedsim.data.batches import BatchStream
from fedsim.engines.runner import run
from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm
from fedsim.strategies import STRATEGIES, ClientHooks, RoundInfo
from fedsim.strategies.fedrod import FEDROD_HEAD
from tests.conftest import small_config
from tests.test_moon import weights_of

LR, STEPS, BATCH, CLASSES, SHAPE = 0.1, 3, 8, 4, (1, 4, 4)
COUNTS = torch.tensor([9.0, 6.0, 5.0, 0.0])  # the client's training samples per class: class 3 absent


def model(bias: bool = False) -> FedsimModel:
    torch.manual_seed(0)
    return create_model("mlp", CLASSES, SHAPE, create_norm("ln"), {"hidden": [6, 5], "bias": bias})


def stream(seed: int) -> BatchStream:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (20, *SHAPE), dtype=torch.uint8, generator=g)
    y = torch.repeat_interleave(torch.arange(3), COUNTS[:3].long())  # the labels COUNTS counts
    return BatchStream(x, y[torch.randperm(20, generator=g)], BATCH, torch.Generator().manual_seed(seed))


def hooks(**options: float) -> ClientHooks:
    spec = STRATEGIES.get("fedrod")
    return spec(spec.Params(**options)).client()


def fedsim_round(
    net: FedsimModel, client: ClientHooks, weights: dict[str, torch.Tensor], state: RecordDict, seed: int
) -> tuple[float, RecordDict]:
    """One round of fedsim's client from the global ``weights``: its hooks around ``train_local``, the SGD over the
    model's parameters and the hooks' own, as a worker builds it."""
    info = RoundInfo(seed, 0, STEPS, None, LR, 0.0, COUNTS)
    client.load_global(net, to_array_record(weights), state)
    client.begin_round(net, RecordDict({wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: seed})}), state, info)
    work = ClientRound(net, client, stream(seed), info)
    sgd = LocalSgd([*net.parameters(), *client.own_parameters(net)], lr=LR)
    (result,) = train_local([work], sgd)
    client.end_round(net, state, info, result.steps)
    return result.mean_loss, RecordDict({wire.ARRAYS: client.reply_arrays(net, state)})


def generic_logits(w: FedsimModel, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The representation z (the classifier's input) and the generic head's logits g = h_G(z; ψ)."""
    z = w.forward_features(x)
    return z, w.classifier(z)


def reference_round(
    net: FedsimModel, weights: dict[str, torch.Tensor], head: dict[str, torch.Tensor], seed: int, gamma: float
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float]:
    """The paper's local training of the linear variant: per mini-batch, (θ, ψ) -= η·∇L^BSM and φ -= η·∇_φ L, with
    L^BSM = −log(n_y^γ e^{g_y} / Σ_c n_c^γ e^{g_c}) and L = CE(g + φ·z, y) on z and g held fixed."""
    w = copy.deepcopy(net)
    w.load_state_dict(weights)
    w.train()
    phi = {k: v.clone().requires_grad_(True) for k, v in head.items()}
    theta = list(w.parameters())
    losses = []
    for x, y in stream(seed).batches(STEPS):
        z, g = generic_logits(w, x)
        weighted = COUNTS.pow(gamma).unsqueeze(0) * torch.exp(g)  # n_c^γ·e^{g_c}; 0 for the absent class
        balanced = -torch.log(weighted.gather(1, y[:, None]).squeeze(1) / weighted.sum(1)).mean()
        personal_logits = g.detach() + z.detach() @ phi["weight"].T + phi.get("bias", 0.0)
        personal = F.cross_entropy(personal_logits, y)
        grads = torch.autograd.grad(balanced, theta)
        phi_grads = torch.autograd.grad(personal, list(phi.values()))
        with torch.no_grad():
            for p, d in zip(theta, grads, strict=True):
                p -= LR * d
            for p, d in zip(phi.values(), phi_grads, strict=True):
                p -= LR * d
        losses.append(balanced.item() + personal.item())
    trained = {k: v.detach().clone() for k, v in w.state_dict().items()}
    return trained, {k: v.detach().clone() for k, v in phi.items()}, sum(losses) / len(losses)


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        # float32 rounding: the reference's exp/log form against fedsim's log-sum-exp differ by ~1e-7 relative per
        # step, ~1e-6 after three steps moving the weights by ~0.1; a wrong prior, a gradient leaking through the
        # detached z or g, or a head not stepped is off by > 1e-3
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=2e-5, msg=k)


@pytest.mark.parametrize("bias", [False, True])  # LN-FL's bias-free models, and a personal head with b_P
@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_two_rounds_match_the_papers_losses_with_the_personal_head_from_state(bias: bool, gamma: float) -> None:
    net, client, state = model(bias), hooks(gamma=gamma), RecordDict()
    x0 = weights_of(net)
    zero = {"weight": torch.zeros(CLASSES, 5), **({"bias": torch.zeros(CLASSES)} if bias else {})}
    # round 1: φ starts at zero; trained beside the model, then kept in state and never sent
    ref1, head1, ref_loss1 = reference_round(net, x0, zero, 1, gamma)
    loss1, reply = fedsim_round(net, client, x0, state, 1)
    assert_close(weights_of(reply[wire.ARRAYS]), ref1)  # the reply: the model's tensors only
    assert_close(weights_of(state[FEDROD_HEAD]), head1)
    assert loss1 == pytest.approx(ref_loss1, rel=1e-5)
    assert head1["weight"].abs().max() > 1e-2  # the head moved
    # round 2: a new global model (other clients moved it) and the client's own φ from state
    x1 = {k: v + 0.3 * torch.randn_like(v) for k, v in x0.items()}
    ref2, head2, ref_loss2 = reference_round(net, x1, head1, 2, gamma)
    loss2, reply = fedsim_round(net, client, x1, state, 2)
    assert_close(weights_of(reply[wire.ARRAYS]), ref2)
    assert_close(weights_of(state[FEDROD_HEAD]), head2)
    assert loss2 == pytest.approx(ref_loss2, rel=1e-5)


def test_the_balanced_softmax_mattered_and_gamma_zero_trains_the_generic_model_as_fedavg() -> None:
    spec = STRATEGIES.get("fedavg")
    runs = {}
    for name, client in (("rod", hooks()), ("rod0", hooks(gamma=0.0)), ("avg", spec(spec.Params()).client())):
        net, state = model(), RecordDict()
        x = weights_of(net)
        fedsim_round(net, client, x, state, 1)
        runs[name] = (weights_of(net), state)
    # γ = 0: plain cross-entropy on the generic logits, the personal head's loss reaching none of the model
    assert all(torch.equal(runs["rod0"][0][k], runs["avg"][0][k]) for k in runs["avg"][0])
    assert FEDROD_HEAD in runs["rod0"][1] and len(runs["avg"][1]) == 0
    assert max((runs["rod"][0][k] - runs["avg"][0][k]).abs().max().item() for k in runs["avg"][0]) > 1e-3


def test_the_personalised_model_adds_the_clients_head_to_the_generic_logits() -> None:
    net, client, state = model(), hooks(), RecordDict()
    x0 = weights_of(net)
    x = stream(5).x[:6].float()
    copy_ = copy.deepcopy(net)
    never_trained = client.personalize(copy_, RecordDict(), lambda m: None)
    assert torch.equal(never_trained(x), copy_(x))  # no head yet: φ = 0, the generic model
    fedsim_round(net, client, x0, state, 1)
    _, head, _ = reference_round(net, x0, {"weight": torch.zeros(CLASSES, 5)}, 1, 1.0)
    copy_.load_state_dict(x0)  # the round's global model, loaded into the worker's copy
    fine_tuned = []
    personal = client.personalize(copy_, state, fine_tuned.append)
    assert not fine_tuned  # FedRoD's own personalisation: no generic fine-tuning
    with torch.no_grad():
        z, g = generic_logits(copy_.eval(), x)
        torch.testing.assert_close(personal.eval()(x), g + z @ head["weight"].T, rtol=1e-5, atol=1e-5)
    assert set(weights_of(copy_)) == set(x0)  # the copy is left a plain model: it reloads next time


def test_personal_accuracy_scores_the_clients_heads_end_to_end(tmp_path: Path, one_thread: None) -> None:
    lines = {}
    for name, strategy in (("rod", {"name": "fedrod"}), ("avg", {"name": "fedavg"})):
        cfg = small_config(tmp_path / name, name=name, strategy=strategy, eval={"personal": {"steps": 0}})
        run_dir = Path(run(parse_config(cfg))["run_dir"])
        lines[name] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rod, avg = lines["rod"][-1], lines["avg"][-1]
    assert avg["personal_acc"] == avg["client_mean_acc"]  # FedAvg, no fine-tuning: the generic model
    # the clients' heads took part: every client (all sampled) scores g + p, not g
    assert rod["client_personal_acc"] != rod["client_acc"]
    assert rod["personal_acc"] > rod["client_mean_acc"]  # label skew: the personal head fits the client's classes
