"""``fedsim sweep``: one base config, a grid (and/or explicit cells) of overrides, every run.

A sweep file::

    base: ../cifar10_1class_fedavg.yaml      # relative to the sweep file
    name: strategies-1class
    set: {train.rounds: 30, eval.every: 10}  # applied to every run
    grid:                                    # every combination
      strategy.name: [fedavg, fedprox]
      seed: [0, 1]
    cells:                                   # and/or explicit combinations, each crossed with grid
      - {model.norm: ln}
      - {model.norm: fn}
    parallel: 1                              # runs at once (separate processes)

Each run lands in ``<output>/<sweep name>/<cell name>/``; a run whose ``summary.json`` exists is
skipped, so an interrupted sweep resumes where it stopped. Every cell is validated before the
first run starts.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedsim.config import RunConfig, load_config
from fedsim.errors import ConfigError


class SweepFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base: str = Field(description="the base run config, relative to the sweep file")
    name: str | None = None
    output: str = "runs/sweeps"
    set: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    cells: list[dict[str, Any]] = Field(default_factory=list)
    parallel: int = Field(1, ge=1)

    @field_validator("grid")
    @classmethod
    def _non_empty(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in grid.items():
            if not values:
                raise ValueError(f"grid.{key} is an empty list: give at least one value")
        return grid


def _override(key: str, value: Any) -> str:
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def cell_name(overrides: dict[str, Any]) -> str:
    if not overrides:
        return "base"
    parts = []
    for key, value in overrides.items():
        if isinstance(value, dict):  # {name: fedprox, mu: 0.1} -> fedprox+mu=0.1
            rest = [f"{k}={v}" for k, v in value.items() if k != "name"]
            value = "+".join([str(value.get("name", ""))] + rest).strip("+")
        parts.append(f"{key.split('.')[-1]}={value}")
    return ",".join(parts).replace("/", "_").replace(" ", "")


def expand(sweep: SweepFile) -> list[dict[str, Any]]:
    keys = list(sweep.grid)
    combos = [dict(zip(keys, values, strict=True)) for values in itertools.product(*sweep.grid.values())]
    cells = sweep.cells or [{}]
    return [{**cell, **combo} for cell in cells for combo in combos]


def plan(path: str | Path) -> tuple[Path, list[tuple[str, RunConfig]]]:
    """The sweep directory and every (cell name, validated config); raises before anything runs."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file not found: {path.resolve()}")
    try:
        sweep = SweepFile.model_validate(yaml.safe_load(path.read_text()) or {})
    except Exception as err:
        raise ConfigError(f"{path}: {err}") from err
    base = path.parent / sweep.base
    name = sweep.name or path.stem
    out = Path(sweep.output) / name
    runs = []
    for cell in expand(sweep):
        overrides = [_override(k, v) for k, v in {**sweep.set, **cell}.items()]
        try:
            cfg = load_config(base, overrides)
        except ConfigError as err:
            raise ConfigError(f"sweep cell {cell_name(cell)}: {err}") from err
        cname = cell_name(cell)
        cfg.name = cname
        cfg.output.run_dir = str(out / cname)
        cfg.output.progress = False
        runs.append((cname, cfg))
    names = [n for n, _ in runs]
    if len(set(names)) != len(names):
        raise ConfigError("two sweep cells have the same overrides: remove the duplicate")
    return out, runs


def _run_one(cfg_json: str) -> dict[str, Any]:
    from fedsim.runner import run

    return run(RunConfig.from_json(cfg_json))


def run_sweep(path: str | Path, parallel: int | None = None, log=print) -> Path:  # type: ignore[no-untyped-def]
    out, runs = plan(path)
    sweep = SweepFile.model_validate(yaml.safe_load(Path(path).read_text()))
    todo = [(n, c) for n, c in runs if not (Path(c.output.run_dir or "") / "summary.json").exists()]
    log(f"sweep {out}: {len(runs)} runs, {len(runs) - len(todo)} already complete")
    workers = parallel or sweep.parallel
    if workers == 1:
        for name, cfg in todo:
            summary = _run_one(cfg.to_json())
            log(f"  {name}: client-mean acc {summary['final_client_mean_acc']}")
    else:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            for (name, _), summary in zip(todo, pool.map(_run_one, [c.to_json() for _, c in todo]), strict=True):
                log(f"  {name}: client-mean acc {summary['final_client_mean_acc']}")
    return out
