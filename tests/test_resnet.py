"""ResNet-18 (fedsim/models/resnet.py): its parameter counts, and ``norm_sites: inner`` (LN-FL Table 13)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.errors import ConfigError
from fedsim.norms import norm_modules
from fedsim.norms.basic import FeatureNorm
from tests.model_support import build, n_params

pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


def test_resnet18_param_count() -> None:
    def conv(c_in: int, c_out: int, k: int) -> int:
        return c_in * c_out * k * k

    total, c_in = conv(3, 64, 3), 64
    for width in (64, 128, 256, 512):
        for _ in range(2):
            total += conv(c_in, width, 3) + conv(width, width, 3)
            total += conv(c_in, width, 1) if c_in != width else 0
            c_in = width
    total += 512 * 10
    # Cross-check: the common CIFAR ResNet-18 (BN, fc bias) has 11,173,962 parameters; it has
    # 9,600 BN parameters (2 x 4,800 channels at 17 + 3 shortcut sites) and a 10-entry fc bias.
    assert total == 11_173_962 - 9_600 - 10
    assert n_params(build("resnet18", "none")) == total
    assert n_params(build("resnet18", "bn")) == total + 2 * (64 + 4 * (64 + 128 + 256 + 512))


def test_resnet18_inner_sites_normalise_only_inside_each_block() -> None:
    """LN-FL Table 13: block(x) = ρ(x + A₂ n ρ A₁ x), n at the inner site only, FN on the feature."""
    model = build("resnet18", "fn", norm_options={"inside": "ln"}, norm_sites="inner")
    found = dict(norm_modules(model))
    assert list(found) == [f"blocks.{i}.norm1" for i in range(8)] + ["feature_norm"]
    assert all(isinstance(found[f"blocks.{i}.norm1"], nn.GroupNorm) for i in range(8))
    assert isinstance(found["feature_norm"], FeatureNorm)
    assert all(isinstance(m, nn.Identity) for m in (model.norm1, *(b.norm2 for b in model.blocks)))
    # one block by hand: ρ(x + A₂ n(ρ(A₁ x))), identity shortcut
    block, x = model.blocks[0], torch.randn(2, 64, 8, 8)
    by_hand = F.relu(x + block.conv2(F.group_norm(F.relu(block.conv1(x)), 1, block.norm1.weight, block.norm1.bias)))
    torch.testing.assert_close(block(x), by_hand)
    # LN adds 2 x 64 + ... affine parameters at the 8 inner sites only: half the per-block count of `ln`
    inner = 2 * (2 * 64 + 2 * 128 + 2 * 256 + 2 * 512)
    assert n_params(model) == n_params(build("resnet18", "none")) + inner
    scale = dict(norm_modules(build("resnet18", "fn", norm_options={"inside": "scale"}, norm_sites="inner")))
    assert len(scale) == 9 and all(isinstance(m, FeatureNorm) for m in scale.values())  # "FedFN - n inside"


def test_norm_sites_is_a_resnet_option() -> None:
    assert len(dict(norm_modules(build("resnet18", "ln")))) == 17  # norm_sites: all, the default
    with pytest.raises(ConfigError, match=r"model\.norm_sites\b.*'outer'.*'resnet18'"):
        build("resnet18", "ln", norm_sites="outer")
    with pytest.raises(ConfigError, match=r"model\.norm_sites\b.*'cnn'"):
        build("cnn", "ln", norm_sites="inner")
