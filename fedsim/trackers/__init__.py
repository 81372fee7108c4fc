"""Experiment trackers: TensorBoard, MLflow, Weights & Biases, or your own (``output.trackers``).

:mod:`fedsim.trackers.base` has the contract; :class:`Trackers` drives the ones a run names.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from fedsim.errors import ConfigError
from fedsim.record.layout import TRACKED
from fedsim.registry import Resolved
from fedsim.trackers import mlflow, tensorboard, wandb  # noqa: F401 (the built-ins register themselves on import)
from fedsim.trackers.base import TRACKERS, Tracker


def numbers(record: dict[str, Any]) -> dict[str, float]:
    """A metrics line's finite numbers (not its round, lists or missing values)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k != "round" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


class Trackers:
    """The trackers of one run, driven together by its run directory.

    A tracker that fails (a tracking server gone, a full disk, a plugin's bug) is reported in one line naming
    it and its method and is not called again: the run goes on, and ``metrics.jsonl`` keeps every number."""

    def __init__(self, trackers: list[Tracker], run_dir: Path) -> None:
        self.trackers, self.run_dir = list(trackers), run_dir

    def _each(self, method: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as err:  # noqa: BLE001 (whatever a tracker raises, the run and its files go on)
                self.trackers.remove(tracker)
                if method != "close":
                    with suppress(Exception):  # what it holds open, if it can; it has been reported once
                        tracker.close()
                name = TRACKERS.name_of(type(tracker))
                print(f"fedsim: warning: tracker {name!r} failed in {method} and is stopped ({type(err).__name__}: "
                      f"{err}); metrics.jsonl has every number", file=sys.stderr)  # fmt: skip

    def log_config(self, config: dict[str, Any]) -> None:
        self._each("log_config", lambda t: t.log_config(config))

    def log_metrics(self, record: dict[str, Any]) -> None:
        values = numbers(record)
        self._each("log_metrics", lambda t: t.log_metrics(record["round"], values))

    def close(self) -> None:
        """The run directory's files to each tracker, then each closed."""
        files = [self.run_dir / name for name in TRACKED if (self.run_dir / name).is_file()]

        def log_files(tracker: Tracker) -> None:
            for path in files:
                tracker.log_artifact(path)

        self._each("log_artifact", log_files)
        self._each("close", lambda t: t.close())


def resolve_trackers(blocks: list[Any], where: str = "output.trackers") -> list[Resolved[Tracker]]:
    """Each ``{name: ..., <options>}`` block looked up, its options validated and its optional dependency
    checked, and no tracker named twice (each writes where the run directory says: ``tb/``, the MLflow run
    id, the W&B run; twice, every number would be logged twice): before a run starts."""
    resolved: list[Resolved[Tracker]] = []
    for i, block in enumerate(blocks):
        tracker = TRACKERS.resolve(block.name, block.options, f"{where}[{i}]")
        if (first := next((j for j, r in enumerate(resolved) if r.cls is tracker.cls), None)) is not None:
            raise ConfigError(
                f"{where}[{i}]: {block.name!r} is {where}[{first}] again ({blocks[first].name!r}); give each "
                "tracker once"
            )
        tracker.cls.check_installed(f"{where}[{i}] ({block.name})")
        resolved.append(tracker)
    return resolved


def open_trackers(blocks: list[Any], run_dir: Path, name: str) -> Trackers:
    """The trackers a run's ``output.trackers`` names, built for its run directory."""
    return Trackers([tracker.create(run_dir, name) for tracker in resolve_trackers(blocks)], run_dir)


__all__ = ["TRACKERS", "Tracker", "Trackers", "numbers", "open_trackers", "resolve_trackers"]
