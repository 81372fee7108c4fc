"""Diagnostics (fedsim.experiment.diagnostics) against the anchors of specs/pln-and-isometry.md, and ``fedsim plot``."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torch import nn

from fedsim.app.cli import main
from fedsim.config import DiagnosticsConfig
from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.errors import ConfigError
from fedsim.experiment.diagnostics import (
    ProbeDiagnostics,
    effective_rank,
    gram,
    isometry,
    isometry_gap,
    layer_inputs,
    probe_images,
    singular_values,
)
from fedsim.experiment.resolve import resolve
from fedsim.models import create_model
from fedsim.norms import create_norm
from fedsim.record.reader import read_metrics
from tests.conftest import small_config

ALL_ON = {"features": True, "isometry": True, "grad_norms": True}


# ---------------------------------------------------------------- isometry: spec §2.2 anchors


def _equicorrelated(n: int, rho: float) -> torch.Tensor:
    return torch.full((n, n), rho, dtype=torch.float64).fill_diagonal_(1.0)


@pytest.mark.parametrize(
    ("g", "expected"),
    [
        (torch.eye(5, dtype=torch.float64), 1.0),
        (3 * torch.eye(5, dtype=torch.float64), 1.0),
        (torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)), 0.885346),
        (_equicorrelated(2, 0.5), 0.866025),
        (_equicorrelated(2, 0.9), 0.435890),
        (_equicorrelated(10, 0.5), 0.635491),
    ],
)
def test_isometry_anchors(g: torch.Tensor, expected: float) -> None:
    assert isometry(g) == pytest.approx(expected, abs=1e-6)


def test_isometry_gap_and_two_vectors() -> None:
    assert isometry_gap(torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0]))) == pytest.approx(0.121777, abs=1e-6)
    a, b, theta = 2.0, 3.0, 0.7  # I = 2ab sinθ / (a² + b²) (the paper's prose drops the 2)
    x = torch.tensor([[a, 0.0], [b * math.cos(theta), b * math.sin(theta)]], dtype=torch.float64)
    assert isometry(gram(x)) == pytest.approx(2 * a * b * math.sin(theta) / (a * a + b * b), abs=1e-12)
    assert isometry(gram(x)) == pytest.approx(0.594662, abs=1e-6)


def test_isometry_is_zero_for_singular_grams() -> None:
    x = torch.randn(6, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert isometry(gram(torch.cat([x, x[:1]]))) == 0.0  # a duplicate sample
    assert isometry(gram(torch.randn(12, 8, dtype=torch.float64))) == 0.0  # n > D
    assert isometry(torch.ones(4, 4, dtype=torch.float64)) == 0.0
    assert isometry(gram(x - x.mean(0))) == 0.0  # centred across the batch: rank <= n - 1
    assert isometry_gap(torch.ones(3, 3)) == math.inf


def test_rms_scaling_raises_isometry_by_am_over_gm_of_squared_norms() -> None:
    """ISO Thm 1 as the exact identity I(G̃)/I(G) = AM(a²)/GM(a²), on RMS scaling alone (spec §2.3)."""
    two = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    assert isometry(gram(two)) == pytest.approx(0.8) and isometry(gram(two / two.norm(dim=1, keepdim=True))) == 1.0
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 32, dtype=torch.float64, generator=gen) * torch.rand(8, 1, dtype=torch.float64, generator=gen)
    rms = nn.RMSNorm(32, eps=0.0, elementwise_affine=False).double()
    a2 = x.pow(2).sum(1)
    ratio = isometry(gram(rms(x))) / isometry(gram(x))
    assert ratio == pytest.approx(float(a2.mean() / a2.log().mean().exp()), rel=1e-10)
    assert ratio > 1


def _create_input(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """The authors' create_input (degeneracy 10), then centred and RMS-normalised per sample (spec §2.8)."""
    u, s, vh = torch.linalg.svd(torch.randn(n, d, generator=gen), full_matrices=False)
    s[0] *= 10
    x = (u * s) @ vh
    x = x - x.mean(1, keepdim=True)
    return x / x.pow(2).mean(1, keepdim=True).sqrt()


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_isometry_gap_falls_with_depth_for_ln_at_initialisation(activation: str) -> None:
    """ISO Thm 4 / spec §2.8: Linear -> σ -> LN (no affine), W ~ N(0, 1/d), n = 10, d = 1000, 20 layers."""
    d, depth = 1000, 20
    torch.manual_seed(0)
    norm = create_norm("ln", {"affine": False})
    model = create_model("mlp", 10, (1, 1, d), norm, {"hidden": [d] * depth, "activation": activation})
    for fc in model.fcs:
        nn.init.normal_(fc.weight, std=d**-0.5)
    x = _create_input(10, d, torch.Generator().manual_seed(0)).view(10, 1, 1, d)
    feats = layer_inputs(model, x)
    assert list(feats) == [f"fcs.{i}" for i in range(depth)] + ["classifier"]  # x^0 ... x^20 in depth order
    gaps = [isometry_gap(gram(f)) for f in feats.values()]
    assert 1.2 < gaps[0] < 1.8  # spec: 1.541 averaged over seeds
    if activation == "tanh":  # β = 1.07: slow, steady (spec: 1.541 -> 0.284 at ℓ = 20)
        assert gaps[20] < 0.5 * gaps[0]
        assert sum(b > a for a, b in zip(gaps, gaps[1:], strict=False)) <= 3  # a trend, not strict
        assert isometry_gap(gram(feats["fcs.10"])) > 0.25
    else:  # β = 1.27: fast, down to the finite-width floor (spec: 0.010 at ℓ = 20)
        assert gaps[20] < 0.05


