"""The sweep file and its plan: one base config, a grid (and/or explicit cells) of overrides, expanded into every
cell's name, directory and validated config, and where each cell stands (new, to resume, done).

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
    axes:                                    # and/or named lists of combinations, crossed with each other
      setting:                               # (for keys that must change together)
        - {partition: {name: n_class, classes_per_client: 2}, train.num_clients: 50}
        - {partition: {name: dirichlet, beta: 0.1}, train.num_clients: 20}
    parallel: 1                              # runs at once (separate processes)
    ray: {address: auto, cpus_per_run: 2}    # optional: runs as Ray tasks, here or on a cluster

Each run lands in ``<output>/<sweep name>/<cell name>/``: a ``name``, ``output.run_dir`` or ``output.dir``
given for a cell (:data:`SWEEP_OWNED`) is refused, as are two cells whose names collide. A run whose
``summary.json`` exists is skipped, so an interrupted sweep resumes where it stopped; one that finished
with other settings (say a short ``--set train.rounds=20`` run where the full budget now goes) is an
error, never silently taken for the cell; so is one without a readable ``config.yaml`` (a damaged run directory).

Bad cells: every cell's config is validated before the first run starts, each distinct dataset read once
and each cell checked against its data, model and strategy as ``fedsim run`` checks it (not on a Ray cluster,
whose nodes hold their own data); if any cell is invalid the sweep runs
nothing and names each bad cell with its reason (exit status 2), so a typo in one cell does not cost
the hours of the cells before it.

A sweep has at most ``max_cells`` cells (1,000 unless the file raises it, to at most 10,000), counted before any
is expanded: each cell's config is built and validated up front. Names are never paths: the sweep's
``name`` is one directory name, and a cell's name (made of its overrides) longer than 200 characters
is cut to 191 and ends with ``~`` and 8 hex digits of its full name's SHA-256.

``overrides`` (``fedsim sweep FILE --set key=value ...``) apply on top of the file's ``set`` to
every cell, e.g. a short budget; they may not touch a key the grid, the cells or the axes vary.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fedsim.config import NOT_LEARNING, HomePath, RunConfig, flatten
from fedsim.config_file import check_keys_once, format_validation_error, keys_overlap, load_config, read_yaml
from fedsim.errors import ConfigError, FedsimError, brief
from fedsim.experiment.resolve import resolve
from fedsim.names import NAME_RULE, cut, is_name, printable
from fedsim.ownership import check_not_in_a_run
from fedsim.record.layout import CHECKPOINT, CONFIG, SUMMARY
from fedsim.trackers import resolve_trackers

OUTPUT = "--output (or the sweep file's output)"  # the sweep directory, as messages name it
MAX_CELLS = 1_000  # each cell's config is built and validated before the first run (~2.5 ms and ~20 kB each)
# and the most a file may raise max_cells to: 10,000 cells are ~200 MB of configs and ~25 s of validation before the
# first run, and every 10x more costs 10x the memory and the wait
CELLS_LIMIT = 10_000

class _SweepSection(BaseModel):
    # as a run config's sections: no unknown key, no boolean or text as a number (`parallel: true` is not 1), no
    # inf, no control character in any text (a key or value of the grid, the cells, the axes included)
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    _printable = field_validator("*")(printable)


class RaySweep(_SweepSection):
    """Run the cells as Ray tasks: on this machine, or spread over a running cluster."""

    address: str | None = Field(
        None, pattern=r"^(auto|(ray://)?\S+:\d+)$", description="a running cluster; none: a Ray instance here"
    )
    cpus_per_run: float = Field(1.0, gt=0, description="CPUs Ray reserves for each run")
    gpus_per_run: float = Field(0.0, ge=0, description="GPUs Ray reserves for each run (fractions share one)")


class SweepFile(_SweepSection):
    base: str = Field(description="the base run config, relative to the sweep file")
    name: str | None = None
    output: HomePath = "runs/sweeps"
    set: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    cells: list[dict[str, Any]] = Field(default_factory=list)
    axes: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    parallel: int = Field(1, ge=1)
    ray: RaySweep | None = Field(None, description="run cells as Ray tasks instead of local processes")
    max_cells: int = Field(
        MAX_CELLS, ge=1, le=CELLS_LIMIT, description="the most cells the sweep may have (raise it on purpose)"
    )

    @field_validator("name")
    @classmethod
    def _a_name_not_a_path(cls, name: str | None) -> str | None:
        if name is not None and not is_name(name):
            raise ValueError(
                f"name = {brief(name)}: the sweep's name is a directory name under output (or --output); give "
                f"{NAME_RULE} (put paths in output)"
            )
        return name

    @field_validator("grid", "axes")
    @classmethod
    def _non_empty(cls, lists: dict[str, list[Any]], info: ValidationInfo) -> dict[str, list[Any]]:
        for key, values in lists.items():
            if not values:
                raise ValueError(f"{info.field_name}.{key} is an empty list: give at least one value")
        return lists

    @model_validator(mode="after")
    def _each_key_once(self) -> SweepFile:
        """Each value is set in one place: a key in two of set, grid, cells and axes, or a section that a cell
        sets beside a key inside it (``train`` and ``train.lr``: the section's mapping replaces what the other
        set) would leave a cell's name or the set values saying what it does not train. A section in ``set``
        with keys inside it varied (``model.norm: ln``, then ``model.norm.affine``) refines, as it reads."""
        sources = {"set": set(self.set), "grid": set(self.grid), "cells": {k for cell in self.cells for k in cell}}
        sources.update({f"axes.{name}": {k for c in combos for k in c} for name, combos in self.axes.items()})
        keyed = sorted(((key, source) for source, keys in sources.items() for key in sorted(keys)), key=lambda k: k[0])
        for (key_a, a), (key_b, b) in itertools.combinations(keyed, 2):  # key_a <= key_b: a section comes first
            if key_a == key_b and a != b:
                raise ValueError(f"{key_a} set by both {a} and {b}: set each value in one place")
            if key_b.startswith(key_a + ".") and a != "set":
                where = f"both {a} and {b}" if a != b else a
                raise ValueError(
                    f"{key_a} and {key_b} set by {where}: the section {key_a} replaces what {key_b} sets; set each "
                    "value in one place"
                )
        return self

    @model_validator(mode="after")
    def _not_what_the_sweep_sets(self) -> SweepFile:
        """A cell's name and directory are the sweep's (``<output>/<name>/<cell name>``): a value for them in
        ``set`` or a cell was silently replaced."""
        given = [("set", k, v) for k, v in self.set.items()] + [("grid", k, None) for k in self.grid]
        given += [("cells", k, v) for cell in self.cells for k, v in cell.items()]
        given += [(f"axes.{name}", k, v) for name, combos in self.axes.items() for c in combos for k, v in c.items()]
        for source, key, value in given:
            if (owned := sweep_owned(key, value)) is not None:
                raise ValueError(f"{source} sets {owned}: {OWNED_WHY}")
        return self

    def size(self) -> int:
        """The number of cells, counted without expanding them."""
        return math.prod(map(len, [self.cells or [{}], *self.axes.values(), *self.grid.values()]))

    def varied_keys(self) -> list[str]:
        """Every key the grid, the cells or the axes set, in order."""
        axes = (k for combos in self.axes.values() for c in combos for k in c)
        return list(dict.fromkeys([*self.grid, *(k for cell in self.cells for k in cell), *axes]))


# what the sweep sets in each cell's config itself, and why a value given for it is refused
SWEEP_OWNED = ("name", "output.run_dir", "output.dir")
OWNED_WHY = (
    "each cell's name and directory are the sweep's (<output>/<sweep name>/<cell name>); set the sweep file's "
    "name and output (or fedsim sweep --output) instead"
)


def sweep_owned(key: str, value: Any = None) -> str | None:
    """The key of :data:`SWEEP_OWNED` that setting ``key`` to ``value`` sets (``output: {run_dir: x}`` sets
    ``output.run_dir``), else None."""
    for owned in SWEEP_OWNED:
        if key == owned:
            return owned
        section, _, rest = owned.partition(".")
        if key == section and isinstance(value, dict) and rest in value:
            return owned
    return None


def _override(key: str, value: Any) -> str:
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def cell_name(overrides: dict[str, Any]) -> str:
    """The cell's directory name, made of its overrides: stable across sweeps, so a rerun finds its runs."""
    if not overrides:
        return "base"
    parts = []
    for key, value in overrides.items():
        if isinstance(value, dict):  # {name: fedprox, mu: 0.1} -> fedprox+mu=0.1
            rest = [f"{k}={v}" for k, v in value.items() if k != "name"]
            value = "+".join([str(value.get("name", ""))] + rest).strip("+")
        *parents, leaf = key.split(".")
        if leaf == "name" and parents:  # model.name: cnn -> model=cnn, not name=cnn
            leaf = parents[-1]
        parts.append(f"{leaf}={value}")
    name = ",".join(parts).translate({ord("/"): "_", ord("\\"): "_", ord("\0"): "_", ord(" "): None})
    return cut(name)  # a long swept value (a list of layer widths): still one name, still unique


