"""fedsim sweep's plan (fedsim.sweep.plan): the sweep file, its cells, their names and directories, all checked
before any run (cheap)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from fedsim.app.cli import main
from fedsim.sweep.execute import run_sweep
from fedsim.sweep.plan import cell_name, plan
from tests.conftest import MNIST_SMALL, make_sweep, one_line


@pytest.mark.parametrize(
    ("grid", "fragment"),
    [
        ({"model.normm": ["ln"]}, "model.normm: unknown key"),
        ({"model.norm": []}, "empty list"),
        ({"model.norm": ["ln", "nope"]}, "unknown norms 'nope'"),
    ],
)
def test_bad_grid_fails_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], grid, fragment) -> None:  # type: ignore[no-untyped-def]
    path = make_sweep(tmp_path, grid)
    assert main(["sweep", str(path)]) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()


@pytest.mark.parametrize(
    ("grid", "extra", "argv", "named"),
    [
        ({"seed": [0, 0]}, {}, [], ("seed=0",)),
        # the overrides differ; only the directory names made of them collide (it said "the same overrides")
        ({"data.cache_dir": ["a/b", "a_b"]}, {}, [], ("data.cache_dir=a/b", "data.cache_dir=a_b", "cache_dir=a_b")),
        # each cell went to <sweep>/<cell> whatever these said
        ({"seed": [0]}, {"set": {"output.run_dir": "x"}}, [], ("set ", "output.run_dir")),
        ({"seed": [0]}, {"set": {"output": {"run_dir": "x"}}}, [], ("set ", "output.run_dir")),
        ({"seed": [0]}, {"cells": [{"name": "mine"}]}, [], ("cells ", "name")),
        ({"seed": [0]}, {}, ["--set", "output.dir=x"], ("--set output.dir=x", "output.dir")),
    ],
)  # fmt: skip
def test_cells_that_would_share_or_ignore_a_directory_are_refused(  # type: ignore[no-untyped-def]
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grid, extra, argv, named
) -> None:
    """The cells, keys and values each names; the wording: tests/test_bad_inputs.py."""
    path = make_sweep(tmp_path, grid, **extra)
    assert main(["sweep", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert all(n in err for n in named) and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "sweeps").exists()


def test_invalid_cells_are_refused_together_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cells = [{"model.norm": "ln"}, {"model.norm": "nope"}, {"train.lr": -1}, {"model.norm": "none"}]
    path = make_sweep(tmp_path, {}, cells=cells)
    assert main(["sweep", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "2 of 4" in line and "norm=nope" in line and "'nope'" in line, line  # the count, each cell and field
    assert "lr=-1" in line and "train.lr" in line, line
    assert not (tmp_path / "sweeps").exists()



@pytest.mark.parametrize(
    ("extra", "argv"),
    [
        ({"set": {"eval.personal.steps": 2, "eval": {"every": 1}}}, []),  # in the file's set
        ({"set": {"eval.personal.steps": 2}}, ["--set", "eval={every: 1}"]),  # --set after the file's set
    ],
)
def test_a_section_that_would_drop_a_key_set_before_it_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: dict, argv: list[str]
) -> None:
    """The cells ran with personalised evaluation off, the steps dropped in silence by the section after them."""
    path = make_sweep(tmp_path, {"seed": [0]})
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **extra}, sort_keys=False))  # set's order
    assert main(["sweep", str(path), *argv]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"fedsim: error: sweep file {path}: its set, then --set, in order: --set eval=") and (
        "holds --set eval.personal.steps" in line
    ), line
    assert not (tmp_path / "sweeps").exists()

def test_cells_that_do_not_fit_their_data_or_model_are_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What only the data and the model can check (an ETF of fewer dimensions than the dataset's classes, FedBN on
    a model without normalisation weights) is checked for every cell as fedsim run checks it, before the first
    cell trains: such a cell failed hours into a sweep, after the cells before it."""
    etf, fedbn = {"strategy": {"name": "fedetf", "etf_dim": 3}}, {"model.norm": "none", "strategy": {"name": "fedbn"}}
    path = make_sweep(tmp_path, {}, cells=[{"strategy": {"name": "fedavg"}}, etf, fedbn])
    assert main(["sweep", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "2 of 3" in line and f"cell {cell_name(etf)}: strategy.etf_dim = 3" in line, line
    assert f"cell {cell_name(fedbn)}: model.norm: strategy 'fedbn'" in line, line
    assert not (tmp_path / "sweeps").exists()

@pytest.mark.parametrize(
    ("grid", "extra", "named"),
    [
        # a section beside a key inside it: the section's mapping would replace the other's value, and the cell
        # named lr=0.1 would train at 0.2 (and the set values be dropped)
        ({"train.lr": [0.1], "train": [{"lr": 0.2}]}, {}, ("train ", "train.lr", "grid")),
        ({}, {"cells": [{"train.lr": 0.1}, {"train": {"lr": 0.1}}]}, ("train ", "train.lr", "cells")),
        ({"train.rounds": [1, 2]}, {"set": {"train.rounds": 1}}, ("train.rounds", "set", "grid")),
        (
            {},
            {"set": {"train.rounds": 1}, "cells": [{"train": {"lr": 0.2}}]},
            ("train ", "train.rounds", "cells", "set"),
        ),
    ],
)
def test_a_value_set_in_two_places_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grid: dict, extra: dict, named: tuple[str, ...]
) -> None:
    """The keys and the places that set them; the wording: tests/test_bad_inputs.py."""
    assert main(["sweep", str(make_sweep(tmp_path, grid, **extra))]) == 2
    line = one_line(capsys.readouterr().err)
    assert all(n in line for n in named), line
    assert not (tmp_path / "sweeps").exists()


@pytest.mark.parametrize(
    "name", ["../../escape", "<absolute>", "..", "a/b", "x" * 201], ids=["up", "absolute", "dotdot", "slash", "long"]
)
def test_a_sweep_name_is_never_a_path(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    path = make_sweep(tmp_path, {"seed": [0]}, name=name.replace("<absolute>", str(elsewhere)))
    assert main(["sweep", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"fedsim: error: sweep file {path}: name = ")  # the file, the key, its value
    assert not (tmp_path / "sweeps").exists() and not (tmp_path.parent / "escape").exists()
    assert not elsewhere.exists()


@pytest.mark.parametrize("base", ["s.yaml", "./s.yaml", "../sweeps/s.yaml"])
def test_a_sweep_based_on_itself_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], base: str) -> None:
    """One line saying the base is the sweep file itself, not an error per sweep key that reading it as a run config
    would give (data missing, base and grid unknown)."""
    path = tmp_path / "sweeps" / "s.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({"base": base, "output": str(tmp_path / "out"), "grid": {"seed": [0, 1]}}))
    assert main(["sweep", str(path)]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"fedsim: error: sweep file {path}: base: {base} ")
    assert not (tmp_path / "out").exists()


def test_long_cell_names_are_cut_to_one_unique_directory_name(tmp_path: Path) -> None:
    path = make_sweep(tmp_path, {"model.hidden": [[8] * 100, [8] * 101, [8] * 200]})
    out, runs = plan(path)
    names = [name for name, _ in runs]
    assert [len(n) for n in names] == [200, 200, 200] and len(set(names)) == 3
    assert names[0].startswith("hidden=[8,8,") and re.fullmatch(r"[^~]{191}~[0-9a-f]{8}", names[0])
    assert [cfg.output.run_dir for _, cfg in runs] == [str(out / n) for n in names]
    assert cell_name({"model.norm": "a\\b\0c d/e"}) == "norm=a_b_cd_e"


def test_the_number_of_cells_is_bounded_before_they_are_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 3 x 1,001 cells, every one invalid: refused for its size at once, before any is built and validated
    path = make_sweep(tmp_path, {"seed": list(range(1001)), "model.norm": ["no1", "no2", "no3"]})
    assert main(["sweep", str(path)]) == 2
    line = one_line(capsys.readouterr().err)  # the count, the bound, the setting that lets them through
    assert line.startswith(f"fedsim: error: sweep file {path}: 3,003 cells ") and "max_cells = 1,000" in line
    assert "max_cells: 3003" in line
    path = make_sweep(tmp_path, {"seed": [0, 1, 2]}, cells=[{"model.norm": "ln"}, {"model.norm": "none"}], max_cells=6)
    assert len(plan(path)[1]) == 6  # raised on purpose, it lets them through
    # 10^20 cells: refused at once from the lists' lengths, and never advised past the limit max_cells has
    path = make_sweep(tmp_path, {f"x{i}": list(range(10)) for i in range(20)}, max_cells=10_000)
    assert main(["sweep", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"fedsim: error: sweep file {path}: 100,000,000,000,000,000,000 cells ")
    assert "max_cells = 10,000" in line
    assert "max_cells: " not in line  # never advised past the limit max_cells has


def test_max_cells_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a max_cells far beyond the limit would build and validate cells for minutes, using GBs, before the first run
    path = make_sweep(tmp_path, {"seed": [0, 1]}, max_cells=10_000_000)
    assert main(["sweep", str(path)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "max_cells" in err and "10000" in err, err  # the key and its bound; the wording: the corpus


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"parallel": True}, "parallel"),
        ({"parallel": "2"}, "parallel"),
        ({"ray": {"cpus_per_run": float("inf")}}, "ray.cpus_per_run"),
    ],
    ids=["boolean", "text", "inf"],
)
def test_sweep_numbers_are_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra, fragment) -> None:  # type: ignore[no-untyped-def]
    path = make_sweep(tmp_path, {"seed": [0]}, **extra)
    assert main(["sweep", str(path)]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"fedsim: error: sweep file {path}: {fragment}")
    assert not (tmp_path / "sweeps").exists()


