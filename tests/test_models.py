"""Models x normalisers: placement of the sites, parameter counts, the registry and its errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedsim.errors import ConfigError
from fedsim.models import FedsimModel, create_model, list_models
from fedsim.models.size import counted
from fedsim.norms import NORM_SITE_ATTR, create_norm, is_norm_module, list_norms, norm_modules
from fedsim.norms.basic import FeatureNorm

CIFAR, MNIST = (3, 32, 32), (1, 28, 28)
BUILTIN_NORMS = ["none", "ln", "fn", "gn", "bn"]
BUILTIN_MODELS = ["cnn", "mlp", "resnet18"]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny batches gain nothing from intra-op threads, and on a shared CPU their spinning
    # made this module 3-4x slower (45 s vs 11 s measured).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(model: str, norm: str, in_shape=CIFAR, norm_options=None, **args) -> FedsimModel:
    return create_model(model, 10, in_shape, create_norm(norm, norm_options), args)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_builtins_registered() -> None:
    assert set(BUILTIN_NORMS) <= set(list_norms())
    assert set(BUILTIN_MODELS) <= set(list_models())


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


@pytest.mark.parametrize("model_name", BUILTIN_MODELS)
def test_fn_feature_has_norm_sqrt_d(model_name: str) -> None:
    model = build(model_name, "fn")
    z = model.forward_features(torch.randn(5, *CIFAR))
    assert z.shape == (5, model.feature_dim)
    expected = torch.full((5,), math.sqrt(model.feature_dim))
    torch.testing.assert_close(z.norm(dim=1), expected)


def test_fn_gradient_finite_at_zero() -> None:
    x = torch.zeros(3, 8, requires_grad=True)
    FeatureNorm(1e-5)(x).sum().backward()
    assert torch.isfinite(x.grad).all()


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


@pytest.mark.parametrize(("position", "sees_negatives"), [("after", False), ("before", True)])
def test_norm_position(position: str, sees_negatives: bool) -> None:
    model = build("cnn", "ln", norm_position=position)
    seen: list[torch.Tensor] = []
    model.norm1.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    model(torch.randn(4, *CIFAR))
    assert bool((seen[0] < 0).any()) is sees_negatives  # after ReLU the norm sees no negatives


@pytest.mark.parametrize("model_name", ["cnn", "resnet18"])
def test_the_projection_head_sits_between_the_features_and_the_classifier(model_name: str) -> None:
    # MOON Sec. 3.2: base encoder -> projection head (d -> d -> ReLU ... -> width) -> output layer on the head
    plain, projected = build(model_name, "ln"), build(model_name, "ln", projection=32)
    d = plain.feature_dim
    assert plain.projector is None and projected.feature_dim == d
    l1, act, l2 = projected.projector  # type: ignore[misc]
    assert (l1.in_features, l1.out_features, l2.in_features, l2.out_features) == (d, d, d, 32)
    assert isinstance(act, nn.ReLU) and projected.classifier.in_features == 32  # type: ignore[union-attr]
    assert n_params(projected) - n_params(plain) == d * d + d * 32 + 32 * 10 - d * 10  # no biases by default
    x = torch.randn(3, *CIFAR)
    h = projected.forward_features(x)
    assert h.shape == (3, d)
    torch.testing.assert_close(projected(x), projected.classifier(l2(F.relu(l1(h)))))


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


def test_mlp_param_count() -> None:
    assert n_params(build("mlp", "none")) == 3072 * 200 + 200 * 200 + 200 * 10
    assert n_params(build("mlp", "ln", in_shape=MNIST, hidden=[50])) == 784 * 50 + 2 * 50 + 50 * 10


@pytest.mark.parametrize("model_name", BUILTIN_MODELS)
def test_the_size_check_counts_on_the_meta_device_what_the_model_allocates(model_name: str) -> None:
    """fedsim.models.size counts a model without its storage: the same elements and bytes, parameters and
    buffers (BN's running statistics) alike, as the model built for real, for every built-in normaliser."""
    for norm in list_norms():
        real = build(model_name, norm)
        tensors = [*real.parameters(), *real.buffers()]
        expected = (sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors))
        assert counted(lambda norm=norm: build(model_name, norm)) == expected, norm


# --- every pair trains -----------------------------------------------------------------------


