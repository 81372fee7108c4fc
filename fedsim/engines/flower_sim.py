"""The ``flower`` engine: Flower's own simulation runtime on Ray (isolated here, since
``run_simulation`` is deprecated in favour of the SuperLink-based runtime)."""

from __future__ import annotations

import warnings
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedsim.config import RunConfig


def run_flower_simulation(cfg: RunConfig) -> dict[str, Any]:
    from flwr.simulation import run_simulation

    from fedsim.client_app import app as client_app
    from fedsim.server_app import run_server

    summary: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        summary.update(run_server(grid, cfg))

    res = cfg.simulation.client_resources
    init_args: dict[str, Any] = {"include_dashboard": False}
    if cfg.simulation.ray_address:
        init_args["address"] = cfg.simulation.ray_address
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=cfg.train.num_clients,
            backend_config={
                "client_resources": {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus},
                "init_args": init_args,
            },
        )
    return summary
