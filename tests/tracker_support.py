"""What the trackers' tests share (tests/test_trackers.py, test_tensorboard.py, test_mlflow.py, test_wandb.py):
a small run with the trackers given, and the numbers every tracker must have recorded of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fedsim
from tests.conftest import small_config

ROUNDS = 2


def tracked_run(tmp_path: Path, *trackers: Any) -> fedsim.Run:
    raw = small_config(tmp_path, train={"rounds": ROUNDS}, eval={"every": 1})
    raw["output"].update(run_dir=str(tmp_path / "run"), trackers=list(trackers))
    return fedsim.run(raw)


def numbers_by_round(run: fedsim.Run) -> dict[str, dict[int, float]]:
    """metrics.jsonl's numbers, key -> {round: value}: what every tracker must have recorded."""
    frame = run.metrics
    keys = [k for k in frame.columns if k != "round" and frame[k].map(lambda v: isinstance(v, float)).all()]
    return {k: {int(r): float(v) for r, v in frame[k].items()} for k in keys}
