"""Round overhead and speed against the compute floor, for every engine, in one process and one run.

    python benchmarks/round_overhead.py            # everything below
    python benchmarks/round_overhead.py --quick    # fewer rounds; no 50/100-client Flower runtime
    python benchmarks/round_overhead.py --memory   # RSS at rounds 100 and 1,000 (inline, 0 steps)
    python benchmarks/round_overhead.py --paper --hogs 2   # the paper setting beside 2 busy processes

Per-round cost is the run's steady round time (``steady_s_per_round`` in summary.json): the mean
time from the end of round 1's aggregation to the end of the last round's, evaluation excluded,
so start-up, data loading and the first round's imports do not count. The compute floor is the
same SGD steps (same model, same batches, same augmentation) in a bare PyTorch loop in this
process. The machine is noisy: read the ratios, which are measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from flwr.app import MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords as flower_aggregate
from rich.console import Console
from rich.table import Table

from fedsim.arrays import to_array_record
from fedsim.client.runtime import round_seed
from fedsim.config import RunConfig
from fedsim.config_file import parse_config
from fedsim.data.batches import BatchStream
from fedsim.engines.runner import run
from fedsim.experiment.resolve import resolve
from fedsim.layout import choose_layout, usable_cores
from fedsim.strategies.aggregation import aggregate_arrayrecords

REPO = Path(__file__).resolve().parents[1]
CIFAR = REPO.parent / "shared" / "datasets" / "cifar10_jpg_q75.tar.gz"


def base_config(clients: int, steps: int, backend: str, engine: str, out: Path, vmap_clients: int = 1) -> RunConfig:
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
            "simulation": {
                "backend": backend, "threads": 1, "client_resources": {"num_cpus": 1}, "vmap_clients": vmap_clients,
            },
            "output": {"dir": str(out), "progress": False, "save_model": False},
        }
    )


def per_round(cfg: RunConfig, rounds: int) -> float:
    cfg = cfg.model_copy(deep=True)
    cfg.train.rounds = rounds
    return float(run(cfg)["steady_s_per_round"])


def compute_floor(cfg: RunConfig, rounds: int, threads: int = 1, channels_last: bool = True) -> float:
    """Seconds per round of the bare loop: the same clients, steps, batches and model, one process."""
    torch.set_num_threads(threads)
    experiment = resolve(cfg)
    fed = experiment.federation()
    ds = fed.dataset
    model = experiment.build_model()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
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


def label(engine: str, backend: str, vmap_clients: int = 1) -> str:
    if engine == "flower":
        return "flower (Ray runtime)"
    return f"local ({backend}, vmap {vmap_clients})" if vmap_clients > 1 else f"local ({backend})"


def overhead_table(console: Console, out: Path, quick: bool) -> None:
    table = Table(title="per-round overhead at 0 local steps (paper CNN, CIFAR-10 shapes)")
    for col in ("engine", "clients", "ms / round", "ms / client"):
        table.add_column(col)
    rounds = 20 if quick else 60  # steady rounds of the local engines (Flower's runtime: 6, it is slow)
    for engine, backend in ENGINES:
        for clients in (10, 50, 100):
            if engine == "flower" and clients > 10 and quick:
                continue
            n = min(rounds, 6) if engine == "flower" else rounds
            ms = per_round(base_config(clients, 0, backend, engine, out), n) * 1000
            table.add_row(label(engine, backend), str(clients), f"{ms:.1f}", f"{ms / clients:.2f}")
            console.print(f"  {label(engine, backend):22s} {clients:4d} clients: {ms:8.1f} ms/round")
    console.print(table)


def honest_floor(cfg: RunConfig, rounds: int, console: Console) -> tuple[float, str]:
    """The fastest bare loop this machine runs: best over thread counts and memory formats."""
    best = (float("inf"), "")
    for threads in sorted({1, CORES}):
        for channels_last in (False, True):
            s = compute_floor(cfg, rounds, threads, channels_last)
            name = f"{threads} thread{'s' if threads > 1 else ''}, {'channels-last' if channels_last else 'contiguous'}"
            console.print(f"  bare loop, {name:28s}: {s:.3f} s/round")
            best = min(best, (s, name))
    return best


def paper_table(console: Console, out: Path, quick: bool) -> None:
    paper = Table(title="paper setting: 10 clients x 10 steps x batch 32, paper CNN, CIFAR-10")
    for col in ("layout", "s / round", "rounds / s", "ratio to floor"):
        paper.add_column(col)
    floor_cfg = base_config(10, 10, "inline", "local", out)
    rounds = 3 if quick else 5
    floor, how = honest_floor(floor_cfg, rounds, console)
    paper.add_row(f"compute floor (bare loop, {how})", f"{floor:.3f}", f"{1 / floor:.3f}", "1.00")
    layouts = [(name, "local", sim, 1) for name, sim in LAYOUTS.items()]
    layouts += [("Flower's runtime", "flower", {"threads": 1}, 1), ("inline, vmap 10", "local", {"threads": 1}, 10)]
    for name, engine, sim, vmap_clients in layouts:
        cfg = base_config(10, 10, "inline", engine, out, vmap_clients)
        cfg.simulation = cfg.simulation.model_copy(update=sim)
        if sim.get("backend") == "auto":  # say what it chose here
            chosen = choose_layout(cfg).simulation
            name = f"{name}: {chosen.backend}, {chosen.threads} thread{'s' if chosen.threads != 1 else ''}"
        s = per_round(cfg, 3 if quick else 6)
        paper.add_row(name, f"{s:.3f}", f"{1 / s:.3f}", f"{s / floor:.2f}")
        console.print(f"  {name:28s}: {s:.3f} s/round, {s / floor:.2f}x floor")
    # the floor again, last: the machine drifts, and the ratios must not flatter
    floor2, how2 = honest_floor(floor_cfg, rounds, console)
    paper.add_row(f"compute floor, again ({how2})", f"{floor2:.3f}", f"{1 / floor2:.3f}", f"{floor2 / floor:.2f}")
    console.print(paper)


def aggregation_table(console: Console, out: Path) -> None:
    """fedsim's aggregation against Flower's own on the same 10 replies of the paper CNN: same bytes."""
    experiment = resolve(base_config(10, 0, "inline", "local", out))
    records = []
    for seed in range(10):
        torch.manual_seed(seed)
        arrays = to_array_record(experiment.build_model().state_dict())
        records.append(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 5000})}))
    table = Table(title="aggregating 10 replies of the paper CNN (3.2 MB each)")
    for col in ("implementation", "ms", "ratio to Flower's"):
        table.add_column(col)
    ms = {}
    for name, fn in (("Flower's", flower_aggregate), ("fedsim.strategies.aggregation", aggregate_arrayrecords)):
        fn(records, "num-examples")
        t0 = time.perf_counter()
        for _ in range(20):
            result = fn(records, "num-examples")
        ms[name] = (time.perf_counter() - t0) / 20 * 1000, {k: a.data for k, a in result.items()}
    flower_ms, flower_bytes = ms["Flower's"]
    for name, (value, data) in ms.items():
        same = "" if data == flower_bytes else " (DIFFERENT BYTES)"
        table.add_row(name + same, f"{value:.2f}", f"{value / flower_ms:.2f}")
    console.print(table)


def memory_table(console: Console, out: Path) -> None:
    cfg = base_config(10, 0, "inline", "local", out)
    cfg.train.rounds = 1000
    cfg.eval.every = 100
    summary = run(cfg)
    lines = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    rss = {m["round"]: m["rss_mb"] for m in lines}
    table = Table(title="resident memory, inline engine, 10 clients, 0 local steps")
    table.add_column("round")
    table.add_column("RSS MiB")
    for r in sorted(rss):
        table.add_row(str(r), f"{rss[r]:.1f}")
    console.print(table)
    console.print(f"growth from round 100 to 1,000: {rss[1000] - rss[100]:+.1f} MiB")


ENGINES = [("local", "inline"), ("local", "ray"), ("flower", "inline")]
CORES = usable_cores()
# fedsim's layouts at the paper setting; the first is the default, which fedsim.layout makes concrete
LAYOUTS: dict[str, dict[str, object]] = {
    "the default (auto)": {"backend": "auto", "threads": "auto"},
    "inline, 1 thread (the default until auto)": {"backend": "inline", "threads": 1},
    f"inline, {CORES} threads": {"backend": "inline", "threads": CORES},
    f"Ray pool, {CORES} workers x 1 thread": {"backend": "ray", "threads": 1},
}


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[None]:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def run_tables(args: argparse.Namespace, console: Console, out: Path) -> None:
    if args.memory:
        memory_table(console, out)
    elif args.paper:
        paper_table(console, out, args.quick)
    else:
        aggregation_table(console, out)
        overhead_table(console, out, args.quick)
        paper_table(console, out, args.quick)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--memory", action="store_true", help="only the 1,000-round memory check")
    parser.add_argument("--paper", action="store_true", help="only the paper setting against the floor")
    parser.add_argument(
        "--hogs", type=int, default=0, metavar="N", help="beside N processes that keep a core busy each (loaded)"
    )
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="fedsim-bench-"))
    console = Console()
    with busy_processes(args.hogs):
        run_tables(args, console, out)
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
