"""The figures' arithmetic and labels (fedsim/app/plots.py): the mean ± std over seeds at the rounds every seed
evaluated, the personalised series where lines have it, legend labels, reference lines. The figures of real runs,
drawn: tests/test_report.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsim.app.plots import _mark_references, mean_and_std, parse_references, plot_accuracy, run_labels
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
    np.testing.assert_allclose(std, [np.sqrt(50), np.sqrt(200)])  # sample std (n - 1), as the report's
    assert mean_and_std([a], "client_mean_acc")[2].tolist() == [0.0, 0.0]  # one seed: no band


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
    # an option of one strategy only is in that run's label alone (not "beta_1=None" in the others')
    yogi = run(0, [], **{"strategy.name": "fedyogi", "strategy.options.beta_1": 0.9})
    assert run_labels([run(0, []), yogi]) == ["strategy=fedavg", "strategy=fedyogi, beta_1=0.9"]


def test_close_references_are_named_at_either_end_of_their_lines() -> None:
    """Each name sits just above its line, at the right end unless it would overlap the name above it there
    (LN-FL's 78.04 and 77.52, 73.13 and 71.83 on a 10-80 axis): never two names on top of each other."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        ax.set_ylim(10, 80)
        _mark_references(ax, {"FedLN": 78.04, "FedLN 2": 77.52, "FedAvg": 56.82, "Yogi": 73.13, "FedAvg 2": 71.83})
        fig.canvas.draw()
        placed = {t.get_text().partition(":")[0]: t.get_window_extent() for t in ax.texts}
        ends = {name: t.get_ha() for name, t in zip(placed, ax.texts, strict=True)}
    finally:
        plt.close(fig)
    assert ends == {"FedLN": "right", "FedLN 2": "left", "Yogi": "right", "FedAvg 2": "left", "FedAvg": "right"}
    boxes = list(placed.values())
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_reference_lines_are_name_and_percent() -> None:
    assert parse_references(["LN-FL FedLN=78.04", "a=b=1"]) == {"LN-FL FedLN": 78.04, "a=b": 1.0}
    for bad in ("78.04", "=5", "x=101", "x=nan", "x=high", "x\n=5"):
        with pytest.raises(ConfigError, match="give NAME=PERCENT"):
            parse_references([bad])
    with pytest.raises(ConfigError, match="'x' is given twice"):
        parse_references(["x=1", "x=2"])


def test_the_title_names_only_the_lines_the_figure_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs without a global test set (eval.global_test: false) have no dashed line, and the title says none;
    one with it names its dashed line; one with eval.personal its dotted one."""
    from fedsim.app import plots

    titles: list[str] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: titles.append(fig.axes[0].get_title()))
    plain = [{"round": 10, "client_mean_acc": 0.2}]
    scored = [{"round": 10, "client_mean_acc": 0.2, "global_acc": 0.3}]
    personal = [{"round": 10, "client_mean_acc": 0.2, "personal_acc": 0.9}]
    for lines in (plain, scored, personal):
        plot_accuracy([run(0, lines), run(1, lines)], tmp_path / "acc.png", with_global=True, over_seeds=True)
    assert titles == [
        "client-mean accuracy, mean ± sample std over seeds",
        "client-mean accuracy (solid), global-model accuracy (dashed), mean ± sample std over seeds",
        "client-mean accuracy (solid), personalised client-mean (dotted), mean ± sample std over seeds",
    ]
