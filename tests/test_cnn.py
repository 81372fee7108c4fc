"""The LN-FL CNN (fedsim/models/cnn.py): where its normalisation sites sit and what they compute, its parameter
counts, its BN statistics, and the inputs it refuses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.errors import ConfigError
from fedsim.norms import norm_modules
from fedsim.norms.basic import FeatureNorm
from tests.model_support import CIFAR, MNIST, build, n_params

pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


# --- placement -------------------------------------------------------------------------------


def test_cnn_fn_has_one_norm_module_at_the_feature_site() -> None:
    model = build("cnn", "fn")
    found = list(norm_modules(model))
    assert [name for name, _ in found] == ["feature_norm"]
    assert isinstance(found[0][1], FeatureNorm)
    calls: list[str] = []
    for name in ("fcs", "feature_norm", "classifier"):
        getattr(model, name).register_forward_hook(lambda m, i, o, name=name: calls.append(name))
    model(torch.randn(4, *CIFAR))
    assert calls[-2:] == ["feature_norm", "classifier"]  # nothing between feature norm and classifier


def _manual_ln(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Per-sample mean / variance over every non-batch dim, then γ, β per channel (dim 1)."""
    dims = tuple(range(1, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, unbiased=False, keepdim=True)
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return (x - mean) / torch.sqrt(var + eps) * w.view(shape) + b.view(shape)


def test_cnn_ln_normalises_over_chw_after_the_activation() -> None:
    model = build("cnn", "ln")
    norms = [model.norm1, model.norm2, *model.fc_norms]
    for m in norms:  # non-trivial affine so γ, β placement is checked too
        nn.init.normal_(m.weight)
        nn.init.normal_(m.bias)
    assert isinstance(model.feature_norm, nn.Identity)
    x = torch.randn(4, *CIFAR)
    h = F.max_pool2d(_manual_ln(F.relu(model.conv1(x)), model.norm1.weight, model.norm1.bias), 2)
    h = F.max_pool2d(_manual_ln(F.relu(model.conv2(h)), model.norm2.weight, model.norm2.bias), 2)
    h = h.flatten(1)
    assert h.shape[1] == 1600
    for fc, n in zip(model.fcs, model.fc_norms, strict=True):
        h = _manual_ln(F.relu(fc(h)), n.weight, n.bias)
    torch.testing.assert_close(model.forward_features(x), h, atol=1e-4, rtol=1e-4)


def test_gn_and_bn_sites() -> None:
    gn = build("cnn", "gn")
    assert isinstance(gn.norm1, nn.GroupNorm) and gn.norm1.num_groups == 2
    assert isinstance(gn.fc_norms[0], nn.GroupNorm) and isinstance(gn.feature_norm, nn.Identity)
    bn = build("cnn", "bn")
    assert isinstance(bn.norm1, nn.BatchNorm2d) and isinstance(bn.fc_norms[1], nn.BatchNorm1d)
    assert isinstance(bn.feature_norm, nn.Identity)


# --- parameter counts ------------------------------------------------------------------------


def test_cnn_param_counts() -> None:
    none = 3 * 64 * 25 + 64 * 64 * 25 + 1600 * 384 + 384 * 192 + 192 * 10
    assert n_params(build("cnn", "none")) == none
    assert n_params(build("cnn", "ln")) == none + 2 * (64 + 64 + 384 + 192)
    assert n_params(build("cnn", "ln", norm_options={"affine": False})) == none
    assert n_params(build("cnn", "fn")) == none
    # Table 7's variant and MNIST: 28 -> 24 -> 12 -> 8 -> 4, flatten 64 * 16.
    assert n_params(build("cnn", "none", hidden=[384])) == 3 * 64 * 25 + 64 * 64 * 25 + 1600 * 384 + 384 * 10
    mnist = 1 * 64 * 25 + 64 * 64 * 25 + 1024 * 384 + 384 * 192 + 192 * 10
    assert n_params(build("cnn", "none", in_shape=MNIST)) == mnist
    with_bias = none + 64 + 64 + 384 + 192 + 10
    assert n_params(build("cnn", "none", bias=True)) == with_bias


# --- statistics ------------------------------------------------------------------------------


def test_bn_running_stats_buffers_update() -> None:
    model = build("cnn", "bn")
    buffers = dict(model.named_buffers())
    for site in ("norm1", "norm2", "fc_norms.0", "fc_norms.1"):
        assert {f"{site}.running_mean", f"{site}.running_var", f"{site}.num_batches_tracked"} <= set(buffers)
    before = model.norm1.running_mean.clone()
    model(torch.randn(8, *CIFAR))
    assert not torch.equal(before, model.norm1.running_mean)


# --- config errors ---------------------------------------------------------------------------


def test_cnn_rejects_tiny_inputs() -> None:
    with pytest.raises(ConfigError, match=r"'cnn'.*16x16.*\(3, 8, 8\)"):
        build("cnn", "none", in_shape=(3, 8, 8))
