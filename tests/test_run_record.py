"""A finished run directory read back agrees with itself: ``fedsim report``, ``fedsim plot`` and the Python API
refuse, in one line naming the run, a directory whose files disagree (metrics cut short, a line the run could not
have written, a summary or config.yaml edited or copied from another run), which they tabulated and drew before
as if complete; a line lost before the last is said, and the rest read. Real runs, edited on disk."""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from fedsim.api import Run
from fedsim.cli import main
from fedsim.config import THREADS_PER_CPU, parse_config
from fedsim.errors import FedsimError
from fedsim.runner import run
from tests.conftest import small_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two finished runs, seeds 0 and 1, of 5 rounds evaluated every 2: metrics lines at rounds 2, 4 and 5."""
    root = tmp_path_factory.mktemp("finished")
    for seed in (0, 1):
        run_dir = root / "runs" / f"seed{seed}"
        run(parse_config(small_config(root, seed=seed, train={"rounds": 5}, output={"run_dir": str(run_dir)})))
    return root / "runs"


def lines(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def write_lines(run_dir: Path, records: list[dict[str, object]]) -> None:
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def edit_json(path: Path, **fields: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def edit_config(run_dir: Path, section: str | None, key: str, value: object) -> None:
    path = run_dir / "config.yaml"
    tree = yaml.safe_load(path.read_text())
    (tree[section] if section else tree)[key] = value
    path.write_text(yaml.safe_dump(tree, sort_keys=False))


def edit_partition(run_dir: Path, edit: Callable[[list[list[str]]], object]) -> None:
    path = run_dir / "partition.csv"
    rows = list(csv.reader(path.read_text().splitlines()))
    edit(rows)
    path.write_text("".join(",".join(row) + "\n" for row in rows))


def copy_reseeded(runs: Path) -> None:
    """A copy of seed 0 given seed 2 in its config.yaml: the report counted seed 0's numbers twice, as 3 seeds."""
    shutil.copytree(runs / "seed0", runs / "seed2")
    edit_config(runs / "seed2", None, "seed", 2)


