"""Experiment trackers (``output.trackers``): what each records, read back with the tracker's own tools
(MLflow's client, W&B's offline log reader, TensorBoard's event reader), a user's own tracker by dotted
path, a tracker that fails, and a missing optional dependency."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import fedsim
from fedsim.errors import ConfigError
from tests.conftest import small_config

ROUNDS = 2
PLUGIN = "tests.plugins.call_log_tracker:CallLog"


pytestmark = pytest.mark.usefixtures("one_thread")


def tracked_run(tmp_path: Path, *trackers: Any) -> fedsim.Run:
    raw = small_config(tmp_path, train={"rounds": ROUNDS}, eval={"every": 1})
    raw["output"].update(run_dir=str(tmp_path / "run"), trackers=list(trackers))
    return fedsim.run(raw)


def numbers_by_round(run: fedsim.Run) -> dict[str, dict[int, float]]:
    """metrics.jsonl's numbers, key -> {round: value}: what every tracker must have recorded."""
    frame = run.metrics
    keys = [k for k in frame.columns if k != "round" and frame[k].map(lambda v: isinstance(v, float)).all()]
    return {k: {int(r): float(v) for r, v in frame[k].items()} for k in keys}


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


def test_tensorboard_scalars_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tracked_run(tmp_path, "tensorboard")
    events = EventAccumulator(str(run.dir / "tb"))
    events.Reload()
    for key, by_round in numbers_by_round(run).items():
        recorded = {e.step: e.value for e in events.Scalars(key)}
        assert recorded == pytest.approx(by_round, rel=1e-6)  # TensorBoard stores float32


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="pip install 'fedsim[mlflow]'")
@pytest.mark.slow
def test_mlflow_store_read_back_with_mlflows_client(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = tracked_run(tmp_path, "mlflow")
    client = MlflowClient(tracking_uri=f"sqlite:///{run.dir / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "t"]
    (record,) = client.search_runs([experiment.experiment_id])
    assert record.info.status == "FINISHED" and record.info.run_name == "run"
    assert record.data.params["train.rounds"] == str(ROUNDS) and record.data.params["strategy.name"] == "fedavg"
    for key, by_round in numbers_by_round(run).items():
        history = client.get_metric_history(record.info.run_id, key)
        assert {m.step: m.value for m in history} == by_round
    assert sorted(a.path for a in client.list_artifacts(record.info.run_id)) == [
        "config.yaml", "partition.csv", "summary.json",
    ]  # fmt: skip


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


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="pip install 'fedsim[mlflow]'")
@pytest.mark.slow
def test_a_resumed_run_continues_its_mlflow_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.app import ArrayRecord
    from mlflow.tracking import MlflowClient

    from fedsim.server.reporter import RoundReporter

    report = RoundReporter.round_done

    def interrupt_in_round_2(self: RoundReporter, server_round: int, arrays: ArrayRecord, *facts: Any) -> Any:
        if server_round == 2:  # after round 1's metrics and checkpoint: Ctrl-C
            raise KeyboardInterrupt
        return report(self, server_round, arrays, *facts)

    raw = small_config(tmp_path, train={"rounds": ROUNDS}, eval={"every": 1})
    raw["output"].update(run_dir=str(tmp_path / "run"), trackers=["mlflow"], checkpoint_every=1)
    monkeypatch.setattr(RoundReporter, "round_done", interrupt_in_round_2)
    with pytest.raises(KeyboardInterrupt):
        fedsim.run(raw)
    monkeypatch.undo()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    (stopped,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert stopped.info.status == "FAILED"  # closed, however the run ended

    run = fedsim.resume(tmp_path / "run")
    (record,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert record.info.run_id == stopped.info.run_id and record.info.status == "FINISHED"
    history = client.get_metric_history(record.info.run_id, "client_mean_acc")
    assert sorted(m.step for m in history) == [1, 2]
    assert {m.step: m.value for m in history} == numbers_by_round(run)["client_mean_acc"]


def test_the_old_tensorboard_flag_is_the_tracker_with_a_warning(tmp_path: Path) -> None:
    from fedsim.config import DeprecatedConfig

    raw = small_config(tmp_path)
    with pytest.warns(DeprecatedConfig, match=r"output.tensorboard is deprecated .* output.trackers: \[tensorboard\]"):
        cfg = fedsim.make_config(raw, ["output.tensorboard=true"])
    assert [t.name for t in cfg.output.trackers] == ["tensorboard"]
    assert fedsim.make_config(raw, ["output.tensorboard=false"]).output.trackers == []  # old run dirs: no word