# ---------------------------------------------------------------- effective rank


def test_effective_rank_of_known_rank_matrices() -> None:
    gen = torch.Generator().manual_seed(0)
    q1, _ = torch.linalg.qr(torch.randn(50, 50, dtype=torch.float64, generator=gen))
    q2, _ = torch.linalg.qr(torch.randn(20, 20, dtype=torch.float64, generator=gen))
    for r in (1, 3, 7):
        equal = q1[:, :r] @ q2[:r]  # rank r, r equal singular values
        assert effective_rank(singular_values(equal)) == pytest.approx(r, abs=1e-9)
        uneven = q1[:, :r] @ torch.diag(torch.arange(1.0, r + 1, dtype=torch.float64) ** 2) @ q2[:r]
        assert 1 <= effective_rank(singular_values(uneven)) < r or r == 1
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert effective_rank(p) == pytest.approx(math.exp(-(p * p.log()).sum().item()))
    assert effective_rank(torch.zeros(4)) == 0.0


# ---------------------------------------------------------------- config


def test_diagnostics_config_defaults_off_and_is_strict(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path))
    assert ProbeDiagnostics.from_experiment(resolve(cfg)) is None
    with pytest.raises(ConfigError, match=r"diagnostics\.feature\b"):
        parse_config(small_config(tmp_path, diagnostics={"feature": True}))
    with pytest.raises(ConfigError, match=r"isometry_size\b.*\b20\b.*probe_size"):
        parse_config(small_config(tmp_path, diagnostics={"probe_size": 16, "isometry_size": 20}))


