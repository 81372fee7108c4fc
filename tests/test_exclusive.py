"""One fedsim run, sweep or ``fedsim local`` at a time per process: a second one started from another thread while
one runs is refused at once, before it makes anything, and the one running gets exactly the numbers it gets alone
(two at once shared torch's random state: seed 0's accuracy came out 0.1067 or 0.2450 where alone it is 0.1505)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import fedsim
from fedsim.app.local import continue_locally
from fedsim.errors import FedsimError
from fedsim.record.writer import RunDir
from tests.conftest import small_config, write_config

NUMBERS = ["round", "train_loss", "client_mean_acc", "global_acc", "global_loss", "per_class_acc", "client_acc"]
WAIT_S = 300


class Paused:
    """Holds the thread named ``name`` right after its first metrics line, until :meth:`resume`: whatever another
    thread starts meanwhile meets a run under way, on any machine however slow."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.reached, self.go = threading.Event(), threading.Event()
        append_metrics = RunDir.append_metrics

        def append_and_wait(run_dir: RunDir, record: dict[str, Any]) -> None:
            append_metrics(run_dir, record)
            if threading.current_thread().name == name and not self.reached.is_set():
                self.reached.set()
                self.go.wait(WAIT_S)

        monkeypatch.setattr(RunDir, "append_metrics", append_and_wait)

    def wait(self) -> None:
        assert self.reached.wait(WAIT_S), "the paused thread never wrote its first metrics line"

    def resume(self) -> None:
        self.go.set()


def in_thread(name: str, target: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``target()`` started in a thread named ``name``; what it returned or raised, under "value" or "error"."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = target()
        except BaseException as err:  # noqa: BLE001 (asserted by the test)
            out["error"] = err

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread, out


def numbers(run: fedsim.Run) -> list[dict[str, Any]]:
    return run.metrics[NUMBERS].to_dict("records")


def sweep_file(tmp_path: Path) -> Path:
    """A sweep of one cell: the small config, seed 0."""
    write_config(tmp_path, small_config(tmp_path), "base.yaml")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml", "name": "s", "output": str(tmp_path / "sweeps"),
                                    "grid": {"seed": [0]}, "parallel": 1}))  # fmt: skip
    return path


def refused_while_a_run_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: Callable[[], Any]
) -> tuple[fedsim.Run, str]:
    """``second()`` called while a run in thread 'first' is under way (held after its first metrics line): the
    run, once it has finished, and the message of the error ``second()`` raised."""
    paused = Paused(monkeypatch, "first")
    first, out = in_thread("first", lambda: fedsim.run(small_config(tmp_path / "first")))
    try:
        paused.wait()
        with pytest.raises(FedsimError) as refused:
            second()
    finally:
        paused.resume()
        first.join(WAIT_S)
    return out["value"], str(refused.value)


def names_both(refused: str, refused_what: str, running: str, thread: str) -> bool:
    """Whether ``refused`` (one line) names what was refused, then what is running and in which thread."""
    return "\n" not in refused and bool(re.search(rf"\b{refused_what}\b.*\b{running}\b.*'{thread}'", refused))


def test_a_second_run_in_another_thread_is_refused_and_the_first_gets_its_numbers_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    alone = numbers(fedsim.run(small_config(tmp_path / "alone")))
    first, refused = refused_while_a_run_runs(tmp_path, monkeypatch, lambda: fedsim.run(small_config(tmp_path / "2")))
    assert names_both(refused, "a run", "a run", "first"), refused
    assert not (tmp_path / "2").exists()  # refused before it made its output.dir
    assert numbers(first) == alone
    assert numbers(fedsim.run(small_config(tmp_path / "after"))) == alone  # the process is free again


def test_a_run_while_a_sweep_runs_is_refused_and_the_sweep_gets_its_numbers_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    """The sweep in the main thread (it takes SIGTERM over, which only the main thread may), its one cell run in
    that thread too; a run from another thread meanwhile is refused."""
    alone = numbers(fedsim.run(small_config(tmp_path / "alone")))
    paused = Paused(monkeypatch, threading.main_thread().name)

    def run_when_the_sweep_is_under_way() -> fedsim.Run:
        try:
            paused.wait()
            return fedsim.run(small_config(tmp_path / "second"))
        finally:
            paused.resume()

    second, out = in_thread("second", run_when_the_sweep_is_under_way)
    try:
        sweep = fedsim.run_sweep(sweep_file(tmp_path), log=lambda line: None)
    finally:
        paused.resume()
        second.join(WAIT_S)
    assert "value" not in out and isinstance(out["error"], FedsimError), out
    assert names_both(str(out["error"]), "a run", "a sweep", "MainThread"), out
    assert not (tmp_path / "second").exists()
    (cell,) = sweep.runs
    assert numbers(cell) == alone


def test_a_sweep_while_a_run_runs_is_refused_before_it_makes_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    sweep = sweep_file(tmp_path)
    first, refused = refused_while_a_run_runs(tmp_path, monkeypatch, lambda: fedsim.run_sweep(sweep, log=print))
    assert names_both(refused, "a sweep", "a run", "first"), refused
    assert not (tmp_path / "sweeps").exists()
    assert first.finished


def test_fedsim_local_while_a_run_runs_is_refused_before_it_makes_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    finished = fedsim.run(small_config(tmp_path / "finished"))
    _, refused = refused_while_a_run_runs(tmp_path, monkeypatch, lambda: continue_locally(finished.dir, 0, 2, 1))
    assert names_both(refused, "fedsim local", "a run", "first"), refused
    assert not [p for p in finished.dir.iterdir() if p.name.startswith("local-")]
