"""The paper's 1-class cell on a GPU, one client at a time and ``simulation.vmap_clients``, against the CPU.

    python benchmarks/gpu_speed.py                        # FedAvg, 200 rounds on the GPU, 20 on the CPU
    python benchmarks/gpu_speed.py --norm ln --rounds 100  # FedLN

Runs configs/cifar10_1class_fedavg.yaml (CIFAR-10 q75, 10 clients, 10 local steps of batch 32, no
checkpoints) with ``fedsim run`` in three layouts on the same machine, one after the other:
the CPU (inline, one torch thread per core), CUDA one client at a time, CUDA with ``vmap_clients: 10``.
"s / round" is training alone: the run's ``steady_s_per_round`` (summary.json: the mean round after the
first, evaluation excluded), so rows of different lengths and evaluation intervals compare; the ratio is
against the CPU row. "an evaluation" is what one costs: the slope of the run's clock between its first and
last of four evaluations (``metrics.jsonl``'s ``time_s``) less the training, times the rounds between them.
"10,000 rounds" is the cell as configured: 10,000 rounds of training and its 100 evaluations.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "cifar10_1class_fedavg.yaml"
ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_USAGE_STATS_ENABLED": "0"}
EVALUATIONS = 4  # per run: the slope spans the last three intervals


def layouts(cores: int, vmap: int) -> dict[str, list[str]]:
    return {
        f"CPU, inline, {cores} threads": ["simulation.backend=inline", f"simulation.threads={cores}"],
        "CUDA, one client at a time": ["simulation.device=cuda"],
        f"CUDA, vmap_clients: {vmap}": ["simulation.device=cuda", f"simulation.vmap_clients={vmap}"],
    }


def timed_run(overrides: list[str], rounds: int, run_dir: Path) -> tuple[float, float, float]:
    """(training s/round, seconds per evaluation, client-mean accuracy at the end) of one ``fedsim run``."""
    every = max(1, rounds // EVALUATIONS)
    sets = [f"train.rounds={every * EVALUATIONS}", f"eval.every={every}", f"output.run_dir={run_dir}",
            "output.progress=false", *overrides]  # fmt: skip
    subprocess.run(["fedsim", "run", str(CONFIG), "--set", *sets], check=True, env={**os.environ, **ENV},
                   stdout=subprocess.DEVNULL)  # fmt: skip
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time_s" in r]
    slope = (rows[-1]["time_s"] - rows[0]["time_s"]) / (rows[-1]["round"] - rows[0]["round"])
    training = json.loads((run_dir / "summary.json").read_text())["steady_s_per_round"]
    return training, max(0.0, (slope - training) * every), rows[-1]["client_mean_acc"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="rounds of each GPU run")
    parser.add_argument("--cpu-rounds", type=int, default=20, help="rounds of the CPU run (several times slower)")
    parser.add_argument("--norm", default="none", help="model.norm: none is FedAvg's cell, ln FedLN's")
    parser.add_argument("--vmap", type=int, default=10, help="simulation.vmap_clients of the vmapped row")
    parser.add_argument("--data-root", help="data.root, where the config's relative path does not reach the data")
    args = parser.parse_args()
    common = [f"model.norm={args.norm}"] + ([f"data.root={args.data_root}"] if args.data_root else [])

    cell = yaml.safe_load(CONFIG.read_text())
    cell_rounds, cell_evaluations = cell["train"]["rounds"], cell["train"]["rounds"] // cell["eval"]["every"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedsim-gpu-speed-") as tmp:
        for i, (name, overrides) in enumerate(layouts(os.cpu_count() or 1, args.vmap).items()):
            rounds = args.cpu_rounds if i == 0 else args.rounds
            rows.append((name, rounds, *timed_run([*common, *overrides], rounds, Path(tmp) / str(i))))

    table = Table(title=f"{CONFIG.name}, model.norm={args.norm}")
    for column in ("layout", "rounds", "s / round", "× the CPU", "an evaluation", f"{cell_rounds:,} rounds",
                   "client-mean acc"):  # fmt: skip
        table.add_column(column, justify="left" if column == "layout" else "right")
    cpu = rows[0][2]
    for name, rounds, training, evaluation, acc in rows:
        cell_s = training * cell_rounds + evaluation * cell_evaluations
        table.add_row(name, str(rounds), f"{training:.3f}", f"{cpu / training:.2f}", f"{evaluation:.2f} s",
                      f"{cell_s / 60:.0f} min", f"{acc:.2%}")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