def expand(sweep: SweepFile) -> list[dict[str, Any]]:
    """Every cell's overrides: each explicit cell x each combination of the axes x each grid point."""
    keys = list(sweep.grid)
    grid = [dict(zip(keys, values, strict=True)) for values in itertools.product(*sweep.grid.values())]
    axes = [{k: v for part in parts for k, v in part.items()} for parts in itertools.product(*sweep.axes.values())]
    return [{**cell, **axis, **point} for cell in sweep.cells or [{}] for axis in axes for point in grid]


def read_sweep(path: str | Path) -> SweepFile:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"sweep file {path}: a directory, not a YAML file")
    raw = read_yaml(path, "sweep file") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep file {path}: the top level must be a mapping (base, grid, cells, ...)")
    try:
        return SweepFile.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"sweep file {path}: {format_validation_error(err, SweepFile)}") from err


def _check_overrides(overrides: Sequence[str], sweep: SweepFile) -> None:
    varied = sweep.varied_keys()
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key.path=value, e.g. train.rounds=20")
        if (owned := sweep_owned(key.strip())) is not None:
            raise ConfigError(f"--set {item}: sets {owned}: {OWNED_WHY}")
        hit = next((v for v in varied if keys_overlap(key.strip(), v)), None)
        if hit is not None:
            raise ConfigError(
                f"--set {item}: the sweep varies {hit!r} from cell to cell (grid, cells or axes); a value set for "
                f"every cell would hide that, so edit the sweep file instead"
            )


