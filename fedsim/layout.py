"""The default worker layout: ``simulation.backend: auto`` and ``simulation.threads: auto`` made concrete.

Measured at the paper setting on 2 cores (docs/speed.md; ``benchmarks/round_overhead.py``): inline with
one thread is 1.9x the compute floor, inline with both threads and the Ray pool of one-thread workers
are both within 6% of it on a quiet machine, and beside two busy processes the pool is the fastest
layout by far (2.9 s per round against 6.0 s inline with both threads: intra-op threads wait for each
other at every op, the pool's workers never do). So a round of several CPU clients goes to the pool,
one thread per worker; anything else, and a federation beyond the pool's ``POOLED_CLIENTS``, runs
inline on every core.

A one-thread pool worker computes what one-thread inline does, bit for bit (tests/test_golden.py), so
the default reproduces ``backend: inline, threads: 1``. The choice is made once, by the process that
plans a run, and written into the run directory's config.yaml: a resume runs the layout it started on.
"""

from __future__ import annotations

import os

from fedsim.config import POOLED_CLIENTS, RunConfig, SimulationConfig


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container's cpuset narrows)."""
    return len(os.sched_getaffinity(0))


def worker_threads(sim: SimulationConfig, cores: int | None = None) -> int:
    """``threads: auto`` in a process that is one of several client workers: its share of CPUs, at most the
    ``cores`` it may run on (default :func:`usable_cores`): a ``num_cpus`` of a cluster's scale on a small
    SuperNode would ask torch for as many threads, and torch crashes on a million."""
    return max(1, min(int(sim.client_resources.num_cpus), cores or usable_cores()))


def torch_threads(sim: SimulationConfig) -> int:
    """The intra-op threads for a process that trains or evaluates. A ``threads: auto`` that no planner
    made concrete is a SuperNode's (``fedsim compose``: a container on a host this process never saw)."""
    return sim.threads if isinstance(sim.threads, int) else worker_threads(sim)


def choose_layout(cfg: RunConfig, cores: int | None = None, pool: bool = True) -> RunConfig:
    """``cfg`` with its backend and threads concrete for ``cores`` (default: :func:`usable_cores`).

    ``pool=False`` keeps ``backend: auto`` off the Ray pool: a sweep that already runs several cells at
    once gives each its share of the cores instead.
    """
    sim = cfg.simulation
    cores = cores or usable_cores()
    backend = sim.backend
    if backend == "auto":
        per_round = cfg.train.clients_per_round or cfg.train.num_clients
        several = sim.device == "cpu" and cores >= 2 and per_round >= 2 and cfg.train.num_clients <= POOLED_CLIENTS
        backend = "ray" if cfg.engine == "local" and pool and (sim.ray_address is not None or several) else "inline"
    threads = sim.threads
    if threads == "auto":
        one_process = cfg.engine == "local" and backend == "inline"
        threads = cores if one_process else worker_threads(sim, cores)
    return cfg.model_copy(update={"simulation": sim.model_copy(update={"backend": backend, "threads": threads})})
