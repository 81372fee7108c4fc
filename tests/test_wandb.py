"""The Weights & Biases tracker (fedsim/trackers/wandb.py): an offline run read back with W&B's own reader of
its log."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from tests.tracker_support import ROUNDS, numbers_by_round, tracked_run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="pip install 'fedsim[wandb]'")
@pytest.mark.slow
def test_wandb_offline_run_read_back_with_wandbs_reader(tmp_path: Path) -> None:
    run = tracked_run(tmp_path, "wandb")
    (log,) = (run.dir / "wandb").glob("offline-run-*/run-*.wandb")
    # W&B's own reader of its offline log: one JSON record per line
    out = subprocess.run(["wandb", "leet", "inspect", "--json", str(log)], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    history = {r["history"]["item"]["_step"]: r["history"]["item"] for r in records if r["type"] == "history"}
    for key, by_round in numbers_by_round(run).items():
        assert {step: item[key] for step, item in history.items() if key in item} == by_round
    config = {}
    for r in records:  # the run's first record and later updates
        update = (r.get("run", {}).get("config") or r.get("config") or {}).get("update", {})
        config.update(update)
    assert config["train.rounds"] == ROUNDS and config["model.norm.name"] == "ln"
    saved = {f["path"] for r in records if r["type"] == "files" for f in r["files"]["files"]}
    assert {"config.yaml", "partition.csv", "summary.json"} <= saved
