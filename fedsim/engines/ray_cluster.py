"""Joining Ray: a fresh instance in this process, or an existing cluster (``simulation.ray_address``).

A Ray instance started here is this process's alone: every server it starts (the GCS, the raylet's node and
object managers, each worker's and this driver's core worker, the runtime-env agent) listens on 127.0.0.1, and
the dashboard is off, so no other machine can join it and run code in it (:func:`_on_loopback`). Only
``simulation.ray_address`` joins a wider cluster, whose exposure is the cluster's own (docs/ray-clusters.md).

The address is checked before any data is loaded or a run directory written (:mod:`fedsim.engines.ray_address`),
because one that no Ray answers at otherwise surfaces late: after the data is decoded, or, under Flower's
runtime, as a logged error in a thread. It is checked again just before ``ray.init`` joins it: ``ray.init``
itself waits minutes on an address where no Ray answers, and no signal reaches it there. Leaving a cluster only
disconnects this driver (its actors end with its job); the cluster and whatever else runs on it stay up.

A Ray instance started here never outlives this process: Ray's head processes get a parent-death
signal from Ray itself, but its agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) are the
raylet's children and, once it is gone, spend a minute trying to report to the dead GCS (deaf to
SIGTERM meanwhile); a :func:`fedsim.processes.watchdog` kills them. And ``ray.init`` installs its own SIGTERM handler
(``sys.exit(15)``), and the absl failure handler of its core worker takes SIGTERM as a crash: neither is
let in (:func:`_uninterrupted`), so a SIGTERM stays one line, 143, during ``ray.init`` too.

Of what Ray forwards to this process's console, the workers' lines (a plugin's print or warning) are kept and
those of Ray's own processes (the raylet's, the GCS's, the autoscaler's and the runtime-env agent's error logs)
dropped (:func:`_forward_workers_only`): they are Ray's account of a fault that fedsim states in its own one line,
and they stay in the session's log files.

A head that goes away mid-run (its GCS killed, its machine gone) takes the workers on it with it; the pool asks
:func:`head_gone` whenever a worker is lost, and a head that does not answer within ``RAY_HEAD_WAIT_S`` ends the
run in fedsim's one line, before Ray's own bound (a minute) ends the driver in lines of its own.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from fedsim.config import RAY_HEAD_WAIT_S, SimulationConfig
from fedsim.engines.ray_address import FIELD, probe_cluster
from fedsim.environment import check_ray_started, check_ray_temp_dir
from fedsim.errors import ConfigError, FedsimError
from fedsim.processes import signals_deferred, watchdog

AGENTS_GRACE_S = 1.0
# what Ray's log monitor names the lines of its own processes (ray._private.log_monitor), not a worker's pid
RAY_SERVICES = frozenset({"raylet", "gcs_server", "autoscaler", "runtime_env"})


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


def start_ray(address: str | None, field: str = FIELD, **init_args: Any) -> None:
    """``ray.init``: a Ray instance here, on loopback (``address`` None), never a cluster that `ray start` left
    running; or the cluster at ``address`` (the option ``field``), once it has answered the probe of
    :mod:`fedsim.engines.ray_address`. See the module's docstring for what it guarantees."""
    import ray

    if address is None:  # from before the head starts, so its agents are found as they appear; they are
        watchdog(grace_s=AGENTS_GRACE_S)  # killed: an agent waiting on the dead GCS acts on SIGTERM after 60 s
    else:  # again: the cluster may have gone since the run's checks, and ray.init would wait minutes, deaf
        probe_cluster(address, field)
    with _on_loopback() if address is None else nullcontext(), _uninterrupted():
        ray.init(address=address or "local", include_dashboard=False, **init_args)
    _forward_workers_only()


def workers_only(handle: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """``handle`` (a handler of Ray's forwarded log lines) for the lines of workers alone."""

    def forward(data: dict[str, Any]) -> None:
        if data.get("pid") not in RAY_SERVICES:
            handle(data)

    return forward


def _forward_workers_only() -> None:
    """Ray's forwarding of log lines to this process's console, for the workers' lines alone."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    dispatcher.handlers = [(name, workers_only(handle)) for name, handle in dispatcher.handlers]


def init_ray(sim: SimulationConfig) -> bool:
    """Start Ray here, or join ``sim.ray_address``; False if this process was already connected.

    Whoever gets True calls ``ray.shutdown()`` when done: that stops a Ray started here but only
    disconnects from a cluster that was joined.
    """
    import ray  # here, not at the top: the runner checks addresses without loading Ray

    if ray.is_initialized():  # a caller's session (a test, a notebook): use it, leave it up
        return False
    if sim.ray_address is None:
        check_ray_temp_dir()
    try:
        start_ray(sim.ray_address, log_to_driver=True, logging_level="warning", configure_logging=False)
    except FedsimError:  # the address's probe: one line already
        raise
    except Exception as err:  # Ray raises ConnectionError, TimeoutError, RuntimeError, ... here
        if sim.ray_address is None:
            check_ray_started(err)  # an address-space limit named
            raise
        why = " ".join(str(err).split())  # Ray's messages span lines (a version mismatch: seven)
        raise ConfigError(f"{FIELD} = {sim.ray_address!r}: could not join the Ray cluster: {why}") from err
    return True


def head_gone(address: str, within: float = RAY_HEAD_WAIT_S) -> str | None:
    """Why the head of a Ray cluster, its GCS at ``address`` (host:port), is gone (it refused or ignored a
    connection for ``within`` seconds, retried each second: a restarting head has that long), or None once it
    answers."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + within
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=max(deadline - time.monotonic(), 0.1)).close()
            return None
        except OSError as err:
            if time.monotonic() >= deadline:
                why = err.strerror or type(err).__name__
                return f"the Ray cluster's head (its GCS at {address}) did not answer within {within:g} s ({why})"
            time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
