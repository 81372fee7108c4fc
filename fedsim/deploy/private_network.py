"""``fedsim deploy`` on a loopback address runs in a network namespace of its own.

Flower 1.41's SuperLink serves its Control API (``flwr ls``, ``flwr stop``, submitting runs) on the same
port as the Fleet API and, in the open-source build, does not authenticate its callers: on 127.0.0.1
every local process could stop or read the run. So the launcher re-runs itself, and with it the
SuperLink, the SuperNodes and their ClientApps, under ``unshare --user --map-root-user --net``: a new
network namespace (with its own loopback that no process outside can reach) inside a new user namespace
(so no privileges are needed where the kernel allows unprivileged user namespaces). Files are still
owned by the user who ran fedsim. Where no namespace can be made, the run goes on in the host's network
with one line saying what is exposed. ``deploy.private_network: false`` turns it off (e.g. to
``flwr ls`` the run from outside).

The launcher outside validates the config and plans the run (bad input is one line, before anything
starts), hands the resolved config to the one inside on its stdin, forwards Ctrl-C and SIGTERM to it,
and returns what it wrote. The one inside dies with it (a parent-death signal, re-armed inside because
entering a user namespace may clear it) and then stops its processes as on Ctrl-C.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import subprocess
import sys
from typing import Any

from fedsim.config import RunConfig
from fedsim.errors import ChildExit
from fedsim.processes import die_with, run_in_charge
from fedsim.record.reader import read_summary
from fedsim.server.console import console

ENV = "FEDSIM_PRIVATE_NETWORK"  # set inside the namespace: the pid of the launcher outside
UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--"]
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def inside() -> bool:
    return ENV in os.environ


def wanted(cfg: RunConfig) -> bool:
    """A private network is asked for and meaningful: the SuperLink listens on loopback only."""
    return cfg.deploy.private_network and ipaddress.ip_address(cfg.deploy.address).is_loopback and not inside()


def unavailable() -> str | None:
    """Why no namespace can be made here (None: it can)."""
    try:
        probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "no unshare program (util-linux)"
    except subprocess.TimeoutExpired:
        return "unshare did not answer within 30 s"
    return None if probe.returncode == 0 else (probe.stderr.strip() or f"unshare exited {probe.returncode}")


def deploy_inside(cfg: RunConfig, resume: bool = False) -> dict[str, Any]:
    """Run the deployment of ``cfg`` (planned: its run directory fixed) in a private network, from the
    checkpoint in its run directory if ``resume``; its summary."""
    given = ["--resume", "-"] if resume else ["-"]  # "-": the config comes on stdin, planned
    cmd = [*UNSHARE, sys.executable, "-m", "fedsim.app.cli", "deploy", *given]
    env = {**os.environ, ENV: str(os.getpid())}
    code = run_in_charge(cmd, stdin=cfg.to_json().encode(), stdout=subprocess.DEVNULL, env=env)
    if code != 0:
        raise ChildExit(code if code > 0 else 128 - code)
    return read_summary(cfg.output.run_dir or "")


def received_config() -> RunConfig:
    """In the namespace: settle in, then read the config the launcher outside planned (JSON on stdin)."""
    _settle_inside()
    return RunConfig.from_json(sys.stdin.read())


def _settle_inside() -> None:
    """Die with the launcher outside, and bring up the namespace's loopback."""
    die_with(int(os.environ[ENV]))  # re-armed: entering the user namespace may have cleared it
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


def warn_exposed(cfg: RunConfig, why: str) -> None:
    console.print(
        f"fedsim deploy: no private network ({why}); the SuperLink's Control API on {cfg.deploy.address} "
        "is reachable by every local process for this run",
        style="yellow",
    )
