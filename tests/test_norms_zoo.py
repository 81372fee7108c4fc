"""Every normaliser of the zoo alike: registered with its paper, finite on degenerate inputs, in every model, and
only its parameters and running statistics travel. Each one against its definition: tests/test_ln_variants.py,
tests/test_weierstrass.py, tests/test_affine_divergence.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm, list_norms
from fedsim.norms.ln_variants import (
    EpsNorm,
)
from fedsim.norms.weierstrass import WeierstrassNorm

CIFAR = (3, 32, 32)
ZOO = [
    "scale", "ln_reduced", "rms", "pln", "ln_weierstrass", "ln_goldschmidt", "ln_randomized",
    "ln_clamped", "l2", "affine_like", "patchnorm",
]
F64 = torch.float64


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()  # tiny batches: intra-op threads only spin on a shared CPU
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(model: str, norm: str, norm_options: dict | None = None, **args) -> FedsimModel:
    return create_model(model, 10, CIFAR, create_norm(norm, norm_options), args)


def test_zoo_registered_with_a_paper_summary() -> None:
    from fedsim.norms import get_norm

    assert set(ZOO) <= set(list_norms())
    for name in ZOO:
        summary = get_norm(name).__doc__.strip().splitlines()[0]
        assert any(key in summary for key in ("LN-FL", "PLN", "SMOOTH", "AFFDIV")), name


def _site_modules(name: str, args: dict) -> list[tuple[nn.Module, tuple[int, ...]]]:
    norm = create_norm(name, args)
    return [
        (norm.make("conv", 16), (2, 16, 4, 4)),
        (norm.make("linear", 16), (2, 16)),
        (norm.make("feature", 16), (2, 16)),
        (norm.linear(16, 8, True), (2, 16)),
        (norm.conv(16, 8, 3, 1, 1, True), (2, 16, 4, 4)),
    ]


DEGENERATE = [(name, {}) for name in ZOO] + [
    ("patchnorm", {"mode": "l2", "linear": True}),
    ("pln", {"group_size": 1, "center": False}),
    ("ln_goldschmidt", {"delta_range": None}),
    ("rms", {"affine": False}),
]


@pytest.mark.parametrize(("name", "args"), DEGENERATE)
def test_finite_at_zero_variance_and_zero_input(name: str, args: dict) -> None:
    for module, shape in _site_modules(name, args):
        for train in (True, False):
            module.train(train)
            for fill in (0.0, 1.5):  # all-zero, then constant (zero variance)
                x = torch.full(shape, fill, requires_grad=True)
                y = module(x)
                y.square().sum().backward()
                assert torch.isfinite(y).all(), (name, module, fill)
                grads = [x.grad, *(p.grad for p in module.parameters())]
                assert all(torch.isfinite(g).all() for g in grads), (name, module, fill)
    model = build("cnn", name, args)
    x = torch.zeros(2, *CIFAR, requires_grad=True)
    model(x).square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters()), name


@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("model_name", ["cnn", "resnet18", "mlp"])
def test_forward_backward_in_every_model(model_name: str, name: str) -> None:
    model = build(model_name, name)
    logits = model(torch.randn(2, *CIFAR))
    assert logits.shape == (2, 10) and logits.dtype == torch.float32
    F.cross_entropy(logits, torch.arange(2)).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", ZOO)
def test_only_parameters_and_running_statistics_travel(name: str) -> None:
    model = build("cnn", name)
    params = dict(model.named_parameters())
    assert all(key.endswith((".weight", ".bias")) for key in params)  # no σ, steps, eps, group_size
    travelling = set(model.state_dict()) - set(params)
    assert all(key.endswith(".running_var") for key in travelling), travelling
    assert bool(travelling) == (name == "ln_goldschmidt")
    for key in travelling:  # a genuine statistic: it moves with training
        before = model.state_dict()[key].clone()
        model(torch.randn(2, *CIFAR))
        assert not torch.equal(before, model.state_dict()[key])


@pytest.mark.parametrize("name", ["l2", "affine_like", "patchnorm"])
def test_layer_replacements_keep_the_plain_parameter_set(name: str) -> None:
    plain = build("resnet18", "none")
    replaced = build("resnet18", name)
    assert {k: v.shape for k, v in replaced.state_dict().items()} == {
        k: v.shape for k, v in plain.state_dict().items()
    }
    assert isinstance(replaced.classifier, nn.Linear)


def test_ln_variant_sites_follow_ln() -> None:
    for name in ("ln_weierstrass", "ln_goldschmidt", "ln_randomized", "ln_clamped"):
        model = build("cnn", name)
        assert isinstance(model.feature_norm, nn.Identity)
        assert isinstance(model.norm1, EpsNorm | WeierstrassNorm) and model.norm1.weight.shape == (64,)
