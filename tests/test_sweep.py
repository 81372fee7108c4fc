"""fedsim sweep / fedsim report: grids validated up front, finished runs skipped, tables over seeds."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from fedsim.cli import main
from fedsim.report import write_report
from fedsim.sweep import run_sweep
from tests.conftest import small_config, write_config


def make_sweep(tmp_path: Path, grid: dict, **extra) -> Path:  # type: ignore[no-untyped-def]
    write_config(tmp_path, small_config(tmp_path, train={"rounds": 2}, eval={"every": 1}), "base.yaml")
    sweep = {"base": "base.yaml", "name": "s", "output": str(tmp_path / "sweeps"), "grid": grid, **extra}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


@pytest.mark.parametrize(
    ("grid", "fragment"),
    [
        ({"model.normm": ["ln"]}, "model.normm: unknown key"),
        ({"model.norm": []}, "empty list"),
        ({"model.norm": ["ln", "nope"]}, "unknown norms 'nope'"),
    ],
)
def test_bad_grid_fails_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], grid, fragment) -> None:  # type: ignore[no-untyped-def]
    path = make_sweep(tmp_path, grid)
    assert main(["sweep", str(path)]) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()


def test_sweep_runs_grid_skips_finished_and_reports(tmp_path: Path) -> None:
    path = make_sweep(tmp_path, {"model.norm": ["ln", "none"], "seed": [0, 1]})
    out = run_sweep(path, log=lambda _: None)
    dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert dirs == ["norm=ln,seed=0", "norm=ln,seed=1", "norm=none,seed=0", "norm=none,seed=1"]
    stamp = (out / "norm=ln,seed=0" / "summary.json").stat().st_mtime_ns
    (out / "norm=none,seed=1" / "summary.json").unlink()  # as if interrupted in that run
    lines: list[str] = []
    run_sweep(path, log=lines.append)
    assert "4 runs, 3 already complete" in lines[0] and len(lines) == 2
    assert (out / "norm=ln,seed=0" / "summary.json").stat().st_mtime_ns == stamp
    assert len((out / "norm=none,seed=1" / "metrics.jsonl").read_text().splitlines()) == 2  # not appended twice

    write_report(out, target=0.2)
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["norm"] for r in rows] == ["ln", "none"] and all(r["seeds"] == "2" for r in rows)
    assert "±" in rows[0]["final client-mean acc %"]
    assert (out / "accuracy.png").stat().st_size > 10_000
    assert (out / "results.md").read_text().startswith("| norm | seeds |")

    # the same groups, as mean ± std bands over the seeds (fedsim plot --mean-over-seeds, the report's plot)
    from fedsim.plots import mean_and_std
    from fedsim.report import load_runs
    from fedsim.rundir import seed_groups

    groups = seed_groups(load_runs(out))
    assert list(groups) == ["norm=ln", "norm=none"] and all(len(m) == 2 for m in groups.values())
    rounds, mean, std = mean_and_std(groups["norm=ln"], "client_mean_acc")
    last = [100 * r["metrics"][-1]["client_mean_acc"] for r in groups["norm=ln"]]
    assert rounds == [1, 2] and mean[-1] == pytest.approx(sum(last) / 2)
    assert std[-1] == pytest.approx(abs(last[0] - last[1]) / 2)
    assert main(["plot", str(out), "--mean-over-seeds", "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "accuracy.png").stat().st_size > 10_000


def test_report_plots_final_accuracy_against_a_swept_key(tmp_path: Path) -> None:
    from fedsim.errors import FedsimError
    from fedsim.plots import plot_final_vs
    from fedsim.report import load_runs

    path = make_sweep(tmp_path, {"partition.beta": [0.1, 1.0, 10.0], "model.norm": ["ln", "none"]})
    out = run_sweep(path, log=lambda _: None)
    assert main(["report", str(out), "--vs", "partition.beta"]) == 0
    assert (out / "final_vs_beta.png").stat().st_size > 10_000
    runs = load_runs(out)
    assert plot_final_vs(runs, "partition.beta", tmp_path / "p.png") == 2  # one line per norm
    with pytest.raises(FedsimError, match="numeric model.norm"):
        plot_final_vs(runs, "model.norm", tmp_path / "q.png")


def test_sweep_on_ray_gives_the_same_runs(tmp_path: Path) -> None:
    import json

    import ray

    grid = {"model.norm": ["ln", "none"]}
    (tmp_path / "local").mkdir()
    (tmp_path / "ray").mkdir()
    local = run_sweep(make_sweep(tmp_path / "local", grid), log=lambda _: None)
    lines: list[str] = []
    on_ray = run_sweep(make_sweep(tmp_path / "ray", grid, parallel=2, ray={"cpus_per_run": 1}), log=lines.append)
    assert len(lines) == 3 and not ray.is_initialized()  # every run reported; Ray left
    for cell in ("norm=ln", "norm=none"):
        a, b = (json.loads((d / cell / "summary.json").read_text()) for d in (local, on_ray))
        assert a["final_client_mean_acc"] == b["final_client_mean_acc"]
        assert (local / cell / "metrics.jsonl").read_text().count("\n") == 2
