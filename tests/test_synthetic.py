"""Synthetic(α, β) (fedsim.data.synthetic) against FedProx's definition, written here from the paper and the
authors' generator, not from fedsim's code."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.data import DATASETS
from fedsim.data.synthetic import Synthetic
from fedsim.errors import ConfigError, DataError


def loader(**options: object) -> Synthetic:
    made = DATASETS.resolve("synthetic", options, "data.dataset").create()
    assert isinstance(made, Synthetic)
    return made


def fedprox_client(k: int, alpha: float, beta: float, iid: bool, seed: int = 0, d: int = 60, c: int = 10):  # type: ignore[no-untyped-def]
    """Client k as FedProx's generate_synthetic draws it (n ~ int(lognormal(4, 2)) + 50; u, B ~ N(0, α), N(0, β);
    v ~ N(B, 1); W, b ~ N(u, 1); x ~ N(v, diag(j^-1.2)); y = argmax softmax(xW + b); 90% train), from the
    documented streams."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, k]))
    n = int(rng.lognormal(4, 2)) + 50
    u = rng.normal(0, alpha)
    big_b = rng.normal(0, beta)
    v = np.ones(d) * big_b if iid else rng.normal(big_b, 1, d)
    if iid:
        shared = np.random.default_rng(np.random.SeedSequence([seed, 2**32]))
        w, b = shared.normal(0, 1, (d, c)), shared.normal(0, 1, c)
    else:
        w, b = rng.normal(u, 1, (d, c)), rng.normal(u, 1, c)
    cov = np.array([(j + 1) ** -1.2 for j in range(d)])
    x = v + np.sqrt(cov) * rng.standard_normal((n, d))
    logits = x @ w + b
    soft = np.exp(logits - logits.max(1, keepdims=True))
    y = np.argmax(soft / soft.sum(1, keepdims=True), axis=1)
    cut = int(0.9 * n)
    return x[:cut].astype(np.float32), y[:cut], x[cut:].astype(np.float32), y[cut:]


@pytest.mark.parametrize(("alpha", "beta", "iid"), [(1.0, 1.0, False), (0.5, 0.5, False), (0.0, 0.0, False),
                                                   (1.0, 1.0, True)])  # fmt: skip
def test_each_client_is_fedprox_s_definition(alpha: float, beta: float, iid: bool) -> None:
    data = loader(alpha=alpha, beta=beta, iid=iid)
    for k in (0, 1, 7, 999_999):
        got = data.client(k)
        x_tr, y_tr, x_te, y_te = fedprox_client(k, alpha, beta, iid)
        np.testing.assert_array_equal(got.x_train.view(len(got.x_train), -1).numpy(), x_tr)
        np.testing.assert_array_equal(got.x_test.view(len(got.x_test), -1).numpy(), x_te)
        np.testing.assert_array_equal(got.y_train.numpy(), y_tr)
        np.testing.assert_array_equal(got.y_test.numpy(), y_te)
        assert got.x_train.dtype == torch.float32 and got.y_train.dtype == torch.int64
        assert got.x_train.shape[1:] == (1, 1, 60) == (1, 1, *data.in_shape[2:])
        assert len(got.y_train) + len(got.y_test) >= 50


def test_a_client_is_the_same_whatever_was_drawn_before_and_in_another_instance() -> None:
    a, b = loader(), loader()
    first = a.client(42).x_train
    for k in range(5):
        b.client(k)
    assert torch.equal(first, b.client(42).x_train) and torch.equal(first, a.client(42).x_train)
    assert not torch.equal(loader(seed=1).client(42).x_test, a.client(42).x_test)


def test_the_inputs_have_the_published_covariance() -> None:
    # one client's x about its own mean v_k: variance j^-1.2 per coordinate; the sample variance of n normals
    # has a standard error of var * sqrt(2 / (n - 1)): 6 of them is a bound no correct generator crosses
    data = loader(max_samples=None)
    k = next(k for k in range(1000) if len(data.client(k).y_train) > 5000)
    x = data.client(k).x_train.view(-1, 60).double().numpy()
    var, expected = x.var(0, ddof=1), np.arange(1, 61) ** -1.2
    assert np.all(np.abs(var - expected) < 6 * expected * np.sqrt(2 / (len(x) - 1)))


