"""Joining Ray: a fresh instance in this process, or an existing cluster (``simulation.ray_address``).

A Ray instance started here is this process's alone: every server it starts (the GCS, the raylet's node and
object managers, each worker's and this driver's core worker, the runtime-env agent) listens on 127.0.0.1, and
the dashboard is off, so no other machine can join it and run code in it (:func:`_on_loopback`). Only
``simulation.ray_address`` joins a wider cluster, whose exposure is the cluster's own (docs/ray-clusters.md).

The address is checked before any data is loaded or a run directory written, because an address
that nobody answers on otherwise surfaces late: as a Ray timeout after the data is decoded, or,
under Flower's runtime, as a logged error in a thread. Leaving a cluster only disconnects this
driver (its actors end with its job); the cluster and whatever else runs on it stay up.

A Ray instance started here never outlives this process: Ray's head processes get a parent-death
signal from Ray itself, but its agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) are the
raylet's children and, once it is gone, spend a minute trying to report to the dead GCS (deaf to
SIGTERM meanwhile); a :func:`fedsim.processes.watchdog` kills them. And ``ray.init`` installs its own SIGTERM handler
(``sys.exit(15)``), and the absl failure handler of its core worker takes SIGTERM as a crash: neither is
let in (:func:`_uninterrupted`), so a SIGTERM stays one line, 143, during ``ray.init`` too.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from fedsim.config import RunConfig, SimulationConfig
from fedsim.errors import ConfigError
from fedsim.names import check_host
from fedsim.processes import signals_deferred, watchdog

FIELD = "simulation.ray_address"
FORMS = "auto, host:port (the head's GCS, port 6379 by default) or ray://host:port (Ray Client, port 10001)"
CONNECT_TIMEOUT_S = 5.0
AGENTS_GRACE_S = 1.0


def _auto_address() -> str:
    # ray.init's own order for "auto": RAY_ADDRESS, then the cluster `ray start` last started here
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env
    from ray._private.services import canonicalize_bootstrap_address_or_die

    try:
        return canonicalize_bootstrap_address_or_die("auto")
    except (ConnectionError, ValueError) as err:
        raise ConfigError(
            f"{FIELD} = 'auto', but no running Ray cluster was found: RAY_ADDRESS is not set and "
            "`ray start --head` was not run on this machine; start one or give its address"
        ) from err


def cluster_endpoint(address: str) -> tuple[str, int]:
    """The host and port that ``address`` connects to; ``auto`` resolved as ``ray.init`` does."""
    resolved = _auto_address() if address == "auto" else address
    host, sep, port = resolved.removeprefix("ray://").rpartition(":")
    if not sep or not host or "/" in host or not port.isdigit() or not 0 < int(port) <= 65535:
        via = f" (from 'auto': {resolved!r})" if resolved != address else ""
        raise ConfigError(f"{FIELD} = {address!r}{via} is not a Ray address; use {FORMS}")
    return check_host(host.strip("[]"), f"{FIELD} = {address!r}: the host"), int(port)


def check_ray_address(cfg: RunConfig) -> None:
    """Fail before training when ``simulation.ray_address`` is unused or nothing listens there."""
    address = cfg.simulation.ray_address
    if address is None:
        return
    if cfg.engine == "local" and cfg.simulation.backend == "inline":
        raise ConfigError(
            f"{FIELD} = {address!r} has no effect with engine 'local' and simulation.backend 'inline' "
            "(clients run in this process): set simulation.backend: ray, or engine: flower"
        )
    host, port = cluster_endpoint(address)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ConfigError(
            f"{FIELD} = {address!r}: no Ray cluster answers at {host}:{port} ({err}); start the cluster "
            f"(`ray start --head` on its head node) or give a running one's address: {FORMS}"
        ) from err


@contextmanager
def _on_loopback() -> Iterator[None]:
    """Every server of the Ray instance that ``ray.init`` starts in the block listens on 127.0.0.1 alone.

    Ray's servers listen on every address (this driver's on the node's IP) unless the node's IP is 127.0.0.1.
    ``ray.init`` takes that IP from ``get_node_ip_address``, and turns a given 127.0.0.1 into it as well; it is
    the loopback address only while ``ray_constants.ENABLE_RAY_CLUSTER`` is False, Ray's setting for a
    one-machine instance on Windows and macOS (read from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER at import). The
    constant is False for the block, in this process alone: the processes ``ray.init`` starts are told the
    node's IP on their command lines, and a cluster joined later is joined at the host's address again.
    """
    from ray._private import ray_constants

    enabled, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = enabled


@contextmanager
def _uninterrupted() -> Iterator[None]:
    """Ctrl-C or SIGTERM while the block (``ray.init``) runs is raised once it has ended; a second one at once.

    Raised inside ``ray.init``, the signal left Ray's core worker half built and its C++ threads running into
    the interpreter's exit: a segfault after fedsim's line (exit 139: 2 of 2 Ctrl-Cs sent as the core worker
    started, 3 of 3 SIGTERMs once absl's handler was off). Two handlers of Ray's took SIGTERM there and are
    kept out of the block. ray.init's own
    (``sys.exit``) is set through ``set_sigterm_handler``, a no-op meanwhile (Ray defers Ctrl-C the same way,
    ``DeferSigint``). The absl failure handler that the core worker installs counts SIGTERM as a crash: it
    printed a stack dump and armed a 3 s alarm that abort()ed the unwinding run (exit 134, 3 of 3); Ray's
    switch for it is the variable RAY_DISABLE_FAILURE_SIGNAL_HANDLER, read at import into the constant that
    the core worker reads as it starts: the constant is set, for this process alone (Ray's workers would
    inherit the variable). The cost: no C++ stack when Ray's code crashes in this process.
    """
    from ray._private import ray_constants, utils

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    set_sigterm_handler, utils.set_sigterm_handler = utils.set_sigterm_handler, lambda handler: None
    try:
        with signals_deferred(lambda: None):  # nothing to wind down: ray.init ends by itself
            yield
    finally:
        utils.set_sigterm_handler = set_sigterm_handler


def start_ray(address: str | None, **init_args: Any) -> None:
    """``ray.init``: a Ray instance here, on loopback (``address`` None), never a cluster that `ray start` left
    running; or the cluster at ``address``. See the module's docstring for what it guarantees."""
    import ray

    if address is None:  # from before the head starts, so its agents are found as they appear; they are
        watchdog(grace_s=AGENTS_GRACE_S)  # killed: an agent waiting on the dead GCS acts on SIGTERM after 60 s
    with _on_loopback() if address is None else nullcontext(), _uninterrupted():
        ray.init(address=address or "local", include_dashboard=False, **init_args)


def init_ray(sim: SimulationConfig) -> bool:
    """Start Ray here, or join ``sim.ray_address``; False if this process was already connected.

    Whoever gets True calls ``ray.shutdown()`` when done: that stops a Ray started here but only
    disconnects from a cluster that was joined.
    """
    import ray  # here, not at the top: the runner checks addresses without loading Ray

    if ray.is_initialized():  # a caller's session (a test, a notebook): use it, leave it up
        return False
    try:
        start_ray(sim.ray_address, log_to_driver=True, logging_level="warning", configure_logging=False)
    except Exception as err:  # Ray raises ConnectionError, TimeoutError, RuntimeError, ... here
        if sim.ray_address is None:
            raise
        raise ConfigError(f"{FIELD} = {sim.ray_address!r}: could not join the Ray cluster: {err}") from err
    return True
