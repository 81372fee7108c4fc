"""A run directory read back whole (fedsim/record/run.py, ``read_run``): what it returns of a finished run, of one
still running, of one before its first evaluation or without its partition table; which record an unfinished run's
files are held to (summary.json, else progress.json, else a resume's checkpoint.pt); a run short of its last
evaluation, one with an evaluation lost, a partition table of another client count and a directory without its
config.yaml refused or said; and a live run read again, a bounded number of times, until its progress.json holds
still. The run directories are written here through fedsim's own writer (RunDir), without training. The same checks
on real runs edited on disk, through report, plot and the API: tests/test_run_record.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from flwr.app import ArrayRecord

import fedsim.record.run as run_module
from fedsim.config import RunConfig
from fedsim.config_file import parse_config
from fedsim.errors import FedsimError
from fedsim.record.checkpoint import Checkpoint
from fedsim.record.reader import final_accuracies
from fedsim.record.run import read_run
from fedsim.record.verify import LostEvaluations
from fedsim.record.writer import RunDir
from tests.conftest import small_config

CLASSES = [f"c{k}" for k in range(10)]
TRAIN = np.arange(40, dtype=np.int64).reshape(4, 10) % 7 + 1  # clients x classes
TEST = np.arange(40, dtype=np.int64).reshape(4, 10) % 3


def line(server_round: int) -> dict[str, Any]:
    """The metrics line of ``server_round``: numbers of its own, so a line of another round reads otherwise."""
    return {"round": server_round, "train_loss": 2.0 / server_round, "client_mean_acc": server_round / 10,
            "client_acc": [server_round / 10, None, server_round / 20, 0.5]}  # fmt: skip


def config(tmp_path: Path, run_dir: Path, rounds: int = 4) -> RunConfig:
    return parse_config(small_config(tmp_path, train={"rounds": rounds}, eval={"every": 2},
                                     output={"run_dir": str(run_dir)}))  # fmt: skip


def written(
    tmp_path: Path,
    done: int = 4,
    finished: bool = True,
    evaluated: tuple[int, ...] | None = None,
    clients: int = 4,
    partition: bool = True,
    summary_rounds: int = 4,
) -> Path:
    """A run of 4 rounds evaluated every 2, as fedsim writes it after round ``done`` (``finished``: with its summary):
    its config, its partition table (``clients`` rows a split), the lines of the rounds ``evaluated`` (default: each
    evaluation round so far) and progress.json after every round; its summary says ``summary_rounds`` rounds."""
    run_dir = tmp_path / "run"
    cfg = config(tmp_path, run_dir)
    out = RunDir(run_dir)
    out.write_config(cfg)
    if partition:
        out.write_partition(TRAIN[:clients], TEST[:clients], CLASSES)
    for server_round in range(1, done + 1):
        if server_round in (evaluated if evaluated is not None else (2, 4)):
            out.append_metrics(line(server_round))
        out.write_progress(server_round, 2.0 / server_round, None)
    if finished:
        out.write_summary({"name": "t", "rounds": summary_rounds, **final_accuracies(out.read_metrics())})
    return run_dir


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``tree``'s leaves by dotted path."""
    leaves: dict[str, Any] = {}
    for key, value in tree.items():
        leaves.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {prefix + key: value})
    return leaves


# --- what is read -----------------------------------------------------------------------------


def test_a_finished_run_reads_back_as_written(tmp_path: Path) -> None:
    run_dir = written(tmp_path)
    record = read_run(str(run_dir))
    assert record["dir"] == run_dir and isinstance(record["dir"], Path)
    config = record["config"]
    assert config == flat(yaml.safe_load((run_dir / "config.yaml").read_text()))  # the file's leaves, flattened
    assert (config["train.rounds"], config["eval.every"], config["model.hidden"], config["name"]) == (4, 2, [64], "t")
    assert record["summary"] == json.loads((run_dir / "summary.json").read_text())
    assert record["summary"]["final_client_mean_acc"] == 0.4 and record["summary"]["best_client_mean_acc"] == 0.4
    assert record["metrics"] == [line(2), line(4)]
    assert record["partition"] is not None
    classes, counts = record["partition"]
    assert classes == CLASSES and sorted(counts) == ["test", "train"]
    assert np.array_equal(counts["train"], TRAIN) and np.array_equal(counts["test"], TEST)


@pytest.mark.parametrize(("done", "rounds"), [(0, []), (1, []), (2, [2]), (3, [2])])
def test_an_unfinished_run_has_no_summary_and_the_lines_so_far(tmp_path: Path, done: int, rounds: list[int]) -> None:
    record = read_run(written(tmp_path, done, finished=False))
    assert record["summary"] is None and [m["round"] for m in record["metrics"]] == rounds
    assert record["metrics"] == [line(r) for r in rounds] and record["config"]["train.rounds"] == 4


