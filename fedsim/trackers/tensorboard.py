"""TensorBoard: every round's numbers as scalars in ``<run dir>/tb/`` (``tensorboard --logdir <run dir>``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedsim.files import check_links
from fedsim.record.paths import make_dir
from fedsim.trackers.base import TRACKERS, Tracker


@TRACKERS.register("tensorboard")
class TensorBoard(Tracker):
    """Scalars per round in <run dir>/tb/ (TensorBoard's event files)."""

    def __init__(self, params: Any, run_dir: Path, name: str) -> None:
        super().__init__(params, run_dir, name)
        from torch.utils.tensorboard import SummaryWriter

        check_links(run_dir, ["tb"])
        make_dir(run_dir / "tb", "output.trackers (tensorboard's tb/ directory)")
        self.writer = SummaryWriter(str(run_dir / "tb"))

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
