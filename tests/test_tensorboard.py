"""The TensorBoard tracker (fedsim/trackers/tensorboard.py): every round's numbers, read back with
TensorBoard's own event reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tracker_support import numbers_by_round, tracked_run

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tensorboard_scalars_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tracked_run(tmp_path, "tensorboard")
    events = EventAccumulator(str(run.dir / "tb"))
    events.Reload()
    for key, by_round in numbers_by_round(run).items():
        recorded = {e.step: e.value for e in events.Scalars(key)}
        assert recorded == pytest.approx(by_round, rel=1e-6)  # TensorBoard stores float32
