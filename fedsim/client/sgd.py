"""Clients' local SGD: torch's own SGD update (``torch.optim.sgd.sgd``, the function ``torch.optim.SGD.step``
calls), without the ``torch.optim.Optimizer`` around it.

The Optimizer class imports ``torch._dynamo`` the first time it is built and on every step (for graph
breaks under ``torch.compile``, which fedsim never uses): about a second of CPU at the start of every
process that trains, each ``fedsim run``, Ray worker and ClientApp process. The update is the same function
with the same arguments, so every number is bit-identical to ``torch.optim.SGD`` (tests/test_sgd.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.sgd import sgd


class LocalSgd:
    """SGD with momentum and weight decay over ``params``; its momentum is cleared by :meth:`reset`."""

    def __init__(
        self, params: Iterable[torch.nn.Parameter], lr: float, momentum: float = 0.0, weight_decay: float = 0.0
    ) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.momentum_buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def reset(self) -> None:
        """Forget the momentum (a new round, or another client)."""
        self.momentum_buffers = [None] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of the parameters that have a gradient, as ``torch.optim.SGD.step`` makes it."""
        with_grad = [i for i, p in enumerate(self.params) if p.grad is not None]
        buffers = [self.momentum_buffers[i] for i in with_grad]
        sgd(
            [self.params[i] for i in with_grad],
            [self.params[i].grad for i in with_grad],  # type: ignore[misc]
            buffers,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            lr=self.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
        for i, buffer in zip(with_grad, buffers, strict=True):  # sgd() creates a buffer on its first step
            self.momentum_buffers[i] = buffer