def test_the_probe_is_256_images_or_the_whole_smaller_test_set_and_a_given_size_must_fit() -> None:
    """Left out, the probe takes 256 test images, or all of a smaller test set; a given size the test set
    cannot give is refused even with every diagnostic off (it was asked for: never cut down silently)."""
    assert probe_images(DiagnosticsConfig(), 1000) == 256
    assert probe_images(DiagnosticsConfig(), 100) == 100
    assert probe_images(DiagnosticsConfig(probe_size=64), 100) == 64
    with pytest.raises(ConfigError, match=r"diagnostics\.probe_size\b.*100000.*\b1000\b"):
        probe_images(DiagnosticsConfig(probe_size=100_000), 1000)


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Three 4-round runs: LN with every diagnostic, the same without, no norm with features only."""
    tmp = tmp_path_factory.mktemp("diag")
    variants: dict[str, dict[str, Any]] = {
        "ln_diag": {"diagnostics": ALL_ON},
        "ln_plain": {},
        "none_diag": {"model": {"norm": "none"}, "diagnostics": {"features": True}},
    }
    dirs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLWR_HOME", str(tmp / "flwr-home"))
        mp.setenv("FLWR_TELEMETRY_ENABLED", "0")
        for name, sections in variants.items():
            cfg = small_config(tmp, output={"run_dir": str(tmp / "runs" / name)}, **sections)
            dirs[name] = Path(run(parse_config(cfg))["run_dir"])
    yield dirs


def test_run_writes_diagnostics_without_changing_the_run(runs: dict[str, Path]) -> None:
    lines, plain = read_metrics(runs["ln_diag"]), read_metrics(runs["ln_plain"])
    assert [m["round"] for m in lines] == [2, 4]
    assert [m["client_mean_acc"] for m in lines] == [m["client_mean_acc"] for m in plain]  # RNG untouched
    assert not {"feature_sv", "isometry", "init_grad_norms"} & set(plain[0])  # off: nothing computed

    first, last = lines
    for m in lines:
        sv = m["feature_sv"]
        assert len(sv) == 64 and sv == sorted(sv, reverse=True)  # min(probe 256, feature dim 64)
        assert 1 < m["feature_erank"] <= 64
        assert m["feature_norm_mean"] == pytest.approx(8.0, rel=1e-2)  # LN features: ‖z‖ = √64
        assert len(m["class_norms"]) == 10
        assert list(m["isometry"]) == ["fcs.0", "classifier"]
        assert all(0 < v <= 1 for v in m["isometry"].values())
    assert first["isometry"]["fcs.0"] == last["isometry"]["fcs.0"]  # the fixed probe's input images
    assert set(first["init_grad_norms"]) == {"fcs.0.weight", "fc_norms.0.weight", "fc_norms.0.bias",
                                             "classifier.weight"}
    assert all(v > 0 for v in first["init_grad_norms"].values()) and first["init_grad_norm_mean"] > 0
    assert "init_grad_norms" not in last

    # the diagnostics are of the global model: recompute from the saved final model
    cfg = parse_config(small_config(runs["ln_diag"].parent))
    ds = resolve(cfg).federation().dataset
    model = create_model("mlp", 10, ds.in_shape, create_norm("ln"), {"hidden": [64]})
    model.load_state_dict(torch.load(runs["ln_diag"] / "model.pt"))
    with torch.no_grad():
        z = model.eval().forward_features(ds.x_test[:256].float() / 255)
    assert singular_values(z).tolist() == pytest.approx(last["feature_sv"], rel=1e-4, abs=1e-6)


def _assert_png(path: Path) -> None:
    assert path.stat().st_size > 10_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.format == "PNG" and min(img.size) > 300


def test_fedsim_plot_writes_three_pngs(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plots"
    assert main(["plot", *map(str, runs.values()), "--out", str(out)]) == 0
    names = ["accuracy.png", "label_distribution.png", "feature_spectrum.png"]
    assert capsys.readouterr().out.split() == [str(out / n) for n in names]
    for name in names:
        _assert_png(out / name)

    assert main(["plot", str(runs["ln_plain"])]) == 0  # one run: PNGs go into it; no spectrum to draw
    captured = capsys.readouterr()
    assert "feature_spectrum.png: no feature diagnostics" in captured.err
    assert (runs["ln_plain"] / "accuracy.png").exists() and not (runs["ln_plain"] / "feature_spectrum.png").exists()
    assert main(["plot", str(tmp_path / "nope")]) == 2


@pytest.mark.slow
def test_fedsim_plot_draws_rounds_on_a_log_scale_and_marks_reference_accuracies(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from matplotlib.figure import Figure

    import fedsim.app.plots

    saved: dict[str, Figure] = {}
    save = fedsim.app.plots._save
    monkeypatch.setattr(fedsim.app.plots, "_save", lambda fig, path: (saved.update({path.name: fig}), save(fig, path)))
    args = ["--log-rounds", "--reference", "LN-FL FedLN=78.04", "--reference", "LN-FL FedAvg=56.82"]
    assert main(["plot", *map(str, runs.values()), "--out", str(tmp_path / "plots"), *args]) == 0
    (acc,) = saved["accuracy.png"].axes
    assert acc.get_xscale() == "log" and acc.get_xlabel() == "round (log scale)"
    marks = [line.get_ydata()[0] for line in acc.get_lines() if line.get_linestyle() == ":"]
    assert marks == [78.04, 56.82]
    assert {t.get_text() for t in acc.texts} == {"LN-FL FedLN: 78.04", "LN-FL FedAvg: 56.82"}
    assert saved["feature_spectrum.png"].axes[1].get_xscale() == "log"  # effective rank over rounds

    saved.clear()
    assert main(["plot", *map(str, runs.values()), "--out", str(tmp_path / "plain")]) == 0
    (acc,) = saved["accuracy.png"].axes
    assert acc.get_xscale() == "linear" and not acc.texts  # neither without the options
    capsys.readouterr()
    for bad in ["FedLN=101", "FedLN=nan", "=50", "FedLN", "FedLN=high"]:
        assert main(["plot", str(runs["ln_plain"]), "--out", str(tmp_path / "bad"), "--reference", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--reference" in err and "[0, 100]" in err, err
    assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_feature_diagnostics_measure_the_classifiers_input_through_a_projection_head() -> None:
    # class_norms are the rows of classifier.weight: the features beside them must be the tensor it multiplies,
    # the projection head's output when the model has one (not the encoder's output below it)
    torch.manual_seed(0)
    model = create_model("mlp", 10, (1, 8, 8), create_norm("fn"), {"hidden": [32], "projection": 6})
    x = torch.randn(20, 1, 8, 8)
    out = ProbeDiagnostics(DiagnosticsConfig(features=True), model, x, torch.zeros(20, dtype=torch.long)).measure()
    z = model.project(model.forward_features(x)).detach().double()
    assert z.shape == (20, 6)
    assert out["feature_norm_mean"] == pytest.approx(float(z.norm(dim=1).mean()), rel=1e-9)
    assert out["feature_erank"] == pytest.approx(effective_rank(singular_values(z)), rel=1e-9)
    assert out["feature_norm_mean"] != pytest.approx(math.sqrt(32))  # FN's √d norm is the encoder output's
