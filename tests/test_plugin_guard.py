"""A plugin cannot end a run as a success, stall it past train.round_timeout_s, or keep fedsim alive after it.

The plugins of tests/plugins/misbehaving.py call ``sys.exit(0)`` or ``os._exit(0)``, or sleep forever, in a
client hook, a normaliser's forward and a strategy's ``aggregate_train``, or leave a non-daemon thread
running. Each run is a real ``fedsim run`` process (or ``fedsim.run`` from Python): a failure is exit status 2
and one ``fedsim: error:`` line naming the plugin and its method, with the rounds recorded before it kept.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import fedsim
from fedsim.errors import FedsimError
from tests.conftest import REPO, small_config, write_config
from tests.fault_lines import fault_line

PLUGINS = "tests.plugins.misbehaving"
SPAWN_TIMEOUT_S = 600  # a fedsim process on a loaded 2-core machine: tens of seconds, Ray's start included
ROUND_TIMEOUT_S = 5  # short enough to wait for, long enough for a round of the small config on a loaded machine


def misbehaving(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    """The small config evaluated and checkpointed every round: what round 1 recorded is there to keep."""
    output = {"checkpoint_every": 1, "run_dir": str(tmp_path / "run")}
    return small_config(tmp_path, eval={"every": 1}, output=output, **sections)


# the hook of tests/plugins/misbehaving.py's strategy that exits or never returns, as fedsim names it
AGGREGATE_TRAIN = re.escape(f"strategy '{PLUGINS}:InAggregate': _ExitingAverage.aggregate_train")


def in_client(how: str, **options: Any) -> dict[str, Any]:
    return {"name": f"{PLUGINS}:InClient", "how": how, "round": 2, **options}


def fedsim_run(tmp_path: Path, cfg: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``fedsim run`` of ``cfg`` in a process of its own: the finished process and its run directory."""
    cmd = [sys.executable, "-m", "fedsim.app.cli", "run", str(write_config(tmp_path, cfg))]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=SPAWN_TIMEOUT_S)
    return proc, Path(cfg["output"]["run_dir"])


def the_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a failed fedsim process (status 2, no traceback)."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fedsim: error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return errors[0]


