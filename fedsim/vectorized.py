"""Several clients' local steps at once: ``torch.func.vmap`` over their stacked parameters.

The paper's rounds are 10 clients x 10 steps of a small CNN at batch 32: on a GPU each step is a
few dozen small kernels, launched one client after another. With
``simulation.vmap_clients: N`` a worker trains up to N of a round's clients together: every step
stacks each client's own parameters (so gradients flow back to each client's own model) and runs
one vmapped forward over the stacked batches. Everything else stays per client and unchanged: the
batches (each client's own seeded stream), the strategy's hooks on each client's own model, the
SGD update. A model qualifies when its forward is a pure function of parameters and input: no
running statistics to update (BN, ln_goldschmidt) and no per-client noise stream (ln_randomized).
The forward runs through the first client's module, so forward hooks a strategy registers on its
clients' models do not run per client: a strategy that needs them keeps ``vmap_clients: 1``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedsim.models import FedsimModel


class _FeaturesAndLogits(nn.Module):
    """``model``'s features and logits from one call, for ``functional_call``."""

    def __init__(self, model: FedsimModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.model.forward_features(x)
        return features, self.model.forward_head(features)


class StackedForward:
    """The :data:`fedsim.training.Forward` of lanes whose models share one architecture."""

    def __init__(self, models: Sequence[FedsimModel]) -> None:
        self.template = _FeaturesAndLogits(models[0])
        names = [name for name, _ in models[0].named_parameters()]
        self.parameters = {f"model.{n}": [dict(m.named_parameters())[n] for m in models] for n in names}
        self._vmapped = torch.func.vmap(self._one, in_dims=(0, 0))

    def _one(self, parameters: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.func.functional_call(self.template, parameters, (x,))

    def __call__(self, xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        # stacked anew each step: torch.stack is differentiable, so each lane's gradient lands in its
        # own model's parameters, where the hooks (SCAFFOLD, FedProx) and the optimizer expect it
        stacked = {name: torch.stack(per_lane) for name, per_lane in self.parameters.items()}
        return self._vmapped(stacked, torch.stack(xs))


def why_not_vectorized(model: nn.Module) -> str | None:
    """Why ``model`` cannot train several clients in one vmapped forward, or None when it can."""
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        shown = ", ".join(buffers[:3]) + (", ..." if len(buffers) > 3 else "")
        return f"it keeps running statistics ({shown}), which one vmapped forward cannot update per client"
    if any(callable(getattr(m, "reseed", None)) for m in model.modules()):
        return "it draws noise from a per-client stream (reseed()), which a vmapped forward would share"
    return None
