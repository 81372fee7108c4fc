"""Golden metrics: every engine's numbers for a fixed set of runs, recorded from an earlier main.

A refactoring must not change a single number: each run below is the quickstart (short) under one
strategy, and its ``metrics.jsonl`` (wall-clock fields aside) must equal the file recorded in
``tests/golden/`` under every engine. Bit for bit where this CPU has the instruction set the files
were recorded with (``meta.json``): another set (AVX2 against AVX512) may choose other kernels, and
then only float noise may differ. ``FEDSIM_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` records them
anew, for a change that is meant to change numbers (say so in the commit).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.cli import main as cli_main
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "golden"
QUICKSTART = REPO / "configs" / "quickstart.yaml"
SHORT = [
    "train.rounds=3", "train.local_steps=2", "eval.every=1", "simulation.threads=1",
    "output.progress=false", "output.save_model=false",
]
CASES: dict[str, list[str]] = {
    "fedavg": ["strategy.name=fedavg"],
    "fedprox": ["strategy.name=fedprox", "strategy.mu=0.1"],
    "scaffold-partial": ["strategy.name=scaffold", "train.clients_per_round=4"],
    "fedyogi": ["strategy.name=fedyogi"],
    "fedbn": ["strategy.name=fedbn", "model.norm=bn"],
    "fedlc": ["strategy.name=fedlc"],
    "fedadam": ["strategy.name=fedadam", "strategy.eta=0.01"],
    "fedavgm-partial": ["strategy.name=fedavgm", "strategy.server_momentum=0.9", "train.clients_per_round=5"],
}
ENGINES: dict[str, list[str]] = {
    "inline": ["simulation.backend=inline"],
    "ray-pool": ["simulation.backend=ray"],
    "flower": ["engine=flower"],
}
# The README's suite runs every case inline and the other engines on the cases whose state they route
# differently (SCAFFOLD's control variates and FedBN's local tensors, partial participation); the rest
# of the grid is marked `grid` (minutes), left out of the suite and run by CI after it (.ci/run).
IN_SUITE = {(case, "inline") for case in CASES} | {
    ("scaffold-partial", "ray-pool"), ("fedbn", "ray-pool"),
    ("scaffold-partial", "flower"), ("fedavgm-partial", "flower"),
}
GRID = [
    pytest.param(
        case, engine,
        marks=pytest.mark.grid if (case, engine) not in IN_SUITE else () if engine == "inline" else pytest.mark.slow,
    )
    for engine in ENGINES for case in CASES
]  # fmt: skip
WALL_CLOCK = ("time_s", "rss_mb")  # facts about the machine, not results
UPDATE = os.environ.get("FEDSIM_UPDATE_GOLDEN") == "1"


def run_metrics(tmp_path: Path, overrides: list[str]) -> list[dict[str, Any]]:
    run_dir = tmp_path / "run"
    assert cli_main(["run", str(QUICKSTART), "--set", *SHORT, *overrides, f"output.run_dir={run_dir}"]) == 0
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK} for line in lines]


def same_cpu_kind() -> bool:
    meta = json.loads((GOLDEN / "meta.json").read_text())
    return meta["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def assert_close(got: Any, want: Any, where: str) -> None:
    """Float noise only: a loss to 1e-3 relative, an accuracy to one test sample in a hundred."""
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for k in want:
            assert_close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        tol = 1e-3 * abs(want) if "loss" in where else 0.01
        assert got is not None and math.isclose(got, want, abs_tol=tol), f"{where}: {got} != {want}"
    else:
        assert got == want, where


@pytest.mark.parametrize(("case", "engine"), GRID)
def test_metrics_equal_the_golden_files(tmp_path: Path, case: str, engine: str) -> None:
    got = run_metrics(tmp_path, CASES[case] + ENGINES[engine])
    path = GOLDEN / f"{case}.jsonl"
    if UPDATE and engine == "inline":
        path.write_text("".join(json.dumps(r) + "\n" for r in got))
        meta = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
        (GOLDEN / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    want = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["round"] for r in got] == [1, 2, 3]
    if same_cpu_kind():
        assert got == want
    else:
        assert_close(got, want, case)
