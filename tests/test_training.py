"""The one local training loop (fedsim/client/training.py), against plain torch written here: K steps or whole epochs of
SGD on cross-entropy plus the hooks' changes, the loss it reports, its momentum cleared each round. Several clients
trained together (vmap): tests/test_vectorized.py."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, train_local
from fedsim.data.batches import BatchStream
from fedsim.strategies.hooks import ClientHooks, RoundInfo
from tests.tiny_model import TinyLinear

pytestmark = pytest.mark.usefixtures("seeded")
X = torch.randn(12, 1, 1, 2, generator=torch.Generator().manual_seed(1))
Y = torch.tensor([0, 1, 2] * 4)


def round_info(steps: int | None = None, epochs: int | None = None, momentum: float = 0.0) -> RoundInfo:
    return RoundInfo(1, 0, steps, epochs, 0.1, momentum, torch.tensor([4, 4, 4]))


def stream(batch_size: int = 4, seed: int = 0) -> BatchStream:
    return BatchStream(X, Y, batch_size, torch.Generator().manual_seed(seed))


def by_hand(model: TinyLinear, batches: list, lr: float, momentum: float = 0.0) -> list[float]:
    """Plain SGD (torch.optim.SGD) on cross-entropy over ``batches``: the losses before each step."""
    sgd = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for x, y in batches:
        logits = model.classifier(model.forward_features(x))
        loss = F.cross_entropy(logits, y)
        sgd.zero_grad()
        loss.backward()
        sgd.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(("steps", "epochs", "expected_steps"), [(5, None, 5), (None, 2, 6)])
def test_k_steps_or_whole_epochs_of_sgd_as_torch_takes_them(
    steps: int | None, epochs: int | None, expected_steps: int
) -> None:
    model = TinyLinear(3, bias=True)
    reference = copy.deepcopy(model)
    info = round_info(steps, epochs, momentum=0.9)
    work = ClientRound(model, ClientHooks(None), stream(), info)
    (result,) = train_local([work], LocalSgd(model.parameters(), 0.1, 0.9))
    losses = by_hand(reference, list(stream().batches(expected_steps)), 0.1, 0.9)  # 12 samples / 4 = 3 a pass
    assert (result.steps, result.num_examples) == (expected_steps, expected_steps * 4)
    assert result.mean_loss == pytest.approx(float(np.mean(losses)), rel=1e-6)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)
    torch.testing.assert_close(model.running, reference.running)  # the buffer moved in train mode, as by hand


class Weighed(ClientHooks):
    """Logits halved, 0.3·‖W‖² added, the bias's gradient dropped."""

    def adjust_logits(self, logits: torch.Tensor, info: RoundInfo) -> torch.Tensor:
        return logits / 2

    def extra_loss(self, model, x, features, logits, y):  # type: ignore[no-untyped-def]
        return 0.3 * model.classifier.weight.pow(2).sum()

    def correct_gradients(self, model) -> None:  # type: ignore[no-untyped-def]
        model.classifier.bias.grad = None


