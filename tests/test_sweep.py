"""fedsim sweep / fedsim report: grids validated up front, finished runs skipped, tables over seeds."""

from __future__ import annotations

import csv
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedsim.cli import main
from fedsim.report import write_report
from fedsim.sweep import cell_name, plan, run_sweep
from tests.conftest import MNIST_SMALL, small_config, write_config


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


@pytest.mark.parametrize(
    ("grid", "extra", "argv", "fragment"),
    [
        ({"seed": [0, 0]}, {}, [], "two cells have the same overrides (seed=0): remove the duplicate"),
        # the overrides differ; only the directory names made of them collide (it said "the same overrides")
        ({"data.cache_dir": ["a/b", "a_b"]}, {}, [],
         "cells {data.cache_dir=a/b} and {data.cache_dir=a_b} differ, but their directory names collide "
         "(cache_dir=a_b: "),
        # each cell went to <sweep>/<cell> whatever these said
        ({"seed": [0]}, {"set": {"output.run_dir": "x"}}, [], "set sets output.run_dir: each cell's name and "),
        ({"seed": [0]}, {"set": {"output": {"run_dir": "x"}}}, [], "set sets output.run_dir: "),
        ({"seed": [0]}, {"cells": [{"name": "mine"}]}, [], "cells sets name: "),
        ({"seed": [0]}, {}, ["--set", "output.dir=x"], "--set output.dir=x: sets output.dir: each cell's name "),
    ],
)  # fmt: skip
def test_cells_that_would_share_or_ignore_a_directory_are_refused(  # type: ignore[no-untyped-def]
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grid, extra, argv, fragment
) -> None:
    path = make_sweep(tmp_path, grid, **extra)
    assert main(["sweep", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err
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
    from fedsim.grouping import seed_groups
    from fedsim.plots import mean_and_std
    from fedsim.report import load_runs

    groups = seed_groups(load_runs(out))
    assert list(groups) == ["norm=ln", "norm=none"] and all(len(m) == 2 for m in groups.values())
    rounds, mean, std = mean_and_std(groups["norm=ln"], "client_mean_acc")
    last = [100 * r["metrics"][-1]["client_mean_acc"] for r in groups["norm=ln"]]
    assert rounds == [1, 2] and mean[-1] == pytest.approx(sum(last) / 2)
    assert std[-1] == pytest.approx(abs(last[0] - last[1]) / 2)
    assert main(["plot", str(out), "--mean-over-seeds", "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "accuracy.png").stat().st_size > 10_000


@pytest.mark.slow
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


def test_report_columns_appear_once_each_named_by_as_much_of_the_key_as_tells_them_apart() -> None:
    """A varied key whose last part is another column's name (train.rounds beside the rounds run) or another
    varied key's (model.norm.eps, strategy.eps) is named by more of its path, in the table as in the legends."""
    from fedsim.grouping import seed_groups
    from fedsim.report import table

    def run(rounds: int, eps: float, seed: int) -> dict:  # type: ignore[type-arg]
        config = {"seed": seed, "train.rounds": rounds, "model.norm.eps": eps, "strategy.eps": 0.1}
        config["strategy.name"] = "x"
        summary = {"rounds": rounds, "final_client_mean_acc": 0.5, "best_client_mean_acc": 0.5, "final_global_acc": 0.5}
        return {"config": config, "summary": summary, "metrics": [{"round": rounds, "client_mean_acc": 0.5}]}

    runs = [run(2, 1e-5, 0), run(2, 1e-5, 1), run(4, 1e-3, 0)]
    runs[2]["config"] |= {"strategy.eps": 0.2, "strategy.name": "y"}
    header, rows = table(runs, 0.5)
    assert header[:6] == ["norm.eps", "strategy.eps", "strategy", "train.rounds", "seeds", "rounds"]
    assert len(set(header)) == len(header) and [row[:6] for row in rows] == [
        ["1e-05", "0.1", "x", "2", "2", "2"], ["0.001", "0.2", "y", "4", "1", "4"]
    ]  # fmt: skip
    assert list(seed_groups(runs)) == [
        "norm.eps=1e-05, strategy.eps=0.1, strategy=x, rounds=2",  # a legend has no other rounds
        "norm.eps=0.001, strategy.eps=0.2, strategy=y, rounds=4",
    ]


def test_the_rounds_to_target_column_names_the_target_it_used() -> None:
    """--target 0.505 was reported under 'rounds to 50%', beside runs that reached 50% and showed '-'."""
    from fedsim.report import table

    summary = {"rounds": 2, "final_client_mean_acc": 0.5, "best_client_mean_acc": 0.5, "final_global_acc": 0.5}
    runs = [{"config": {"seed": 0}, "summary": summary, "metrics": [{"round": 2, "client_mean_acc": 0.5}]}]
    assert [table(runs, target)[0][-1] for target in (0.5, 0.505, 0.07, 1.0)] == [
        "rounds to 50%", "rounds to 50.5%", "rounds to 7%", "rounds to 100%"
    ]  # fmt: skip
    assert [table(runs, target)[1][0][-1] for target in (0.5, 0.505)] == ["2", "-"]


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
                if b"fedsim.cli\0run" in cmdline and str(out).encode() in cmdline:
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
    cmd = [sys.executable, "-m", "fedsim.cli", "sweep", str(path), "--parallel", "2"]
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


# -- bad cells, names, size: every check below runs before any training (cheap) --


def one_line(err: str) -> str:
    """The single line a refused command prints (fedsim: error: ...), asserted to be the only one."""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedsim: error: "), err[-2000:]
    return lines[0]


def test_invalid_cells_are_refused_together_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cells = [{"model.norm": "ln"}, {"model.norm": "nope"}, {"train.lr": -1}, {"model.norm": "none"}]
    path = make_sweep(tmp_path, {}, cells=cells)
    assert main(["sweep", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("fedsim: error: 2 of 4 sweep cells are invalid, so none was run: cell norm=nope: ")
    assert "unknown norms 'nope'" in line and "; cell lr=-1: train.lr" in line
    assert not (tmp_path / "sweeps").exists()


@pytest.mark.parametrize(
    ("grid", "extra", "fragment"),
    [
        # a section beside a key inside it: the section's mapping would replace the other's value, and the cell
        # named lr=0.1 would train at 0.2 (and the set values be dropped)
        ({"train.lr": [0.1], "train": [{"lr": 0.2}]}, {}, "train and train.lr set by grid"),
        ({}, {"cells": [{"train.lr": 0.1}, {"train": {"lr": 0.1}}]}, "train and train.lr set by cells"),
        ({"train.rounds": [1, 2]}, {"set": {"train.rounds": 1}}, "train.rounds set by both set and grid"),
        (
            {},
            {"set": {"train.rounds": 1}, "cells": [{"train": {"lr": 0.2}}]},
            "train and train.rounds set by both cells and set",
        ),
    ],
)
def test_a_value_set_in_two_places_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grid: dict, extra: dict, fragment: str
) -> None:
    assert main(["sweep", str(make_sweep(tmp_path, grid, **extra))]) == 2
    assert fragment in one_line(capsys.readouterr().err)
    assert not (tmp_path / "sweeps").exists()


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
    monkeypatch.setattr("fedsim.sweep._run_one", run_one)
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
    monkeypatch.setattr("fedsim.sweep._run_one", failing_run({})[0])  # fixed: the next sweep clears the record
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


@pytest.mark.parametrize(
    "name", ["../../escape", "<absolute>", "..", "a/b", "x" * 201], ids=["up", "absolute", "dotdot", "slash", "long"]
)
def test_a_sweep_name_is_never_a_path(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    path = make_sweep(tmp_path, {"seed": [0]}, name=name.replace("<absolute>", str(elsewhere)))
    assert main(["sweep", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"fedsim: error: sweep file {path}: name = ") and "is a directory name under output" in line
    assert not (tmp_path / "sweeps").exists() and not (tmp_path.parent / "escape").exists()
    assert not elsewhere.exists()


@pytest.mark.parametrize("base", ["s.yaml", "./s.yaml", "../sweeps/s.yaml"])
def test_a_sweep_based_on_itself_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], base: str) -> None:
    """Read as a run config, the sweep file was an error per sweep key (data missing, base and grid unknown)."""
    path = tmp_path / "sweeps" / "s.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({"base": base, "output": str(tmp_path / "out"), "grid": {"seed": [0, 1]}}))
    assert main(["sweep", str(path)]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"fedsim: error: sweep file {path}: base: {base} is this sweep file; give the run config its cells start from"
    )
    assert not (tmp_path / "out").exists()


def test_long_cell_names_are_cut_to_one_unique_directory_name(tmp_path: Path) -> None:
    path = make_sweep(tmp_path, {"model.hidden": [[8] * 100, [8] * 101, [8] * 200]})
    out, runs = plan(path)
    names = [name for name, _ in runs]
    assert [len(n) for n in names] == [200, 200, 200] and len(set(names)) == 3
    assert names[0].startswith("hidden=[8,8,") and re.fullmatch(r"[^~]{191}~[0-9a-f]{8}", names[0])
    assert [cfg.output.run_dir for _, cfg in runs] == [str(out / n) for n in names]
    assert cell_name({"model.norm": "a\\b\0c d/e"}) == "norm=a_b_cd_e"


def test_the_number_of_cells_is_bounded_before_they_are_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 3 x 1,001 cells, every one invalid: refused for its size at once, before any is built and validated
    path = make_sweep(tmp_path, {"seed": list(range(1001)), "model.norm": ["no1", "no2", "no3"]})
    assert main(["sweep", str(path)]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"fedsim: error: sweep file {path}: 3,003 cells (cells x axes x grid), more than max_cells = 1,000; each is "
        "validated before the first run: shrink the grid, or set max_cells: 3003 in the file"
    )
    path = make_sweep(tmp_path, {"seed": [0, 1, 2]}, cells=[{"model.norm": "ln"}, {"model.norm": "none"}], max_cells=6)
    assert len(plan(path)[1]) == 6  # raised on purpose, it lets them through
    # 10^20 cells: refused at once from the lists' lengths, and never advised past the limit max_cells has
    path = make_sweep(tmp_path, {f"x{i}": list(range(10)) for i in range(20)}, max_cells=10_000)
    assert main(["sweep", str(path)]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"fedsim: error: sweep file {path}: 100,000,000,000,000,000,000 cells (cells x axes x grid), more than "
        "max_cells = 10,000; each is validated before the first run: shrink the grid, or split it into several sweep "
        "files (max_cells is at most 10,000)"
    )


def test_max_cells_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # max_cells: 10000000, the refusal's own advice once, built cells for minutes using GBs
    path = make_sweep(tmp_path, {"seed": [0, 1]}, max_cells=10_000_000)
    assert main(["sweep", str(path)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "max_cells" in err and "less than or equal to 10000" in err, err


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"parallel": True}, "parallel"),
        ({"parallel": "2"}, "parallel"),
        ({"ray": {"cpus_per_run": float("inf")}}, "ray.cpus_per_run"),
    ],
    ids=["boolean", "text", "inf"],
)
def test_sweep_numbers_are_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra, fragment) -> None:  # type: ignore[no-untyped-def]
    path = make_sweep(tmp_path, {"seed": [0]}, **extra)
    assert main(["sweep", str(path)]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"fedsim: error: sweep file {path}: {fragment}")
    assert not (tmp_path / "sweeps").exists()


def test_unreadable_data_is_refused_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an archive")
    path = make_sweep(tmp_path, {"seed": [0, 1]}, set={"data.root": str(bad)})
    assert main(["sweep", str(path)]) == 2  # read once for the sweep, not failing every cell in turn
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"fedsim: error: npz dataset {bad}: ") and line.endswith(" (every cell of the sweep)")
    path = make_sweep(tmp_path, {}, cells=[{"data.root": str(bad)}, {"data.root": str(MNIST_SMALL)}])
    assert main(["sweep", str(path)]) == 2
    bad_cell = cell_name({"data.root": str(bad)})
    assert one_line(capsys.readouterr().err).startswith(f"fedsim: error: sweep cell {bad_cell}: npz dataset {bad}: ")
    assert not (tmp_path / "sweeps").exists()


def test_a_finished_cell_without_a_readable_config_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cell's directory with summary.json but its config.yaml missing or unreadable shows no settings to compare:
    the sweep called it "already complete" (and report then refused it). It is a damaged run directory, refused
    in one line naming it before any cell runs."""
    path = make_sweep(tmp_path, {"seed": [0, 1]})
    out = run_sweep(path, log=lambda _: None)
    shutil.rmtree(out / "seed=0")  # a cell still to run: it must not start
    config = out / "seed=1" / "config.yaml"
    for why, damage in (
        ("the run's config.yaml not found: ", config.unlink),
        (f"{config}: not valid YAML (", lambda: config.write_text("train: {rounds: 2")),
        ("its top level is not a mapping of sections", lambda: config.write_text("- train\n")),
    ):
        damage()
        assert main(["sweep", str(path)]) == 2
        line = one_line(capsys.readouterr().err)
        assert line.startswith(
            f"fedsim: error: sweep cell seed=1: {out / 'seed=1'} holds a finished run (summary.json) without a "
            f"readable config.yaml ({why}"
        ) and line.endswith("damaged run directory; restore its config.yaml, or delete that directory to redo the cell")
        assert not (out / "seed=0").exists()
