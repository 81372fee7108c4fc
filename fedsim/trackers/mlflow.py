"""MLflow: the config as parameters, every round's numbers as metrics (step = round), the run's files as
artefacts, in an MLflow experiment named after the run's ``name``."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from fedsim.errors import FedsimError
from fedsim.files import write_file
from fedsim.reading import KIB, read_text
from fedsim.record.layout import SUMMARY
from fedsim.trackers.base import TRACKERS, Tracker

RUN_ID_FILE = "mlflow_run_id"  # a resumed run continues the MLflow run it started
MAX_PARAM = 6000  # MLflow's limit on a parameter value's length


@TRACKERS.register("mlflow")
class MLflow(Tracker):
    """Params, metrics per round and the run's files in MLflow (default: a SQLite store in the run dir)."""

    class Params(Tracker.Params):
        tracking_uri: str | None = Field(
            None,
            description="where runs go: http(s)://server:port, sqlite:///path/mlflow.db, ...; default "
            "sqlite:///<run dir>/mlflow.db (one store per run; name a shared one to compare runs in MLflow)",
        )
        experiment: str | None = Field(None, description="MLflow experiment; default the run's name")

    requires = ("mlflow", "mlflow")

    def __init__(self, params: Any, run_dir: Path, name: str) -> None:
        super().__init__(params, run_dir, name)
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its store's set-up talk is not the run's
        uri = params.tracking_uri or f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        id_file = run_dir / RUN_ID_FILE
        if id_file.exists():  # resumed (a FIFO or a huge file there is refused by name, unread)
            self.run_id = read_text(id_file, "the MLflow run id", KIB, FedsimError).strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment_name = params.experiment or name
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(experiment_name, artifact_location=str(run_dir.resolve() / "mlflow"))
        )
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        write_file(id_file, self.run_id.encode())
        self.status = "FAILED"  # until the run's summary is logged

    def log_config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:MAX_PARAM]) for k, v in config.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))
        if path.name == SUMMARY:
            self.status = "FINISHED"

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status=getattr(self, "status", "FAILED"))
