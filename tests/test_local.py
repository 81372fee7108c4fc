"""``fedsim local``: a finished quickstart run (one class per client) continued on one client alone
overfits that client's class (LN-FL Figs. 2-3); ``fedsim plot`` draws it; bad requests are one line,
before any training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedsim.app.cli import main
from fedsim.app.local import local_dir
from fedsim.config_file import load_config
from fedsim.data import load_dataset
from fedsim.data.fingerprint import fingerprint
from fedsim.engines.runner import run
from fedsim.names import MAX_NAME, is_name
from fedsim.record.manifest import DATA_FINGERPRINT, entry_of
from tests.conftest import MNIST_SMALL, MODEL_SHA256, REPO, another_request, continued_run, replace_model
from tests.data_fixtures import relabelled
from tests.test_reading import make_fifo

QUICKSTART = REPO / "configs" / "quickstart.yaml"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart (CNN + LN, MNIST subset, 10 clients) with one class per client, shortened to 2 rounds.

    Inline on one torch thread: on a loaded 2-core machine a second thread's spinning made this fixture 8x
    slower (48 s against 6 s measured), and a Ray pool would add its start to a 2-round run."""
    out = tmp_path_factory.mktemp("runs")
    overrides = [
        "partition={name: n_class, classes_per_client: 1}", "train.rounds=2", "eval.every=2",
        f"output.run_dir={out / 'quickstart'}", "output.progress=false",
        "simulation.backend=inline", "simulation.threads=1",
    ]  # fmt: skip
    return Path(run(load_config(QUICKSTART, overrides))["run_dir"])


