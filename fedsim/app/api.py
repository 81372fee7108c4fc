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
from typing import TYPE_CHECKING, Any, TypeGuard

from fedsim.config import RunConfig
from fedsim.config_file import apply_overrides, check_keys_once, load_config, parse_config
from fedsim.environment import check_working_directory
from fedsim.errors import ConfigError, brief
from fedsim.record.layout import CONFIG
from fedsim.record.paths import run_dirs
from fedsim.record.run import read_run

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

        records = read_run(self.dir)["metrics"]  # none before the run's first evaluation: no rows, the same index
        return pd.DataFrame.from_records(records, columns=None if records else ["round"]).set_index("round", drop=False)


@dataclass(frozen=True)
class Sweep:
    """A sweep directory read back: its runs, finished or not."""

    dir: Path

    @property
    def runs(self) -> list[Run]:
        """Its run directories, as they are now: those ``fedsim report`` reads
        (:func:`fedsim.record.paths.run_dirs`)."""
        return [Run(path) for path in run_dirs(self.dir)]

    def table(self, target: float = 0.5) -> pd.DataFrame:
        """``fedsim report``'s table of the finished runs: one row per setting, seeds pooled (mean ± sample std)."""
        import pandas as pd

        from fedsim.app.report import load_runs, table

        header, rows = table(load_runs(self.dir), target)
        return pd.DataFrame(rows, columns=header)


# Each public function checks its arguments' types first: a wrong one is a ConfigError naming the argument and
# what it takes, as a bad config value is, never a TypeError or AttributeError from deep inside.


def _got(value: object) -> str:
    return f"{type(value).__name__} {brief(value)}"


def _is_path(value: object) -> TypeGuard[str | os.PathLike[str]]:
    """A path as text (str or os.PathLike of str): bytes paths are not, as config paths are text."""
    return isinstance(value, str | os.PathLike) and isinstance(os.fspath(value), str)


def _path(value: object, argument: str, or_none: bool = False) -> Path:
    if _is_path(value):
        return Path(value)
    raise ConfigError(f"{argument}: give a path (str or os.PathLike){' or None' * or_none}, not {_got(value)}")


def _as_list(overrides: object) -> list[str]:
    """``--set``'s list of ``key=value`` strings (one string alone would be read as a list of one-letter
    overrides)."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides: give a list of key=value strings, e.g. [{overrides!r}], not one string")
    if isinstance(overrides, list | tuple) and all(isinstance(item, str) for item in overrides):
        check_keys_once(list(overrides))
        return list(overrides)
    raise ConfigError(f"overrides: give a list of key=value strings, e.g. ['train.rounds=5'], not {_got(overrides)}")


def make_config(source: ConfigLike, overrides: Sequence[str] = ()) -> RunConfig:
    """A validated :class:`RunConfig` from a YAML path, a mapping of sections or a ``RunConfig``, with
    ``overrides`` as ``fedsim run --set`` takes them (``"train.rounds=5"``, values read as YAML)."""
    check_working_directory()  # relative paths are read from it
    items = _as_list(overrides)
    if isinstance(source, RunConfig):
        source = source.model_dump(mode="json")
    if isinstance(source, Mapping):
        return parse_config(apply_overrides(copy.deepcopy(dict(source)), items))
    if not _is_path(source):
        raise ConfigError(
            f"source: give a YAML path (str or os.PathLike), a mapping of sections or a RunConfig, not {_got(source)}"
        )
    return load_config(source, items)


def run(source: ConfigLike, overrides: Sequence[str] = ()) -> Run:
    """Run one experiment to its end (``fedsim run``); returns its run directory read back."""
    from fedsim.engines.runner import run as run_config

    return Run(Path(run_config(make_config(source, overrides))["run_dir"]))


def resume(run_dir: str | os.PathLike[str]) -> Run:
    """Continue an interrupted run from its last checkpoint (``fedsim run --resume``)."""
    from fedsim.engines.runner import run as run_config
    from fedsim.record.checkpoint import resume_config

    check_working_directory()  # relative paths are read from it
    path = _path(run_dir, "run_dir")
    return Run(Path(run_config(resume_config(path), resume=True)["run_dir"]))


def open_run(run_dir: str | os.PathLike[str]) -> Run:
    """An existing run directory (finished or not); an error if it is not one."""
    path = _path(run_dir, "run_dir")
    if not (path / CONFIG).is_file():
        raise ConfigError(f"{path}: not a run directory (no config.yaml)")
    return Run(path)


def run_sweep(
    path: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    parallel: int | None = None,
    output: str | os.PathLike[str] | None = None,
    log: Callable[[str], Any] = print,
) -> Sweep:
    """Run every unfinished cell of a sweep file (``fedsim sweep``); returns the sweep directory read back."""
    from fedsim.sweep.execute import run_sweep as run_sweep_file

    file, items = _path(path, "path"), _as_list(overrides)
    out = None if output is None else _path(output, "output", or_none=True)
    if parallel is not None and type(parallel) is not int:  # its range: fedsim.sweep.execute.run_sweep
        raise ConfigError(f"parallel: give a whole number of runs at once or None (the file's), not {_got(parallel)}")
    if not callable(log):
        raise ConfigError(f"log: give a function of one str (print, a logger's info), not {_got(log)}")
    return Sweep(Path(run_sweep_file(file, parallel, log=log, overrides=items, output=out)))


def open_sweep(sweep_dir: str | os.PathLike[str]) -> Sweep:
    """An existing sweep directory (or any directory holding run directories)."""
    path = _path(sweep_dir, "sweep_dir")
    if not path.is_dir():
        raise ConfigError(f"{path}: not a directory")
    return Sweep(path)


__all__ = ["Run", "Sweep", "make_config", "open_run", "open_sweep", "resume", "run", "run_sweep"]
