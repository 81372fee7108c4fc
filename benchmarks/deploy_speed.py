"""Seconds per round of the same config under ``fedsim run``, ``fedsim deploy`` and ``fedsim compose``, interleaved.

    python benchmarks/deploy_speed.py                   # every setting, 2 repetitions (about 25 minutes)
    python benchmarks/deploy_speed.py --setting quickstart --repeats 1 --rounds 6

Settings: ``quickstart`` (configs/quickstart.yaml at 3 clients, evaluation every round), ``paper``
(configs/cifar10_1class_fedavg.yaml: CIFAR-10 q75, 10 clients, 10 local steps of batch 32, evaluation
every 100 rounds) and ``paper-1step``: the paper setting with each client's work cut to one step of one
image, its Messages unchanged, which measures what a deployed round costs beyond the clients' work. Each
repetition runs every mode once, one after the other, so that a change of load
on the machine falls on all. s/round is the run's ``steady_s_per_round`` (summary.json: the mean
round time after the first, which pays for start-up). ``fedsim compose`` runs the same SuperLink and
``fedsim-supernode`` commands in containers: its project is written, brought up with Compose in one network
namespace (tests/container_support.py's override, as the container test runs it: no Docker network) and
taken down; it is timed where a Docker Engine answers, a Compose program is installed and the image
``fedsim:latest`` exists (as last built: tests/test_containers.py builds it from the checkout), and
skipped with the reason otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.container_support runs the compose projects, as in the container test
from tests.container_support import IMAGE, Project, compose_programs, docker, engine_answers  # noqa: E402

SETTINGS = {
    "quickstart": ("configs/quickstart.yaml", ["train.num_clients=3", "eval.every=1"]),
    "paper": ("configs/cifar10_1class_fedavg.yaml", ["eval.every=100"]),
    # the paper setting with the clients' work cut to one step of one image, Messages unchanged: what a
    # round costs beyond that work (under fedsim deploy: Flower's transport, the tasks' processes)
    "paper-1step": (
        "configs/cifar10_1class_fedavg.yaml",
        ["eval.every=100", "train.local_steps=1", "train.batch_size=1"],
    ),
}
MODES = ("run", "deploy", "compose")
ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_USAGE_STATS_ENABLED": "0"}
COMPOSE_TIMEOUT_S = 3600


def fedsim(*args: str) -> None:
    subprocess.run(["fedsim", *args], check=True, env={**os.environ, **ENV}, stdout=subprocess.DEVNULL)


def compose_unavailable() -> str | None:
    """Why ``fedsim compose`` cannot be timed here; None: it can."""
    if not engine_answers():
        return "no Docker Engine answers (tests/test_containers.py starts one as root)"
    if not compose_programs():
        return "neither docker-compose nor docker compose is installed"
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        return f"no {IMAGE} image (docker build -f docker/Dockerfile -t {IMAGE} .)"
    return None


def composed(args: list[str], out: Path) -> Path:
    """The run of ``fedsim compose ARGS``'s project, brought up and taken down; its run directory."""
    fedsim("compose", *args, "--out", str(out))
    project = Project(out, next(iter(compose_programs().values())), os.getuid())
    try:
        project("up", "-d")
        code = project.wait(project.container("submit"), COMPOSE_TIMEOUT_S)
        if code != 0:
            raise RuntimeError(f"submit exited {code}:\n{project.logs('submit', 'superlink')}")
    finally:
        project.down()
    (summary,) = out.glob("runs/*/summary.json")
    return summary.parent


def seconds_per_round(mode: str, setting: str, rounds: int, out: Path) -> tuple[float, float]:
    """(steady s/round, wall seconds of the whole command) of one run."""
    config, overrides = SETTINGS[setting]
    path = out / f"{setting}-{mode}-{time.monotonic_ns()}"
    args = [str(REPO / config), "--set", *overrides, f"train.rounds={rounds}", "output.progress=false"]
    start = time.monotonic()
    if mode == "compose":  # the run directory is the project's runs/<name>
        run_dir = composed(args, path)
    else:
        run_dir = path
        fedsim(mode, *args, f"output.run_dir={run_dir}")
    wall = time.monotonic() - start
    return json.loads((run_dir / "summary.json").read_text())["steady_s_per_round"], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), action="append")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    console = Console()
    modes = MODES
    if why := compose_unavailable():
        console.print(f"fedsim compose not timed: {why}")
        modes = tuple(m for m in MODES if m != "compose")
    table = Table("setting", "mode", "s/round (median)", "runs", "× fedsim run", "wall s (median)")
    with tempfile.TemporaryDirectory(prefix="fedsim-deploy-speed-") as tmp:
        for setting in args.setting or list(SETTINGS):
            times: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
            for rep in range(args.repeats):
                for mode in modes if rep % 2 == 0 else modes[::-1]:
                    times[mode].append(seconds_per_round(mode, setting, args.rounds, Path(tmp)))
                    console.print(f"{setting} {mode} #{rep + 1}: {times[mode][-1][0]:.2f} s/round")
            base = statistics.median(s for s, _ in times["run"])
            for mode in modes:
                med = statistics.median(s for s, _ in times[mode])
                table.add_row(setting, f"fedsim {mode}", f"{med:.2f}", " ".join(f"{s:.2f}" for s, _ in times[mode]),
                              f"{med / base:.2f}", f"{statistics.median(w for _, w in times[mode]):.0f}")  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    main()
