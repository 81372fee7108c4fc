"""The normaliser contract's noise seeding (fedsim.norms.base): any module with ``reseed(seed)`` is seeded, whatever
normaliser made it."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedsim.norms import draws_own_noise, seed_norm_noise


class _Jitter(nn.Module):
    """A plugin's noisy module: adds noise from a stream of its own (a ``fedsim.norms.NoiseSource``)."""

    def __init__(self) -> None:
        super().__init__()
        self.seed: int | None = None

    def reseed(self, seed: int) -> None:
        self.seed = seed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed or 0)
        return x + torch.randn(x.shape, generator=gen)


def test_every_noise_source_gets_its_own_stream_from_the_seed_and_its_index() -> None:
    model = nn.Sequential(nn.Linear(4, 4), _Jitter(), nn.ReLU(), nn.Sequential(_Jitter()))
    sources = [m for m in model.modules() if draws_own_noise(m)]
    assert [type(m) for m in sources] == [_Jitter, _Jitter]
    assert seed_norm_noise(model, 7) == 2
    expected = [int(np.random.SeedSequence([7, k]).generate_state(1)[0]) for k in range(2)]
    assert [m.seed for m in sources] == expected
    seed_norm_noise(model, 8)
    assert [m.seed for m in sources] != expected


def test_a_model_without_noise_sources_is_left_as_it_is() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not any(draws_own_noise(m) for m in model.modules())
    assert seed_norm_noise(model, 3) == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
