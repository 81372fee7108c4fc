"""The ``flower`` engine: Flower's own simulation runtime on Ray (isolated here, since
``run_simulation`` is deprecated in favour of the SuperLink-based runtime)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import ray
from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from fedsim.engines.ray_cluster import init_ray
from fedsim.errors import FedsimError
from fedsim.experiment import Experiment
from fedsim.processes import signals_deferred


def _unless(stopped: threading.Event, pull: Callable[..., Iterable[Message]]) -> Callable[..., Iterable[Message]]:
    """``pull`` (the grid's wait for replies), raising once ``stopped`` is set."""

    def pull_unless_stopped(*args: Any, **kwargs: Any) -> Iterable[Message]:
        if stopped.is_set():
            raise FedsimError("the simulation stopped (Ctrl-C or SIGTERM)")
        return pull(*args, **kwargs)

    return pull_unless_stopped


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
        grid.pull_messages = _unless(stopped, grid.pull_messages)  # type: ignore[method-assign]
        summary.update(run_server(grid, experiment, resume))

    res = cfg.simulation.client_resources
    # Ray is started or joined here, not by Flower's backend: as every engine's (its processes never outlive
    # this one, SIGTERM stays fedsim's; fedsim.engines.ray_cluster), and Flower's would ship this driver's
    # sys.path to every node of a cluster as PYTHONPATH (paths that exist only on this machine)
    owned = init_ray(cfg.simulation)
    try:
        with warnings.catch_warnings(), signals_deferred(stopped.set):
            warnings.simplefilter("ignore", DeprecationWarning)
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=cfg.train.num_clients,
                backend_config={
                    "client_resources": {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus},
                },
            )
    finally:
        if owned and ray.is_initialized():  # Flower's backend may have shut it down already
            ray.shutdown()
    return summary
