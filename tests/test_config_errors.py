"""Bad input fails before training, with one message naming the field and what is allowed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.app.cli import main
from fedsim.config_file import load_config
from tests.conftest import run_cli, small_config, write_config


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["strategy.name=fedavgg"], "strategy.name"),
        (["model.norm=layernorm"], "model.norm"),
        (["data.dataset=imagenet"], "data.dataset"),
        (["model.name=vgg"], "model.name"),
        (["train.lr=0"], "train.lr"),
        (["train.lr=-0.1"], "train.lr"),
        (["partition.beta=0"], "partition.beta"),
        (["partition.betta=0.1"], "partition.betta"),
        (["train.rounds=0"], "train.rounds"),
        (["train.clients_per_round=9"], "clients_per_round"),
        (["trian.rounds=3"], "trian"),
        (["engine=warp"], "engine"),
        (["model.norm={name: gn, groups: 0}"], "model.norm.groups"),
        (["model.norm=gn", "model.norm.groups=0"], "model.norm.groups"),
        (["partition={name: n_class, classes_per_client: 11}"], "classes_per_client"),
        (["train.num_clients=6000"], "num_clients"),
        (["simulation.vmap_clients=4", "engine=flower"], "simulation.vmap_clients"),
        (["simulation.vmap_clients=4", "model.norm=bn"], "simulation.vmap_clients"),
        # a lone surrogate passed the first validation, then was a pydantic JSON traceback (experiment.resolve)
        (['name="a\\udcffb"'], "name"),
        (['data.cache_dir="/tmp/\\udcff"'], "data.cache_dir"),
        (['model.norm={name: gn, x: "\\ud800"}'], "model.norm"),
        # the last value won in silence
        (["train.rounds=1", "train.rounds=2"], "--set train.rounds"),
    ],
)
def test_bad_config_is_one_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], field: str
) -> None:
    """Each one line names the field; its wording is asserted in the bad-input corpus (tests/test_bad_inputs.py)."""
    path = write_config(tmp_path, small_config(tmp_path))
    code, err = run_cli(capsys, path, *overrides)
    assert code == 2
    assert err.startswith("fedsim: error: ")
    assert "Traceback" not in err and "Value error" not in err  # pydantic's wording stays out
    assert len(err.splitlines()) == 1 and field in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("metrics.jsonl"))


@pytest.mark.parametrize(
    "head",
    [
        ["run", "c.yaml"],
        ["deploy", "c.yaml"],
        ["compose", "c.yaml"],
        ["sweep", "s.yaml"],
        ["local", "r", "--client", "0", "--steps", "1"],
    ],
)
def test_set_given_twice_adds_up(head: list[str]) -> None:
    """``--set a=1 --set b=2`` sets both: argparse's default for an option given twice is the last list alone,
    which silently dropped ``a=1``."""
    from fedsim.app.cli import build_parser

    args = build_parser().parse_args([*head, "--set", "train.rounds=1", "eval.every=1", "--set", "seed=3"])
    assert args.set == ["train.rounds=1", "eval.every=1", "seed=3"]


def test_set_given_twice_runs_with_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, small_config(tmp_path))
    run_dir = tmp_path / "two-sets"
    argv = ["run", str(path), "--set", "train.rounds=1", "eval.every=1", "--set", f"output.run_dir={run_dir}"]
    assert main(argv) == 0
    rounds = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rounds[-1] == 1  # train.rounds=1 from the first --set held; the run dir came from the second
    code = main(["run", str(path), "--set", "train.rounds=1", "--set", "train.rounds=2"])
    assert code == 2
    assert "--set train.rounds" in capsys.readouterr().err


def test_compose_tls_host_given_twice_adds_up() -> None:
    from fedsim.app.cli import build_parser

    args = build_parser().parse_args(["compose", "c.yaml", "--tls-host", "a.example", "--tls-host", "b.example"])
    assert args.tls_host == ["a.example", "b.example"]


def _single_value_options() -> list[tuple[str, str, str, str]]:
    """(command, option, a value, another value) for every option of every command that takes one value."""
    import argparse

    from fedsim.app.cli import build_parser

    values = {int: ("1", "2"), float: ("0.5", "0.9")}
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (command, action.option_strings[0], *values.get(action.type, ("a", "b")))  # type: ignore[arg-type]
        for command, parser in sub.choices.items()
        for action in parser._actions
        if action.option_strings and isinstance(action, argparse._StoreAction) and action.nargs is None
    ]


def test_every_option_taking_one_value_is_checked_here() -> None:
    options = {(command, option) for command, option, *_ in _single_value_options()}
    assert {("report", "--target"), ("report", "--out"), ("plot", "--out"), ("local", "--client")} <= options
    assert {("run", "--resume"), ("sweep", "--output"), ("sweep", "--parallel"), ("compose", "--nodes")} <= options
    assert len(options) >= 15


@pytest.mark.parametrize(("command", "option", "first", "second"), _single_value_options())
def test_an_option_taking_one_value_given_twice_is_refused(
    capsys: pytest.CaptureFixture[str], command: str, option: str, first: str, second: str
) -> None:
    """argparse keeps the last of ``--target 0.5 --target 0.9`` (``--out a --out b``) and drops the first in
    silence, as ``--set`` given twice did: the user's first value is lost without a word."""
    from fedsim.app.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "x", option, first, option, second])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"fedsim: error: {command}: argument {option}")
    assert f"({first}, then {second})" in line  # both values named; the wording: tests/test_bad_inputs.py


