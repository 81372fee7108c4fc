"""Engines: what delivers the ServerApp's Messages to ClientApps. Strategies never know which."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedsim.experiment.resolve import Experiment
from fedsim.record.paths import default_run_dir


def run_with_engine(experiment: Experiment, resume: bool = False) -> dict[str, Any]:
    """Run ``experiment`` to completion under its engine (``resume``: from its checkpoint); returns the summary."""
    cfg = experiment.config
    if cfg.engine == "flower":
        from fedsim.engines.flower_sim import run_flower_simulation

        return run_flower_simulation(experiment, resume)
    from fedsim.client.app import app
    from fedsim.engines.local import InlineExecutor, LocalGrid
    from fedsim.server.loop import run_server

    if cfg.simulation.backend == "ray":
        from fedsim.engines.ray_pool import RayPoolExecutor

        run_dir = Path(cfg.output.run_dir or default_run_dir(cfg))
        executor: Any = RayPoolExecutor(cfg.simulation, 1, cfg.train.num_clients, run_dir)
    else:
        sim = cfg.simulation
        executor = InlineExecutor(app, 1, cfg.train.num_clients, sim.state_memory_mb)
    try:
        return run_server(LocalGrid(executor), experiment, resume)
    finally:
        executor.shutdown()
