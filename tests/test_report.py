"""fedsim report: tables and plots over a sweep's runs, columns named by the swept keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsim.app.cli import main
from fedsim.sweep.execute import run_sweep
from tests.conftest import make_sweep


@pytest.mark.slow
def test_report_plots_final_accuracy_against_a_swept_key(tmp_path: Path) -> None:
    from fedsim.app.plots import plot_final_vs
    from fedsim.app.report import load_runs
    from fedsim.errors import FedsimError

    path = make_sweep(tmp_path, {"partition.beta": [0.1, 1.0, 10.0], "model.norm": ["ln", "none"]})
    out = run_sweep(path, log=lambda _: None)
    assert main(["report", str(out), "--vs", "partition.beta"]) == 0
    assert (out / "final_vs_beta.png").stat().st_size > 10_000
    runs = load_runs(out)
    assert plot_final_vs(runs, "partition.beta", tmp_path / "p.png") == 2  # one line per norm
    with pytest.raises(FedsimError, match="numeric model.norm"):
        plot_final_vs(runs, "model.norm", tmp_path / "q.png")


def test_report_columns_appear_once_each_named_by_as_much_of_the_key_as_tells_them_apart() -> None:
    """A varied key whose last part is another column's name (train.rounds beside the rounds run) or another
    varied key's (model.norm.eps, strategy.eps) is named by more of its path, in the table as in the legends."""
    from fedsim.app.grouping import seed_groups
    from fedsim.app.report import table

    def run(rounds: int, eps: float, seed: int) -> dict:  # type: ignore[type-arg]
        config = {"seed": seed, "train.rounds": rounds, "model.norm.eps": eps, "strategy.eps": 0.1}
        config["strategy.name"] = "x"
        summary = {"rounds": rounds, "final_client_mean_acc": 0.5, "best_client_mean_acc": 0.5, "final_global_acc": 0.5}
        return {"config": config, "summary": summary, "metrics": [{"round": rounds, "client_mean_acc": 0.5}]}

    runs = [run(2, 1e-5, 0), run(2, 1e-5, 1), run(4, 1e-3, 0)]
    runs[2]["config"] |= {"strategy.eps": 0.2, "strategy.name": "y"}
    header, rows = table(runs, 0.5)
    assert header[:6] == ["norm.eps", "strategy.eps", "strategy", "train.rounds", "seeds", "rounds"]
    assert len(set(header)) == len(header) and [row[:6] for row in rows] == [
        ["1e-05", "0.1", "x", "2", "2", "2"], ["0.001", "0.2", "y", "4", "1", "4"]
    ]  # fmt: skip
    assert list(seed_groups(runs)) == [
        "norm.eps=1e-05, strategy.eps=0.1, strategy=x, rounds=2",  # a legend has no other rounds
        "norm.eps=0.001, strategy.eps=0.2, strategy=y, rounds=4",
    ]


def test_the_rounds_to_target_column_names_the_target_it_used() -> None:
    """The column names the target as given (--target 0.505: 50.5%), not rounded to one that other runs reached."""
    from fedsim.app.report import table

    summary = {"rounds": 2, "final_client_mean_acc": 0.5, "best_client_mean_acc": 0.5, "final_global_acc": 0.5}
    runs = [{"config": {"seed": 0}, "summary": summary, "metrics": [{"round": 2, "client_mean_acc": 0.5}]}]
    assert [table(runs, target)[0][-1] for target in (0.5, 0.505, 0.07, 1.0)] == [
        "rounds to 50%", "rounds to 50.5%", "rounds to 7%", "rounds to 100%"
    ]  # fmt: skip
    assert [table(runs, target)[1][0][-1] for target in (0.5, 0.505)] == ["2", "-"]


def test_each_plus_minus_is_the_sample_std_over_the_seeds() -> None:
    """Seeds at 37.92% and 42.84% (FedLN's first two headline seeds) are 40.38 ± 3.48: the sample std, n - 1 in the
    denominator, as docs/results.md's tables are (the population std would read 2.46); one seed is its number."""
    from fedsim.app.report import table

    def run(seed: int, acc: float) -> dict:  # type: ignore[type-arg]
        summary = {"rounds": 200, "final_client_mean_acc": acc, "best_client_mean_acc": acc, "final_global_acc": None}
        return {"config": {"seed": seed}, "summary": summary, "metrics": [{"round": 200, "client_mean_acc": acc}]}

    _, rows = table([run(0, 0.3792), run(1, 0.4284)], 0.5)
    assert rows[0][:4] == ["2", "200", "40.38 ± 3.48", "40.38 ± 3.48"]
    _, rows = table([run(0, 0.10), run(1, 0.20), run(2, 0.60)], 0.5)
    assert rows[0][2] == "30.00 ± 26.46"  # sqrt(((10 - 30)² + (20 - 30)² + (60 - 30)²) / 2) = sqrt(700)
    assert table([run(0, 0.3792)], 0.5)[1][0][2] == "37.92"
