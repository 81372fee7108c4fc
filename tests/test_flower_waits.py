"""fedsim's one change to Flower internals (fedsim.deploy.flower_waits) fits the pinned Flower exactly, and
nothing else: these tests fail first when Flower is upgraded, so the waits are checked again."""

from __future__ import annotations

import os
import re
import sys
import time
from itertools import pairwise
from pathlib import Path

import flwr
import pytest
from flwr.supercore.inflatable import inflatable_utils
from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError
from flwr.supernode import start_client_internal

from fedsim.deploy import flower_waits
from tests.conftest import REPO


def test_the_pinned_flower_is_the_one_the_waits_were_read_from() -> None:
    pin = re.search(r'"flwr\[simulation\]==([\d.]+)"', (REPO / "pyproject.toml").read_text())
    assert pin is not None and pin.group(1) == flower_waits.FLOWER_VERSION == flwr.__version__
    assert flower_waits.unchanged(start_client_internal, flwr.__version__) is None
    assert flower_waits.pulls_unchanged(flwr.__version__) is None
    assert flower_waits.heartbeat_unchanged(flwr.__version__) is None
    assert flower_waits.superexec_unchanged(flwr.__version__) is None


def test_another_flower_or_other_sleeps_are_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "1.42.0" in (flower_waits.unchanged(start_client_internal, "1.42.0") or "")
    assert "1.42.0" in (flower_waits.pulls_unchanged("1.42.0") or "")
    assert "1.42.0" in (flower_waits.heartbeat_unchanged("1.42.0") or "")
    assert "1.42.0" in (flower_waits.superexec_unchanged("1.42.0") or "")
    source = Path(start_client_internal.__file__).read_text()
    for changed, why in [
        (source.replace("time.sleep(3)", "time.sleep(5)", 1), "calls of time.sleep(3)"),
        (source.replace("time.sleep(0.5)", "time.sleep(0.25)", 1), "calls of time.sleep(0.5)"),
        (source + "\n\ndef later():\n    return time.monotonic()\n", "beyond its sleeps"),
    ]:
        (tmp_path / "changed_loop.py").write_text(changed)
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop("changed_loop", None)
        import changed_loop

        assert why in (flower_waits.unchanged(changed_loop, flwr.__version__) or ""), why
    monkeypatch.setitem(inflatable_utils.pull_objects.__kwdefaults__, "initial_backoff", 2)
    assert "not 1 s" in (flower_waits.pulls_unchanged(flwr.__version__) or "")


def test_only_the_loops_own_waits_get_shorter() -> None:
    short = flower_waits.ShortSleeps()
    start = time.monotonic()
    short.sleep(3)
    short.sleep(0.5)
    assert time.monotonic() - start < 3.0  # 0.11 s asked for; 3.5 s unshortened (margin for a loaded machine)
    start = time.monotonic()
    short.sleep(0.3)  # any other sleep is left as it is
    assert time.monotonic() - start >= 0.3
    assert short.monotonic is time.monotonic


def test_object_pulls_retry_after_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race fedsim's fork server exposes: a ClientApp asks for an object its SuperNode has not
    stored yet; Flower retries after 1 s, fedsim's deployment after 20 ms, then doubling."""
    for fn in flower_waits.pull_functions():
        monkeypatch.setitem(fn.__kwdefaults__, "initial_backoff", fn.__kwdefaults__["initial_backoff"])
    tries: list[float] = []

    def pull(object_id: str) -> bytes:
        tries.append(time.monotonic())
        if len(tries) < 3:
            raise ObjectUnavailableError(object_id)
        return b"content"

    assert flower_waits.shorten_object_pulls()
    assert inflatable_utils.pull_objects(["a"], pull) == {"a": b"content"}
    waits = [b - a for a, b in pairwise(tries)]
    assert len(waits) == 2 and max(waits) < 0.5, waits  # 0.02 s and 0.04 s (±20%); Flower: 1 s and 2 s


def test_the_superexec_looks_for_a_task_when_its_supernode_rings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bell = flower_waits.Doorbell.make(str(tmp_path / "doorbell"))  # the SuperNode's end
    sleeps = flower_waits.DoorbellSleeps(flower_waits.Doorbell(str(tmp_path / "doorbell")))  # the SuperExec's
    monkeypatch.setattr(flower_waits, "DOORBELL_FALLBACK_S", 0.3)
    start = time.monotonic()
    sleeps.sleep(0.01)  # no ring: it looks again after the fallback, not after the interval Flower asks for
    assert time.monotonic() - start >= 0.3
    monkeypatch.setattr(flower_waits, "DOORBELL_FALLBACK_S", 60)
    for _ in range(100_000):  # more rings than the pipe holds: none blocks or raises
        bell.ring()
    start = time.monotonic()
    sleeps.sleep(0.01)  # rings that came before the wait end it at once
    assert time.monotonic() - start < 30  # 60 s if the rings were lost (margin for a loaded machine)
    monkeypatch.setattr(flower_waits, "DOORBELL_FALLBACK_S", 0.3)
    start = time.monotonic()
    sleeps.sleep(0.01)  # all of them were heard: the next wait is a full one
    assert time.monotonic() - start >= 0.3


def test_a_supernode_rings_once_a_message_and_its_objects_are_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pulled = iter([None, 7])  # an empty pull, then a Message of run 7 stored with all its objects
    monkeypatch.setattr(start_client_internal, "_pull_and_store_message", lambda **_: next(pulled))
    bell = flower_waits.Doorbell.make(str(tmp_path / "doorbell"))
    assert flower_waits.ring_when_stored(bell)
    assert start_client_internal._pull_and_store_message(state=None) is None
    with pytest.raises(BlockingIOError):
        os.read(bell.fd, 10)  # an empty pull rings nobody
    assert start_client_internal._pull_and_store_message(state=None) == 7
    assert os.read(bell.fd, 10) == b"\0"