@pytest.mark.parametrize("in_shape", [CIFAR, MNIST], ids=["cifar", "mnist"])
@pytest.mark.parametrize("norm", BUILTIN_NORMS)
@pytest.mark.parametrize("model_name", BUILTIN_MODELS)
def test_forward_backward_finite(model_name: str, norm: str, in_shape: tuple[int, int, int]) -> None:
    model = build(model_name, norm, in_shape=in_shape)
    logits = model(torch.randn(4, *in_shape))
    assert logits.shape == (4, 10)
    F.cross_entropy(logits, torch.arange(4)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


# --- statistics and FedBN's question ---------------------------------------------------------


def test_bn_running_stats_buffers_update() -> None:
    model = build("cnn", "bn")
    buffers = dict(model.named_buffers())
    for site in ("norm1", "norm2", "fc_norms.0", "fc_norms.1"):
        assert {f"{site}.running_mean", f"{site}.running_var", f"{site}.num_batches_tracked"} <= set(buffers)
    before = model.norm1.running_mean.clone()
    model(torch.randn(8, *CIFAR))
    assert not torch.equal(before, model.norm1.running_mean)


def test_is_norm_module_finds_exactly_the_bn_modules() -> None:
    model = build("cnn", "bn")
    found = {name for name, _ in norm_modules(model)}
    bns = {name for name, m in model.named_modules() if isinstance(m, _BatchNorm)}
    assert found == bns == {"norm1", "norm2", "fc_norms.0", "fc_norms.1"}
    assert not any(is_norm_module(m) for m in build("cnn", "none").modules())
    resnet_bn = build("resnet18", "bn")
    assert sum(map(is_norm_module, resnet_bn.modules())) == 17  # stem + 2 per block x 8


# --- registry and config errors --------------------------------------------------------------


def test_unknown_norm_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"^model\.norm\.name: .*'layernorm'") as err:
        create_norm("layernorm")
    for name in BUILTIN_NORMS:
        assert name in str(err.value)
    with pytest.raises(ConfigError, match=r"^model\.name: .*'vgg'.*resnet18"):
        create_model("vgg", 10, CIFAR, create_norm("none"))


@pytest.mark.parametrize(
    ("norm", "args", "field"),
    [
        ("gn", {"group": 2}, "model.norm.group"),
        ("gn", {"groups": 0}, "model.norm.groups"),
        ("ln", {"eps": -1.0}, "model.norm.eps"),
        ("bn", {"momentum": 2.0}, "model.norm.momentum"),
    ],
)
def test_bad_norm_options(norm: str, args: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"{field}\b.*'{norm}'"):
        create_norm(norm, args)


def test_unknown_norm_arg_lists_valid_keys() -> None:
    with pytest.raises(ConfigError, match=r"^model\.norm\.group\b.*'gn'.*groups, eps"):
        create_norm("gn", {"group": 2})


def test_gn_groups_must_divide_features() -> None:
    with pytest.raises(ConfigError, match="model.norm.groups"):
        build("cnn", "gn", norm_options={"groups": 3})


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"hiden": [10]}, "model.hiden"),
        ({"hidden": [0]}, "model.hidden.0"),
        ({"activation": "swish"}, "model.activation"),
    ],
)
def test_bad_model_options(args: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"{field}\b.*'cnn'"):
        build("cnn", "none", **args)


def test_cnn_rejects_tiny_inputs() -> None:
    with pytest.raises(ConfigError, match=r"'cnn'.*16x16.*\(3, 8, 8\)"):
        build("cnn", "none", in_shape=(3, 8, 8))


# --- a user's own normaliser -----------------------------------------------------------------

PLUGIN = "tests.plugins.my_norms:ScaledTanh"


def test_user_normaliser_from_dotted_path() -> None:
    norm = create_norm(PLUGIN, {"scale": 2.0})
    model = create_model("cnn", 10, CIFAR, norm)
    marked = dict(norm_modules(model))
    assert set(marked) == {"norm1", "norm2", "fc_norms.0", "fc_norms.1"}  # marked without its help
    assert getattr(marked["norm1"], NORM_SITE_ATTR) == "conv"
    z = model.forward_features(torch.randn(4, *CIFAR))
    assert z.abs().max() <= 2.0 and z.min() >= 0.0  # 2 tanh(relu(.)) lies in [0, 2)
    with pytest.raises(ConfigError, match=r"model.norm.scal\b.*my_norms:ScaledTanh"):
        create_norm(PLUGIN, {"scal": 2.0})


def test_dotted_path_must_name_a_normaliser() -> None:
    with pytest.raises(ConfigError, match=r"^model\.norm\.name: .*'torch\.nn:LayerNorm'.*fedsim\.norms\.Normaliser"):
        create_norm("torch.nn:LayerNorm")