def test_a_path_starting_with_a_tilde_is_in_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``~`` in a config or sweep file's path, or in an argument the shell left alone (``--out=~/x``, quoted),
    is the home directory, as data.root's and data.cache_dir's always were: it made a directory named ``~``
    in the working directory, and a certificate at ``~/ca.pem`` was 'no file at ~/ca.pem'."""
    import yaml

    from fedsim.sweep.plan import plan

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    path = write_config(tmp_path, small_config(tmp_path))
    assert main(["run", str(path), "--set", "train.rounds=1", "eval.every=1", "output.run_dir=~/rd"]) == 0
    assert (home / "rd" / "summary.json").is_file()
    assert main(["report", "~/rd", "--out=~/report"]) == 0
    assert (home / "report" / "results.md").is_file()
    assert main(["plot", "~/rd", "--out", "~/plots"]) == 0
    assert (home / "plots" / "accuracy.png").is_file()
    assert not (work / "~").exists()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (home / name).write_text("PEM")
    certs = "deploy.certificates={ca: ~/ca.pem, cert: ~/cert.pem, key: ~/key.pem}"
    cfg = load_config(path, ["output.dir=~/runs", "deploy.tls=true", certs])
    assert cfg.output.dir == str(home / "runs") and cfg.deploy.certificates is not None
    assert [cfg.deploy.certificates.ca, cfg.deploy.certificates.key] == [str(home / "ca.pem"), str(home / "key.pem")]
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(path), "name": "s", "output": "~/sweeps", "grid": {"seed": [0]}}))
    assert plan(sweep)[0] == home / "sweeps" / "s"
    capsys.readouterr()


def test_an_empty_path_argument_is_refused_not_read_as_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unset shell variable (``fedsim report "$DIR"``) is an empty path, which Python reads as ``.``: fedsim
    reported, plotted or resumed the working directory, or wrote into it."""
    monkeypatch.chdir(tmp_path)
    cases = {
        ("run", "--resume", ""): "run: argument --resume",
        ("report", ""): "report: argument dir",
        ("report", ".", "--out", ""): "report: argument --out/-o",
        ("plot", ".", "", "--out", "p"): "plot: argument RUN_DIR",
        ("local", "", "--client", "0", "--steps", "1"): "local: argument RUN_DIR",
        ("sweep", ""): "sweep: argument sweep",
        ("sweep", "s.yaml", "--output", ""): "sweep: argument --output",
        ("compose", "c.yaml", "--out", ""): "compose: argument --out",
    }
    for argv, argument in cases.items():
        with pytest.raises(SystemExit) as exit_:
            main(list(argv))
        assert exit_.value.code == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"fedsim: error: {argument}: "), line  # the wording: tests/test_bad_inputs.py
    assert not list(tmp_path.iterdir())


def test_missing_data_path_says_where_it_looked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, small_config(tmp_path, data={"root": "nowhere/mnist.npz"}))
    code, err = run_cli(capsys, path)
    assert code == 2
    assert str(tmp_path / "nowhere" / "mnist.npz") in err  # relative roots resolve against the config file


