"""CCVR (Luo et al., NeurIPS 2021) against its Algorithm 1, written here from the paper's steps.

The reference never calls fedsim's CCVR functions: each client's per-class statistics are ``torch.mean`` and
``torch.cov`` of its features; the pooled ones are the mean and covariance of every client's features of the class
together (what the paper's aggregation formula equals); the virtual features are drawn from N(μ_c, Σ_c) by the
recipe docs/algorithms.md states; the classifier is an ``nn.Linear`` retrained with ``torch.optim.SGD``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Context, Message
from torch import nn

from fedsim import wire
from fedsim.arrays import array_view, to_array_record
from fedsim.client.runtime import ClientRuntime
from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.errors import ConfigError, TrainingError
from fedsim.models import create_model
from fedsim.models.evaluation import class_feature_stats
from fedsim.norms import create_norm
from fedsim.strategies import ServerSetup
from fedsim.strategies.ccvr import VIRTUAL_STREAM, pool_class_stats
from tests import strategy_rows
from tests.conftest import small_config
from tests.strategy_harness import spec
from tests.test_resume import check_resume

CLASSES, WIDTH, SEED = 4, 5, 3


def client_features(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client k's features and labels: skewed, a class absent here, one sample of a class there."""
    g = torch.Generator().manual_seed(50 + k)
    labels = {0: [0] * 9 + [1] * 4 + [3], 1: [1] * 7 + [2] * 6, 2: [0] * 3 + [2], 3: []}[k]
    y = torch.tensor(labels, dtype=torch.long)
    x = torch.randn(len(y), WIDTH, generator=g, dtype=torch.float64) + y[:, None].double()
    return x, y


def stats_record(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """A client's feature-stats record, from torch.mean and torch.cov."""
    counts = torch.bincount(y, minlength=CLASSES)
    means = torch.zeros(CLASSES, WIDTH, dtype=torch.float64)
    covariances = torch.zeros(CLASSES, WIDTH, WIDTH, dtype=torch.float64)
    for c in range(CLASSES):
        if counts[c] > 0:
            means[c] = x[y == c].mean(0)
        if counts[c] > 1:
            covariances[c] = torch.cov(x[y == c].T)
    if not len(y):
        means, covariances = torch.zeros(CLASSES, 0, dtype=torch.float64), torch.zeros(CLASSES, 0, 0).double()
    return {wire.CLASS_COUNTS: counts, wire.CLASS_MEANS: means, wire.CLASS_COVARIANCES: covariances}


def test_pooled_statistics_are_those_of_every_clients_features_together() -> None:
    clients = [client_features(k) for k in range(4)]
    counts, means, covariances = pool_class_stats([to_array_record(stats_record(*c)) for c in clients])
    x = torch.cat([c[0] for c in clients])
    y = torch.cat([c[1] for c in clients])
    assert counts.tolist() == torch.bincount(y, minlength=CLASSES).tolist()
    for c in range(CLASSES):
        # float64 sums of a few dozen terms of order 1: a few ulps
        torch.testing.assert_close(means[c], x[y == c].mean(0), rtol=1e-12, atol=1e-12)
        expected = torch.cov(x[y == c].T) if counts[c] > 1 else torch.zeros(WIDTH, WIDTH, dtype=torch.float64)
        torch.testing.assert_close(covariances[c], expected, rtol=1e-10, atol=1e-12)


def test_a_clients_statistics_are_its_features_mean_and_covariance() -> None:
    torch.manual_seed(0)
    model = create_model("mlp", CLASSES, (1, 3, 3), create_norm("ln"), {"hidden": [6]})
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (70, 1, 3, 3), dtype=torch.uint8, generator=g)  # more than one forward chunk
    y = torch.tensor([0] * 40 + [2] * 29 + [3])

    def to_inputs(xb: torch.Tensor) -> torch.Tensor:
        return xb.float() / 255

    counts, means, covariances = class_feature_stats(model, x, y, CLASSES, to_inputs)
    model.eval()
    with torch.no_grad():
        z = model.project(model.forward_features(to_inputs(x))).double()
    assert counts.tolist() == [40, 0, 29, 1]
    assert means.dtype == covariances.dtype == torch.float64
    for c, n in enumerate(counts.tolist()):
        # float32 features summed in float64: the mean's error is the features' own rounding
        torch.testing.assert_close(means[c], z[y == c].mean(0) if n else torch.zeros(6).double(), rtol=1e-6, atol=1e-7)
        expected = torch.cov(z[y == c].T) if n > 1 else torch.zeros(6, 6, dtype=torch.float64)
        torch.testing.assert_close(covariances[c], expected, rtol=1e-6, atol=1e-7)


