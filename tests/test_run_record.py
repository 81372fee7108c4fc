"""A finished run directory read back agrees with itself: ``fedsim report``, ``fedsim plot`` and the Python API
refuse, in one line naming the run, a directory whose files disagree (metrics cut short, a line the run could not
have written, a summary or config.yaml edited or copied from another run), which they tabulated and drew before
as if complete; a line lost before the last is said, and the rest read. Real runs, edited on disk."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from fedsim.app.api import Run
from fedsim.app.cli import main
from fedsim.config import THREADS_PER_CPU
from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.errors import FedsimError
from fedsim.record.manifest import entry_of, summary_checksum
from fedsim.record.run import read_run
from tests.conftest import small_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two finished runs, seeds 0 and 1, of 5 rounds evaluated every 2: metrics lines at rounds 2, 4 and 5."""
    root = tmp_path_factory.mktemp("finished")
    for seed in (0, 1):
        run_dir = root / "runs" / f"seed{seed}"
        summary = run(
            parse_config(small_config(root, seed=seed, train={"rounds": 5}, output={"run_dir": str(run_dir)}))
        )
        assert summary == json.loads((run_dir / "summary.json").read_text())  # what it returns is what it wrote
    return root / "runs"


def lines(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def write_lines(run_dir: Path, records: list[dict[str, object]]) -> None:
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def edit_json(path: Path, **fields: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def older_summary(path: Path, *keys: str, **fields: object) -> None:
    """``path`` (a summary.json) as a fedsim before ``keys``, before summaries' own checksum and before record
    versions wrote it, with ``fields``."""
    summary = {k: v for k, v in json.loads(path.read_text()).items() if k not in (*keys, "files", "summary_sha256")}
    path.write_text(json.dumps({**{k: v for k, v in summary.items() if k != "record_version"}, **fields}))


def upgraded(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``run_dir``'s older record upgraded (``fedsim record upgrade``), what it said (and warned: said again
    when the run is read next) left out of ``capsys``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["record", "upgrade", str(run_dir)]) == 0
    capsys.readouterr()


def progress_of(run_dir: Path, last_round: int, count: int) -> None:
    """``run_dir``'s progress.json as the run wrote it after round ``last_round``, listing the first ``count``
    lines of its metrics.jsonl as they are now."""
    covered = b"".join((run_dir / "metrics.jsonl").read_bytes().splitlines(keepends=True)[:count])
    progress = json.loads((run_dir / "progress.json").read_text())
    progress["files"]["metrics.jsonl"] = entry_of(covered)
    (run_dir / "progress.json").write_text(json.dumps({**progress, "round": last_round}))


def forged_summary(path: Path, **fields: object) -> None:
    """``path`` (a summary.json) with ``fields``, and its own checksum made again to match them."""
    summary = {**json.loads(path.read_text()), **fields}
    path.write_text(json.dumps({**summary, "summary_sha256": summary_checksum(summary)}))


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


# what is done to a copy of the two runs, the run at fault, and what its one line names after the run's path: the
# file, field, values and record at odds (the wording: tests/test_bad_inputs.py)
BROKEN: dict[str, tuple[Callable[[Path], None], str, tuple[str, ...]]] = {
    "last-line-cut": (
        lambda runs: write_lines(runs / "seed0", lines(runs / "seed0")[:-1]),
        "seed0/metrics.jsonl",
        ("bytes", "summary.json"),
    ),
    "middle-line-lost": (
        lambda runs: write_lines(runs / "seed0", [line for line in lines(runs / "seed0") if line["round"] != 2]),
        "seed0/metrics.jsonl",
        ("bytes", "summary.json"),
    ),
    "line-of-another-run": (
        lambda runs: write_lines(
            runs / "seed0", [lines(runs / "seed1")[1] if line["round"] == 4 else line for line in lines(runs / "seed0")]
        ),
        "seed0/metrics.jsonl",
        ("summary.json",),
    ),
    "client-accuracy-edited": (
        lambda runs: write_lines(
            runs / "seed1",
            [{**line, "client_acc": [0.9] * 4} if line["round"] == 2 else line for line in lines(runs / "seed1")],
        ),
        "seed1/metrics.jsonl",
        ("summary.json",),
    ),
    "round-renumbered": (
        lambda runs: write_lines(
            runs / "seed0",
            [{**line, "round": 3 if line["round"] == 4 else line["round"]} for line in lines(runs / "seed0")],
        ),
        "seed0/metrics.jsonl",
        (", line 2: ", "round 3", "eval.every: 2", "5", "(got 3)"),
    ),
    "summary-final-accuracy": (  # in a summary whose own checksum was forged to match, held to the metrics lines
        lambda runs: forged_summary(runs / "seed0" / "summary.json", final_client_mean_acc=0.99),
        "seed0",
        ("summary.json", "final_client_mean_acc", "0.99", "metrics.jsonl"),
    ),
    "summary-final-accuracy-sealed": (
        lambda runs: edit_json(runs / "seed0" / "summary.json", final_client_mean_acc=0.99),
        "seed0",
        ("summary.json", "summary_sha256"),
    ),
    "summary-wall-time": (  # shown by fedsim.open_run(...).summary, and in the notes of a 10,000-round cell
        lambda runs: edit_json(runs / "seed1" / "summary.json", wall_time_s=1.0),
        "seed1",
        ("summary.json", "summary_sha256"),
    ),
    "summary-rounds": (
        lambda runs: edit_json(runs / "seed0" / "summary.json", rounds=4),
        "seed0",
        ("summary.json", "4 rounds", "train.rounds", "5"),
    ),
    "config-lr-edited": (
        lambda runs: edit_config(runs / "seed1", "train", "lr", 0.1),
        "seed1/config.yaml",
        ("summary.json",),
    ),
    "copy-reseeded": (
        copy_reseeded,
        "seed2/config.yaml",
        ("summary.json",),
    ),
    "config-missing": (
        lambda runs: (runs / "seed1" / "config.yaml").unlink(),
        "seed1",
        ("config.yaml",),
    ),
    "partition-of-another-run": (
        lambda runs: shutil.copy(runs / "seed1" / "partition.csv", runs / "seed0" / "partition.csv"),
        "seed0/partition.csv",
        ("summary.json",),
    ),
    "partition-count-edited": (
        lambda runs: edit_partition(runs / "seed1", lambda rows: rows[1].__setitem__(2, str(int(rows[1][2]) + 1))),
        "seed1/partition.csv",
        ("sha256", "summary.json"),
    ),
    "partition-client-missing": (
        lambda runs: edit_partition(runs / "seed0", lambda rows: rows.pop()),
        "seed0/partition.csv",
        ("bytes", "summary.json"),
    ),
    "config-of-another-layout": (
        lambda runs: edit_config(runs / "seed1", None, "evaluation", {"every": 2}),
        "seed1/config.yaml",
        (": evaluation: ",),
    ),
}


def names_in(message: str, culprit: Path, named: tuple[str, ...]) -> bool:
    """Whether ``message`` names ``culprit``'s path, then each of ``named``."""
    _, found, rest = message.partition(str(culprit))
    return bool(found) and all(n in rest for n in named)


@pytest.mark.parametrize("case", list(BROKEN))
def test_report_plot_and_the_api_refuse_a_run_whose_files_disagree(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    assert main(["report", str(runs), "--out", str(tmp_path / "intact")]) == 0  # the copies read as they are
    capsys.readouterr()
    breaks, culprit, named = BROKEN[case]
    breaks(runs)
    for command, out in (("report", "rep"), ("plot", "fig")):
        argv = [command, str(runs), "--out", str(tmp_path / out)]
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and names_in(err, runs / culprit, named), err
    with pytest.raises(FedsimError) as caught:
        _ = Run(runs / culprit.partition("/")[0]).metrics
    assert names_in(str(caught.value), runs / culprit, named), str(caught.value)
    assert not (tmp_path / "rep").exists() and not (tmp_path / "fig").exists()


def test_a_run_of_a_larger_machine_is_read_and_any_edit_of_its_config_refused(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run made on a larger machine, with more threads than this one allows a run, is read here (it runs
    nowhere here); its config.yaml's bytes are in the manifest, so an edit even of what it does not learn from
    (its name) is refused: a run is renamed by its directory."""
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    edit_config(runs / "seed1", "simulation", "threads", THREADS_PER_CPU * (os.cpu_count() or 1) + 1)
    summary = json.loads((runs / "seed1" / "summary.json").read_text())
    summary["files"]["config.yaml"] = entry_of((runs / "seed1" / "config.yaml").read_bytes())
    forged_summary(runs / "seed1" / "summary.json", files=summary["files"])  # as that machine's run wrote it
    edit_config(runs / "seed0", None, "name", "renamed")
    assert main(["report", str(runs), "--out", str(tmp_path / "refused")]) == 2
    assert f"{runs / 'seed0' / 'config.yaml'}: " in capsys.readouterr().err
    edit_config(runs / "seed0", None, "name", "t")
    assert main(["report", str(runs), "--out", str(tmp_path / "rep")]) == 0, capsys.readouterr().err
    assert [row["seeds"] for row in csv.DictReader(open(tmp_path / "rep" / "results.csv"))] == ["2"]
    assert capsys.readouterr().err == ""


def test_an_evaluation_lost_before_the_last_is_said_and_the_rest_read(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line lost from the middle of metrics.jsonl of a run from before metrics checksums (round 4,100 of
    results/full-budget's FedAvg cell, a file replaced under the running run), upgraded: the summary and the
    other lines are the run's, so the run is read, and a warning names the round its curve and rounds-to-target
    skip. (A run with the checksum is refused: "middle-line-lost".)"""
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    older_summary(runs / "seed0" / "summary.json")
    kept = [line for line in lines(runs / "seed0") if line["round"] != 2]
    write_lines(runs / "seed0", kept)
    upgraded(runs / "seed0", capsys)  # its lines as they are now, checksummed once
    assert main(["report", str(runs), "--out", str(tmp_path / "rep")]) == 0
    assert capsys.readouterr().err == (
        f"fedsim: warning: {runs / 'seed0' / 'metrics.jsonl'} has no line for round 2 of the rounds the run "
        "evaluated (eval.every: 2): its curve and rounds to a target skip them\n"
    )
    assert [line["round"] for line in lines(runs / "seed0")] == [4, 5]
    assert list(Run(runs / "seed0").metrics["round"]) == [4, 5]


def test_a_finished_run_lists_its_files_by_size_and_sha256(finished: Path) -> None:
    summary = json.loads((finished / "seed0" / "summary.json").read_text())
    other = json.loads((finished / "seed1" / "summary.json").read_text())
    assert set(summary["files"]) >= {"config.yaml", "partition.csv", "metrics.jsonl"}
    for name, entry in summary["files"].items():
        assert entry == entry_of((finished / "seed0" / name).read_bytes())
        assert entry != other["files"][name]  # the seed draws another partition too
    assert summary["summary_sha256"] == summary_checksum(summary) != other["summary_sha256"]


def test_a_run_of_a_fedsim_before_partition_checksums_is_read(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A summary without partition_sha256 (written before it existed, as results/full-budget's were), upgraded:
    the checksum is of the table as it is, and the run and its label-distribution figure are made."""
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    for seed in (0, 1):
        older_summary(runs / f"seed{seed}" / "summary.json", "partition_sha256")
    upgraded(runs, capsys)
    assert main(["plot", str(runs), "--out", str(tmp_path / "fig")]) == 0, capsys.readouterr().err
    assert (tmp_path / "fig" / "label_distribution.png").stat().st_size > 0


def test_a_run_of_an_earlier_fedsim_is_read_after_a_config_key_is_added(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checksum is of config.yaml's own keys: a run made before a key existed (its config.yaml without it,
    its summary's checksum of that file) is read by a fedsim that has the key, with its default."""
    from fedsim.record.legacy import config_checksum

    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    path = runs / "seed0" / "config.yaml"
    tree = yaml.safe_load(path.read_text())
    assert tree["train"].pop("weight_decay") == 0.0  # as if fedsim had not had it: its default since
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    older_summary(runs / "seed0" / "summary.json", config_sha256=config_checksum(tree))
    upgraded(runs / "seed0", capsys)
    assert main(["report", str(runs), "--out", str(tmp_path / "rep")]) == 0, capsys.readouterr().err
    assert [row["seeds"] for row in csv.DictReader(open(tmp_path / "rep" / "results.csv"))] == ["2"]


def test_runs_gathered_by_symlink_are_read_each_once(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder of links to run directories (a paper's runs gathered from a sweep): report, plot and the API read
    through them (Path.rglob passed them over: the report showed 1 seed of 3, exit 0); a run reached twice (a link
    to the runs' folder too) is one run, and a link back up is no loop."""
    from fedsim import open_sweep
    from fedsim.app.plots import find_runs

    assert main(["report", str(finished), "--out", str(tmp_path / "direct")]) == 0
    paper = tmp_path / "paper"
    paper.mkdir()
    (paper / "s0").symlink_to(finished / "seed0")
    (paper / "s1").symlink_to(finished / "seed1")
    (paper / "t").symlink_to(finished)  # both runs again, as t/seed0 and t/seed1
    (paper / "up").symlink_to(paper)
    found = [paper / "s0", paper / "s1"]  # each run by the first name reached, in name order
    assert find_runs([paper]) == found and [run.dir for run in open_sweep(paper).runs] == found
    assert main(["report", str(paper), "--out", str(tmp_path / "linked")]) == 0
    assert (tmp_path / "linked" / "results.csv").read_text() == (tmp_path / "direct" / "results.csv").read_text()
    assert [row["seeds"] for row in csv.DictReader(open(tmp_path / "linked" / "results.csv"))] == ["2"]
    assert main(["plot", str(paper), "--mean-over-seeds", "--out", str(tmp_path / "fig")]) == 0
    assert "fedsim: error" not in capsys.readouterr().err


def stopped_before_its_first_evaluation(root: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run of :func:`finished`'s config and ``seed`` interrupted in round 2 (Ctrl-C), after its checkpoint of
    round 1 and before its first evaluation (round 2): a seed of a sweep under way. (Interrupted before its
    first checkpoint, it recorded nothing and its directory is taken back: fedsim.record.claim.take_back.)"""
    from fedsim.server.reporter import RoundReporter

    trained = RoundReporter.trained

    def interrupted_in_round_2(self: RoundReporter) -> None:
        if (run_dir / "checkpoint.pt").exists():
            raise KeyboardInterrupt
        trained(self)

    run_dir = root / f"seed{seed}"
    monkeypatch.setattr(RoundReporter, "trained", interrupted_in_round_2)
    output = {"run_dir": str(run_dir), "checkpoint_every": 1}
    with pytest.raises(KeyboardInterrupt):
        run(parse_config(small_config(root, seed=seed, train={"rounds": 5}, output=output)))
    monkeypatch.undo()
    assert not (run_dir / "metrics.jsonl").exists()
    return run_dir


@pytest.mark.slow
def test_a_seed_not_evaluated_yet_is_left_out_of_its_mean_and_said(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """plot --mean-over-seeds with one seed not evaluated yet: its config's line is the mean of the seeds that
    are, labelled with their count, and the seed left out is said (the rounds every seed evaluated were none, and
    the whole config vanished from the figure without a word, exit 0)."""
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    assert main(["plot", str(runs), "--mean-over-seeds", "--out", str(tmp_path / "two")]) == 0
    stopped = stopped_before_its_first_evaluation(runs, 2, monkeypatch)
    capsys.readouterr()
    assert main(["plot", str(runs), "--mean-over-seeds", "--out", str(tmp_path / "three")]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"fedsim: skipped {stopped} in accuracy.png: no client-mean accuracy evaluated yet; its config's line is the "
        "mean over the other 2 seeds"
    )
    # the figure is the two evaluated seeds' own: the same mean, band and label ("runs (2 seeds)")
    assert (tmp_path / "three" / "accuracy.png").read_bytes() == (tmp_path / "two" / "accuracy.png").read_bytes()
    assert main(["plot", str(runs), "--out", str(tmp_path / "each")]) == 0
    assert f"fedsim: skipped {stopped} in accuracy.png: no client-mean accuracy evaluated yet\n" in (
        capsys.readouterr().err
    )


def test_seeds_that_share_no_evaluated_round_are_said_not_dropped(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Running seeds whose lines lost from metrics.jsonl leave them no round in common (seed 0 at round 4 with
    round 2's line lost, seed 1 at round 2; runs of a fedsim before metrics checksums): no mean to draw, and
    said."""
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs)
    write_lines(runs / "seed0", lines(runs / "seed0")[1:2])
    write_lines(runs / "seed1", lines(runs / "seed1")[:1])
    for seed in (0, 1):
        (runs / f"seed{seed}" / "summary.json").unlink()
        edit_json(runs / f"seed{seed}" / "progress.json", files=None, record_version=None)  # a fedsim before them
        upgraded(runs / f"seed{seed}", capsys)
    assert main(["plot", str(runs), "--mean-over-seeds", "--out", str(tmp_path / "fig")]) == 0
    assert "fedsim: skipped runs in accuracy.png: its 2 seeds have no evaluated round in common\n" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_seeds_trained_on_other_data_are_refused_not_averaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seeds of one config whose data.root held other data (the file replaced between them; their summaries'
    data_sha256 differ) were averaged as one row: report and plot's mean over seeds refuse them in one line
    naming two of the runs. Summaries without data_sha256 (a fedsim before it) are pooled as before."""
    import numpy as np

    from tests.conftest import MNIST_SMALL

    data, runs = tmp_path / "mnist.npz", tmp_path / "runs"
    arrays = dict(np.load(MNIST_SMALL))
    for seed in (0, 1):
        if seed == 1:  # the same path, other data: the training labels rotated
            arrays["y_train"] = (arrays["y_train"] + 1) % 10
        np.savez(data, **arrays)
        cfg = small_config(tmp_path, seed=seed, data={"root": str(data)}, output={"run_dir": str(runs / f"s{seed}")})
        run(parse_config(cfg))
    mean_plot = ["plot", str(runs), "--mean-over-seeds", "--out", str(tmp_path / "fig")]
    for argv in (["report", str(runs), "--out", str(tmp_path / "rep")], mean_plot):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fedsim: error: {runs / 's0'} and {runs / 's1'} ") and "data_sha256" in err, err
        assert len(err.splitlines()) == 1, err  # both runs and the checksum that differs (wording: the corpus)
    assert not (tmp_path / "rep").exists() and not (tmp_path / "fig").exists()  # refused before --out is made
    assert main(["plot", str(runs), "--out", str(tmp_path / "each")]) == 0  # each run drawn alone: no mean
    older_summary(runs / "s1" / "summary.json", "data_sha256")
    upgraded(runs / "s1", capsys)
    assert main(["report", str(runs), "--out", str(tmp_path / "rep")]) == 0
    assert [row["seeds"] for row in csv.DictReader(open(tmp_path / "rep" / "results.csv"))] == ["2"]


def test_an_unfinished_runs_config_edited_since_is_refused(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stopped run (no summary.json) whose config.yaml was edited since (train.lr) was drawn and read back
    under the edited value, which --resume refuses: progress.json lists the config the run ran, so plot and the
    API refuse it too."""
    run_dir = tmp_path / "runs" / "stopped"
    shutil.copytree(finished / "seed0", run_dir)
    (run_dir / "summary.json").unlink()
    config = (run_dir / "config.yaml").read_bytes()
    assert json.loads((run_dir / "progress.json").read_text())["files"]["config.yaml"] == entry_of(config)
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "intact")]) == 0
    capsys.readouterr()
    edit_config(run_dir, "train", "lr", 0.2)
    size = len(config)
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "fig")]) == 2
    err = capsys.readouterr().err  # the file, both sizes and the record (wording: the corpus)
    assert len(err.splitlines()) == 1 and names_in(err, run_dir / "config.yaml", (f"{size - 1:,}", f"{size:,}")), err
    assert "progress.json" in err, err
    with pytest.raises(FedsimError, match=r"config\.yaml\b.*progress\.json\b"):
        _ = Run(run_dir).config
    assert not (tmp_path / "fig").exists()


def test_an_unfinished_runs_metrics_are_checked_as_far_as_progress_covers_them(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stopped run (no summary.json): progress.json's metrics checksum covers the lines written before it, and
    the run may have written the line of the round after it before it stopped (appended, then progress.json
    rewritten), which is read; a line of another run spliced in, fewer lines than progress.json covers, or more
    than that one line after them, is refused."""
    run_dir = tmp_path / "runs" / "stopped"
    shutil.copytree(finished / "seed0", run_dir)
    (run_dir / "summary.json").unlink()
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["files"]["metrics.jsonl"] == entry_of((run_dir / "metrics.jsonl").read_bytes())
    own = lines(run_dir)
    # as the run left it when stopped after round 5's line, before its progress.json of round 5
    progress_of(run_dir, 4, 2)
    assert [line["round"] for line in read_run(run_dir)["metrics"]] == [2, 4, 5]  # the line after progress.json
    write_lines(run_dir, own[:1])
    with pytest.raises(FedsimError, match=r"metrics\.jsonl\b.*progress\.json\b"):  # wording: the corpus
        read_run(run_dir)
    write_lines(run_dir, own)
    progress_of(run_dir, 2, 1)  # two lines past round 2: the run wrote one at most before it stopped
    with pytest.raises(FedsimError, match=r"metrics\.jsonl\b.*progress\.json\b"):
        read_run(run_dir)
    progress_of(run_dir, 4, 2)
    write_lines(run_dir, [own[0], lines(finished / "seed1")[1], own[2]])
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "fig")]) == 2
    err = capsys.readouterr().err
    assert str(run_dir / "metrics.jsonl") in err and "progress.json" in err and len(err.splitlines()) == 1, err
    write_lines(run_dir, [own[0], own[1], lines(finished / "seed1")[2]])  # past what progress.json covers
    assert read_run(run_dir)["metrics"][2] == lines(finished / "seed1")[2] != own[2]


@pytest.mark.slow
def test_a_resume_that_fails_leaves_the_stopped_runs_lines_held_to_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume removes the stopped run's progress.json (a launcher polling it would show the old round), then
    refuses to go on (here: other data at data.root): the run's metrics lines are held to its checkpoint's
    instead, which vouches for the lines a resume keeps, so an edit is still refused; and its partition.csv is
    held to progress.json's checksum while that is there."""
    import numpy as np

    from tests.conftest import MNIST_SMALL
    from tests.test_resume import fedsim, stopped_in

    data, run_dir = tmp_path / "mnist.npz", tmp_path / "runs" / "stopped"
    np.savez(data, **np.load(MNIST_SMALL))
    raw = small_config(tmp_path, data={"root": str(data)}, train={"rounds": 9}, eval={"every": 1},
                       output={"run_dir": str(run_dir), "checkpoint_every": 4})  # fmt: skip
    stopped_in(raw, 7, monkeypatch)  # lines of rounds 1-6, its checkpoint at round 4
    other = tmp_path / "other"
    run(parse_config(small_config(tmp_path, seed=1, output={"run_dir": str(other)})))
    shutil.copy(run_dir / "partition.csv", tmp_path / "partition.csv")
    shutil.copy(other / "partition.csv", run_dir / "partition.csv")
    with pytest.raises(FedsimError, match=r"partition\.csv\b.*progress\.json\b"):
        read_run(run_dir)
    shutil.copy(tmp_path / "partition.csv", run_dir / "partition.csv")

    arrays = dict(np.load(data))
    np.savez(data, **{**arrays, "y_train": (arrays["y_train"] + 1) % 10})
    resume = fedsim("run", "--resume", str(run_dir))  # a process of its own: this one holds the data decoded
    _, err = resume.communicate(timeout=600)
    assert resume.returncode == 2 and "data_sha256" in err and not (run_dir / "progress.json").exists(), err
    assert [line["round"] for line in read_run(run_dir)["metrics"]] == [1, 2, 3, 4, 5, 6]
    own, edited = lines(run_dir), lines(run_dir)
    edited[2]["client_mean_acc"] = 0.99
    write_lines(run_dir, edited)
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "fig")]) == 2
    err = capsys.readouterr().err  # the file, its lines the checkpoint holds, the checkpoint (wording: the corpus)
    assert len(err.splitlines()) == 1 and re.search(r"metrics\.jsonl\b.*\b4 lines\b.*checkpoint\.pt", err), err
    write_lines(run_dir, own)
    assert len(read_run(run_dir)["metrics"]) == 6
    edit_config(run_dir, "train", "lr", 0.2)  # and progress.json, which held the config's checksum, is gone
    with pytest.raises(FedsimError, match=rf"{re.escape(str(run_dir))}\b.*config\.yaml\b.*checkpoint\b.*train\.lr"):
        read_run(run_dir)


def test_a_run_that_moves_on_while_it_is_read_is_read_again(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live run writes two lines between the reader's progress.json and its metrics.jsonl (a fast run,
    evaluated each round): read as it was, it had lines past what progress.json covers and was refused; its
    progress.json read again has moved on, so both are read again, of one round."""
    import fedsim.record.run

    run_dir = tmp_path / "live"
    shutil.copytree(finished / "seed0", run_dir)
    (run_dir / "summary.json").unlink()
    now = (run_dir / "progress.json").read_text()
    progress_of(run_dir, 2, 1)
    read = fedsim.record.reader.metrics_bytes

    def moving_on(*args: object, **kwargs: object) -> object:
        metrics = read(*args, **kwargs)
        (run_dir / "progress.json").write_text(now)  # the run's progress.json of round 5, written meanwhile
        return metrics

    monkeypatch.setattr(fedsim.record.run, "metrics_bytes", moving_on)
    assert [line["round"] for line in read_run(run_dir)["metrics"]] == [2, 4, 5]