def plan(
    path: str | Path, overrides: Sequence[str] = (), output: str | Path | None = None
) -> tuple[Path, list[tuple[str, RunConfig]]]:
    """The sweep directory and every (cell name, validated config); raises before anything runs, naming
    every invalid cell (see the module's docstring).

    ``overrides`` (``key.path=value``, as ``fedsim run --set``) apply to every cell after the
    file's ``set``; ``output`` replaces the file's ``output`` directory.
    """
    path = Path(path)
    sweep = read_sweep(path)
    _check_overrides(overrides, sweep)
    if (size := sweep.size()) > sweep.max_cells:
        fix = (
            f"set max_cells: {size} in the file"
            if size <= CELLS_LIMIT
            else f"split it into several sweep files (max_cells is at most {CELLS_LIMIT:,})"
        )
        raise ConfigError(
            f"sweep file {path}: {size:,} cells (cells x axes x grid), more than max_cells = {sweep.max_cells:,}; "
            f"each is validated before the first run: shrink the grid, or {fix}"
        )
    base = path.parent / sweep.base
    if base.resolve() == path.resolve():  # read as a run config, every sweep key would be an error of its own
        raise ConfigError(
            f"sweep file {path}: base: {sweep.base} is this sweep file; give the run config its cells start from"
        )
    name = sweep.name or path.stem
    if not is_name(name):  # a file's name (the default) may be too long for a directory's
        raise ConfigError(f"sweep file {path}: its name {brief(name)} is not a directory name: set name: in the file")
    out = Path(output if output is not None else sweep.output) / name
    check_not_in_a_run(out, OUTPUT)
    fixed = [*(_override(k, v) for k, v in sweep.set.items()), *overrides]
    try:  # a section after a key inside it would drop the key in silence, as in one --set list
        check_keys_once(fixed)
    except ConfigError as err:
        raise ConfigError(f"sweep file {path}: its set, then --set, in order: {err}") from None
    cells = expand(sweep)
    _check_names(cells, path)
    runs, bad = [], {}
    for cell in cells:
        cname = cell_name(cell)
        try:
            cfg = load_config(base, [*fixed, *(_override(k, v) for k, v in cell.items())])
            resolve(cfg)  # every plugin and option, the trackers' too, before the first run starts
            resolve_trackers(cfg.output.trackers)
        except FedsimError as err:
            bad[cname] = str(err)
            continue
        cfg.name = cname
        cfg.output.run_dir = str(out / cname)
        cfg.output.progress = False
        runs.append((cname, cfg))
    refuse_bad_cells(bad, size)
    return out, runs


def _check_names(cells: list[dict[str, Any]], path: Path) -> None:
    """Each cell has a directory of its own: two cells of the same overrides are one, and two whose overrides
    differ only in what a directory name cannot hold (``a/b`` and ``a_b``) would share one."""
    seen: dict[str, dict[str, Any]] = {}
    for cell in cells:
        other = seen.setdefault(cell_name(cell), cell)
        if other is cell:
            continue
        if other == cell:
            raise ConfigError(
                f"sweep file {path}: two cells have the same overrides ({cell_name(cell)}): remove the duplicate"
            )
        show = ", ".join
        raise ConfigError(
            f"sweep file {path}: cells {{{show(_override(k, v) for k, v in other.items())}}} and "
            f"{{{show(_override(k, v) for k, v in cell.items())}}} differ, but their directory names collide "
            f"({cell_name(cell)}: a cell's directory is named after its overrides, made a directory name): give "
            "values that stay apart as names"
        )