def reference_calibration(  # noqa: PLR0913
    weight: torch.Tensor,
    bias: torch.Tensor,
    clients: list[tuple[torch.Tensor, torch.Tensor]],
    server_round: int,
    per_class: int,
    epochs: int,
    batch: int,
    lr: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1's server side: the pooled Gaussians of the classes present, M_c virtual features each, then the
    classifier g_φ retrained from its value with cross-entropy and SGD."""
    x = torch.cat([c[0] for c in clients])
    y = torch.cat([c[1] for c in clients])
    seed = int(np.random.SeedSequence([SEED, server_round, VIRTUAL_STREAM]).generate_state(1)[0])
    g = torch.Generator().manual_seed(seed)
    virtual, labels = [], []
    for c in range(CLASSES):
        xc = x[y == c]
        if not len(xc):
            continue
        mu = xc.mean(0)
        sigma = torch.cov(xc.T) if len(xc) > 1 else torch.zeros(WIDTH, WIDTH, dtype=torch.float64)
        lam, v = torch.linalg.eigh(sigma)
        eps = torch.randn(per_class, WIDTH, generator=g, dtype=torch.float64)
        virtual.append(mu + eps @ (v * lam.clamp(min=0).sqrt()).T)
        labels.append(torch.full((per_class,), c))
    z, t = torch.cat(virtual).float(), torch.cat(labels)
    head = nn.Linear(WIDTH, CLASSES)
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    sgd = torch.optim.SGD(head.parameters(), lr=lr)
    for _ in range(epochs):
        order = torch.randperm(len(t), generator=g)
        for start in range(0, len(t), batch):
            idx = order[start : start + batch]
            sgd.zero_grad()
            F.cross_entropy(head(z[idx]), t[idx]).backward()
            sgd.step()
    return head.weight.detach(), head.bias.detach()


def test_one_calibration_is_algorithm_one() -> None:
    clients = [client_features(k) for k in range(4)]
    g = torch.Generator().manual_seed(9)
    weight, bias = torch.randn(CLASSES, WIDTH, generator=g), torch.randn(CLASSES, generator=g)
    body = torch.randn(3, generator=g)
    arrays = to_array_record({"body.w": body, "classifier.weight": weight, "classifier.bias": bias})
    options = {"virtual_per_class": 30, "epochs": 2, "batch_size": 16, "lr": 0.1}
    strategy = spec("ccvr", **options).server(ServerSetup(4, frozenset(), SEED))
    got = strategy.calibrated_arrays(6, arrays, [to_array_record(stats_record(*c)) for c in clients])

    want_w, want_b = reference_calibration(weight, bias, clients, 6, 30, 2, 16, 0.1)
    assert list(got.keys()) == list(arrays.keys())
    assert np.array_equal(np.array(array_view(got["body.w"])), np.array(array_view(arrays["body.w"])))  # untouched
    # 3 classes x 30 features, 2 epochs of batches of 16: 12 float32 SGD steps, in another order of operations
    np.testing.assert_allclose(np.array(array_view(got["classifier.weight"])), want_w.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(array_view(got["classifier.bias"])), want_b.numpy(), rtol=1e-5, atol=1e-6)
    assert (want_w - weight).abs().max() > 1e-2  # the classifier moved


def metrics_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_run_trains_as_fedavg_and_scores_its_calibrated_model(tmp_path: Path, one_thread: None) -> None:
    runs = {
        name: Path(run(parse_config(small_config(tmp_path / name, **strategy_rows.sections(name))))["run_dir"])
        for name in ("fedavg", "ccvr")
    }
    fedavg, ccvr = (metrics_of(runs[name]) for name in ("fedavg", "ccvr"))
    assert [m["train_loss"] for m in ccvr] == [m["train_loss"] for m in fedavg]  # the same training, bit for bit
    assert all(c["client_mean_acc"] != f["client_mean_acc"] for c, f in zip(ccvr, fedavg, strict=True))
    saved = torch.load(runs["ccvr"] / "model.pt", weights_only=True)
    plain = torch.load(runs["fedavg"] / "model.pt", weights_only=True)
    assert all(torch.equal(saved[k], plain[k]) for k in saved if not k.startswith("classifier."))
    assert not torch.equal(saved["classifier.weight"], plain["classifier.weight"])  # model.pt: the scored model


@pytest.mark.parametrize("norm", ["l2", "affine_like"])
def test_a_model_without_a_linear_classifier_is_refused_in_one_line(norm: str) -> None:
    """A classifier that is not W·z + b: a Sequential, and the nn.Linear subclasses of model.norm l2 and affine_like
    (they normalise by the features' norm, so the calibration fitted W·z + b and the model scored another map)."""
    model = create_model("mlp", CLASSES, (1, 3, 3), create_norm("ln"), {"hidden": [6]})
    model.classifier = nn.Sequential(nn.Linear(6, CLASSES))
    with pytest.raises(ConfigError, match=r"^strategy: ccvr retrains a linear classifier, .* Sequential: give"):
        spec("ccvr").adapt_model(model, SEED)
    model = create_model("mlp", CLASSES, (1, 3, 3), create_norm(norm), {"hidden": [6]})
    assert isinstance(model.classifier, nn.Linear) and type(model.classifier) is not nn.Linear
    with pytest.raises(ConfigError, match=r"^strategy: ccvr retrains a linear classifier, W·z \+ b; .*Linear: give"):
        spec("ccvr").adapt_model(model, SEED)



def test_virtual_features_the_machine_cannot_hold_are_refused_before_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """K·M_c features of d float64s, held about 3 times, in at most half the machine's memory: drawn at the first
    evaluation, after rounds of training, they would otherwise run out of memory there and lose the run."""
    model = create_model("mlp", CLASSES, (1, 3, 3), create_norm("ln"), {"hidden": [6]})  # d = 6
    per_feature = 3 * 8 * CLASSES * 6  # bytes per virtual feature of each class
    monkeypatch.setattr("fedsim.strategies.ccvr.machine_memory", lambda: 2 * 1000 * per_feature)
    assert spec("ccvr", virtual_per_class=1000).adapt_model(model, SEED) is model  # exactly half: accepted
    with pytest.raises(ConfigError, match=r"^strategy.virtual_per_class = 1,001: .*: give at most 1,000$"):
        spec("ccvr", virtual_per_class=1001).adapt_model(model, SEED)

@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_clients_that_fail_to_send_their_statistics_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    def fails(self: ClientRuntime, msg: Message, context: Context) -> Message:
        raise RuntimeError("no features here")

    monkeypatch.setattr(ClientRuntime, "feature_stats", fails)
    sections = strategy_rows.sections("ccvr")
    config = small_config(tmp_path, train={"on_client_failure": policy}, **sections)
    with pytest.raises(TrainingError, match=r"^round 2, feature statistics: .*no features here"):
        run(parse_config(config))


@pytest.mark.slow
def test_a_killed_ccvr_run_resumes_to_the_uninterrupted_one(tmp_path: Path) -> None:
    sections = strategy_rows.sections("ccvr")
    check_resume(tmp_path, stateful=False, **sections)
