"""A test tracker that appends every call it gets to ``<run dir>/tracker-calls.jsonl``; ``fail_in`` names a
method that raises instead. Referenced from YAML as ``tests.plugins.call_log_tracker:CallLog``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedsim.trackers import Tracker


class CallLog(Tracker):
    """Logs each call as a JSON line (test plugin)."""

    class Params(Tracker.Params):
        fail_in: str | None = None

    def _log(self, method: str, *args: Any) -> None:
        if method == self.params.fail_in:
            raise RuntimeError(f"injected failure in {method}")
        with open(self.run_dir / "tracker-calls.jsonl", "a") as f:
            f.write(json.dumps([method, *args]) + "\n")

    def log_config(self, config: dict[str, Any]) -> None:
        self._log("log_config", config)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._log("log_metrics", step, metrics)

    def log_artifact(self, path: Path) -> None:
        self._log("log_artifact", path.name)

    def close(self) -> None:
        self._log("close")
