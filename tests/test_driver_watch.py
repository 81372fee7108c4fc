"""fedsim.engines.driver_watch: when ``fedsim run`` watches its driver, and what it says of one that ended without
a word (the driver killed and Ray ending it on a real cluster: tests/test_ray_cluster.py, slow)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from fedsim.config_file import parse_config
from fedsim.engines.driver_watch import NOTE_ENV, describe_unsaid_end, wanted
from tests.conftest import small_config
from tests.fault_lines import assert_said, fault_line


@pytest.mark.parametrize(
    ("engine", "address", "watched"),
    [("flower", "10.0.0.1:6379", True), ("flower", None, False), ("local", "10.0.0.1:6379", False)],
)
def test_only_flowers_runtime_on_a_cluster_is_watched(
    tmp_path: Path, engine: str, address: str | None, watched: bool
) -> None:
    simulation = {"backend": "ray", "ray_address": address} if engine == "local" else {"ray_address": address}
    assert wanted(parse_config(small_config(tmp_path, engine=engine, simulation=simulation))) is watched


def test_the_driver_itself_is_not_watched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NOTE_ENV, str(tmp_path / "note.json"))
    assert not wanted(parse_config(small_config(tmp_path, engine="flower", simulation={"ray_address": "h:1"})))


def test_a_driver_that_ended_before_joining_is_said_so() -> None:
    assert_said("driver ended before joining", describe_unsaid_end(-9, None), how="was ended by SIGKILL")


def test_a_head_that_answers_and_a_run_that_recorded_nothing_are_said_as_they_are(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as head:
        gcs = f"127.0.0.1:{head.getsockname()[1]}"
        said = describe_unsaid_end(1, {"run_dir": str(tmp_path), "gcs": gcs})
    kept = fault_line("no checkpoint in", run_dir=re.escape(str(tmp_path))) + "; " + fault_line("no metrics")
    assert_said("driver ended, head answers", said, how="ended with exit status 1", gcs=gcs, kept=kept)
