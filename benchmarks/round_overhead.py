"""Round overhead and speed against the compute floor, for every engine, in one process and one run.

    python benchmarks/round_overhead.py            # full: 10 and 100 clients, all engines
    python benchmarks/round_overhead.py --quick    # fewer rounds, no 100-client Flower runtime

Per-round cost is a slope: each setting runs twice, for R1 and R2 rounds, and the cost is
(T(R2) - T(R1)) / (R2 - R1), so start-up, data loading and the final evaluation cancel out.
The compute floor is the same SGD steps (same model, same batches, same augmentation) in a bare
PyTorch loop in this process. The machine is noisy: read the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from fedsim.client_app import build_model, round_seed
from fedsim.config import RunConfig, parse_config
from fedsim.data.batches import BatchStream
from fedsim.federation import load_federation
from fedsim.runner import run

REPO = Path(__file__).resolve().parents[1]
CIFAR = REPO.parent / "shared" / "datasets" / "cifar10_jpg_q75.tar.gz"


def base_config(clients: int, steps: int, backend: str, engine: str, out: Path) -> RunConfig:
    data = (
        {"dataset": "imagefolder", "root": str(CIFAR), "augment": True}
        if CIFAR.exists()
        else {"dataset": "npz", "root": str(REPO / "fedsim/assets/mnist_small.npz"), "augment": False}
    )
    return parse_config(
        {
            "name": "bench",
            "seed": 0,
            "engine": engine,
            "data": data,
            "partition": {"name": "n_class", "classes_per_client": 1} if clients == 10 else {"name": "iid"},
            "model": {"name": "cnn", "norm": "none"},
            "train": {"num_clients": clients, "local_steps": steps, "batch_size": 32, "lr": 0.01, "rounds": 1},
            "eval": {"every": 100000, "global_test": False},
            "simulation": {"backend": backend, "threads": 1, "client_resources": {"num_cpus": 1}},
            "output": {"dir": str(out), "progress": False, "save_model": False},
        }
    )


def timed_run(cfg: RunConfig, rounds: int) -> float:
    cfg = cfg.model_copy(deep=True)
    cfg.train.rounds = rounds
    t0 = time.perf_counter()
    run(cfg)
    return time.perf_counter() - t0


def per_round(cfg: RunConfig, r1: int, r2: int) -> float:
    timed_run(cfg, 1)  # warm caches: decoded data, imports
    return (timed_run(cfg, r2) - timed_run(cfg, r1)) / (r2 - r1)


def compute_floor(cfg: RunConfig, rounds: int) -> float:
    """Seconds per round of the bare loop: the same clients, steps, batches and model."""
    torch.set_num_threads(cfg.simulation.threads)
    fed = load_federation(cfg)
    ds = fed.dataset
    model = build_model(cfg, ds.num_classes, ds.in_shape).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
    clients = [(ds.x_train[torch.from_numpy(i)], ds.y_train[torch.from_numpy(i)]) for i in fed.partition.train]
    t0 = time.perf_counter()
    for r in range(1, rounds + 1):
        for pid, (x, y) in enumerate(clients):
            gen = torch.Generator().manual_seed(round_seed(cfg.seed, r, pid))
            stream = BatchStream(x, y, 32, gen, augment=cfg.data.augment, normalize=None, device=torch.device("cpu"))
            for xb, yb in stream.batches(cfg.train.local_steps):
                loss = F.cross_entropy(model(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    return (time.perf_counter() - t0) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    out = Path(tempfile.mkdtemp(prefix="fedsim-bench-"))
    console = Console()
    r1, r2 = (2, 6) if args.quick else (5, 25)
    engines = [("local", "inline"), ("local", "ray"), ("flower", "inline")]
    table = Table(title="per-round overhead, 0 local steps (paper CNN)")
    for col in ("engine", "clients", "ms / round"):
        table.add_column(col)
    for clients in (10, 100):
        for engine, backend in engines:
            if engine == "flower" and clients == 100 and args.quick:
                continue
            cfg = base_config(clients, 0, backend, engine, out)
            fr1, fr2 = (2, 4) if engine == "flower" else (r1, r2)
            ms = per_round(cfg, fr1, fr2) * 1000
            label = "flower (Ray runtime)" if engine == "flower" else f"local ({backend})"
            table.add_row(label, str(clients), f"{ms:.1f}")
            console.print(f"  {label:22s} {clients:4d} clients: {ms:8.1f} ms/round")
    console.print(table)

    paper = Table(title="paper setting: 10 clients x 10 steps x batch 32, paper CNN, CIFAR-10")
    for col in ("engine", "s / round", "rounds / s", "ratio to floor"):
        paper.add_column(col)
    floor_cfg = base_config(10, 10, "inline", "local", out)
    floor = compute_floor(floor_cfg, 3 if args.quick else 5)
    paper.add_row("compute floor (bare loop)", f"{floor:.3f}", f"{1 / floor:.3f}", "1.00")
    for engine, backend in engines:
        cfg = base_config(10, 10, backend, engine, out)
        s = per_round(cfg, 2, 4) if args.quick or engine == "flower" else per_round(cfg, 2, 7)
        label = "flower (Ray runtime)" if engine == "flower" else f"local ({backend})"
        paper.add_row(label, f"{s:.3f}", f"{1 / s:.3f}", f"{s / floor:.2f}")
        console.print(f"  {label:22s}: {s:.3f} s/round, {s / floor:.2f}x floor")
    # the floor is re-measured last as well: the machine drifts, and the ratio must not flatter
    floor2 = compute_floor(floor_cfg, 3 if args.quick else 5)
    paper.add_row("compute floor, again", f"{floor2:.3f}", f"{1 / floor2:.3f}", f"{floor2 / floor:.2f}")
    console.print(paper)
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
