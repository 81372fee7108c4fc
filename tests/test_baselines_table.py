"""The later baselines' 200-round table (docs/results.md, results/baselines-200rounds/): each number of it is what
the committed runs' own files hold, computed here without fedsim's report, so the page can never drift from the
runs it reports, nor list a seed that did not finish or leave out one that did."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from tests.conftest import REPO

RESULTS = REPO / "results" / "baselines-200rounds"
PAGE = REPO / "docs" / "results.md"
SECTION = "## The later label-skew baselines with and without LN, 200 rounds"
NORMS = ("none", "ln")
# | MOON | 10.01 ± 0.12 | 0, 1, 2 | 1.1 | 40.99 | 0 | 90.7 | +30.98 |
ROW = re.compile(r"^\| (?P<method>MOON|FedDyn|FedNova|FedExP|FedNTD) \| (?P<cells>.*) \|$")
HEADLINE = re.compile(
    r"^\| (?P<method>FedAvg|FedLN \(FedAvg \+ LN\)) \| (?P<acc>[^|]+) \| 0, 1, 2 \| (?P<erank>[^|]+) \|"
)
HEADLINE_SECTION = "## The headline at 200 rounds, three seeds"


def section() -> list[str]:
    text = PAGE.read_text()
    assert SECTION in text, f"{PAGE} has no section {SECTION!r}"
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0].splitlines()


def rows() -> list[re.Match[str]]:
    found = [m for line in section() if (m := ROW.match(line))]
    assert found, f"no table rows in {PAGE}'s section {SECTION!r}"
    return found


def finished(strategy: str, norm: str) -> dict[int, Path]:
    """The runs of the sweep with this strategy and norm that finished (summary.json), by seed."""
    runs = {}
    for path in RESULTS.glob(f"seed=*,strategy={strategy},norm={norm}"):
        if (path / "summary.json").is_file():
            runs[int(path.name.split(",")[0].removeprefix("seed="))] = path
    return runs


def final_accuracy(run: Path) -> float:
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] == 200, run
    return 100 * summary["final_client_mean_acc"]


def final_erank(run: Path) -> float:
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["round"] == 200, run
    return last["feature_erank"]


def spread(values: list[float]) -> str:
    """Mean ± sample std, as fedsim report and every table of the page write them; a single seed's number alone."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


@pytest.mark.parametrize("row", rows(), ids=lambda m: m["method"])
def test_each_number_of_the_table_is_the_runs_own(row: re.Match[str]) -> None:
    cells = [c.strip() for c in row["cells"].split("|")]
    assert len(cells) == 7, row.group(0)
    strategy, means = row["method"].lower(), []
    for norm, (acc, seeds, erank) in zip(NORMS, (cells[0:3], cells[3:6]), strict=True):
        runs = finished(strategy, norm)
        if not runs:
            assert (acc, seeds, erank) == ("not measured yet", "-", "-"), (norm, row.group(0))
            continue
        assert seeds == ", ".join(map(str, sorted(runs))), (norm, seeds, sorted(runs))  # every finished seed
        values = [final_accuracy(runs[s]) for s in sorted(runs)]
        assert acc == spread(values), (norm, acc, values)
        assert erank == f"{statistics.mean(final_erank(runs[s]) for s in sorted(runs)):.1f}", (norm, erank)
        means.append(statistics.mean(values))
    lift = cells[6]
    assert lift == (f"{means[1] - means[0]:+.2f}" if len(means) == 2 else "-"), (lift, means)


def test_every_strategy_of_the_sweep_has_its_row() -> None:
    """Each strategy with a run directory in the sweep, finished or not, has its row ("not measured yet" till then)."""
    stated = {m["method"].lower() for m in rows()}
    swept = {path.name.split(",")[1].removeprefix("strategy=") for path in RESULTS.glob("seed=*")}
    assert swept <= stated, swept - stated


def test_the_fedavg_row_is_the_headlines() -> None:
    """FedAvg's and FedLN's numbers beside the baselines are the 200-round headline table's (same page)."""
    one_class = PAGE.read_text().split(HEADLINE_SECTION, 1)[1].split("2 classes per client")[0]
    headline = {m["method"].split()[0]: m for line in one_class.splitlines() if (m := HEADLINE.match(line))}
    assert set(headline) == {"FedAvg", "FedLN"}, headline
    row = next(line for line in section() if line.startswith("| FedAvg / FedLN"))
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    assert cells[:6] == [headline["FedAvg"]["acc"].strip(), "0, 1, 2", headline["FedAvg"]["erank"].strip(),
                         headline["FedLN"]["acc"].strip(), "0, 1, 2", headline["FedLN"]["erank"].strip()]  # fmt: skip
    mean = [float(c.split(" ± ")[0]) for c in (cells[0], cells[3])]
    assert cells[6] == f"{mean[1] - mean[0]:+.2f}"
