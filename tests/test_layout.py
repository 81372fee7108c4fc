"""The default worker layout (fedsim.layout): what ``backend: auto`` and ``threads: auto`` become,
where the choice is written down, and how a sweep that runs several cells at once shares the cores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.config_file import parse_config
from fedsim.deploy.compose import container_config
from fedsim.engines.runner import run
from fedsim.layout import choose_layout, torch_threads, usable_cores
from fedsim.sweep.execute import cell_layout
from fedsim.sweep.plan import read_sweep
from tests.conftest import small_config, write_config

AUTO = {"backend": "auto", "threads": "auto"}


def config(tmp_path: Path, engine: str = "local", per_round: int | None = None, **simulation: Any):
    train = {"num_clients": 10, "clients_per_round": per_round}
    return parse_config(small_config(tmp_path, engine=engine, train=train, simulation={**AUTO, **simulation}))


# (engine, clients per round, simulation options, cores) -> (backend, threads)
CASES = {
    "several CPU clients, 2 cores: the pool, one thread per worker": ("local", 10, {}, 2, ("ray", 1)),
    "several CPU clients, 16 cores": ("local", 10, {}, 16, ("ray", 1)),
    "one core: inline on it": ("local", 10, {}, 1, ("inline", 1)),
    "one client a round: inline on every core": ("local", 1, {}, 8, ("inline", 8)),
    "two clients a round are several": ("local", 2, {}, 2, ("ray", 1)),
    "CUDA: inline, one process on the GPU": ("local", 10, {"device": "cuda"}, 4, ("inline", 4)),
    "a Ray cluster given: the pool, even on one core here": ("local", 1, {"ray_address": "auto"}, 1, ("ray", 1)),
    "pool workers of 2.5 CPUs: 2 threads each": ("local", 10, {"client_resources": {"num_cpus": 2.5}}, 8, ("ray", 2)),
    "Flower's runtime: its actors' share": ("flower", 10, {}, 4, ("inline", 1)),
    "inline asked for: every core": ("local", 10, {"backend": "inline"}, 4, ("inline", 4)),
    "the pool asked for on one core": ("local", 10, {"backend": "ray"}, 1, ("ray", 1)),
    "threads asked for are kept": ("local", 10, {"threads": 3}, 2, ("ray", 3)),
    "workers of more CPUs than the machine has: its cores": (
        "local",
        10,
        {"client_resources": {"num_cpus": 10**6}},
        4,
        ("ray", 4),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_auto_becomes_a_concrete_layout(tmp_path: Path, case: str) -> None:
    engine, per_round, simulation, cores, want = CASES[case]
    sim = choose_layout(config(tmp_path, engine, per_round, **simulation), cores).simulation
    assert (sim.backend, sim.threads) == want
    assert torch_threads(sim) == want[1]


def test_a_chosen_layout_is_kept_and_explicit_values_never_change(tmp_path: Path) -> None:
    cfg = choose_layout(config(tmp_path), 2)
    assert choose_layout(cfg, 16) == cfg  # a resume on a bigger machine runs the layout it started on
    explicit = config(tmp_path, backend="inline", threads=1)
    assert choose_layout(explicit, 16).simulation == explicit.simulation


def test_the_run_directory_records_the_layout_the_run_used(tmp_path: Path) -> None:
    # one client a round: inline on every core (the pool case is the quickstart's, test_run_dir.py)
    cfg = small_config(tmp_path, train={"rounds": 1, "clients_per_round": 1}, simulation=AUTO)
    saved = yaml.safe_load((Path(run(parse_config(cfg))["run_dir"]) / "config.yaml").read_text())
    assert (saved["simulation"]["backend"], saved["simulation"]["threads"]) == ("inline", usable_cores())


@pytest.mark.parametrize(
    ("sweep", "workers", "want"),
    [
        ({}, 1, ("auto", "auto")),  # one cell at a time: each run chooses as `fedsim run` does
        ({}, 2, ("inline", max(1, usable_cores() // 2))),  # two processes share the cores, no pool each
        ({"ray": {"cpus_per_run": 2}}, 1, ("inline", 2)),  # a Ray task holds its CPUs; a pool inside would wait
        ({"ray": {"cpus_per_run": 0.5}}, 4, ("inline", 1)),
    ],
)
def test_a_sweep_running_cells_at_once_gives_each_its_share(
    tmp_path: Path, sweep: dict[str, Any], workers: int, want: tuple[Any, Any]
) -> None:
    path = write_config(tmp_path, {"base": "base.yaml", "grid": {"seed": [0, 1]}, **sweep}, "sweep.yaml")
    sim = cell_layout(config(tmp_path), read_sweep(path), workers).simulation
    assert (sim.backend, sim.threads) == want


def test_a_supernode_on_a_host_fedsim_never_saw_takes_its_share(tmp_path: Path) -> None:
    cfg = config(tmp_path, client_resources={"num_cpus": 2})
    cfg.data.root = "fedsim:assets/mnist_small.npz"
    inside = container_config(cfg)  # what fedsim compose ships: auto stays auto
    assert inside.simulation.threads == "auto" and torch_threads(inside.simulation) == 2
