"""Runs pooled over seeds (fedsim/app/grouping.py): the keys they differ in, their short labels, and the groups a
report averages, refusing a seed counted twice or seeds trained on other data. The report's table and the plot's
bands over real runs: tests/test_report.py."""

from __future__ import annotations

from typing import Any

import pytest

from fedsim.app.grouping import seed_groups, short_keys, varying_keys
from fedsim.errors import DataError, FedsimError


def run(name: str, seed: int, data: str | None = None, **config: Any) -> dict[str, Any]:
    base = {"name": name, "seed": seed, "strategy.name": "fedavg", "model.norm.name": "ln", "train.rounds": 10}
    summary = None if data is None else {"data_sha256": data}
    return {"dir": f"runs/{name}-{seed}", "config": {**base, **config}, "summary": summary}


def test_the_keys_runs_differ_in_leave_out_seed_name_and_what_does_not_change_learning() -> None:
    runs = [
        run("a", 0, **{"model.norm.name": "none", "output.dir": "x", "simulation.threads": 1}),
        run("b", 1, **{"train.lr": 0.1, "output.dir": "y", "simulation.threads": 2, "diagnostics.features": True}),
    ]
    assert varying_keys(runs) == ["model.norm.name", "train.lr"]  # a key one run lacks differs too
    assert varying_keys([runs[0]]) == []


def test_short_labels_grow_only_as_far_as_they_must() -> None:
    assert short_keys(["strategy.name", "model.norm.name", "train.lr"]) == ["strategy", "norm", "lr"]
    assert short_keys(["model.norm.eps", "strategy.eps"]) == ["norm.eps", "strategy.eps"]
    assert short_keys(["train.rounds"], taken=("rounds",)) == ["train.rounds"]
    assert short_keys(["a.b.c", "x.b.c", "y.c"]) == ["a.b.c", "x.b.c", "y.c"]


def test_groups_pool_the_seeds_of_each_config_in_the_runs_order() -> None:
    runs = [run("r", 0), run("r", 0, **{"model.norm.name": "none"}), run("r", 1), run("r", 2)]
    groups = seed_groups(runs)
    assert list(groups) == ["norm=ln", "norm=none"]
    assert [r["config"]["seed"] for r in groups["norm=ln"]] == [0, 1, 2]
    assert seed_groups([run("r", 0), run("r", 1)]) == {"runs": [run("r", 0), run("r", 1)]}  # nothing varies


def test_one_seed_twice_is_an_error_naming_both_directories() -> None:
    with pytest.raises(FedsimError, match=r"^runs/a-0 and runs/b-0 are both seed 0 of one config"):
        seed_groups([run("a", 0), run("b", 0, **{"output.dir": "elsewhere"})])


def test_seeds_trained_on_other_data_are_an_error_naming_two_of_them() -> None:
    with pytest.raises(DataError, match=r"^runs/r-0 and runs/r-2 are seeds of one config trained on other data"):
        seed_groups([run("r", 0, "a" * 64), run("r", 1, "a" * 64), run("r", 2, "b" * 64)])
    assert len(seed_groups([run("r", 0, "a" * 64), run("r", 1), run("r", 2, "a" * 64)])["runs"]) == 3  # unfinished
