"""tests/fault_lines.py, the one table of what fedsim says at a fault while a run runs: every row is matched by a
test that provokes its fault, and a line reworded, or a row filled in with a field missing, fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fault_lines import LINES, assert_said, assert_said_among, fault_line

TESTS = Path(__file__).parent


def test_every_row_is_matched_by_a_test() -> None:
    named = " ".join(p.read_text() for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name)
    unused = [name for name in LINES if f'"{name}"' not in named]
    assert unused == [], f"rows no test names (a row nothing matches cannot fail): {unused}"


def test_a_reworded_line_does_not_match_its_row() -> None:
    line = "fedsim: error: training diverged in round 3: client 1: training loss is inf; " + (
        "no checkpoint was written (output.checkpoint_every: 0); the metrics so far are in /r"
    )
    fields = {
        "round": 3,
        "cause": fault_line("training loss", client=1, loss="inf"),
        "kept": fault_line("no checkpoint kept", kept=fault_line("metrics kept", run_dir="/r")),
    }
    assert_said("diverged", line, **fields)
    for reworded in (line.replace("diverged", "failed"), line.replace("(output", "output"), line + ".", line[1:]):
        with pytest.raises(AssertionError, match="does not match row 'diverged'"):
            assert_said("diverged", reworded, **fields)
    with pytest.raises(AssertionError, match="matches row 'diverged'"):
        assert_said_among("diverged", "Ray said this\n" + line.replace("training", "train"), round=3, cause=".+",
                          kept=".+")  # fmt: skip
    assert_said_among("diverged", "Ray said this\n" + line + "\n", round=3, cause=".+", kept=".+")


def test_a_row_filled_in_without_one_of_its_fields_is_refused() -> None:
    with pytest.raises(KeyError, match="kept"):
        fault_line("diverged", round=3, cause=".+")


def test_numbers_fill_a_row_as_they_print_and_paths_are_escaped_by_the_caller() -> None:
    assert fault_line("checkpoint kept", round=2, run_dir=re.escape("/a.b")) == (
        r"the last good checkpoint \(round 2\) is in /a\.b"
    )
