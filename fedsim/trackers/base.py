"""The tracker contract: where a run's config, per-round metrics and files go besides its run directory.

A tracker is a :class:`Tracker` subclass registered in :data:`TRACKERS` (or named by an entry point of the
group ``fedsim.trackers``, or by a ``package.module:Class`` path), with its options in a nested ``Params``,
built as ``Tracker(params, run_dir, name)``. The run calls, in this order:

- :meth:`Tracker.log_config` once, with the whole config flattened (``{"train.rounds": 200, ...}``);
- :meth:`Tracker.log_metrics` after every evaluated round, with that round's numbers (lists and missing
  values left out: per-client lists stay in ``metrics.jsonl``);
- :meth:`Tracker.log_artifact` with each file the run directory holds at the end (config, partition,
  summary);
- :meth:`Tracker.close` once, however the run ended.

A resumed run builds its trackers again in the same run directory: a tracker that can continue its own
record of the run keeps what it needs to there (MLflow its run id).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, ClassVar

from fedsim.errors import ConfigError
from fedsim.registry import PluginParams, Registry


class Tracker:
    """Base of every tracker (see the module's docstring for the contract)."""

    class Params(PluginParams):
        pass

    # the module a tracker imports and the fedsim extra that installs it: checked before a run starts
    requires: ClassVar[tuple[str, str] | None] = None

    def __init__(self, params: Any, run_dir: Path, name: str) -> None:
        self.params, self.run_dir, self.name = params, run_dir, name

    @classmethod
    def check_installed(cls, where: str) -> None:
        """A missing optional dependency, as one line naming the extra that brings it."""
        if cls.requires is not None and importlib.util.find_spec(cls.requires[0]) is None:
            module, extra = cls.requires
            raise ConfigError(f"{where}: needs {module}, which is not installed: pip install 'fedsim[{extra}]'")

    def log_config(self, config: dict[str, Any]) -> None:
        pass

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_artifact(self, path: Path) -> None:
        pass

    def close(self) -> None:
        pass


TRACKERS: Registry[Tracker] = Registry("trackers", Tracker)