@pytest.mark.slow
def test_one_client_alone_overfits_its_class(finished_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local", str(finished_run), "--client", "3", "--steps", "12", "--every", "4"]) == 0
    out = finished_run / "local-3"
    assert capsys.readouterr().out.strip() == str(out)
    request = json.loads((out / "local.json").read_text())
    assert request["client"] == 3 and len(request["classes"]) == 1 and request["lr"] == 0.05
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 4, 8, 12]
    first, last = lines[0], lines[-1]
    # before: the federated model; after 12 steps on one class it predicts that class for everything
    assert last["own_class_acc"] > 0.95 and last["own_class_acc"] > first["own_class_acc"]
    assert first["other_class_acc"] > 0.1 and last["other_class_acc"] < 0.05
    # the per-class accuracies agree with both: 1 own class, 9 others of 100 test images each
    (own,) = request["classes"]
    assert last["per_class_acc"][own] == last["own_class_acc"]
    others = [a for c, a in enumerate(last["per_class_acc"]) if c != own]
    assert sum(others) / 9 == pytest.approx(last["other_class_acc"])
    assert first["train_loss"] is None and last["train_loss"] < lines[1]["train_loss"]
    assert all(m["feature_erank"] > 1 and len(m["feature_sv"]) == 192 for m in lines)  # diagnostics on
    assert main(["plot", str(out)]) == 0 and (out / "local.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--client", "10", "--steps", "5"], "--client 10"),
        (["--client", "0", "--steps", "5", "--every", "6"], "--every 6"),
        (["--client", "0", "--steps", "2", "--set", "train.num_clients=5"], "--set train.num_clients"),
        (["--client", "0", "--steps", "2", "--set", "train.batch_size=5001"], "train.batch_size = 5001"),
    ],
)
def test_bad_request_is_one_line_before_training(
    finished_run: Path, capsys: pytest.CaptureFixture[str], args: list[str], names: str
) -> None:
    """A refused request against a real finished run: one line naming what was refused, and nothing written
    (the wording of each is the bad-input corpus's, tests/test_bad_inputs.py, local-*)."""
    assert main(["local", str(finished_run), *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"fedsim: error: {names}")
    assert not list(finished_run.glob(f"local-{args[1]}*"))  # nothing written for the refused request


def test_missing_or_unfinished_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nothing"
    assert main(["local", str(missing), "--client", "0", "--steps", "5"]) == 2
    assert capsys.readouterr().err.strip() == f"fedsim: error: {missing}: not a run directory (no config.yaml there)"
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text((REPO / "configs" / "quickstart.yaml").read_text())
    assert main(["local", str(unfinished), "--client", "0", "--steps", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a finished run with a saved model (no summary.json or model.pt)" in err[0]
    assert f"fedsim run --resume {unfinished}" in err[0] and not (unfinished / "local-0").exists()


@pytest.mark.slow
def test_set_changes_the_local_training_and_a_model_that_does_not_fit_is_one_line(
    finished_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["local", str(finished_run), "--client", "5", "--steps", "2", "--set", "train.lr=0.01"]) == 0
    request = json.loads((finished_run / "local-5,train.lr=0.01" / "local.json").read_text())
    assert request["lr"] == 0.01 and request["overrides"] == ["train.lr=0.01"]
    capsys.readouterr()
    # the quickstart's LN model has LN's gamma and beta, which a model without norms lacks
    assert main(["local", str(finished_run), "--client", "6", "--steps", "2", "--set", "model.norm=none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.pt does not fit the model this config builds (--set model.norm=none)" in err[0]
    assert not list(finished_run.glob("local-6*"))


def test_each_client_and_set_list_has_a_directory_name_of_its_own() -> None:
    """A long --set was ENAMETOOLONG's traceback; '/' and ' ' were replaced, so two lists shared a directory."""
    names = [
        local_dir("r", 0, items).name
        for items in (
            [], ["train.lr=0.01"], ["model.norm=fn", "train.lr=0.1"], ["model.norm=fn,train.lr=0.1"],
            ["data.cache_dir=/tmp/x"], ["data.cache_dir=_tmp_x"], ["model={name: cnn, norm: fn}"],
            ["model={name: cnn,norm: fn}"], ["train.lr=0." + "1" * 300], ["train.lr=0." + "1" * 301],
        )
    ]  # fmt: skip
    assert names[:3] == ["local-0", "local-0,train.lr=0.01", "local-0,model.norm=fn,train.lr=0.1"]  # as typed
    assert len(set(names)) == len(names) and all(n.startswith("local-0,") for n in names[1:])
    assert all(len(n) <= MAX_NAME and is_name(n) for n in names)
    assert local_dir("r", 1, ["train.lr=0.01"]).name == "local-1,train.lr=0.01"


def test_another_request_never_replaces_a_continuation(finished_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A re-run with other --steps wrote over the last one's results in silence."""
    request = another_request(finished_run, 7)
    out = local_dir(finished_run, 7)
    assert main(["local", str(finished_run), "--client", "7", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedsim: error: {out} ") and err.count("\n") == 1, err  # wording: the corpus
    assert json.loads((out / "local.json").read_text()) == request and not (out / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_continuation_of_another_model_than_its_runs_is_refused(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """local.json records the model it continued: the run run again in its directory (another seed: another
    model.pt), or a local-<k>/ copied into another run, is refused by fedsim plot and by fedsim local, not drawn
    as a continuation of the model the run directory now holds."""
    assert main(["local", str(finished_run), "--client", "1", "--steps", "2"]) == 0
    capsys.readouterr()
    run_dir = tmp_path / "copy"
    shutil.copytree(finished_run, run_dir)
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "fig")]) == 0  # as it is: drawn
    assert (tmp_path / "fig" / "local.png").is_file()
    capsys.readouterr()
    replace_model(run_dir)  # another model, as the run's own
    local = run_dir / "local-1"
    for argv in (["plot", str(run_dir), "--out", str(tmp_path / "fig2")], ["plot", str(local)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fedsim: error: {local}: ") and err.count("\n") == 1, err
        assert "model_sha256 in local.json" in err and str(run_dir / "summary.json") in err  # the fields compared
    assert not (tmp_path / "fig2").exists() and not (local / "local.png").exists()


def test_a_model_changed_on_disk_is_refused(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """model.pt is checked against the checksum summary.json recorded: a weight changed after the run
    (which torch.load reads without complaint) is one line, before any training."""
    run_dir = tmp_path / "copy"
    shutil.copytree(finished_run, run_dir, ignore=shutil.ignore_patterns("local-*"))
    data = (run_dir / "model.pt").read_bytes()
    assert json.loads((run_dir / "summary.json").read_text())["files"]["model.pt"] == entry_of(data)
    (run_dir / "model.pt").write_bytes(data[:-300] + bytes(b ^ 1 for b in data[-300:-200]) + data[-200:])  # a weight
    assert main(["local", str(run_dir), "--client", "0", "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.pt: not the file the run wrote (its sha256 in summary.json's files" in err[0]
    (run_dir / "model.pt").write_bytes(b"not a model")
    assert main(["local", str(run_dir), "--client", "0", "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"model.pt: 11 bytes where the run wrote {len(data):,}" in err[0]
    assert not list(run_dir.glob("local-*"))


def test_a_config_edited_after_the_run_is_refused(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """config.yaml is checked against the checksum summary.json recorded: a seed edited after the run would split
    the data otherwise, and client k's data would be another client's, trained on without a word."""
    run_dir = tmp_path / "copy"
    shutil.copytree(finished_run, run_dir, ignore=shutil.ignore_patterns("local-*"))
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("seed: 0\n", "seed: 1\n", 1))
    assert main(["local", str(run_dir), "--client", "0", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedsim: error: {run_dir / 'config.yaml'}: ") and err.count("\n") == 1, err  # the corpus
    assert not list(run_dir.glob("local-*"))


def test_other_data_than_the_run_trained_on_is_refused(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """summary.json records the fingerprint of the run's data: its model continued on other data (here the
    quickstart's images with the training labels permuted) would be no continuation of it."""
    data = tmp_path / "relabelled.npz"
    relabelled(MNIST_SMALL, data)
    recorded = json.loads((finished_run / "summary.json").read_text())[DATA_FINGERPRINT]
    now = fingerprint(load_dataset("npz", data))
    assert main(["local", str(finished_run), "--client", "0", "--steps", "2", "--set", f"data.root={data}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedsim: error: data.root {data} ") and err.count("\n") == 1, err  # wording: the corpus
    assert f"{DATA_FINGERPRINT} {now[:16]}..., {finished_run / 'summary.json'} recorded {recorded[:16]}..." in err
    run_dir = tmp_path / "copy"
    shutil.copytree(finished_run, run_dir, ignore=shutil.ignore_patterns("local-*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    del summary[DATA_FINGERPRINT], summary["summary_sha256"], summary["record_version"]  # a fedsim before them
    (run_dir / "summary.json").write_text(json.dumps(summary))
    assert main(["record", "upgrade", str(run_dir)]) == 0  # upgraded: still without a fingerprint
    capsys.readouterr()
    assert main(["local", str(run_dir), "--client", "0", "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"summary.json: records no fingerprint ({DATA_FINGERPRINT})" in err[0]
    assert not list(finished_run.glob("local-0,*")) and not list(run_dir.glob("local-*"))


def unread_run(root: Path) -> Path:
    """A run directory as far as ``fedsim local`` gets before its summary: the quickstart's config and a
    model.pt that is never read (the summary is read first)."""
    run_dir = root / "run"
    run_dir.mkdir()
    shutil.copy(QUICKSTART, run_dir / "config.yaml")
    (run_dir / "model.pt").write_bytes(b"never read")
    return run_dir


def test_a_summary_fedsim_did_not_write_is_one_line_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """summary.json goes through fedsim.reading: a FIFO is refused unopened (make_fifo's writer turns a reader
    that would wait on it into one that reads an empty file, so a hang fails instead of stalling the suite),
    50 MB unread, and JSON that is not a summary names the field."""
    run_dir = unread_run(tmp_path)
    summary = make_fifo(run_dir / "summary.json")
    argv = ["local", str(run_dir), "--client", "0", "--steps", "2"]
    for expected in (
        f"summary {summary}: a FIFO (named pipe), not a regular file",
        f"summary {summary}: 50,000,000 bytes; fedsim reads at most 16,777,216 for it",
        f"summary {summary}: not readable as the JSON fedsim writes (the top level: Input should be a valid "
        "dictionary or instance of Summary (got [1, 2]))",
    ):
        assert main(argv) == 2
        assert capsys.readouterr().err == f"fedsim: error: {expected}\n"
        summary.unlink()
        if "FIFO" in expected:
            with open(summary, "wb") as f:  # 50 MB on disk, none of it written
                f.truncate(50_000_000)
        else:
            summary.write_text("[1, 2]")
    assert not list(run_dir.glob("local-*"))


LOCAL_REQUEST = {
    "run_dir": "/runs/quickstart", "client": 3, "steps": 4, "every": 2, "classes": [3], "lr": 0.05,
    "momentum": 0.0, "weight_decay": 0.0, "batch_size": 32, "augment": False, "overrides": [],
    "model_sha256": MODEL_SHA256,
}  # fmt: skip


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("garbage", "expected value at line 1 column 1"),
        (json.dumps({**LOCAL_REQUEST, "client": "three"}), "client: Input should be a valid integer (got 'three')"),
        (json.dumps({**LOCAL_REQUEST, "classes": None}), "classes: Input should be a valid list (got None)"),
        (json.dumps([LOCAL_REQUEST]), "the top level: Input should be a valid dictionary or instance of LocalRequest"),
    ],
)
@pytest.mark.slow
def test_plot_of_a_continuation_fedsim_did_not_write_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, problem: str
) -> None:
    """``fedsim plot`` reads local.json through fedsim.reading (it was json.loads: a traceback), before any
    figure is drawn."""
    local = continued_run(tmp_path) / "local-3"
    local.mkdir()
    (local / ".fedsim").write_text("local continuation\n")
    (local / "metrics.jsonl").write_text('{"step": 0, "own_class_acc": 0.5, "other_class_acc": 0.1}\n')
    (local / "local.json").write_text(content)
    assert main(["plot", str(local)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"fedsim: error: fedsim local's request {local / 'local.json'}: not readable as the JSON fedsim writes "
        f"({problem}"
    ), err
    assert len(err.splitlines()) == 1 and not (local / "local.png").exists()
    (local / "local.json").write_text(json.dumps(LOCAL_REQUEST))  # what fedsim writes: drawn
    assert main(["plot", str(local)]) == 0 and (local / "local.png").stat().st_size > 10_000
