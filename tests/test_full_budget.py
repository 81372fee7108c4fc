"""The full-budget results (results/full-budget/): the numbers their README and the front page state are the
ones in the cells' own files, so a table can never drift from the runs it reports."""

from __future__ import annotations

import json
import re
import warnings

import pytest

from fedsim.record.checkpoint import Checkpoint
from fedsim.record.run import read_run
from fedsim.record.verify import LeftOut
from tests.conftest import REPO

RESULTS = REPO / "results" / "full-budget"
# | `cell` | config | 2,600 of 10,000 (client-mean accuracy 38.65% at 2,600; 36.85% at 2,500) | state |
ROW = re.compile(
    r"^\| `(?P<cell>[\w-]+)` \| [^|]+ \| (?P<done>[\d,]+) of 10,000 \((?P<accs>[^)]*)\) \| (?P<state>\w+) \|$"
)
ACC = re.compile(r"(?P<pct>\d+\.\d\d)% at (?P<round>[\d,]+)")


def number(text: str) -> int:
    return int(text.replace(",", ""))


def rows() -> list[re.Match[str]]:
    found = [m for line in (RESULTS / "README.md").read_text().splitlines() if (m := ROW.match(line))]
    assert found, "no table rows in results/full-budget/README.md"
    return found


def evaluated(cell: str) -> dict[int, float]:
    """Client-mean accuracy by evaluated round."""
    lines = (RESULTS / cell / "metrics.jsonl").read_text().splitlines()
    return {m["round"]: m["client_mean_acc"] for m in map(json.loads, lines) if m.get("client_mean_acc") is not None}


def rounds_done(cell: str) -> int:
    summary = RESULTS / cell / "summary.json"
    if summary.is_file():
        return int(json.loads(summary.read_text())["rounds"])
    return Checkpoint.load(RESULTS / cell).round


@pytest.mark.parametrize("row", rows(), ids=lambda m: m["cell"])
def test_each_number_of_the_table_is_the_cells_own(row: re.Match[str]) -> None:
    cell = row["cell"]
    accs = evaluated(cell)
    stated = [(number(m["round"]), float(m["pct"])) for m in ACC.finditer(row["accs"])]
    assert stated, row.group(0)
    for at, pct in stated:
        assert at in accs, f"{cell}: round {at} is not an evaluated round of metrics.jsonl"
        assert pct == round(100 * accs[at], 2), (cell, at, pct, accs[at])
    done = number(row["done"])
    assert stated[0][0] == max(r for r in accs if r <= done)  # the latest evaluation of the rounds stated
    # a cell still running in this checkout may have gone on since its row was written; a committed one has not
    assert done <= rounds_done(cell)
    assert (row["state"] == "finished") == (RESULTS / cell / "summary.json").is_file()


@pytest.mark.filterwarnings("ignore::fedsim.record.verify.LostEvaluations")  # FedAvg 1 class's round 4,100
@pytest.mark.parametrize("cell", sorted(p.name for p in RESULTS.iterdir() if (p / "config.yaml").is_file()))
def test_each_cell_reads_whole_from_what_the_repository_holds(cell: str) -> None:
    """``fedsim report`` and ``fedsim plot`` read a cell as a fresh clone has it: its files agree with each other
    and with its record, and a model.pt the record lists but the repository does not keep is named in a warning."""
    summary = RESULTS / cell / "summary.json"
    listed = summary.is_file() and "model.pt" in json.loads(summary.read_text())["files"]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", LeftOut)
        record = read_run(RESULTS / cell)
    assert [str(w.message).split(":")[0] for w in said if w.category is LeftOut] == (
        [str(RESULTS / cell / "model.pt")] if listed and not (RESULTS / cell / "model.pt").exists() else []
    )
    assert len(record["metrics"]) >= 90 * rounds_done(cell) // 10_000  # evaluated every 100 rounds, a lost line or so


def test_the_front_page_states_the_tables_rounds() -> None:
    table = {m["cell"]: number(m["done"]) for m in rows()}
    front = re.findall(
        r"(FedAvg|FedLN) (\d) class(?:es)? at ([\d,]+)", " ".join((REPO / "README.md").read_text().split())
    )
    assert front, "README.md names no full-budget cell"
    for method, classes, done in front:
        assert table[f"{method.lower()}-{classes}class-seed0"] == number(done), (method, classes, done)


# | FedLN (FedAvg + LN) | 77.10 | 78.04 | 40.16 ± 2.50 |   (the front page's full-budget table)
FRONT_ROW = re.compile(
    r"^\| (?P<method>FedAvg|FedLN|FedYogi)[^|,]*(?:, (?P<classes>\d) classes)? \| (?P<ours>[^|]+) \|"
)


def test_the_front_pages_full_budget_table_is_the_cells_own() -> None:
    """Each number of the README's full-budget table is its cell's final client-mean accuracy (summary.json);
    a cell said to be unfinished at N rounds has no summary and a checkpoint of at least N rounds (its row in
    results/full-budget/README.md says N too), one not started has no directory."""
    found = [m for line in (REPO / "README.md").read_text().splitlines() if (m := FRONT_ROW.match(line))]
    assert len(found) == 5, [m.group(0) for m in found]
    table = {m["cell"]: number(m["done"]) for m in rows()}
    for row in found:
        cell = RESULTS / f"{row['method'].lower()}-{row['classes'] or 1}class-seed0"
        ours = row["ours"].strip()
        if ours == "not started":
            assert not cell.exists(), cell
        elif unfinished := re.fullmatch(r"unfinished: ([\d,]+) of 10,000 rounds", ours):
            done = number(unfinished[1])
            assert not (cell / "summary.json").exists() and done <= rounds_done(cell.name), cell
            assert table[cell.name] == done, (cell.name, table[cell.name], done)
        else:
            summary = json.loads((cell / "summary.json").read_text())
            assert summary["rounds"] == 10_000 and float(ours) == round(100 * summary["final_client_mean_acc"], 2)
