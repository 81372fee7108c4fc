"""Seconds per round of the same config under ``fedsim run`` and ``fedsim deploy``, interleaved.

    python benchmarks/deploy_speed.py                   # both settings, 2 repetitions (about 15 minutes)
    python benchmarks/deploy_speed.py --setting quickstart --repeats 1 --rounds 6

Settings: ``quickstart`` (configs/quickstart.yaml at 3 clients, evaluation every round) and ``paper``
(configs/cifar10_1class_fedavg.yaml: CIFAR-10 q75, 10 clients, 10 local steps of batch 32, evaluation
every 100 rounds). Each repetition runs every mode once, one after the other, so that a change of load
on the machine falls on both. s/round is the run's ``steady_s_per_round`` (summary.json: the mean
round time after the first, which pays for start-up). ``fedsim compose`` runs the same SuperLink and
``fedsim-supernode`` commands in containers; it is not timed here (it needs a Docker Engine and the
image: see tests/test_containers.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {
    "quickstart": ("configs/quickstart.yaml", ["train.num_clients=3", "eval.every=1"]),
    "paper": ("configs/cifar10_1class_fedavg.yaml", ["eval.every=100"]),
}
MODES = ("run", "deploy")
ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_USAGE_STATS_ENABLED": "0"}


def seconds_per_round(mode: str, setting: str, rounds: int, out: Path) -> tuple[float, float]:
    """(steady s/round, wall seconds of the whole command) of one run."""
    config, overrides = SETTINGS[setting]
    run_dir = out / f"{setting}-{mode}-{time.monotonic_ns()}"
    cmd = ["fedsim", mode, str(REPO / config), "--set", *overrides, f"train.rounds={rounds}",
           f"output.run_dir={run_dir}", "output.progress=false"]  # fmt: skip
    start = time.monotonic()
    subprocess.run(cmd, check=True, env={**os.environ, **ENV}, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - start
    return json.loads((run_dir / "summary.json").read_text())["steady_s_per_round"], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), action="append")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    console = Console()
    table = Table("setting", "mode", "s/round (median)", "runs", "× fedsim run", "wall s (median)")
    with tempfile.TemporaryDirectory(prefix="fedsim-deploy-speed-") as tmp:
        for setting in args.setting or list(SETTINGS):
            times: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
            for rep in range(args.repeats):
                for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                    times[mode].append(seconds_per_round(mode, setting, args.rounds, Path(tmp)))
                    console.print(f"{setting} {mode} #{rep + 1}: {times[mode][-1][0]:.2f} s/round")
            base = statistics.median(s for s, _ in times["run"])
            for mode in MODES:
                med = statistics.median(s for s, _ in times[mode])
                table.add_row(setting, f"fedsim {mode}", f"{med:.2f}", " ".join(f"{s:.2f}" for s, _ in times[mode]),
                              f"{med / base:.2f}", f"{statistics.median(w for _, w in times[mode]):.0f}")  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    main()
