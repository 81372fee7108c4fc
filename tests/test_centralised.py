"""The centralised baseline (partitions/centralised.py): the split, one client holding everything; and end to end,
the same steps per round, scored the same way; a federated config refused with one line before training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fedsim.app.cli import main
from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.errors import ConfigError
from fedsim.sweep.plan import plan
from tests.conftest import small_config, write_config
from tests.test_partitions import TEST, TRAIN, split


def centralised(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    return {**small_config(tmp_path, **sections), "partition": {"name": "centralised"}}


def test_centralised_run_learns_and_scores_the_whole_test_set(tmp_path: Path) -> None:
    cfg = centralised(tmp_path, train={"num_clients": 1, "rounds": 4, "local_steps": 10})
    run_dir = Path(run(parse_config(cfg))["run_dir"])
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # 40 SGD steps of batch 16 on MNIST: far above chance (10%); this MLP reaches 80% (76% after 20 steps).
    assert lines[-1]["round"] == 4 and lines[-1]["client_mean_acc"] > 0.7
    assert lines[-1]["client_mean_acc"] > lines[0]["client_mean_acc"]
    # one client holding the whole test set: the paper's client-mean accuracy is the global accuracy
    assert lines[-1]["client_acc"] == [lines[-1]["client_mean_acc"]]
    assert lines[-1]["client_mean_acc"] == pytest.approx(lines[-1]["global_acc"], abs=1e-12)
    counts = (run_dir / "partition.csv").read_text().splitlines()
    assert counts[1].endswith(",5000") and counts[2].endswith(",1000")  # train, then test: everything


def test_centralised_with_many_clients_is_one_line_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = centralised(tmp_path)  # train.num_clients: 4
    assert main(["run", str(write_config(tmp_path, cfg))]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # the partition, the field and its value (wording: the corpus)
    assert len(err) == 1 and err[0].startswith("fedsim: error: partition 'centralised'"), err
    assert "train.num_clients" in err[0] and "got 4" in err[0], err
    assert not list((tmp_path / "runs").rglob("metrics.jsonl"))


def test_a_sweep_cell_with_many_clients_fails_at_plan(tmp_path: Path) -> None:
    write_config(tmp_path, small_config(tmp_path), "base.yaml")
    sweep = {"base": "base.yaml", "grid": {"partition": [{"name": "iid"}, {"name": "centralised"}]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    with pytest.raises(ConfigError, match=r"sweep cell partition=centralised\b.*train\.num_clients\b.*\bgot 4\b"):
        plan(tmp_path / "s.yaml")  # before the iid cell, or any, has run


def test_centralised_is_one_client_with_everything() -> None:
    part = split("centralised", 1, seed=0)
    np.testing.assert_array_equal(part.train[0], np.arange(len(TRAIN)))
    np.testing.assert_array_equal(part.test[0], np.arange(len(TEST)))
    assert part.train[0].dtype == part.test[0].dtype == np.int64 and part.note == ""


@pytest.mark.parametrize("num_clients", [2, 10])
def test_centralised_refuses_more_than_one_client(num_clients: int) -> None:
    with pytest.raises(ConfigError, match=rf"train\.num_clients\b.*\b1\b.*\b{num_clients}\b"):
        split("centralised", num_clients, seed=0)


