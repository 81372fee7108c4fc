"""A dataset generated per client (fedsim.data.generated; Synthetic(α, β) is the built-in): what a run of it may
ask for, and a million-client federation run as a user runs it, whose cost is set by the clients it samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fedsim.app.cli import main
from fedsim.record.checkpoint import Checkpoint
from fedsim.record.reader import read_metrics
from tests.conftest import one_line, run_cli, write_config
from tests.test_resume import killed_at

MILLION = 1_000_000


def synthetic_config(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    """FedProx's Synthetic(1, 1), logistic regression, 100 of a million clients a round, inline on one thread."""
    cfg: dict[str, Any] = {
        "name": "synthetic",
        "seed": 0,
        "data": {"dataset": {"name": "synthetic", "alpha": 1.0, "beta": 1.0}, "augment": False},
        "partition": {"name": "natural"},
        "model": {"name": "mlp", "hidden": []},
        "train": {"rounds": 3, "num_clients": MILLION, "clients_per_round": 100, "local_steps": 5, "batch_size": 10,
                  "lr": 0.01},  # fmt: skip
        "eval": {"every": 1, "global_test": False, "clients": 50},
        "output": {"run_dir": str(tmp_path / "run"), "progress": False, "checkpoint_every": 1},
        "simulation": {"backend": "inline", "threads": 1},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
    return cfg


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("eval.global_test=true", "eval.global_test: true"),
        ("data.augment=true", "data.augment: true"),
        ("data.normalize=true", "data.normalize: true"),
        ("diagnostics.features=true", "diagnostics: a probe batch"),
        ("diagnostics.probe_size=64", "diagnostics: a probe batch"),
        ("partition.name=dirichlet", "partition: 'dirichlet'"),
        ("partition.name=iid", "partition: 'iid'"),
        ("simulation.backend=ray", "simulation.backend: ray"),
        ("engine=flower", "engine: flower"),
        ("simulation.ray_address=auto", "simulation.ray_address"),
        ("eval.clients=1000001", "eval.clients"),
    ],
)
def test_what_a_generated_federation_cannot_serve_is_refused_in_one_line_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, field: str
) -> None:
    code, err = run_cli(capsys, write_config(tmp_path, synthetic_config(tmp_path)), override)
    assert code == 2 and field in one_line(err)
    assert not (tmp_path / "run").exists()


def test_the_natural_partition_of_a_loaded_dataset_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import small_config

    code, err = run_cli(capsys, write_config(tmp_path, small_config(tmp_path, partition="natural")))
    assert code == 2 and "partition: 'natural'" in one_line(err) and "'npz'" in one_line(err)


def test_more_clients_than_a_finite_dataset_has_samples_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import small_config

    cfg = small_config(tmp_path, train={"num_clients": MILLION, "clients_per_round": 100})
    code, err = run_cli(capsys, write_config(tmp_path, cfg))
    assert code == 2 and "num_clients must be in 1.." in one_line(err) and "got 1000000" in one_line(err)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fedavg", "scaffold"])
def test_a_million_client_run_trains_and_scores_the_clients_it_samples_and_resumes_to_the_same_numbers(
    tmp_path: Path, strategy: str
) -> None:
    """``fedsim run`` of 1,000,000 clients, 100 a round, as a user runs it (its own process); SCAFFOLD's c_i on
    disk beyond a tiny state_memory_mb. Killed after round 2's checkpoint and resumed, it ends with the numbers
    of the run that was not."""
    cfg = synthetic_config(tmp_path, strategy={"name": strategy}, simulation={"state_memory_mb": 0.01})
    whole = _run(tmp_path, cfg, "whole")
    lines = read_metrics(whole)
    assert [m["round"] for m in lines] == [1, 2, 3]
    for m in lines:
        scored = m["eval_clients"]
        assert len(scored) == 50 == len(set(scored)) == len(m["client_acc"]) and scored == sorted(scored)
        assert 0 <= scored[0] and scored[-1] < MILLION
        assert 0 < m["client_mean_acc"] < 1
    assert lines[0]["eval_clients"] != lines[1]["eval_clients"]  # a sample of its own each evaluation
    assert not (whole / "partition.csv").exists()  # no table of a million rows
    if strategy == "scaffold":  # every checkpoint recorded the state of the clients that trained, and only theirs
        assert len(Checkpoint.load(whole).client_state) == 300
    killed = tmp_path / "killed"
    killed_at(tmp_path, write_config(tmp_path, {**cfg, "output": {**cfg["output"], "run_dir": str(killed)}}), 3)
    assert main(["run", "--resume", str(killed)]) == 0
    assert _numbers(read_metrics(killed)) == _numbers(lines)


def _run(tmp_path: Path, cfg: dict[str, Any], name: str) -> Path:
    cfg = {**cfg, "output": {**cfg["output"], "run_dir": str(tmp_path / name)}}
    res = subprocess.run(
        [sys.executable, "-m", "fedsim.app.cli", "run", str(write_config(tmp_path, cfg, f"{name}.yaml"))],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp_path / name


def _numbers(lines: list[dict[str, Any]]) -> list[str]:
    keep = ("round", "train_loss", "client_mean_acc", "client_acc", "eval_clients")
    return [json.dumps({k: m.get(k) for k in keep}) for m in lines]


def test_the_shipped_million_client_config_runs_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = Path(__file__).resolve().parents[1] / "configs" / "synthetic_million.yaml"
    overrides = ("train.rounds=1", "eval.every=1", "eval.clients=20", "output.checkpoint_every=0",
                 f"output.run_dir={tmp_path / 'run'}", "output.progress=false", "simulation.threads=1")  # fmt: skip
    code, err = run_cli(capsys, config, *overrides)
    assert code == 0, err
    (line,) = read_metrics(tmp_path / "run")
    assert len(line["eval_clients"]) == 20 and line["round"] == 1 and 0 <= line["client_mean_acc"] <= 1