def test_a_run_without_a_partition_table_has_none(tmp_path: Path) -> None:
    record = read_run(written(tmp_path, partition=False))
    assert record["partition"] is None and record["metrics"] == [line(2), line(4)]


# --- which record the files are held to ---------------------------------------------------------


def edit_round_2(run_dir: Path) -> None:
    """Round 2's line of metrics.jsonl with another client-mean accuracy, written by hand."""
    edited = [{**m, "client_mean_acc": 0.9} if m["round"] == 2 else m for m in read_run_lines(run_dir)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in edited))


def read_run_lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_finished_run_is_held_to_its_summary_not_its_progress(tmp_path: Path) -> None:
    run_dir = written(tmp_path)
    (run_dir / "progress.json").write_text("not what fedsim writes")  # a finished run's is not read
    assert read_run(run_dir)["metrics"] == [line(2), line(4)]
    edit_round_2(run_dir)
    with pytest.raises(FedsimError) as err:
        read_run(run_dir)
    message = str(err.value)  # the file and the record it is held to (wording: the corpus)
    assert message.startswith(str(run_dir / "metrics.jsonl")) and "summary.json" in message, message


def test_an_unfinished_run_is_held_to_its_progress(tmp_path: Path) -> None:
    run_dir = written(tmp_path, 3, finished=False)
    progress = (run_dir / "progress.json").read_text()
    edit_round_2(run_dir)
    with pytest.raises(FedsimError) as err:
        read_run(run_dir)
    message = str(err.value)  # wording: the corpus
    assert message.startswith(str(run_dir / "metrics.jsonl")) and "progress.json" in message, message
    (run_dir / "metrics.jsonl").write_text(json.dumps(line(2)) + "\n")
    assert read_run(run_dir)["metrics"] == [line(2)]
    (run_dir / "progress.json").write_text(progress[:-1])  # cut short: read, and named
    with pytest.raises(FedsimError, match=re.escape(str(run_dir / "progress.json"))):
        read_run(run_dir)


def test_a_summary_of_other_rounds_than_its_config_is_refused(tmp_path: Path) -> None:
    run_dir = written(tmp_path, summary_rounds=5)  # its checksums its own: a summary of another run's config
    with pytest.raises(FedsimError) as err:
        read_run(run_dir)
    message = str(err.value)  # both counts and the field (wording: the corpus)
    assert message.startswith(f"{run_dir}: ") and "summary.json" in message and "train.rounds" in message, message


def resume_under_way(tmp_path: Path, kept: list[dict[str, Any]]) -> Path:
    """A run stopped after round 4 with a checkpoint of round 2 holding ``kept``, whose resume removed progress.json."""
    run_dir = written(tmp_path, 4, finished=False)
    Checkpoint(
        round=2, arrays=ArrayRecord(), server_state=ArrayRecord(), metrics=kept, elapsed_s=1.0, run_key="run-k",
        client_state={}, config=config(tmp_path, run_dir).to_json(), data_sha256="cd" * 32, rng={}, failed={},
    ).save(run_dir)  # fmt: skip
    (run_dir / "progress.json").unlink()
    return run_dir


def test_a_resume_under_way_is_held_to_its_checkpoint(tmp_path: Path) -> None:
    run_dir = resume_under_way(tmp_path, [line(2)])
    # the lines the checkpoint holds, then the stopped run's after it
    assert read_run(run_dir)["metrics"] == [line(2), line(4)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in (line(4),)))  # round 2's lost
    with pytest.raises(FedsimError) as err:
        read_run(run_dir)
    message = str(err.value)  # the run, the file and the checkpoint (wording: the corpus)
    assert message.startswith(f"{run_dir}: ") and re.search(r"metrics\.jsonl\b.*\bcheckpoint\.pt\b", message), message


