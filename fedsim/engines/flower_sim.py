"""The ``flower`` engine: Flower's own simulation runtime on Ray (isolated here, since
``run_simulation`` is deprecated in favour of the SuperLink-based runtime)."""

from __future__ import annotations

import warnings
from typing import Any

import ray
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedsim.engines.ray_cluster import init_ray
from fedsim.experiment import Experiment


def run_flower_simulation(experiment: Experiment, resume: bool = False) -> dict[str, Any]:
    from flwr.simulation import run_simulation

    from fedsim.client.app import app as client_app
    from fedsim.server.loop import run_server

    cfg = experiment.config

    summary: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        summary.update(run_server(grid, experiment, resume))

    res = cfg.simulation.client_resources
    # A cluster is joined here, not by Flower's backend, which would also ship this driver's
    # sys.path to every node as PYTHONPATH (paths that exist only on this machine)
    joined = cfg.simulation.ray_address is not None and init_ray(cfg.simulation)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=cfg.train.num_clients,
                backend_config={
                    "client_resources": {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus},
                    # a Ray instance here unless joined above (None would join any `ray start` cluster)
                    "init_args": {"include_dashboard": False, "address": "local"},
                },
            )
    finally:
        if joined and ray.is_initialized():  # disconnects; the cluster stays up
            ray.shutdown()
    return summary
