"""Models x normalisers across modules: the registry and its errors, every model with every normaliser, what
fedsim.norms finds in the models, a user's own normaliser. Each model's own tests: tests/test_cnn.py,
test_mlp.py, test_resnet.py; the base's (norm position, projection head): test_models_base.py; the size check:
test_model_size.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from fedsim.errors import ConfigError
from fedsim.models import create_model, list_models
from fedsim.norms import NORM_SITE_ATTR, create_norm, is_norm_module, list_norms, norm_modules
from fedsim.norms.basic import FeatureNorm
from tests.model_support import BUILTIN_MODELS, BUILTIN_NORMS, CIFAR, MNIST, build


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


def test_builtins_registered() -> None:
    assert set(BUILTIN_NORMS) <= set(list_norms())
    assert set(BUILTIN_MODELS) <= set(list_models())


# --- feature normalisation in every model ----------------------------------------------------


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
