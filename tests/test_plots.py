"""The figures' arithmetic and labels (fedsim/app/plots.py): the mean ± std over seeds at the rounds every seed
evaluated, the personalised series where lines have it, legend labels, reference lines. The figures of real runs,
drawn: tests/test_report.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsim.app.plots import mean_and_std, parse_references, plot_accuracy, run_labels
from fedsim.errors import ConfigError


def run(seed: int, lines: list[dict[str, Any]], **config: Any) -> dict[str, Any]:
    return {"dir": Path(f"runs/r-{seed}"), "config": {"seed": seed, "strategy.name": "fedavg", **config},
            "metrics": lines, "summary": None}  # fmt: skip


def test_the_mean_and_std_over_seeds_are_at_the_rounds_every_seed_has() -> None:
    a = run(0, [{"round": 10, "client_mean_acc": 0.2}, {"round": 20, "client_mean_acc": 0.4}])
    b = run(1, [{"round": 10, "client_mean_acc": 0.3}, {"round": 20, "client_mean_acc": 0.6},
                {"round": 30, "client_mean_acc": 0.7}])  # fmt: skip
    rounds, mean, std = mean_and_std([a, b], "client_mean_acc")
    assert rounds == [10, 20]  # round 30: one seed only, left out
    np.testing.assert_allclose(mean, [25.0, 50.0])
    np.testing.assert_allclose(std, [5.0, 10.0])  # population std, as the report's


def test_personalised_accuracy_is_averaged_where_the_lines_have_it() -> None:
    lines = [{"round": 10, "client_mean_acc": 0.2}, {"round": 20, "client_mean_acc": 0.4, "personal_acc": 0.9}]
    rounds, mean, _ = mean_and_std([run(0, lines), run(1, lines)], "personal_acc")
    assert rounds == [20] and mean.tolist() == [90.0]  # eval.personal.every: round 10 was not personalised
    assert mean_and_std([run(0, lines[:1])], "personal_acc")[0] == []


def test_a_seed_not_evaluated_yet_is_left_out_and_said(tmp_path: Path) -> None:
    done = run(0, [{"round": 10, "client_mean_acc": 0.2}])
    pending = run(1, [])
    notes = plot_accuracy([done, pending], tmp_path / "acc.png", over_seeds=True)
    assert notes == ["runs/r-1 in acc.png: no client-mean accuracy evaluated yet; its config's line is the mean "
                     "over the other 1 seed"]  # fmt: skip
    assert (tmp_path / "acc.png").stat().st_size > 0


def test_legend_labels_name_what_differs_else_the_seed_else_the_directory() -> None:
    assert run_labels([run(0, [], **{"model.norm.name": "ln"}), run(0, [], **{"model.norm.name": "none"})]) == [
        "norm=ln", "norm=none"]  # fmt: skip
    assert run_labels([run(0, []), run(1, [])]) == ["seed=0", "seed=1"]
    assert run_labels([run(0, [])]) == ["r-0"]


def test_reference_lines_are_name_and_percent() -> None:
    assert parse_references(["LN-FL FedLN=78.04", "a=b=1"]) == {"LN-FL FedLN": 78.04, "a=b": 1.0}
    for bad in ("78.04", "=5", "x=101", "x=nan", "x=high", "x\n=5"):
        with pytest.raises(ConfigError, match="give NAME=PERCENT"):
            parse_references([bad])
    with pytest.raises(ConfigError, match="'x' is given twice"):
        parse_references(["x=1", "x=2"])
