"""The MLflow tracker (fedsim/trackers/mlflow.py): its store read back with MLflow's own client, and a resumed
run continuing its MLflow run."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

import fedsim
from tests.conftest import small_config
from tests.tracker_support import ROUNDS, numbers_by_round, tracked_run

pytestmark = pytest.mark.usefixtures("one_thread")


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
