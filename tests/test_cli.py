"""The ``fedsim`` command's own ending (fedsim/app/cli.py): its exit status, and the exit it takes when threads it
cannot wait for are left. Each command's behaviour: the tests of what it does (tests/test_run_dir.py, test_signals.py,
test_report.py, ...); every bad input's one line: tests/test_bad_inputs.py."""

from __future__ import annotations

import pytest

from fedsim.app import cli


@pytest.mark.parametrize(("abandoned", "exits_now"), [(False, False), (True, True)])
def test_a_bounded_call_still_running_ends_the_command_without_pythons_own_exit(
    monkeypatch: pytest.MonkeyPatch, abandoned: bool, exits_now: bool
) -> None:
    ended: list[int] = []
    monkeypatch.setattr(cli, "_command", lambda argv: 130)  # a run interrupted while its clients' thread trains
    monkeypatch.setattr(cli, "abandoned_calls", lambda: abandoned)
    monkeypatch.setattr(cli, "exit_now", ended.append)
    assert cli.main(["run", "x.yaml"]) == 130
    assert ended == ([130] if exits_now else [])