def test_the_hooks_change_the_logits_the_loss_and_the_gradients() -> None:
    model = TinyLinear(3, bias=True)
    reference = copy.deepcopy(model)
    work = ClientRound(model, Weighed(None), stream(), round_info(3))
    (result,) = train_local([work], LocalSgd(model.parameters(), 0.1))
    losses = []
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in stream().batches(3):
        logits = reference.classifier(reference.forward_features(x)) / 2
        loss = F.cross_entropy(logits, y) + 0.3 * reference.classifier.weight.pow(2).sum()
        sgd.zero_grad()
        loss.backward()
        reference.classifier.bias.grad = None
        sgd.step()
        losses.append(loss.item())
    assert result.mean_loss == pytest.approx(float(np.mean(losses)), rel=1e-6)
    torch.testing.assert_close(model.classifier.weight, reference.classifier.weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(model.classifier.bias, reference.classifier.bias)  # never stepped: as it was


class Pushed(ClientHooks):
    """A correction far larger than the cross-entropy's gradient (FedDyn's −g_k + α(θ − θ^{t−1}) can be)."""

    def correct_gradients(self, model) -> None:  # type: ignore[no-untyped-def]
        model.classifier.weight.grad.add_(50.0)


def test_max_grad_norm_bounds_each_step_corrections_included_and_leaves_smaller_gradients_alone() -> None:
    """Plain SGD with a clipped gradient moves the weights by lr·c exactly, along the unclipped gradient;
    a bound above the gradient's norm changes nothing (bit for bit)."""
    clipped, free, loose = TinyLinear(3, bias=True), TinyLinear(3, bias=True), TinyLinear(3, bias=True)
    free.load_state_dict(clipped.state_dict())
    loose.load_state_dict(clipped.state_dict())
    flat = lambda model: torch.cat([p.detach().clone().ravel() for p in model.parameters()])  # noqa: E731
    before = flat(clipped)
    for model, bound in ((clipped, 0.2), (free, None), (loose, 1e6)):
        info = replace(round_info(1), max_grad_norm=bound)
        train_local([ClientRound(model, Pushed(None), stream(), info)], LocalSgd(model.parameters(), 0.1))
    step_clipped, step_free = flat(clipped) - before, flat(free) - before
    # clip_grad_norm_ scales by c / (‖g‖ + 1e-6): with ‖g‖ ≈ 50·√(2·3) the 1e-6 is 3e-9 relative
    assert step_clipped.norm().item() == pytest.approx(0.1 * 0.2, rel=1e-5)
    torch.testing.assert_close(step_clipped / step_clipped.norm(), step_free / step_free.norm(), rtol=1e-5, atol=1e-6)
    assert step_free.norm().item() > 10  # the bound did bind: the free step was 0.1 · ~120
    for p, q in zip(loose.parameters(), free.parameters(), strict=True):
        assert torch.equal(p, q)


def test_momentum_is_cleared_between_rounds() -> None:
    model = TinyLinear(3, bias=False)
    sgd = LocalSgd(model.parameters(), 0.1, momentum=0.9)
    info = round_info(2, momentum=0.9)
    train_local([ClientRound(model, ClientHooks(None), stream(seed=3), info)], sgd)
    after_one = copy.deepcopy(model)
    train_local([ClientRound(model, ClientHooks(None), stream(seed=4), info)], sgd)  # the same optimiser again
    by_hand(after_one, list(stream(seed=4).batches(2)), 0.1, 0.9)  # a fresh torch SGD: no momentum carried over
    torch.testing.assert_close(model.classifier.weight, after_one.classifier.weight, rtol=1e-6, atol=1e-7)


def test_after_step_sees_each_step_and_training_goes_on_in_train_mode() -> None:
    model = TinyLinear(3, bias=True)
    seen: list[tuple[int, bool, float]] = []

    def after_step(steps: int, losses: torch.Tensor) -> None:
        seen.append((steps, model.training, losses.item()))
        model.eval()  # fedsim local scores the model here

    work = ClientRound(model, ClientHooks(None), stream(), round_info(4))
    (result,) = train_local([work], LocalSgd(model.parameters(), 0.1), after_step=after_step)
    assert [(s, training) for s, training, _ in seen] == [(1, True), (2, True), (3, True), (4, True)]
    assert result.mean_loss == pytest.approx(float(np.mean([loss for *_, loss in seen])), rel=1e-6)


def test_a_client_without_data_takes_no_step_and_reports_zero() -> None:
    model = TinyLinear(3, bias=True)
    before = copy.deepcopy(model.state_dict())
    empty = BatchStream(X[:0], Y[:0], 4, torch.Generator().manual_seed(0))
    work = ClientRound(model, ClientHooks(None), empty, round_info(5))
    (result,) = train_local([work], LocalSgd(model.parameters(), 0.1))
    assert (result.steps, result.num_examples, result.mean_loss) == (0, 0, 0.0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
