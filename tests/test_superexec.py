"""fedsim.deploy.superexec: Flower's ``flower-superexec``, arguments as given, whose wait between looks for a
task ends when its SuperNode rings the doorbell ``FEDSIM_DOORBELL`` names; without one, Flower's unchanged.
That a deployed task starts at the ring is tests/test_flower_waits.py's and tests/test_deploy.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.deploy import flower_waits, superexec

# in a process of its own: Flower's SuperExec, given --help, prints its usage and exits; then what its loop's
# ``time`` is (fedsim's doorbell sleeps, or Python's time module)
SHOW = """
import sys
import time
from flwr.supercore.superexec import run_superexec
from fedsim.deploy import superexec
sys.argv = ["flower-superexec", "--help"]
try:
    superexec.main()
finally:
    print("loop time:", run_superexec.time is time or type(run_superexec.time).__name__)
"""


@pytest.mark.parametrize("doorbell", [True, False])
def test_the_superexec_is_flowers_and_waits_on_the_doorbell_it_is_given(tmp_path: Path, doorbell: bool) -> None:
    env = {key: value for key, value in os.environ.items() if key != superexec.DOORBELL_ENV}
    if doorbell:
        flower_waits.Doorbell.make(str(tmp_path / "doorbell"))
        env[superexec.DOORBELL_ENV] = str(tmp_path / "doorbell")
    res = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("usage: flower-superexec")
    expected = "loop time: DoorbellSleeps" if doorbell else "loop time: True"  # True: Python's own
    assert res.stdout.splitlines()[-1].strip() == expected
