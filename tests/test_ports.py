"""Free TCP ports for the servers fedsim starts (fedsim/ports.py): below the kernel's ephemeral range (which outgoing
connections and bind(0) use), above Ray's worker ports, distinct, and free when handed out."""

from __future__ import annotations

import socket

import pytest

from fedsim import ports
from fedsim.errors import FedsimError


def test_servers_get_ports_below_the_ephemeral_range_and_above_rays_workers() -> None:
    low, high = ports.ephemeral_range()
    assert 0 < low <= high < 65536
    span = ports.server_ports()
    assert span.stop == low and span.start in (ports.RAY_WORKER_PORTS_END, 1024)
    assert span.start == ports.RAY_WORKER_PORTS_END or low <= ports.RAY_WORKER_PORTS_END + 1000


def test_a_narrow_ephemeral_range_leaves_room_from_1024(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (15000, 60999))
    assert ports.server_ports() == range(1024, 15000)
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (32768, 60999))
    assert ports.server_ports() == range(ports.RAY_WORKER_PORTS_END, 32768)


def test_free_ports_are_distinct_outside_taken_and_bindable() -> None:
    first = ports.free_ports(["127.0.0.1"] * 3)
    more = ports.free_ports(["127.0.0.1"] * 3, taken=set(first))
    assert len(set(first)) == 3 and len(set(more)) == 3 and not set(first) & set(more)
    assert all(p in ports.server_ports() for p in first + more)
    for port in more:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # nothing holds it once handed out


def test_no_free_port_is_one_error_naming_the_range_and_address(monkeypatch: pytest.MonkeyPatch) -> None:
    span = ports.server_ports()
    held = ports.free_ports(["127.0.0.1"] * 2)
    monkeypatch.setattr(ports, "server_ports", lambda: range(min(held), min(held) + 1))
    said = rf"^no free TCP port in {min(held)}-{min(held)} on 127\.0\.0\.1$"
    with pytest.raises(FedsimError, match=said):  # every port of the range taken by servers not started yet
        ports.free_ports(["127.0.0.1"], taken=set(held))
    with socket.socket() as listener:  # or listened on now
        listener.bind(("127.0.0.1", min(held)))
        listener.listen()
        with pytest.raises(FedsimError, match=said):
            ports.free_ports(["127.0.0.1"])
    assert min(held) in span


def test_free_ports_are_distinct_bindable_and_never_ephemeral(monkeypatch: pytest.MonkeyPatch) -> None:
    low, _ = ports.ephemeral_range()
    span = ports.server_ports()
    assert span.stop == low  # below what the kernel gives outgoing connections
    chosen = ports.free_ports(["127.0.0.1"] * 50)
    assert len(set(chosen)) == 50
    assert all(p in span for p in chosen)
    # a port something listens on, and a port promised to a server not yet started, are passed over
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", chosen[0]))
        busy.listen()
        monkeypatch.setattr(ports.random, "randrange", lambda n: chosen[0] - span.start)  # the scan starts there
        assert ports.free_ports(["127.0.0.1"], taken={chosen[0] + 1})[0] == chosen[0] + 2