def test_unreadable_data_is_refused_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an archive")
    path = make_sweep(tmp_path, {"seed": [0, 1]}, set={"data.root": str(bad)})
    assert main(["sweep", str(path)]) == 2  # read once for the sweep, not failing every cell in turn
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"fedsim: error: npz dataset {bad}: ") and "every cell" in line  # once, for every cell
    path = make_sweep(tmp_path, {}, cells=[{"data.root": str(bad)}, {"data.root": str(MNIST_SMALL)}])
    assert main(["sweep", str(path)]) == 2
    bad_cell = cell_name({"data.root": str(bad)})
    assert one_line(capsys.readouterr().err).startswith(f"fedsim: error: sweep cell {bad_cell}: npz dataset {bad}: ")
    assert not (tmp_path / "sweeps").exists()


def test_a_finished_cell_without_a_readable_config_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cell's directory with summary.json but its config.yaml missing or unreadable shows no settings to compare,
    so nothing shows it is the cell's run: it is a damaged run directory, never "already complete", refused in one
    line naming it before any cell runs."""
    path = make_sweep(tmp_path, {"seed": [0, 1]})
    out = run_sweep(path, log=lambda _: None)
    shutil.rmtree(out / "seed=0")  # a cell still to run: it must not start
    config = out / "seed=1" / "config.yaml"
    for damage in (config.unlink, lambda: config.write_text("train: {rounds: 2"), lambda: config.write_text("- t\n")):
        damage()
        assert main(["sweep", str(path)]) == 2
        line = one_line(capsys.readouterr().err)  # the cell, its directory, the file; the wording: the corpus
        assert line.startswith(f"fedsim: error: sweep cell seed=1: {out / 'seed=1'} ") and "config.yaml" in line
        assert not (out / "seed=0").exists()
