"""fedsim sweep's execution (fedsim.sweep.execute): finished runs skipped, cells in processes or on Ray, a stopped
sweep resumed, a failing cell isolated."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedsim.app.cli import main
from fedsim.app.report import write_report
from fedsim.sweep.execute import run_sweep
from fedsim.sweep.plan import cell_name
from tests.conftest import make_sweep, one_line, small_config, write_config


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
    from fedsim.app.grouping import seed_groups
    from fedsim.app.plots import mean_and_std
    from fedsim.app.report import load_runs

    groups = seed_groups(load_runs(out))
    assert list(groups) == ["norm=ln", "norm=none"] and all(len(m) == 2 for m in groups.values())
    rounds, mean, std = mean_and_std(groups["norm=ln"], "client_mean_acc")
    last = [100 * r["metrics"][-1]["client_mean_acc"] for r in groups["norm=ln"]]
    assert rounds == [1, 2] and mean[-1] == pytest.approx(sum(last) / 2)
    assert std[-1] == pytest.approx(abs(last[0] - last[1]) / 2**0.5)  # the sample std of two seeds
    assert main(["plot", str(out), "--mean-over-seeds", "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "accuracy.png").stat().st_size > 10_000


@pytest.mark.slow
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


def cell_processes(out: Path, sweep_pid: int) -> list[int]:
    """Live ``fedsim run`` processes of this sweep's cells (their command lines name its directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int(proc.name) != sweep_pid:
                cmdline = (proc / "cmdline").read_bytes()
                if b"fedsim.app.cli\0run" in cmdline and str(out).encode() in cmdline:
                    if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                        found.append(int(proc.name))
        except OSError:  # ended meanwhile
            continue
    return found


def checkpointed_round(run_dir: Path) -> int:
    from fedsim.record.checkpoint import Checkpoint

    try:
        return Checkpoint.load(run_dir).round
    except Exception:  # not written yet, or being replaced
        return 0


def start_sweep(path: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "fedsim.app.cli", "sweep", str(path), "--parallel", "2"]
    return subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_until(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


@pytest.mark.slow
@pytest.mark.long
def test_stopping_a_sweep_stops_its_runs_and_a_rerun_resumes_them(tmp_path: Path) -> None:
    # each signal comes while both cells wait at a known round (tests/plugins/hold_at_round.py), two rounds
    # past a checkpoint: on any machine, where a cell could finish before a watcher's signal on a loaded one
    hold = tmp_path / "hold"
    strategy = {"name": "tests.plugins.hold_at_round:HoldAtRound", "hold_file": str(hold)}
    base = small_config(tmp_path, strategy=strategy, train={"rounds": 30}, eval={"every": 10},
                        output={"checkpoint_every": 5})  # fmt: skip
    write_config(tmp_path, base, "base.yaml")
    sweep = {"base": "base.yaml", "name": "s", "output": str(tmp_path / "sweeps"), "grid": {"seed": [0, 1]}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    out = tmp_path / "sweeps" / "s"
    cells = [out / "seed=0", out / "seed=1"]
    for sig, at in ((signal.SIGTERM, 12), (signal.SIGKILL, 17)):
        hold.write_text(str(at))
        proc = start_sweep(path)
        waiting = lambda a=at: [w for w in tmp_path.glob("hold.*") if w.read_text() == str(a)]  # noqa: E731
        wait_until(lambda w=waiting: len(w()) == 2, 300, f"{sig}: the cells never reached round {at}")
        assert len(cell_processes(out, proc.pid)) == 2
        proc.send_signal(sig)
        proc.communicate(timeout=120)
        assert proc.returncode == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL)
        # however the sweep ends, its runs end with it (SIGKILL: by their parent-death signal)
        wait_until(lambda p=proc.pid: not cell_processes(out, p), 60, f"{sig}: runs outlived the sweep")
        assert not any((c / "summary.json").exists() for c in cells)
        assert [checkpointed_round(c) for c in cells] == [at - 2, at - 2]
    # the next sweep resumes both cells from their checkpoints: every round once, in order
    hold.unlink()
    proc = start_sweep(path)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert "2 to resume from their checkpoints" in stdout
    for cell in cells:
        rounds = [json.loads(x)["round"] for x in (cell / "metrics.jsonl").read_text().splitlines()]
        assert rounds == [10, 20, 30]
        assert json.loads((cell / "summary.json").read_text())["resumed_from_round"] == 15


def failing_run(fail: dict[str, Exception]):  # type: ignore[no-untyped-def]
    """A stand-in for a cell's run: raises ``fail[cell name]``, else a summary (no training needed)."""
    ran: list[str] = []

    def run_one(cfg_json: str, resume: bool = False) -> dict[str, float]:
        name = json.loads(cfg_json)["name"]
        ran.append(name)
        if name in fail:
            raise fail[name]
        return {"final_client_mean_acc": 0.5}

    return run_one, ran


def test_a_cell_failing_while_it_runs_is_recorded_and_the_others_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedsim.errors import DataError

    run_one, ran = failing_run(
        {"seed=1": DataError("npz dataset x.npz: not a .npz archive"), "seed=2": RuntimeError("plugin bug")}
    )
    monkeypatch.setattr("fedsim.sweep.execute._run_one", run_one)
    path = make_sweep(tmp_path, {"seed": [0, 1, 2, 3]})
    assert main(["sweep", str(path)]) == 1  # ran, some cells failed: not bad input's 2
    out, err = capsys.readouterr()
    assert ran == ["seed=0", "seed=1", "seed=2", "seed=3"]
    sweep_dir = tmp_path / "sweeps" / "s"
    assert one_line(err) == (
        f"fedsim: error: 2 of 4 sweep runs failed (why: {sweep_dir}/failed.json; their metrics so far are in "
        f"{sweep_dir}): seed=1, seed=2"
    )
    assert "  seed=1: failed: npz dataset x.npz: not a .npz archive\n  seed=2: failed: RuntimeError: plugin bug" in out
    assert json.loads((sweep_dir / "failed.json").read_text()) == {
        "seed=1": "npz dataset x.npz: not a .npz archive",
        "seed=2": "RuntimeError: plugin bug",
    }
    monkeypatch.setattr("fedsim.sweep.execute._run_one", failing_run({})[0])  # fixed: the next sweep clears the record
    assert main(["sweep", str(path)]) == 0
    assert not (sweep_dir / "failed.json").exists()


@pytest.mark.slow
def test_a_cell_failing_in_its_process_leaves_its_running_sibling_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cells = [{"strategy": "tests.plugins.raising_server:RaisingServer"}, {"strategy": "fedavg", "train.rounds": 30}]
    path = make_sweep(tmp_path, {}, cells=cells, parallel=2)
    assert main(["sweep", str(path)]) == 1
    out, err = capsys.readouterr()
    bad, good = (cell_name(c) for c in cells)
    assert f"  {bad}: failed: " in out and "injected failure in round 1" in out
    assert one_line(err).endswith(f"): {bad}")
    sweep_dir = tmp_path / "sweeps" / "s"
    assert json.loads((sweep_dir / good / "summary.json").read_text())["rounds"] == 30  # finished, not killed
    assert list(json.loads((sweep_dir / "failed.json").read_text())) == [bad]