# what is done to a copy of the two runs, the run at fault, and what its one line says (after the run's path)
BROKEN: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "last-line-cut": (
        lambda runs: write_lines(runs / "seed0", lines(runs / "seed0")[:-1]),
        "seed0",
        ": metrics.jsonl ends at round 4 but the run finished 5 rounds (summary.json), the last of which it evaluates",
    ),
    "round-renumbered": (
        lambda runs: write_lines(
            runs / "seed0",
            [{**line, "round": 3 if line["round"] == 4 else line["round"]} for line in lines(runs / "seed0")],
        ),
        "seed0/metrics.jsonl",
        ", line 2: not readable as the JSON fedsim writes (round: round 3 is not one the run evaluated "
        "(eval.every: 2, and its last, 5) (got 3))",
    ),
    "summary-final-accuracy": (
        lambda runs: edit_json(runs / "seed0" / "summary.json", final_client_mean_acc=0.99),
        "seed0",
        ": summary.json's final_client_mean_acc is 0.99, its metrics.jsonl's ",
    ),
    "summary-rounds": (
        lambda runs: edit_json(runs / "seed0" / "summary.json", rounds=4),
        "seed0",
        ": summary.json says the run finished 4 rounds, its config.yaml's train.rounds is 5",
    ),
    "config-lr-edited": (
        lambda runs: edit_config(runs / "seed1", "train", "lr", 0.1),
        "seed1",
        ": config.yaml is not the config the run finished with (config_sha256 in summary.json differs",
    ),
    "copy-reseeded": (
        copy_reseeded,
        "seed2",
        ": config.yaml is not the config the run finished with (config_sha256 in summary.json differs",
    ),
    "config-missing": (
        lambda runs: (runs / "seed1" / "config.yaml").unlink(),
        "seed1",
        ": a run directory (partition.csv, metrics.jsonl, summary.json, progress.json) without its config.yaml",
    ),
    "partition-of-another-run": (
        lambda runs: shutil.copy(runs / "seed1" / "partition.csv", runs / "seed0" / "partition.csv"),
        "seed0",
        ": partition.csv is not the partition the run trained on (partition_sha256 in summary.json differs",
    ),
    "partition-count-edited": (
        lambda runs: edit_partition(runs / "seed1", lambda rows: rows[1].__setitem__(2, str(int(rows[1][2]) + 1))),
        "seed1",
        ": partition.csv is not the partition the run trained on (partition_sha256 in summary.json differs",
    ),
    "partition-client-missing": (
        lambda runs: edit_partition(runs / "seed0", lambda rows: rows.pop()),
        "seed0/partition.csv",
        ": rows per split {'train': 4, 'test': 3}, where the run's config.yaml has 4 clients (train.num_clients)",
    ),
    "config-of-another-layout": (
        lambda runs: edit_config(runs / "seed1", None, "evaluation", {"every": 2}),
        "seed1/config.yaml",
        ": evaluation: unknown key; valid keys: name, seed, engine, data,",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_report_plot_and_the_api_refuse_a_run_whose_files_disagree(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    assert main(["report", str(runs), "--out", str(tmp_path / "intact")]) == 0  # the copies read as they are
    capsys.readouterr()
    breaks, culprit, problem = BROKEN[case]
    breaks(runs)
    for command, out in (("report", "rep"), ("plot", "fig")):
        argv = [command, str(runs), "--out", str(tmp_path / out)]
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and str(runs / culprit) in err and problem in err, err
    with pytest.raises(FedsimError) as caught:
        _ = Run(runs / culprit.partition("/")[0]).metrics
    assert str(runs / culprit) in str(caught.value) and problem in str(caught.value)
    assert not (tmp_path / "rep").exists() and not (tmp_path / "fig").exists()


def test_an_edit_of_what_does_not_change_learning_still_reads(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checksum covers what a run learns from: a run renamed, or given other threads (what resume may change
    too), is the same run; and a run made on a larger machine, with more threads than this one allows a run, is
    read here (it runs nowhere here)."""
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    edit_config(runs / "seed0", None, "name", "renamed")
    edit_config(runs / "seed1", "simulation", "threads", THREADS_PER_CPU * (os.cpu_count() or 1) + 1)
    assert main(["report", str(runs), "--out", str(tmp_path / "rep")]) == 0
    assert [row["seeds"] for row in csv.DictReader(open(tmp_path / "rep" / "results.csv"))] == ["2"]
    assert capsys.readouterr().err == ""


def test_an_evaluation_lost_before_the_last_is_said_and_the_rest_read(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line lost from the middle of metrics.jsonl (a file replaced under the running run, as round 4,100 of
    results/full-budget's FedAvg cell): the summary and the other lines are the run's, so the run is read, and
    a warning names the round its curve and rounds-to-target skip."""
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    kept = [line for line in lines(runs / "seed0") if line["round"] != 2]
    write_lines(runs / "seed0", kept)
    assert main(["report", str(runs), "--out", str(tmp_path / "rep")]) == 0
    assert capsys.readouterr().err == (
        f"fedsim: warning: {runs / 'seed0' / 'metrics.jsonl'} has no line for round 2 of the rounds the run "
        "evaluated (eval.every: 2): its curve and rounds to a target skip them\n"
    )
    assert [line["round"] for line in lines(runs / "seed0")] == [4, 5]
    assert list(Run(runs / "seed0").metrics["round"]) == [4, 5]


def test_a_finished_run_records_its_configs_and_partitions_checksums(finished: Path) -> None:
    summary = json.loads((finished / "seed0" / "summary.json").read_text())
    other = json.loads((finished / "seed1" / "summary.json").read_text())
    for key in ("config_sha256", "partition_sha256"):
        assert len(summary[key]) == 64 and summary[key] != other[key]  # the seed draws another partition too


def test_a_run_of_a_fedsim_before_partition_checksums_is_read(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A summary without partition_sha256 (written before it existed, as results/full-budget's): the table is
    checked for its rows only, and the run and its label-distribution figure are made."""
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    for seed in (0, 1):
        path = runs / f"seed{seed}" / "summary.json"
        summary = json.loads(path.read_text())
        del summary["partition_sha256"]
        path.write_text(json.dumps(summary))
    assert main(["plot", str(runs), "--out", str(tmp_path / "fig")]) == 0, capsys.readouterr().err
    assert (tmp_path / "fig" / "label_distribution.png").stat().st_size > 0


def test_a_run_of_an_earlier_fedsim_is_read_after_a_config_key_is_added(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checksum is of config.yaml's own keys: a run made before a key existed (its config.yaml without it,
    its summary's checksum of that file) is read by a fedsim that has the key, with its default."""
    from fedsim.rundir import config_checksum

    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    path = runs / "seed0" / "config.yaml"
    tree = yaml.safe_load(path.read_text())
    assert tree["train"].pop("weight_decay") == 0.0  # as if fedsim had not had it: its default since
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    edit_json(runs / "seed0" / "summary.json", config_sha256=config_checksum(tree))
    assert main(["report", str(runs), "--out", str(tmp_path / "rep")]) == 0, capsys.readouterr().err
    assert [row["seeds"] for row in csv.DictReader(open(tmp_path / "rep" / "results.csv"))] == ["2"]
