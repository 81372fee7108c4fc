"""Free TCP ports for the servers fedsim starts (a SuperLink, its SuperNodes, a test's Ray head).

A port from ``bind(port 0)`` is unsafe twice over once its socket closes: the next ``bind(0)`` may
return it again (a SuperNode was once given its SuperLink's port), and until the server binds it any
outgoing connection may take it as its source port. So the ports come from below the kernel's
ephemeral range, which outgoing connections never use, and are held together until all are chosen.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Collection, Sequence
from pathlib import Path

from fedsim.errors import FedsimError

RAY_WORKER_PORTS_END = 20000  # Ray's workers listen on 10002-19999 by default: stay above them


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out to outgoing connections and ``bind(0)`` (per network namespace)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def server_ports() -> range:
    """Where :func:`free_ports` looks: below the ephemeral range, above Ray's worker ports where there
    is room for it."""
    low = ephemeral_range()[0]
    return range(RAY_WORKER_PORTS_END if low > RAY_WORKER_PORTS_END + 1000 else 1024, low)


def free_ports(addresses: Sequence[str], taken: Collection[int] = ()) -> list[int]:
    """One distinct port per address that nothing listens on now, in :func:`server_ports` and not in
    ``taken`` (ports given to servers that have not started yet).

    The scan starts at a random port so that two launchers choosing at once rarely pick the same."""
    span = server_ports()
    candidates = [port for port in span if port not in taken]
    none_free = f"no free TCP port in {span.start}-{span.stop - 1} on {', '.join(addresses)}"
    if not candidates:
        raise FedsimError(none_free)
    start = random.randrange(len(candidates))
    ports: list[int] = []
    with contextlib.ExitStack() as held:
        it = iter(candidates[start:] + candidates[:start])
        for address in addresses:
            for port in it:
                sock = held.enter_context(socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET))
                try:
                    sock.bind((address, port))
                except OSError:
                    continue
                ports.append(port)
                break
            else:
                raise FedsimError(none_free)
    return ports


def free_port(address: str = "127.0.0.1") -> int:
    return free_ports([address])[0]
