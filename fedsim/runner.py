"""``fedsim run``: validate everything that can be validated, then hand the run to its engine."""

from __future__ import annotations

import os
from typing import Any

from fedsim.config import RunConfig
from fedsim.engines.ray_cluster import check_ray_address
from fedsim.errors import ConfigError
from fedsim.federation import Federation, load_federation
from fedsim.rundir import default_run_dir
from fedsim.vectorized import why_not_vectorized

# Flower must stay offline and quiet: no telemetry, no update check
OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",  # silences a Ray FutureWarning on CPU-only actors
}


def prepare(cfg: RunConfig) -> RunConfig:
    """Fix the run directory and load data and split (bad data fails here, before any training)."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    check_ray_address(cfg)  # a few seconds' check, before minutes of data loading
    cfg = cfg.model_copy(deep=True)
    cfg.output.run_dir = str(default_run_dir(cfg))
    fed = load_federation(cfg)
    if cfg.simulation.vmap_clients > 1:
        check_vmap_clients(cfg, fed)
    return cfg


def check_vmap_clients(cfg: RunConfig, fed: Federation) -> None:
    """Clients train together only through a model whose forward is a pure function of its weights."""
    from fedsim.client_app import build_model

    why = why_not_vectorized(build_model(cfg, fed.dataset.num_classes, fed.dataset.in_shape))
    if why is not None:
        raise ConfigError(
            f"simulation.vmap_clients = {cfg.simulation.vmap_clients}: model {cfg.model.name!r} with model.norm "
            f"{cfg.model.norm!r} cannot train clients together: {why}; use a norm without running statistics "
            "or noise (ln, gn, fn, rms, none, ...) or simulation.vmap_clients: 1"
        )


def run(cfg: RunConfig, resume: bool = False) -> dict[str, Any]:
    """Run ``cfg``; ``resume``: go on from the checkpoint in its run dir (:func:`fedsim.checkpoint.resume_config`)."""
    from fedsim.engines import run_with_engine

    return run_with_engine(prepare(cfg), resume)
