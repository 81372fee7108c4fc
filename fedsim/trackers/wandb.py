"""Weights & Biases, offline by default: the run is written under ``<run dir>/wandb/`` and can be uploaded
later with ``wandb sync``; ``mode: online`` sends it as it runs (needs a W&B login and a network)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from fedsim.trackers.base import TRACKERS, Tracker


@TRACKERS.register("wandb")
class WandB(Tracker):
    """Config, metrics per round and the run's files in a W&B run (offline by default)."""

    class Params(Tracker.Params):
        mode: Literal["offline", "online"] = Field("offline", description="offline: written locally, for wandb sync")
        project: str = Field("fedsim", description="W&B project")
        entity: str | None = Field(None, description="W&B team or user; default your login's")

    requires = ("wandb", "wandb")

    def __init__(self, params: Any, run_dir: Path, name: str) -> None:
        super().__init__(params, run_dir, name)
        os.environ.setdefault("WANDB_SILENT", "true")  # its banner is not the run's output
        import wandb

        # one W&B run per run directory, resumed with it
        run_id = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
        self.run = wandb.init(
            mode=params.mode, project=params.project, entity=params.entity, name=run_dir.name, id=run_id,
            resume="allow", dir=str(run_dir), group=name, settings=wandb.Settings(console="off"),
        )  # fmt: skip

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_artifact(self, path: Path) -> None:
        self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self) -> None:
        self.run.finish()
