"""fedsim.engines.driver_watch: when ``fedsim run`` watches its driver, and what it says of one that ended without
a word (the driver killed and Ray ending it on a real cluster: tests/test_ray_cluster.py, slow)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fedsim.config_file import parse_config
from fedsim.engines.driver_watch import NOTE_ENV, describe_unsaid_end, wanted
from tests.conftest import small_config


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
    assert describe_unsaid_end(-9, None) == (
        "the run's driver (Flower's runtime on a Ray cluster) was ended by SIGKILL and said nothing, before it had "
        "joined the Ray cluster"
    )


def test_a_head_that_answers_and_a_run_that_recorded_nothing_are_said_as_they_are(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as head:
        gcs = f"127.0.0.1:{head.getsockname()[1]}"
        said = describe_unsaid_end(1, {"run_dir": str(tmp_path), "gcs": gcs})
    assert said == (
        "the run's driver (Flower's runtime on a Ray cluster) ended with exit status 1 and said nothing: the Ray "
        f"cluster's head (its GCS at {gcs}) still answers; Ray's log of the driver (python-core-driver-*.log in the "
        f"logs of its node's Ray session) may say why; no checkpoint was written in {tmp_path}; no metrics were written"
    )