def assert_round_1_kept(run_dir: Path, error: str) -> None:
    assert re.search(fault_line("checkpoint kept", round=1, run_dir=re.escape(str(run_dir))), error), error
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [1]
    assert (run_dir / "checkpoint.pt").is_file() and not (run_dir / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inline", pytest.param("ray", marks=pytest.mark.long)])
@pytest.mark.parametrize(("how", "call"), [("sys_exit", "sys.exit(0)"), ("os_exit", "os._exit(0)")])
def test_a_client_hook_that_exits_fails_the_run_naming_the_plugin(
    tmp_path: Path, backend: str, how: str, call: str
) -> None:
    sim = {"backend": backend, "client_resources": {"num_cpus": 1}} if backend == "ray" else {}
    proc, run_dir = fedsim_run(tmp_path, misbehaving(tmp_path, strategy=in_client(how, partition=1), simulation=sim))
    error = the_error(proc)
    who = re.escape(f"strategy '{PLUGINS}:InClient': _ClientThatExits.begin_round")
    exited = fault_line("plugin exited", who=who, call=re.escape(call), file="misbehaving.py")
    assert re.match(fault_line("client failed, run stopped", round=2, client=1), error), error
    assert re.search(r"client 1: PluginExit: " + exited, error), error
    assert_round_1_kept(run_dir, error)


@pytest.mark.slow
def test_under_skip_a_client_that_exits_is_left_out_and_the_run_goes_on(tmp_path: Path) -> None:
    cfg = misbehaving(tmp_path, strategy=in_client("os_exit", partition=1), train={"on_client_failure": "skip"})
    proc, run_dir = fedsim_run(tmp_path, cfg)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [1, 2, 3, 4]
    assert [m.get("failed_clients") for m in lines] == [None, {"2": [1]}, None, None]
    assert (run_dir / "summary.json").is_file()


@pytest.mark.slow
def test_a_normaliser_that_exits_in_forward_fails_the_run_naming_it(tmp_path: Path) -> None:
    norm = {"name": f"{PLUGINS}:InForward", "how": "sys_exit"}
    proc, run_dir = fedsim_run(tmp_path, misbehaving(tmp_path, model={"name": "mlp", "norm": norm, "hidden": [64]}))
    error = the_error(proc)
    # every client fails alike in round 1: said once, for all of them
    who = re.escape(f"model.norm '{PLUGINS}:InForward': _Exits.forward")
    exited = fault_line("plugin exited", who=who, call=re.escape("sys.exit(0)"), file="misbehaving.py")
    assert re.search(r"round 1, training: clients 0, 1, 2, 3: PluginExit: " + exited, error), error
    assert error.count("PluginExit") == 1
    assert not run_dir.exists()  # it recorded nothing: the run directory it made is taken back


@pytest.mark.slow
@pytest.mark.parametrize(("how", "call"), [("sys_exit", "sys.exit(0)"), ("os_exit", "os._exit(0)")])
def test_aggregate_train_that_exits_stops_the_run_naming_the_hook(tmp_path: Path, how: str, call: str) -> None:
    strategy = {"name": f"{PLUGINS}:InAggregate", "how": how, "round": 2}
    proc, run_dir = fedsim_run(tmp_path, misbehaving(tmp_path, strategy=strategy))
    error = the_error(proc)
    exited = fault_line("plugin exited", who=AGGREGATE_TRAIN, call=re.escape(call), file="misbehaving.py")
    assert re.match("fedsim: error: " + exited, error), error
    assert_round_1_kept(run_dir, error)


@pytest.mark.slow
def test_aggregate_train_that_never_returns_stops_the_run_at_round_timeout(tmp_path: Path) -> None:
    strategy = {"name": f"{PLUGINS}:InAggregate", "how": "sleep", "round": 2}
    cfg = misbehaving(tmp_path, strategy=strategy, train={"round_timeout_s": ROUND_TIMEOUT_S})
    proc, run_dir = fedsim_run(tmp_path, cfg)
    error = the_error(proc)
    overran = fault_line("hook overran", who=AGGREGATE_TRAIN, timeout=ROUND_TIMEOUT_S)
    assert re.match("fedsim: error: " + overran, error), error
    assert_round_1_kept(run_dir, error)


@pytest.mark.slow
def test_an_inline_client_that_overruns_stops_the_run_even_under_skip(tmp_path: Path) -> None:
    train = {"round_timeout_s": ROUND_TIMEOUT_S, "on_client_failure": "skip"}
    proc, run_dir = fedsim_run(tmp_path, misbehaving(tmp_path, strategy=in_client("sleep", partition=2), train=train))
    error = the_error(proc)
    assert f"round 2, training: client 2 did not finish within train.round_timeout_s = {ROUND_TIMEOUT_S} s" in error, (
        error
    )
    assert "simulation.backend: ray" in error
    assert_round_1_kept(run_dir, error)


@pytest.mark.slow
def test_threads_a_plugin_leaves_do_not_keep_fedsim_run_alive(tmp_path: Path) -> None:
    cfg = misbehaving(tmp_path, model={"name": "mlp", "norm": f"{PLUGINS}:LeavesThread", "hidden": [64]})
    started = time.monotonic()
    proc, run_dir = fedsim_run(tmp_path, cfg)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(run_dir)
    warned = [line for line in proc.stderr.splitlines() if line.startswith("fedsim: warning: ")]
    assert len(warned) == 1 and "1 thread running ('left-by-norm')" in warned[0], proc.stderr
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 4
    assert time.monotonic() - started < SPAWN_TIMEOUT_S


@pytest.mark.slow
def test_from_python_leftover_threads_are_warned_of_once_and_run_returns(tmp_path: Path) -> None:
    cfg = small_config(tmp_path, model={"name": "mlp", "norm": f"{PLUGINS}:LeavesThread", "hidden": [64]})
    script = f"""
        import os, sys, warnings
        import fedsim
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = fedsim.run({str(write_config(tmp_path, cfg))!r})
        print(run.finished, [str(w.message) for w in caught if "left-by-norm" in str(w.message)])
        sys.stdout.flush()
        os._exit(0)  # the plugin's thread would keep this process alive
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, capture_output=True, text=True,
                          timeout=SPAWN_TIMEOUT_S)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    finished, warnings_ = proc.stdout.split(" ", 1)
    assert finished == "True" and warnings_.count("left-by-norm") == 1, proc.stdout


@pytest.mark.parametrize("strategy", [in_client("sys_exit"), {"name": f"{PLUGINS}:InAggregate", "how": "sys_exit"}])
def test_from_python_a_plugin_that_exits_is_a_fedsim_error(tmp_path: Path, strategy: dict[str, Any]) -> None:
    with pytest.raises(FedsimError, match="a plugin cannot end the run"):
        fedsim.run(misbehaving(tmp_path, strategy=strategy))


@pytest.mark.slow
def test_from_python_os_exit_in_a_plugin_is_a_fedsim_error(tmp_path: Path) -> None:
    # in a process of its own: without fedsim's guard, os._exit would end pytest's
    cfg = misbehaving(tmp_path, strategy={"name": f"{PLUGINS}:InAggregate", "how": "os_exit", "round": 2})
    script = f"""
        import fedsim
        from fedsim.errors import FedsimError
        try:
            fedsim.run({str(write_config(tmp_path, cfg))!r})
        except FedsimError as err:
            print(type(err).__name__, err)
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, capture_output=True, text=True,
                          timeout=SPAWN_TIMEOUT_S)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"PluginExit strategy '{PLUGINS}:InAggregate': _ExitingAverage.aggregate_train "
                                  "called os._exit(0)"), proc.stdout  # fmt: skip


