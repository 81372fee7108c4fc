"""Experiment trackers (``output.trackers``) across modules: the contract's calls in order to a user's own tracker
by dotted path, a tracker that fails, what is refused before a run (an unknown tracker, a bad option, a missing
optional dependency, a tracker given twice), the old ``output.tensorboard`` flag. Each built-in tracker, read back
with its own tools: tests/test_tensorboard.py, test_mlflow.py, test_wandb.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

import fedsim
from fedsim.errors import ConfigError
from tests.conftest import small_config
from tests.tracker_support import ROUNDS, numbers_by_round, tracked_run

PLUGIN = "tests.plugins.call_log_tracker:CallLog"


pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_users_tracker_gets_config_every_round_files_and_close_in_order(tmp_path: Path) -> None:
    run = tracked_run(tmp_path, PLUGIN)
    calls = [json.loads(x) for x in (run.dir / "tracker-calls.jsonl").read_text().splitlines()]
    assert [c[0] for c in calls] == ["log_config"] + ["log_metrics"] * ROUNDS + ["log_artifact"] * 3 + ["close"]
    assert calls[0][1]["train.rounds"] == ROUNDS and calls[0][1]["model.norm.name"] == "ln"
    expected = numbers_by_round(run)
    for _, step, values in calls[1 : 1 + ROUNDS]:
        assert values == {k: v[step] for k, v in expected.items() if step in v}
    assert [c[1] for c in calls if c[0] == "log_artifact"] == ["config.yaml", "partition.csv", "summary.json"]


def test_a_failing_tracker_is_reported_once_and_the_run_keeps_its_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tracked_run(tmp_path, {"name": PLUGIN, "fail_in": "log_metrics"})
    assert run.finished and len(run.metrics) == ROUNDS
    err = capsys.readouterr().err
    assert err.count("fedsim: warning: tracker") == 1
    assert f"tracker '{PLUGIN}' failed in log_metrics and is stopped (RuntimeError: injected failure" in err
    calls = [json.loads(x)[0] for x in (run.dir / "tracker-calls.jsonl").read_text().splitlines()]
    assert calls == ["log_config", "close"]  # stopped: closed at once, never called again


def test_unknown_tracker_bad_option_and_missing_extra_fail_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(fedsim.FedsimError, match=r"output.trackers\[0\].name: .*'mlfow'"):
        tracked_run(tmp_path, "mlfow")
    with pytest.raises(fedsim.FedsimError, match=r"output.trackers\[0\].mode\b.*'sometimes'"):
        tracked_run(tmp_path, {"name": "wandb", "mode": "sometimes"})
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else find_spec(name, *a))
    with pytest.raises(fedsim.FedsimError, match=r"pip install 'fedsim\[mlflow\]'"):  # the command to run
        tracked_run(tmp_path, "mlflow")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "twice",
    [["tensorboard", "tensorboard"], ["tensorboard", "fedsim.trackers.tensorboard:TensorBoard"],
     [PLUGIN, {"name": PLUGIN, "fail_in": "close"}]],
    ids=["same-name", "name-and-path", "other-options"],
)  # fmt: skip
def test_a_tracker_given_twice_is_refused_before_the_run(tmp_path: Path, twice: list[Any]) -> None:
    """Every tracker writes where the run directory says (tb/, the MLflow run id, the W&B run): twice, every
    number would be logged twice."""
    with pytest.raises(ConfigError, match=r"^output.trackers\[1\]: .*output.trackers\[0\]"):
        tracked_run(tmp_path, *twice)
    assert not (tmp_path / "run").exists()


def test_the_old_tensorboard_flag_is_the_tracker_with_a_warning(tmp_path: Path) -> None:
    from fedsim.config import DeprecatedConfig

    raw = small_config(tmp_path)
    with pytest.warns(DeprecatedConfig, match=r"output.tensorboard is deprecated .* output.trackers: \[tensorboard\]"):
        cfg = fedsim.make_config(raw, ["output.tensorboard=true"])
    assert [t.name for t in cfg.output.trackers] == ["tensorboard"]
    assert fedsim.make_config(raw, ["output.tensorboard=false"]).output.trackers == []  # old run dirs: no word
