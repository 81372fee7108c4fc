"""``fedsim report DIR``: a results table (Markdown + CSV) and an accuracy plot for a sweep.

Runs are grouped by every config value that differs between them except the seed; each group
reports mean ± sample std over its seeds of the final and best client-mean accuracy and the final
global accuracy, the first evaluated round reaching ``--target`` client-mean accuracy, the final and
best client-mean accuracy of the personalised models where the runs had ``eval.personal`` on, and the
final effective rank of the penultimate features where the runs recorded diagnostics.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.app.grouping import measure_spread, seed_groups, short_keys, varying_keys
from fedsim.app.plots import plot_accuracy, plot_final_vs
from fedsim.errors import FedsimError
from fedsim.files import write_file
from fedsim.record.layout import SUMMARY
from fedsim.record.paths import make_results_dir, run_dirs, runs_root
from fedsim.record.run import read_run


def load_runs(root: Path) -> list[dict[str, Any]]:
    """Every finished run (one with ``summary.json``) under the directory ``root``."""
    runs = [read_run(path) for path in run_dirs(runs_root(root, "DIR")) if (path / SUMMARY).exists()]
    if not runs:
        raise FedsimError(f"no finished runs (summary.json) under {root}")
    return runs


def unfinished(root: Path) -> list[Path]:
    """The run directories under ``root`` that the report leaves out, having no ``summary.json`` (running,
    stopped, failed): said, so that a seed missing from a mean is not missed."""
    return [path for path in run_dirs(Path(root)) if not (path / SUMMARY).exists()]


PERSONAL_SUMMARY = ("final_personal_acc", "best_personal_acc")  # summary.json's, with eval.personal on


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{100 * values[0]:.2f}"
    return f"{100 * np.mean(values):.2f} ± {100 * measure_spread(values):.2f}"


def rounds_to(metrics: list[dict[str, Any]], target: float) -> int | None:
    return next((m["round"] for m in metrics if (m.get("client_mean_acc") or 0) >= target), None)


def table(runs: list[dict[str, Any]], target: float) -> tuple[list[str], list[list[str]]]:
    keys = varying_keys(runs)
    columns = (
        "seeds", "rounds", "final client-mean acc %", "best client-mean acc %", "final global acc %",
        f"rounds to {100 * target:g}%", "feature erank",  # --target 0.505 is 50.5%, not 50%
    )  # fmt: skip
    personal_columns = ("final personal acc %", "best personal acc %")
    header = short_keys(keys, taken=columns + personal_columns) + list(columns[:-1])
    # eval.personal: the personalised models' client-mean, where any run recorded it (a run without: "-")
    with_personal = any("final_personal_acc" in r["summary"] for r in runs)
    if with_personal:
        header += personal_columns
    with_erank = any(m.get("feature_erank") is not None for r in runs for m in r["metrics"])
    if with_erank:
        header.append(columns[-1])
    rows = []
    for members in seed_groups(runs).values():
        values = [str(members[0]["config"].get(k)) for k in keys]
        s = [m["summary"] for m in members]
        reach = [rounds_to(m["metrics"], target) for m in members]
        reached = [x for x in reach if x is not None]
        rows.append([
            *values,
            str(len(members)),
            str(s[0]["rounds"]),
            _mean_std([x["final_client_mean_acc"] for x in s if x["final_client_mean_acc"] is not None]),
            _mean_std([x["best_client_mean_acc"] for x in s if x["best_client_mean_acc"] is not None]),
            _mean_std([x["final_global_acc"] for x in s if x["final_global_acc"] is not None]),
            f"{int(np.mean(reached))}" + ("" if len(reached) == len(reach) else f" ({len(reached)}/{len(reach)})")
            if reached else "-",
        ])
        if with_personal:
            rows[-1] += [_mean_std([x[k] for x in s if x.get(k) is not None]) for k in PERSONAL_SUMMARY]
        if with_erank:
            eranks = [m["metrics"][-1].get("feature_erank") for m in members]
            eranks = [e for e in eranks if e is not None]
            rows[-1].append(f"{np.mean(eranks):.1f}" if eranks else "-")
    return header, rows


def write_report(root: str | Path, target: float = 0.5, vs: str | None = None, out: str | Path | None = None) -> Path:
    """The report of the finished runs under ``root``, written into ``out`` (default ``root``); returns its
    ``results.md``."""
    runs = load_runs(Path(root))
    if vs is not None and not any(isinstance(r["config"].get(vs), int | float) for r in runs):
        raise FedsimError(f"--vs {vs}: no finished run has a numeric {vs}: name a config key the runs vary, "
                          "e.g. partition.beta")  # fmt: skip
    header, rows = table(runs, target)  # runs that may not be pooled (seed_groups) are refused before --out exists
    out = Path(root if out is None else out)
    vs_figure = [f"final_vs_{vs.split('.')[-1]}.png"] if vs is not None else []
    # before any file: a read-only or someone else's directory, a link where a file goes
    make_results_dir(out, "--out", ["results.csv", "results.md", "accuracy.png", *vs_figure])
    text = io.StringIO()
    csv.writer(text).writerows([header, *rows])
    write_file(out / "results.csv", text.getvalue().encode())
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    write_file(out / "results.md", ("\n".join(md) + "\n").encode())
    plot_accuracy(runs, out / "accuracy.png", over_seeds=True)
    if vs is not None:
        plot_final_vs(runs, vs, out / vs_figure[0])
    return out / "results.md"
