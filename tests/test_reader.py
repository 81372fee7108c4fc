"""Reading a run record back (fedsim/record/reader.py), piece by piece: the summary's accuracies from the metrics
lines, the record version check, metrics lines in order and on the run's cadence, and the partition table. Whole run
directories read back and refused: tests/test_run_record.py; every file's bounds: tests/test_reading.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedsim.cadence import EvalCadence
from fedsim.errors import FedsimError
from fedsim.record.layout import RECORD_VERSION, VERSION_KEY
from fedsim.record.reader import check_version, final_accuracies, read_metrics, read_partition


def test_final_accuracies_are_the_last_and_best_client_mean_and_the_last_global() -> None:
    lines = [
        {"round": 2, "client_mean_acc": 0.4, "global_acc": 0.5},
        {"round": 4, "client_mean_acc": 0.7, "global_acc": 0.6},
        {"round": 6, "client_mean_acc": 0.6, "global_acc": 0.65},
    ]
    assert final_accuracies(lines) == {
        "final_client_mean_acc": 0.6, "best_client_mean_acc": 0.7, "final_global_acc": 0.65,
    }  # fmt: skip
    assert final_accuracies([]) == dict.fromkeys(("final_client_mean_acc", "best_client_mean_acc",
                                                  "final_global_acc"))  # fmt: skip


def test_personalised_accuracies_come_from_the_lines_that_have_them() -> None:
    lines = [
        {"round": 2, "client_mean_acc": 0.4, "personal_acc": 0.9},
        {"round": 4, "client_mean_acc": 0.5},  # eval.personal.every: no personalisation this round
        {"round": 6, "client_mean_acc": 0.6, "personal_acc": 0.8},
    ]
    final = final_accuracies(lines)
    assert (final["final_personal_acc"], final["best_personal_acc"]) == (0.8, 0.9)
    assert "final_personal_acc" not in final_accuracies(lines[1:2])  # off: no key at all


@pytest.mark.parametrize(
    ("version", "said"),
    [
        (None, f"a run record of version 0, older than this fedsim's ({RECORD_VERSION}): upgrade it with `fedsim "
               "record upgrade run`"),
        (RECORD_VERSION + 1, f"a run record of version {RECORD_VERSION + 1}, newer than this fedsim's"),
        (True, "record_version True is not a record version fedsim writes"),
        (2.0, "record_version 2.0 is not a record version fedsim writes"),
    ],
)
def test_another_record_version_is_refused_naming_what_to_do(version: object, said: str) -> None:
    record = {} if version is None else {VERSION_KEY: version}
    with pytest.raises(FedsimError) as err:
        check_version(Path("run/summary.json"), record)
    assert str(err.value).startswith(f"run/summary.json: {said}")
    assert check_version(Path("s.json"), {VERSION_KEY: RECORD_VERSION, "x": 1}) == {VERSION_KEY: RECORD_VERSION, "x": 1}


def write_metrics(run_dir: Path, rounds: list[int]) -> None:
    run_dir.mkdir(exist_ok=True)
    lines = [json.dumps({"round": r, "time_s": 1.0, "train_loss": 0.5, "client_mean_acc": 0.5}) for r in rounds]
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))


def test_metrics_lines_are_read_in_order_within_the_run_and_its_cadence(tmp_path: Path) -> None:
    write_metrics(tmp_path / "ok", [2, 4, 5])
    cadence = EvalCadence(2, 5)
    assert [m["round"] for m in read_metrics(tmp_path / "ok", last=5, cadence=cadence)] == [2, 4, 5]
    assert read_metrics(tmp_path / "none") == []  # not evaluated yet
    for name, rounds, line in (("back", [4, 2], 2), ("beyond", [2, 4, 6], 3), ("off", [2, 3], 2)):
        write_metrics(tmp_path / name, rounds)  # a round going back, past the last, or not one the run evaluates
        with pytest.raises(FedsimError) as err:
            read_metrics(tmp_path / name, last=5, cadence=cadence)
        assert str(err.value).startswith(f"metrics {tmp_path / name / 'metrics.jsonl'}, line {line}: "), err.value


def test_the_partition_table_reads_back_as_counts_per_split(tmp_path: Path) -> None:
    (tmp_path / "partition.csv").write_text(
        "split,client,cat,dog,total\ntrain,0,3,1,4\ntrain,1,0,5,5\ntest,0,2,0,2\ntest,1,0,1,1\n"
    )
    classes, counts = read_partition(tmp_path)
    assert classes == ["cat", "dog"]
    assert np.array_equal(counts["train"], [[3, 1], [0, 5]]) and np.array_equal(counts["test"], [[2, 0], [0, 1]])
    (tmp_path / "partition.csv").write_text("split,client,cat,total\ntrain,0,three,3\n")
    with pytest.raises(FedsimError, match=r"partition\.csv: not the partition table fedsim writes \(ValueError"):
        read_partition(tmp_path)