def test_missing_torchvision_files_explain_download(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, small_config(tmp_path, data={"dataset": "cifar10", "root": "tv"}))
    code, err = run_cli(capsys, path)
    assert code == 2
    assert str(tmp_path / "tv") in err and "data.download" in err


def test_a_failed_download_is_one_line_and_leaves_no_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchvision's error names every mirror it tried on lines of their own, after making <root>/MNIST/raw;
    a mirror that refuses the connection fails the same way with or without a network."""
    from torchvision import datasets

    monkeypatch.setattr(datasets.MNIST, "mirrors", ["http://127.0.0.1:9/"])
    root = tmp_path / "junk"
    data = {"dataset": "mnist", "root": str(root), "download": True}
    path = write_config(tmp_path, small_config(tmp_path, data=data))
    code, err = run_cli(capsys, path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("fedsim: error: data.download: ") and str(root / "MNIST" / "raw") in err
    assert "Connection refused" in err and not root.exists()


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(capsys, tmp_path / "absent.yaml")
    assert code == 2 and err.startswith("fedsim: error: ") and "absent.yaml" in err


def test_bad_override_syntax(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, small_config(tmp_path))
    code, err = run_cli(capsys, path, "train.rounds")
    assert code == 2 and "--set 'train.rounds'" in err  # the wording: tests/test_bad_inputs.py


@pytest.mark.slow
def test_cli_process_exit_code_and_no_traceback(tmp_path: Path) -> None:
    path = write_config(tmp_path, small_config(tmp_path, train={"lr": -1}))
    proc = subprocess.run(
        [sys.executable, "-m", "fedsim.app.cli", "run", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "train.lr" in proc.stderr and "Traceback" not in proc.stderr


def test_list_shows_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("fedavg", "dirichlet", "n_class", "iid", "ln", "fn", "gn", "bn", "cnn", "resnet18", "imagefolder"):
        assert f"  {name} " in out
    assert "beta=0.5" in out  # options with their defaults


def test_list_of_an_empty_kind_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", ""]) == 2  # it listed every kind
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedsim: error: ") and "''" in err and len(err.splitlines()) == 1


def test_a_lone_surrogate_in_a_config_file_or_a_sweep_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, small_config(tmp_path))
    path.write_text(path.read_text().replace("\nname: t\n", '\nname: "q\\ud800"\n'))  # YAML's escape for it
    code, err = run_cli(capsys, path)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("fedsim: error: name: "), err
    assert "'q\\ud800'" in err  # the value as it came; the wording: tests/test_bad_inputs.py
    sweep = tmp_path / "sweep.yaml"
    base = write_config(tmp_path, small_config(tmp_path), "base.yaml")
    sweep.write_text(f'base: {base}\ngrid:\n  data.cache_dir: ["a\\udcffb"]\n')
    assert main(["sweep", str(sweep), "--output", str(tmp_path / "sweeps")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "'a\\udcffb'" in err[0]


def test_the_error_file_is_written_only_as_a_new_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FEDSIM_ERROR_FILE (how fedsim sweep learns why a cell's process failed) names a file fedsim makes: a
    path that exists already (a directory, someone's file, a symlink, even a dangling one) is left as it is,
    and the command still ends with its one error line."""
    from fedsim.errors import ERROR_FILE_ENV

    config = write_config(tmp_path, small_config(tmp_path, train={"lr": -1}))
    a_dir, theirs, target = tmp_path / "a_dir", tmp_path / "theirs.txt", tmp_path / "target"
    a_dir.mkdir()
    theirs.write_text("their data\n")
    (tmp_path / "link").symlink_to(target)
    for existing in (a_dir, theirs, tmp_path / "link"):
        monkeypatch.setenv(ERROR_FILE_ENV, str(existing))
        code, err = run_cli(capsys, config)
        assert code == 2 and err.startswith("fedsim: error: train.lr") and len(err.splitlines()) == 1, err
    assert list(a_dir.iterdir()) == [] and theirs.read_text() == "their data\n" and not target.exists()
    fresh = tmp_path / "cell.error.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(fresh))
    code, err = run_cli(capsys, config)
    assert code == 2 and json.loads(fresh.read_text()) == {"type": "ConfigError", "message": err.strip()[15:]}