def refuse_bad_cells(bad: dict[str, str], size: int, shown: int = 5) -> None:
    """Raise one error naming every bad cell (``name -> reason``), the reasons of the first ``shown``."""
    if not bad:
        return
    if len(bad) == 1:
        ((name, reason),) = bad.items()
        raise ConfigError(f"sweep cell {name}: {reason}")
    if len(bad) == size and len(set(bad.values())) == 1:  # the sweep's own problem (its data), not a cell's
        raise ConfigError(f"{next(iter(bad.values()))} (every cell of the sweep)")
    reasons = [f"cell {name}: {reason}" for name, reason in list(bad.items())[:shown]]
    if len(bad) > shown:
        reasons.append(f"and {', '.join(list(bad)[shown:])}")
    raise ConfigError(f"{len(bad)} of {size} sweep cells are invalid, so none was run: " + "; ".join(reasons))


def check_against_data(runs: list[tuple[str, RunConfig]]) -> dict[str, str]:
    """The cells that cannot run here, and why, before any run: each distinct dataset read once (data that is
    missing or corrupt would otherwise fail every cell in turn), then each cell checked against its data, model
    and strategy as ``fedsim run`` checks it (:func:`fedsim.engines.runner.check_runnable`: a batch larger than
    the data, a normaliser or a strategy that does not fit the model), so a bad cell does not fail hours in."""
    from fedsim.data.base import data_source, read_dataset
    from fedsim.data.generated import GeneratedLoader
    from fedsim.engines.runner import check_runnable

    why: dict[str, str | None] = {}
    bad = {}
    for name, cfg in runs:
        d = cfg.data
        key = d.model_dump_json()
        if key not in why:
            try:
                if not isinstance(loader := resolve(cfg).loader, GeneratedLoader):  # nothing to read
                    read_dataset(loader, data_source(d.root, d.download, d.cache_dir), d.dataset.name)
                why[key] = None
            except FedsimError as err:
                why[key] = str(err)
        if (reason := why[key]) is None:
            try:
                check_runnable(resolve(cfg))
            except FedsimError as err:
                reason = str(err)
        if reason is not None:
            bad[name] = reason
    return bad


def _leaves(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` flattened to dotted keys, empty sections dropped (an empty mapping sets nothing)."""
    return {k: v for k, v in flatten(tree).items() if v != {}}


def state_of(cfg: RunConfig) -> str:
    """Where ``cfg``'s cell stands: ``"done"`` (finished with the same settings), ``"resume"`` (stopped
    after a checkpoint of the same settings), else ``"new"``.

    Raises if its directory holds a run of other settings (those that change what is learned), so a
    short-budget run is never taken for a full-budget cell, nor continued, nor overwritten; and if it holds
    a run without a readable config.yaml mapping, which shows no settings to compare: a damaged run directory,
    never taken for the cell's run (the user restores or deletes it).
    """
    run_dir = Path(cfg.output.run_dir or "")
    state = "done" if (run_dir / SUMMARY).exists() else "resume" if (run_dir / CHECKPOINT).exists() else "new"
    if state == "new":
        return state
    what = f"a finished run ({SUMMARY})" if state == "done" else f"an unfinished run ({CHECKPOINT})"
    try:
        raw = read_yaml(run_dir / CONFIG, "the run's config.yaml")
    except ConfigError as err:
        raise _damaged(run_dir, what, str(err)) from err
    if not isinstance(raw, dict):
        raise _damaged(run_dir, what, "its top level is not a mapping of sections")
    wanted = _leaves(cfg.model_dump(mode="json"))
    try:  # with today's defaults filled in, so options added since that run compare as their defaults
        saved = _leaves(RunConfig.model_validate(raw).model_dump(mode="json"))
        keys = wanted.keys() | saved.keys()
    except ValidationError:  # written by a fedsim with other options: compare what both have
        saved = _leaves(raw)
        keys = wanted.keys() & saved.keys()
    differ = [
        f"{k}: {json.dumps(saved.get(k))} there, {json.dumps(wanted.get(k))} here"
        for k in sorted(keys)
        if not k.startswith(NOT_LEARNING) and json.dumps(saved.get(k)) != json.dumps(wanted.get(k))
    ]
    if differ:
        raise ConfigError(
            f"{run_dir} holds {what} with other settings ({'; '.join(differ[:3])}"
            f"{'; ...' if len(differ) > 3 else ''}): give this sweep its own --output directory, "
            f"or delete that run directory to redo it"
        )
    return state


def _damaged(run_dir: Path, what: str, why: str) -> ConfigError:
    return ConfigError(
        f"{run_dir} holds {what} without a readable config.yaml ({why}), so nothing shows it is this cell's run: "
        "a damaged run directory; restore its config.yaml, or delete that directory to redo the cell"
    )
