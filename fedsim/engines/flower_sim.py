"""The ``flower`` engine: Flower's own simulation runtime on Ray (isolated here, since
``run_simulation`` is deprecated in favour of the SuperLink-based runtime).

A client's failure is what it is under the local engine. A client that raises answers with fedsim's one-line
error reply (:class:`ErrorReplies`; Flower's own would hold Ray's traceback, and Flower would log it). A Ray
worker whose process ends mid-round (killed, out of memory, ``os._exit``) fails the message it was running,
its reason Ray's cause in one line (:mod:`fedsim.engines.lost_workers`). Flower's pool would send that dead
worker every later message it gives it; with ``max_restarts`` Ray starts a fresh process in its place, which
computes what the dead one would have (Flower's workers keep no client state: each node's ``Context`` lives
in this process and changes only with a reply). A message Flower's pool gives that worker while Ray replaces it
fails too, with the same error: Ray 2.55 says of it what it says of the message that was running
(``ActorUnavailableError``: "the task may or may not have been executed"), so neither is sent again.

Flower's backend waits on each worker's task with no timeout, and its threads, which this process joins at its
end, wait so on a worker that hangs (a client stuck in its code, a process stopped). The round loop bounds its
own waits (``train.round_timeout_s``); once the ServerApp has ended, however it ended, every actor of Flower's
pool is killed (:func:`_pool_stopped`), so the simulation ends at once, as the run has been recorded or stopped.
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import ray
from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedsim.engines.driver_watch import note_driver
from fedsim.engines.local import handle
from fedsim.engines.lost_workers import GONE, ray_cause, worker_died
from fedsim.engines.ray_cluster import init_ray
from fedsim.errors import FedsimError
from fedsim.experiment.resolve import Experiment
from fedsim.processes import signals_deferred
from fedsim.server.polling import PromptGrid

# Flower's reason for a message whose ClientApp call raised in its backend: "<class 'X'>:<'str(exception)'>"
FLOWER_REASON = re.compile(r"<class '(?P<kind>[^']+)'>:<'(?P<text>.*)'>\Z", re.DOTALL)


class ErrorReplies(ClientApp):
    """``app``, its exceptions answered with fedsim's error reply, as the local engine's workers answer."""

    def __init__(self, app: ClientApp) -> None:
        super().__init__()
        self.app = app

    def __call__(self, message: Message, context: Context) -> Message:
        # in a worker's process: Flower logs a warning there as it ends its workers at a run's end, nothing else
        logging.getLogger("flwr").setLevel(logging.ERROR)
        return handle(self.app, message, context)


def in_one_line(reply: Message) -> Message:
    """``reply``, an error from Flower's Ray backend (a Ray exception's text: the worker died) in fedsim's words."""
    if reply.has_error() and (found := FLOWER_REASON.match(reply.error.reason or "")):
        kind = found["kind"].rpartition(".")[2]
        text = found["text"]
        reply.error = Error(reply.error.code, worker_died(kind, text) if kind in GONE else ray_cause(kind, text))
    return reply


class RuntimeGrid(PromptGrid):
    """Flower's simulation grid as fedsim's round loop uses it: it raises once ``stopped`` is set (Ctrl-C,
    SIGTERM), and says a lost worker's error in one line."""

    def __init__(self, grid: Grid, stopped: threading.Event) -> None:
        super().__init__(grid)
        self.stopped = stopped

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        if self.stopped.is_set():
            raise FedsimError("the simulation stopped (Ctrl-C or SIGTERM)")
        return [in_one_line(reply) for reply in self.grid.pull_messages(message_ids)]


class _FlowerNoise(logging.Filter):
    """Flower's logs that fedsim says better or that nobody can act on: a message that failed in its backend
    (an error and its traceback, per message: the error reply says it, and fedsim's round loop reports it),
    and that ``run_simulation`` is deprecated (fedsim's choice, above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        failed = (record.module, record.funcName) in {("vce_api", "worker"), ("raybackend", "process_message")}
        deprecated = record.funcName == "warn_deprecated_feature" and "run_simulation" in str(record.args)
        return not (failed or deprecated)


@contextmanager
def _flower_noise_dropped() -> Iterator[None]:
    logger, noise = logging.getLogger("flwr"), _FlowerNoise()
    logger.addFilter(noise)
    try:
        yield
    finally:
        logger.removeFilter(noise)


def _live_actors() -> set[str]:
    """The ids of the actors of this driver's Ray job that are not dead (from the cluster's actor table)."""
    from ray._private import state  # the one actor table without Ray's dashboard, which fedsim leaves off

    job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
    return {actor for actor, info in state.actors(job_id=job).items() if info["State"] != "DEAD"}


@contextmanager
def _pool_stopped(before: set[str]) -> Iterator[None]:
    """The actors of this job started since ``before`` (Flower's pool) are killed as the block ends, not
    restarted: a task of theirs still running fails at once, and Flower's threads waiting on it go on."""
    try:
        yield
    finally:
        from ray._private.worker import global_worker  # ray.kill for an actor known by its id, not a handle

        for actor in _live_actors() - before:
            global_worker.core_worker.kill_actor(ray.ActorID.from_hex(actor), True)


def run_flower_simulation(experiment: Experiment, resume: bool = False) -> dict[str, Any]:
    from flwr.simulation import run_simulation

    from fedsim.client.app import app as client_app
    from fedsim.server.loop import run_server

    cfg = experiment.config

    summary: dict[str, Any] = {}
    server_app = ServerApp()
    # Ctrl-C and SIGTERM stop the ServerApp (a thread) at its next wait for replies, and Flower then winds its
    # simulation down as when the ServerApp ends; raised in this thread instead, they left threads waiting forever
    stopped = threading.Event()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        with _pool_stopped(before):
            summary.update(run_server(RuntimeGrid(grid, stopped), experiment, resume))

    res = cfg.simulation.client_resources
    # Ray is started or joined here, not by Flower's backend: as every engine's (its processes never outlive
    # this one, SIGTERM stays fedsim's; fedsim.engines.ray_cluster), and Flower's would ship this driver's
    # sys.path to every node of a cluster as PYTHONPATH (paths that exist only on this machine)
    owned = init_ray(cfg.simulation)
    note_driver(cfg.output.run_dir or "", ray.get_runtime_context().gcs_address)
    before = _live_actors()  # a caller's own actors, in a session of theirs (a notebook's), are not Flower's
    try:
        with warnings.catch_warnings(), signals_deferred(stopped.set), _flower_noise_dropped():
            warnings.simplefilter("ignore", DeprecationWarning)
            run_simulation(
                server_app=server_app,
                client_app=ErrorReplies(client_app),
                num_supernodes=cfg.train.num_clients,
                backend_config={  # Flower passes these to its actors' options: a dead one's process is replaced
                    "client_resources": {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus, "max_restarts": -1},
                },
            )
    finally:
        if owned and ray.is_initialized():  # Flower's backend may have shut it down already
            ray.shutdown()
    return summary