def test_every_option_but_alpha_changes_the_data() -> None:
    def labels(**options: object) -> torch.Tensor:
        return torch.cat([loader(**options).client(k).y_train for k in range(10)])

    base = loader().client(3)
    for options in ({"beta": 0.5}, {"seed": 1}, {"iid": True}):
        assert not torch.equal(loader(**options).client(3).x_train, base.x_train), options
    # alpha moves only u_k, the mean of every entry of W_k and b_k: it adds u_k (sum_j x_j + 1) to every class's
    # logit of a sample alike, which the argmax ignores. The same seed draws the same samples for any alpha (in
    # FedProx's definition alpha changes no distribution); only the fingerprint tells them apart
    assert torch.equal(loader(alpha=0.5).client(3).x_train, base.x_train)
    assert torch.equal(labels(alpha=0.0), labels()) and torch.equal(labels(alpha=10.0), labels())
    assert loader(alpha=0.5).fingerprint() != loader().fingerprint()
    # n_k is the stream's first draw: alpha, beta and iid change what follows it, never the client's size
    assert len(loader(alpha=0.5, iid=True).client(3).y_train) == len(base.y_train)


def test_sizes_follow_the_power_law_and_the_split_is_nine_tenths() -> None:
    # n_k = floor(L) + 50, L ~ LogNormal(4, 2): P(n_k <= m) = P(L < m - 49) = Phi((ln(m - 49) - 4) / 2);
    # over N clients the fraction at or below m has a binomial standard error sqrt(p (1 - p) / N): 6 of them
    data, count = loader(dim=1, num_classes=2), 1000  # n_k is the stream's first draw, whatever d and C
    sizes = []
    for k in range(count):
        got = data.client(k)
        n, n_train = len(got.y_train) + len(got.y_test), len(got.y_train)
        assert n >= 50 and n_train == int(0.9 * n) and len(got.x_train) == n_train
        sizes.append(n)
    for m in (60, 104, 1050):
        p = 0.5 * (1 + math.erf((math.log(m - 49) - 4) / 2 / math.sqrt(2)))
        assert abs(np.mean(np.array(sizes) <= m) - p) < 6 * math.sqrt(p * (1 - p) / count), m


def test_synthetic_iid_inputs_are_one_gaussian_and_its_labels_one_linear_model() -> None:
    # FedProx's Synthetic-IID (generate_iid.py: v_k = 0, one W and b) is iid with alpha = beta = 0: every
    # client's x_j ~ N(0, j^-1.2), so the pooled mean is within 6 standard errors sqrt(j^-1.2 / n) of 0 and the
    # mean square (the variance about the known mean 0) within 6 * j^-1.2 * sqrt(2 / n) of j^-1.2
    data = loader(iid=True, alpha=0.0, beta=0.0, max_samples=2000)
    x = torch.cat([data.client(k).x_train.view(-1, 60) for k in range(100)]).double().numpy()
    n, expected = len(x), np.arange(1, 61) ** -1.2
    assert np.all(np.abs(x.mean(0)) < 6 * np.sqrt(expected / n))
    assert np.all(np.abs((x**2).mean(0) - expected) < 6 * expected * np.sqrt(2 / n))
    # one model for every client: the shared W, b label client 5's samples and client 77's alike
    shared = np.random.default_rng(np.random.SeedSequence([0, 2**32]))
    w, b = shared.normal(0, 1, (60, 10)), shared.normal(0, 1, 10)
    for k in (5, 77):
        got = data.client(k)
        logits = got.x_train.view(-1, 60).double().numpy() @ w + b
        # from float32 inputs a near-tie may flip; the float64 inputs' labels differ on at most a handful
        assert np.mean(np.argmax(logits, 1) == got.y_train.numpy()) > 0.99


def test_max_samples_cuts_the_tail_and_the_fingerprint_follows_every_option() -> None:
    sizes = [len(loader(max_samples=60).client(k).y_train) + len(loader(max_samples=60).client(k).y_test)
             for k in range(20)]  # fmt: skip
    assert max(sizes) <= 60 and min(sizes) >= 50
    prints = {loader(**o).fingerprint() for o in ({}, {"alpha": 0.5}, {"beta": 0.5}, {"iid": True}, {"seed": 1},
                                                  {"dim": 10}, {"num_classes": 5}, {"max_samples": 100})}  # fmt: skip
    assert len(prints) == 8 and loader().fingerprint() == loader().fingerprint()


@pytest.mark.parametrize(
    ("options", "field"),
    [({"alpha": -1}, "alpha"), ({"dim": 0}, "dim"), ({"num_classes": 1}, "num_classes"), ({"spread": 2}, "spread")],
)
def test_bad_options_are_refused_naming_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"data\.dataset\.{field}\b"):
        loader(**options)


def test_it_is_never_loaded_whole() -> None:
    with pytest.raises(DataError, match="generated per client"):
        loader().load(None)  # type: ignore[arg-type]