def test_a_resume_under_way_refuses_a_config_edited_since_its_checkpoint(tmp_path: Path) -> None:
    run_dir = resume_under_way(tmp_path, [line(2)])
    tree = yaml.safe_load((run_dir / "config.yaml").read_text())
    tree["train"]["lr"] = 0.2
    (run_dir / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    with pytest.raises(FedsimError) as err:
        read_run(run_dir)
    message = str(err.value)  # the run, the field and both values (wording: the corpus)
    assert message.startswith(f"{run_dir}: ") and "train.lr" in message and "0.05" in message, message


def test_a_resume_stopped_before_its_first_evaluation_reads_no_lines(tmp_path: Path) -> None:
    run_dir = resume_under_way(tmp_path, [])
    (run_dir / "metrics.jsonl").unlink()
    assert read_run(run_dir)["metrics"] == []


# --- what a run must hold -----------------------------------------------------------------------


@pytest.mark.parametrize(("evaluated", "said"), [((2,), r"\bround 2\b.*\b4 rounds\b"), ((), r"metrics\.jsonl\b")])
def test_a_finished_run_short_of_its_last_evaluation_is_refused(
    tmp_path: Path, evaluated: tuple[int, ...], said: str
) -> None:
    """Files that agree with its summary (written so), but no line of round 4, the last, which a run evaluates."""
    run_dir = written(tmp_path, evaluated=evaluated)
    with pytest.raises(FedsimError) as err:
        read_run(run_dir)
    message = str(err.value)  # wording: the corpus
    assert message.startswith(f"{run_dir}: ") and re.search(said, message), message


def test_an_evaluation_lost_before_the_last_is_said_and_the_rest_read(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = config(tmp_path, run_dir, rounds=8)
    out = RunDir(run_dir)
    out.write_config(cfg)
    for server_round in range(1, 7):  # round 4's line never written
        if server_round in (2, 6):
            out.append_metrics(line(server_round))
        out.write_progress(server_round, 0.5, None)
    with pytest.warns(LostEvaluations) as said:
        record = read_run(run_dir)
    assert [m["round"] for m in record["metrics"]] == [2, 6]
    (warning,) = said
    message = str(warning.message)  # the file and the round lost (wording: the corpus)
    assert message.startswith(str(run_dir / "metrics.jsonl")) and re.search(r"\bround 4\b", message), message


def test_a_partition_table_of_another_client_count_is_refused(tmp_path: Path) -> None:
    run_dir = written(tmp_path, clients=3)  # its manifest lists it: written by the run, of 3 clients where it has 4
    with pytest.raises(FedsimError) as err:
        read_run(run_dir)
    message = str(err.value)  # the file and the field (wording: the corpus)
    assert message.startswith(f"{run_dir / 'partition.csv'}: ") and "train.num_clients" in message, message


def test_a_directory_without_its_config_is_refused_naming_the_files_it_holds(tmp_path: Path) -> None:
    run_dir = written(tmp_path, partition=False)
    (run_dir / "config.yaml").unlink()
    with pytest.raises(FedsimError) as err:
        read_run(run_dir)
    message = str(err.value)  # the directory, what it holds and what it lacks (wording: the corpus)
    assert message.startswith(f"{run_dir}: ") and "config.yaml" in message, message
    assert all(name in message for name in ("metrics.jsonl", "summary.json", "progress.json")), message
    assert "partition.csv" not in message and "checkpoint.pt" not in message, message


@pytest.mark.parametrize("made", [True, False], ids=["empty", "missing"])
def test_an_empty_or_missing_directory_is_not_a_run_directory(tmp_path: Path, made: bool) -> None:
    path = tmp_path / "d"
    if made:
        path.mkdir()
    with pytest.raises(FedsimError) as err:
        read_run(path)
    message = str(err.value)  # said as what it is, not as a run directory to restore (wording: the corpus)
    assert message.startswith(f"{path}: not a run directory (") and "restore" not in message, message
    assert ("no config.yaml" if made else "no such directory") in message, message


# --- a live run ---------------------------------------------------------------------------------


def reads_of(run_dir: Path, monkeypatch: pytest.MonkeyPatch, moving: bool) -> list[bytes]:
    """read_run's reads of metrics.jsonl; ``moving``: progress.json rewritten by the run after each of them (its
    loss of another round), so that no two reads of it agree."""
    reads: list[bytes] = []
    real = run_module.metrics_bytes

    def metrics_bytes(path: Path) -> bytes:
        data = real(path)
        reads.append(data)
        if moving:
            progress = json.loads((run_dir / "progress.json").read_text())
            (run_dir / "progress.json").write_text(json.dumps({**progress, "loss": len(reads) / 10}))
        return data

    monkeypatch.setattr(run_module, "metrics_bytes", metrics_bytes)
    return reads


def test_a_run_whose_progress_holds_still_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = written(tmp_path, 3, finished=False)
    reads = reads_of(run_dir, monkeypatch, moving=False)
    assert read_run(run_dir)["metrics"] == [line(2)] and len(reads) == 1


def test_a_run_that_never_holds_still_is_read_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = written(tmp_path, 3, finished=False)
    reads = reads_of(run_dir, monkeypatch, moving=True)
    assert read_run(run_dir)["metrics"] == [line(2)]  # the last read, checked as it is
    assert len(reads) == run_module._READS and 1 < len(reads) <= 10
