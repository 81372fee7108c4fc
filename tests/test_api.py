"""The Python API (``fedsim.run``, ``fedsim.resume``, ``fedsim.open_run``, ``fedsim.make_config``): the same runs
as the command line, results read back as a DataFrame, and failures as :class:`fedsim.FedsimError`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ArrayRecord

import fedsim
from fedsim.app.cli import main
from fedsim.config import RunConfig
from fedsim.errors import ConfigError
from fedsim.server.reporter import RoundReporter
from tests.conftest import small_config, write_config

pytestmark = pytest.mark.usefixtures("one_thread")


def lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_from_a_mapping_equals_the_command_line_and_reads_back(tmp_path: Path) -> None:
    raw = small_config(tmp_path, output={"run_dir": str(tmp_path / "api")})
    result = fedsim.run(raw, ["train.rounds=2", "eval.every=1"])
    cli_cfg = write_config(tmp_path, {**raw, "output": {**raw["output"], "run_dir": str(tmp_path / "cli")}})
    assert main(["run", str(cli_cfg), "--set", "train.rounds=2", "eval.every=1"]) == 0

    assert result.dir == tmp_path / "api" and result.finished
    assert result.config["train.rounds"] == 2 and result.config["model.norm.name"] == "ln"
    wall_clock = ("time_s", "rss_mb")
    api_lines, cli_lines = lines(tmp_path / "api"), lines(tmp_path / "cli")
    assert [{k: v for k, v in m.items() if k not in wall_clock} for m in api_lines] == [
        {k: v for k, v in m.items() if k not in wall_clock} for m in cli_lines
    ]
    frame = result.metrics
    assert list(frame.index) == [1, 2] and frame.index.name == "round"
    assert frame["client_mean_acc"].tolist() == [m["client_mean_acc"] for m in api_lines]
    assert frame.loc[2, "client_acc"] == api_lines[1]["client_acc"]  # per-client lists stay lists
    assert result.summary["final_client_mean_acc"] == api_lines[-1]["client_mean_acc"]
    assert fedsim.open_run(tmp_path / "api").summary == result.summary


def test_a_config_file_a_mapping_and_a_runconfig_give_one_config(tmp_path: Path) -> None:
    raw = small_config(tmp_path)
    from_file = fedsim.make_config(write_config(tmp_path, raw), ["train.lr=0.1"])
    from_mapping = fedsim.make_config(raw, ["train.lr=0.1"])
    assert isinstance(from_file, RunConfig) and from_file == from_mapping
    assert fedsim.make_config(from_mapping, ["seed=3"]).seed == 3 and from_mapping.seed == 0  # a copy
    assert raw["train"]["lr"] == 0.05  # the caller's mapping is left as it was


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda tmp: fedsim.run(small_config(tmp), ["train.rounds=0"]), "train.rounds"),
        (lambda tmp: fedsim.run(small_config(tmp), "train.rounds=2"), "give a list of key=value strings"),
        (lambda tmp: fedsim.run(tmp / "missing.yaml"), "config file not found"),
        (lambda tmp: fedsim.open_run(tmp), "not a run directory"),
        (lambda tmp: fedsim.resume(tmp), "not a run directory"),
    ],
    ids=["bad-value", "overrides-as-one-string", "missing-file", "open-not-a-run", "resume-not-a-run"],
)
def test_failures_are_fedsim_errors_and_create_nothing(tmp_path: Path, call: Any, fragment: str) -> None:
    with pytest.raises(fedsim.FedsimError, match=fragment):
        call(tmp_path)
    assert not (tmp_path / "runs").exists()


PATH = "a path (str or os.PathLike)"
SOURCE = "a YAML path (str or os.PathLike), a mapping of sections or a RunConfig"
OVERRIDES = "a list of key=value strings"
PARALLEL = "a whole number of runs at once or None"


@pytest.mark.parametrize(
    ("call", "argument", "accepted"),
    [
        (lambda tmp: fedsim.run(123), "source", SOURCE),
        (lambda tmp: fedsim.run(None), "source", SOURCE),
        (lambda tmp: fedsim.run([str(tmp / "cfg.yaml")]), "source", SOURCE),
        (lambda tmp: fedsim.run(str(tmp / "cfg.yaml").encode()), "source", SOURCE),
        (lambda tmp: fedsim.make_config(3.5), "source", SOURCE),
        (lambda tmp: fedsim.run(small_config(tmp), overrides=[1]), "overrides", OVERRIDES),
        (lambda tmp: fedsim.run(small_config(tmp), overrides=None), "overrides", OVERRIDES),
        (lambda tmp: fedsim.run(small_config(tmp), overrides=5), "overrides", OVERRIDES),
        (lambda tmp: fedsim.run(small_config(tmp), overrides={"train.rounds": 2}), "overrides", OVERRIDES),
        (lambda tmp: fedsim.run(small_config(tmp), overrides=b"train.rounds=2"), "overrides", OVERRIDES),
        (lambda tmp: fedsim.make_config(small_config(tmp), [b"train.rounds=2"]), "overrides", OVERRIDES),
        (lambda tmp: fedsim.make_config({1: {}}), "1", "Keys should be strings"),
        (lambda tmp: fedsim.resume(123), "run_dir", PATH),
        (lambda tmp: fedsim.resume(None), "run_dir", PATH),
        (lambda tmp: fedsim.resume(tmp / "missing"), str(Path("missing")), "not a run directory"),
        (lambda tmp: fedsim.open_run(None), "run_dir", PATH),
        (lambda tmp: fedsim.open_run([tmp]), "run_dir", PATH),
        (lambda tmp: fedsim.open_run(b"."), "run_dir", PATH),
        (lambda tmp: fedsim.open_sweep(1), "sweep_dir", PATH),
        (lambda tmp: fedsim.open_sweep(tmp / "missing"), "missing", "not a directory"),
        (lambda tmp: fedsim.run_sweep(1), "path", PATH),
        (lambda tmp: fedsim.run_sweep(tmp / "missing.yaml"), "missing.yaml", "sweep file not found"),
        (lambda tmp: fedsim.run_sweep(tmp / "s.yaml", overrides=[None]), "overrides", OVERRIDES),
        (
            lambda tmp: fedsim.run_sweep(tmp / "s.yaml", parallel="2"),
            "parallel",
            "a whole number of runs at once or None",
        ),
        (
            lambda tmp: fedsim.run_sweep(tmp / "s.yaml", parallel=True),
            "parallel",
            "a whole number of runs at once or None",
        ),
        (lambda tmp: fedsim.run_sweep(tmp / "s.yaml", output=5), "output", "a path (str or os.PathLike) or None"),
        (lambda tmp: fedsim.run_sweep(tmp / "s.yaml", log="print"), "log", "a function of one str"),
    ],
)
def test_a_wrong_argument_type_is_a_config_error_naming_the_argument(
    tmp_path: Path, call: Any, argument: str, accepted: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        call(tmp_path)
    message = str(caught.value)
    assert argument in message and accepted in message, message
    assert not (tmp_path / "runs").exists()


class _NoRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


_LOOP: list[Any] = []
_LOOP.append(_LOOP)


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        # a raw ValueError (int too large to convert) from the error's own message
        (None, "seed", 10**5000, "seed: Input should be less than 9223372036854775808 (got <int without a printable"),
        ("train", "lr", -(10**5000), "train.lr: Input should be a valid number (got <int without a printable form>)"),
        ("train", "batch_size", _NoRepr(), "train.batch_size: Input should be a valid integer (got <_NoRepr without"),
        # plugin options go through JSON in experiment.resolve: these were tracebacks there
        ("model", "hidden", [10**5000], "model: option hidden = <list without a printable form> has no form in the"),
        ("partition", "beta", {"a": object()}, "partition: option beta = {'a': <object object at"),
        ("model", "hidden", _LOOP, "model: option hidden = [[...]] has no form in the run's config.yaml"),
        # a lone surrogate: a pydantic JSON traceback in experiment.resolve
        (None, "name", "a\udcffb", "name: holds '\\udcff', a lone surrogate, not a Unicode character"),
        ("data", "cache_dir", "/tmp/\udcff", "data.cache_dir: holds '\\udcff', a lone surrogate"),
    ],
    ids=["huge-seed", "huge-lr", "no-repr", "huge-option", "object-option", "loop", "surrogate", "surrogate-path"],
)
def test_a_mapping_value_fedsim_cannot_write_is_one_line_naming_its_field(
    tmp_path: Path, section: str | None, key: str, value: object, message: str
) -> None:
    raw = small_config(tmp_path)
    where = raw if section is None else raw.setdefault(section, {})
    if isinstance(where, str):  # a plugin given by its name alone
        where = raw[section] = {"name": where}
    where[key] = value
    with pytest.raises(ConfigError) as caught:
        fedsim.make_config(raw)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)


def test_an_interrupted_run_resumes_from_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (a Jupyter kernel's interrupt) stops ``fedsim.run`` with KeyboardInterrupt, after which
    ``fedsim.resume`` finishes it with the uninterrupted run's numbers."""
    raw = small_config(tmp_path, train={"rounds": 4}, eval={"every": 1})
    whole = fedsim.run(raw, [f"output.run_dir={tmp_path / 'whole'}"])
    report = RoundReporter.round_done

    def interrupt_in_round_3(self: RoundReporter, server_round: int, arrays: ArrayRecord, *facts: Any) -> Any:
        if server_round == 3:
            raise KeyboardInterrupt
        return report(self, server_round, arrays, *facts)

    monkeypatch.setattr(RoundReporter, "round_done", interrupt_in_round_3)
    stopped = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        fedsim.run(raw, [f"output.run_dir={stopped}", "output.checkpoint_every=2"])
    monkeypatch.undo()
    assert not fedsim.open_run(stopped).finished
    resumed = fedsim.resume(stopped)
    assert resumed.summary["resumed_from_round"] == 2
    columns = ["train_loss", "client_mean_acc", "global_acc"]
    assert resumed.metrics[columns].equals(whole.metrics[columns])


def test_a_run_before_its_first_evaluation_has_no_metrics_rows(tmp_path: Path) -> None:
    """Round 1 of a run evaluated every 2 rounds: no metrics.jsonl yet, read as no rows (the same index)."""
    import numpy as np

    from fedsim.config_file import parse_config
    from fedsim.record.writer import RunDir

    out = RunDir(tmp_path / "live")
    cfg = parse_config(small_config(tmp_path))
    out.write_config(cfg)
    counts = np.ones((cfg.train.num_clients, 10), dtype=np.int64)
    out.write_partition(counts, counts, [str(c) for c in range(10)])
    out.write_progress(1, 2.3, None)
    metrics = fedsim.open_run(out.path).metrics
    assert len(metrics) == 0 and list(metrics.index.names) == ["round"] and "round" in metrics.columns
