"""Seconds per round and peak memory from 10 to 1,000,000 clients: FedAvg and SCAFFOLD.

    python benchmarks/scale.py                       # both tables, 50 rounds a cell
    python benchmarks/scale.py --only cifar          # 10 / 100 / 1,000 clients of CIFAR-10, inline and Ray pool
    python benchmarks/scale.py --only synthetic      # 1,000 to 1,000,000 clients of Synthetic(1, 1), inline
    python benchmarks/scale.py --rounds 10           # a quicker look

The cross-device setting: CIFAR-10 (q75), Dirichlet(0.5), the paper CNN, 100 clients sampled a round
(all 10 at 10 clients), 2 local steps of batch 32 (a 1,000-client share is about 38 images, so two steps
are about two epochs of it), evaluation once, after the last round. Each cell is a ``fedsim run``
process of its own, watched from here every 0.5 s:

- s / round: the run's ``steady_s_per_round`` (rounds 2 to the last, evaluation excluded);
- driver peak RSS: the fedsim process's high-water mark (``VmHWM``), where inline clients and their
  state live;
- all processes, peak PSS: the largest sum, over the samples, of the proportional set size of the
  fedsim process and every process under it (Ray's workers, where the pool's clients and their state
  live, and Ray's own services); PSS counts a shared library once, not once per process.

SCAFFOLD's c_i of the paper CNN is 3.2 MB a client: 3.2 GB for 1,000 clients if every client's state
stayed in memory. fedsim keeps up to ``simulation.state_memory_mb`` (512 by default) of it and the rest
on disk (fedsim.engines.states).

The million-client setting: FedProx's Synthetic(1, 1) (each client's samples generated from the
dataset's seed and its id each time it is sampled; n_k cut at ``MAX_SAMPLES``), multinomial logistic
regression (``mlp`` without hidden layers), 100 clients a round, 20 local steps of batch 10,
evaluation of 100 sampled clients every 10 rounds, a checkpoint every 10 rounds (SCAFFOLD's c_i on
disk, in the run directory), the inline engine. Each size's row adds:

- s before round 1: launch to the end of round 1 (progress.json), less a steady round;
- disk MiB: the peak, over the samples, of the run directory and the client states spilled beyond
  ``simulation.state_memory_mb`` (its temporary directory, here under the benchmark's own);
- the ratio of each to 1,000 clients.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from fedsim.processes import tree

REPO = Path(__file__).resolve().parents[1]
CIFAR = REPO.parent / "shared" / "datasets" / "cifar10_jpg_q75.tar.gz"
SIZES = (10, 100, 1000)
STRATEGIES = ("fedavg", "scaffold")
BACKENDS = ("inline", "ray")
SYNTHETIC_SIZES = (1_000, 10_000, 100_000, 1_000_000)
# Synthetic's client sizes follow a power law whose tail (8 in 100,000 clients hold over 100,000 samples, each
# a second to generate) would make a cell's mean s / round hang on whether it sampled one: cut, for every size
MAX_SAMPLES = 5_000


def cell_config(clients: int, strategy: str, backend: str, rounds: int, out: Path) -> dict[str, object]:
    name = f"scale-{clients}-{strategy}-{backend}"
    return {
        "name": name,
        "seed": 0,
        "data": {"dataset": "imagefolder", "root": str(CIFAR), "augment": True},
        "partition": {"name": "dirichlet", "beta": 0.5},
        "model": {"name": "cnn", "norm": "none"},
        "strategy": {"name": strategy},
        "train": {
            "num_clients": clients,
            "clients_per_round": min(clients, 100),
            "local_steps": 2,
            "batch_size": 32,
            "lr": 0.01,
            "rounds": rounds,
        },
        "eval": {"every": rounds, "global_test": False},
        "simulation": {"backend": backend},  # threads: auto (inline on every core; one per pool worker)
        "output": {"run_dir": str(out / name), "progress": False, "save_model": False},
    }


def synthetic_config(clients: int, strategy: str, rounds: int, out: Path) -> dict[str, object]:
    name = f"synthetic-{clients}-{strategy}"
    return {
        "name": name,
        "seed": 0,
        "data": {"dataset": {"name": "synthetic", "alpha": 1.0, "beta": 1.0, "max_samples": MAX_SAMPLES},
                 "augment": False},
        "partition": {"name": "natural"},
        "model": {"name": "mlp", "hidden": []},
        "strategy": {"name": strategy},
        "train": {
            "num_clients": clients,
            "clients_per_round": 100,
            "local_steps": 20,
            "batch_size": 10,
            "lr": 0.01,
            "rounds": rounds,
        },
        "eval": {"every": 10, "global_test": False, "clients": 100},
        "simulation": {"backend": "inline"},
        "output": {"run_dir": str(out / name), "progress": False, "save_model": False, "checkpoint_every": 10},
    }


def _du(path: Path) -> int:
    """Bytes of the files under ``path`` (0 if it is gone)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _kib(pid: int, path: str, field: str) -> int:
    """A ``field: N kB`` line of /proc/<pid>/<path>, 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_cell(cfg: dict[str, object], out: Path) -> dict[str, float]:
    """Run one cell as its own process; its steady s / round, seconds before round 1, peak memory and disk (MiB)."""
    path = out / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_dir, tmp = out / str(cfg["name"]), out / f"{cfg['name']}-tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-c", "from fedsim.app.cli import main; main()", "run", str(path)]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp)}
    )
    driver_hwm = all_pss = disk = 0
    first_round_s = None
    while proc.poll() is None:
        driver_hwm = max(driver_hwm, _kib(proc.pid, "status", "VmHWM"))
        all_pss = max(all_pss, sum(_kib(pid, "smaps_rollup", "Pss") for pid, _ in tree({proc.pid})))
        disk = max(disk, _du(run_dir) + _du(tmp))
        if first_round_s is None and (run_dir / "progress.json").exists():
            first_round_s = time.monotonic() - started
        time.sleep(0.5)
    if proc.returncode != 0:
        raise SystemExit(f"{cfg['name']} failed ({proc.returncode}):\n{proc.stderr.read()[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    shutil.rmtree(tmp, ignore_errors=True)
    steady = summary["steady_s_per_round"]
    return {
        "s_round": steady, "driver_mib": driver_hwm / 1024, "all_mib": all_pss / 1024, "disk_mib": disk / 2**20,
        "before_s": (first_round_s or 0.0) - steady,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--only", choices=("cifar", "synthetic"))
    args = parser.parse_args()
    console = Console()
    out = Path(tempfile.mkdtemp(prefix="fedsim-scale-"))
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    if args.only != "synthetic":
        cifar_table(console, args.rounds, out)
    if args.only != "cifar":
        synthetic_table(console, args.rounds, out)


def synthetic_table(console: Console, rounds: int, out: Path) -> None:
    table = Table(title=f"{rounds} rounds, Synthetic(1, 1), logistic regression, 100 clients a round, inline")
    columns = ("strategy", "clients", "s / round", "s before round 1", "all processes peak PSS MiB", "disk MiB")
    for col in columns:
        table.add_column(col)
    keys = ("s_round", "before_s", "all_mib", "disk_mib")
    for strategy in STRATEGIES:
        base: dict[str, float] | None = None
        for clients in SYNTHETIC_SIZES:
            r = run_cell(synthetic_config(clients, strategy, rounds, out), out)
            base = base or r
            line = [f"{r['s_round']:.3f}", f"{r['before_s']:.1f}", f"{r['all_mib']:.0f}", f"{r['disk_mib']:.1f}"]
            table.add_row(strategy, f"{clients:,}", *line)
            ratios = ", ".join(f"{k} {r[k] / base[k]:.2f}x" for k in keys if base[k])
            console.print(f"  {strategy:8s} {clients:9,d} clients: {' / '.join(line)}  (against 1,000: {ratios})")
    console.print(table)


def cifar_table(console: Console, rounds: int, out: Path) -> None:
    if not CIFAR.exists():
        raise SystemExit(f"CIFAR-10 (q75) not found at {CIFAR}: this benchmark needs the JPEG q75 archive there")
    table = Table(title=f"{rounds} rounds, CIFAR-10, Dirichlet(0.5), paper CNN, 100 clients a round, 2 steps")
    for col in ("strategy", "backend", "clients", "s / round", "driver peak RSS MiB", "all processes peak PSS MiB"):
        table.add_column(col)
    results: dict[tuple[str, str, int], dict[str, float]] = {}
    for strategy in STRATEGIES:
        for backend in BACKENDS:
            for clients in SIZES:
                r = results[strategy, backend, clients] = run_cell(
                    cell_config(clients, strategy, backend, rounds, out), out
                )
                line = f"{r['s_round']:.3f}", f"{r['driver_mib']:.0f}", f"{r['all_mib']:.0f}"
                table.add_row(strategy, backend, str(clients), *line)
                console.print(f"  {strategy:8s} {backend:6s} {clients:5d} clients: {' / '.join(line)}")
    console.print(table)
    for strategy in STRATEGIES:
        for backend in BACKENDS:
            small, large = results[strategy, backend, SIZES[0]], results[strategy, backend, SIZES[-1]]
            driver, every = (large[k] / small[k] for k in ("driver_mib", "all_mib"))
            console.print(
                f"{strategy} {backend}: {SIZES[-1]} against {SIZES[0]} clients: "
                f"driver RSS {driver:.2f}x, all processes {every:.2f}x"
            )


if __name__ == "__main__":
    main()
