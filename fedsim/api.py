"""fedsim from Python: run a config, continue or open a run directory, run a sweep.

The command line is a thin layer over the same functions (``fedsim run`` is :func:`run`, ``fedsim sweep``
is :func:`run_sweep`), so every guarantee holds here too: the config is checked before anything starts, one
live run per run directory, and every failure fedsim foresees is a :class:`~fedsim.errors.FedsimError`
(its message is the CLI's one line). Nothing here installs a signal handler or leaves Ray running, so it
is safe in a Jupyter kernel: interrupting the kernel stops the run as Ctrl-C stops ``fedsim run``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.config import RunConfig, apply_overrides, load_config, parse_config
from fedsim.errors import FedsimError
from fedsim.rundir import read_run

if TYPE_CHECKING:
    import pandas as pd

ConfigLike = str | os.PathLike[str] | Mapping[str, Any] | RunConfig


@dataclass(frozen=True)
class Run:
    """A run directory read back: what ``fedsim run`` wrote there, read afresh at each access (a run that is
    still going shows its latest rounds)."""

    dir: Path

    @property
    def config(self) -> dict[str, Any]:
        """The run's config, flattened: ``{"train.rounds": 200, "model.norm.name": "ln", ...}``."""
        return read_run(self.dir)["config"]

    @property
    def summary(self) -> dict[str, Any] | None:
        """``summary.json``: final and best accuracies, rounds, time; ``None`` while the run is unfinished."""
        return read_run(self.dir)["summary"]

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def metrics(self) -> pd.DataFrame:
        """``metrics.jsonl`` as a DataFrame, one row per evaluated round, indexed by ``round``. Per-client
        and per-class lists stay lists in their cells."""
        import pandas as pd

        return pd.DataFrame.from_records(read_run(self.dir)["metrics"]).set_index("round", drop=False)


@dataclass(frozen=True)
class Sweep:
    """A sweep directory read back: its runs, finished or not."""

    dir: Path

    @property
    def runs(self) -> list[Run]:
        """Its run directories, as they are now."""
        return [Run(p.parent) for p in sorted(self.dir.rglob("config.yaml")) if p.parent != self.dir]

    def table(self, target: float = 0.5) -> pd.DataFrame:
        """``fedsim report``'s table of the finished runs: one row per setting, seeds pooled (mean ± std)."""
        import pandas as pd

        from fedsim.report import load_runs, table

        header, rows = table(load_runs(self.dir), target)
        return pd.DataFrame(rows, columns=header)


def make_config(source: ConfigLike, overrides: Sequence[str] = ()) -> RunConfig:
    """A validated :class:`RunConfig` from a YAML path, a mapping of sections or a ``RunConfig``, with
    ``overrides`` as ``fedsim run --set`` takes them (``"train.rounds=5"``, values read as YAML)."""
    if isinstance(source, RunConfig):
        source = source.model_dump(mode="json")
    if isinstance(source, Mapping):
        return parse_config(apply_overrides(copy.deepcopy(dict(source)), _as_list(overrides)))
    return load_config(source, _as_list(overrides))


def _as_list(overrides: Sequence[str]) -> list[str]:
    """``--set``'s list; one string alone would be read as a list of one-letter overrides."""
    if isinstance(overrides, str):
        raise FedsimError(f"overrides: give a list of key=value strings, e.g. [{overrides!r}], not one string")
    return list(overrides)


def run(source: ConfigLike, overrides: Sequence[str] = ()) -> Run:
    """Run one experiment to its end (``fedsim run``); returns its run directory read back."""
    from fedsim.runner import run as run_config

    return Run(Path(run_config(make_config(source, overrides))["run_dir"]))


def resume(run_dir: str | os.PathLike[str]) -> Run:
    """Continue an interrupted run from its last checkpoint (``fedsim run --resume``)."""
    from fedsim.runner import run as run_config
    from fedsim.server.checkpoint import resume_config

    return Run(Path(run_config(resume_config(run_dir), resume=True)["run_dir"]))


def open_run(run_dir: str | os.PathLike[str]) -> Run:
    """An existing run directory (finished or not); an error if it is not one."""
    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        raise FedsimError(f"{path}: not a run directory (no config.yaml)")
    return Run(path)


def run_sweep(
    path: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    parallel: int | None = None,
    output: str | os.PathLike[str] | None = None,
    log: Callable[[str], Any] = print,
) -> Sweep:
    """Run every unfinished cell of a sweep file (``fedsim sweep``); returns the sweep directory read back."""
    from fedsim import sweep

    return Sweep(Path(sweep.run_sweep(path, parallel, log=log, overrides=_as_list(overrides), output=output)))


def open_sweep(sweep_dir: str | os.PathLike[str]) -> Sweep:
    """An existing sweep directory (or any directory holding run directories)."""
    path = Path(sweep_dir)
    if not path.is_dir():
        raise FedsimError(f"{path}: not a directory")
    return Sweep(path)


__all__ = ["Run", "Sweep", "make_config", "open_run", "open_sweep", "resume", "run", "run_sweep"]