def exit_in_child_of_plugin_code() -> int | None:
    from fedsim.plugin_guard import plugin_code

    with plugin_code():
        child = multiprocessing.get_context("fork").Process(target=print)  # ends with os._exit(0)
        child.start()
        child.join(SPAWN_TIMEOUT_S)
    return child.exitcode


def test_only_the_thread_running_plugin_code_has_os_exit_replaced() -> None:
    from fedsim.errors import PluginExit
    from fedsim.plugin_guard import plugin_code

    with plugin_code(), pytest.raises(PluginExit, match=r"^x called os._exit\(3\) at test_plugin_guard.py:"):
        with plugin_code("x"):
            os._exit(3)
    # another thread's os._exit meanwhile, and a forked child's (multiprocessing's), are the real one
    script = """
        import os, threading
        from fedsim.plugin_guard import plugin_code
        with plugin_code():
            threading.Thread(target=os._exit, args=(7,)).start()
            threading.Event().wait(60)
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, timeout=SPAWN_TIMEOUT_S)
    assert proc.returncode == 7
    assert exit_in_child_of_plugin_code() == 0
    assert os._exit.__module__ == "posix"  # the real one again, outside plugin code


def test_a_bounded_call_that_overruns_is_stopped_at_its_next_line() -> None:
    """A call that overran is stopped (a loop of torch calls left running as Python exits aborts the process)."""
    from fedsim.deadline import call_within

    x = torch.ones(8, 8)

    def forever() -> None:
        while True:
            x @ x

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="overran"):
        call_within(forever, 0.5, lambda: TimeoutError("overran"))
    assert time.monotonic() - started < 5  # stopped at once, not after its grace
    assert not [t for t in threading.enumerate() if t.name == "fedsim-bounded-call"]
    assert call_within(torch.is_grad_enabled, 60, RuntimeError) is True  # the caller's grad mode, on another thread
    with torch.no_grad():
        assert call_within(torch.is_grad_enabled, 60, RuntimeError) is False
