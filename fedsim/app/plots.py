"""``fedsim plot RUN_DIR ...``: the figures a researcher would otherwise script by hand.

One function per figure, each taking runs as :func:`fedsim.record.run.read_run` returns them, so
``fedsim report`` and ``fedsim plot`` draw the same picture the same way:

- :func:`plot_accuracy`: accuracy against rounds, several runs on one axis;
- :func:`plot_label_distribution`: each client's training samples per class, from
  ``partition.csv`` (LN-FL Fig. 8 style: a dot per (client, class), area ∝ count);
- :func:`plot_feature_spectrum`: the singular values of the penultimate features and their
  effective rank over rounds (LN-FL Fig. 3 style), from the ``diagnostics: {features: true}``
  keys of ``metrics.jsonl``;
- :func:`plot_local`: a client trained alone from a finished run (``fedsim local``, LN-FL
  Figs. 2-3): accuracy on its own and on the other classes, feature norm and effective rank,
  against local steps.

Figures are built with matplotlib's object API (``Figure``, no ``pyplot``): no global backend
switch and no figure registry to leak from a long-lived process.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.app.grouping import measure_spread, seed_groups, short_keys, varying_keys
from fedsim.app.local import read_request
from fedsim.errors import ConfigError, FedsimError
from fedsim.files import write_file
from fedsim.record.layout import LOCAL_JSON
from fedsim.record.paths import directories_under, make_results_dir, resolved, run_dirs, runs_root
from fedsim.record.reader import read_metrics
from fedsim.record.run import read_run

ACCURACY, LABELS, SPECTRUM = "accuracy.png", "label_distribution.png", "feature_spectrum.png"
REFERENCE_PT = 7  # the font size of a reference's name
SPECTRUM_FLOOR = 1e-12  # the lowest σ_k / σ_1 the spectrum panel shows
LOCAL = "local.png"
_DPI = 120


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig: Any, path: Path) -> None:
    """``fig`` written to ``path`` whole (:func:`fedsim.files.write_file`: never through a link), in the format
    its suffix names."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=_DPI, format=path.suffix.removeprefix(".") or "png")
    write_file(path, buffer.getbuffer())


def _rounds_axis(ax: Any, log_rounds: bool = False) -> None:
    """Rounds on x: integer ticks, or a log scale (a 10,000-round run's first hundred rounds stay visible)."""
    from matplotlib.ticker import MaxNLocator

    if log_rounds:
        ax.set_xscale("log")
        ax.set_xlabel("round (log scale)")
        return
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")


def parse_references(pairs: list[str]) -> dict[str, float]:
    """``--reference NAME=PERCENT`` values as {name: accuracy in %}, e.g. ``"LN-FL FedLN=78.04"``."""
    references: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.rpartition("=")
        try:
            percent = float(value)
        except ValueError:
            percent = float("nan")
        if not sep or not name.strip() or not name.isprintable() or not 0 <= percent <= 100:  # NaN fails too
            raise ConfigError(f"--reference {pair!r}: give NAME=PERCENT, a name and an accuracy in [0, 100]")
        if name in references:
            raise ConfigError(f"--reference {pair!r}: {name!r} is given twice")
        references[name] = percent
    return references


def _mark_references(ax: Any, references: Mapping[str, float]) -> None:
    """A dotted horizontal line per reference accuracy (in %), named just above it: at the right end of the axes,
    or at the left end where that name would overlap the one above it (close references, e.g. 78.04 and 77.52)."""
    low, high = ax.get_ylim()
    height = (REFERENCE_PT * ax.figure.dpi / 72 + 4) / ax.get_window_extent().height * (high - low)  # a name's
    lowest = {1.0: float("inf"), 0.0: float("inf")}  # per end of the axes: the lowest name placed there so far
    for name, value in sorted(references.items(), key=lambda item: -item[1]):
        ax.axhline(value, color="0.35", linestyle=":", linewidth=1)
        end = next((x for x in (1.0, 0.0) if value + height <= lowest[x]), 1.0)
        lowest[end] = value
        ax.annotate(f"{name}: {value:g}", (end, value), xycoords=("axes fraction", "data"),
                    xytext=(-3 if end else 3, 2), textcoords="offset points", ha="right" if end else "left",
                    va="bottom", fontsize=REFERENCE_PT, color="0.25")  # fmt: skip


def run_labels(runs: list[dict[str, Any]]) -> list[str]:
    """A legend label per run: the config values that differ between the runs (those it has), else the directory
    name."""
    if len(runs) > 1:
        keys = varying_keys(runs)
        for extra in ([], ["seed"]):
            names = list(zip(short_keys(keys + extra), keys + extra, strict=True))
            # a key a run does not have (another strategy's option) is left out of its label
            labels = [", ".join(f"{name}={v}" for name, k in names if (v := r["config"].get(k)) is not None)
                      for r in runs]  # fmt: skip
            if all(labels) and len(set(labels)) == len(labels):
                return labels
    return [r["dir"].name for r in runs]


def _series(run: dict[str, Any], key: str) -> list[tuple[int, float]]:
    """(round, 100 · value) for the metrics lines that have ``key``."""
    return [(m["round"], 100 * m[key]) for m in run["metrics"] if m.get(key) is not None]


def plot_accuracy(
    runs: list[dict[str, Any]],
    path: Path,
    with_global: bool = False,
    over_seeds: bool = False,
    log_rounds: bool = False,
    references: Mapping[str, float] | None = None,
) -> list[str]:
    """Client-mean accuracy (solid), ``with_global`` global-model accuracy (dashed) and, where runs have it, the
    personalised models' client-mean accuracy (``eval.personal``, dotted) per round; returns a note
    per run or group left out of the figure, saying why (a run not evaluated yet).

    ``over_seeds``: one line per group of runs that differ only in their seed (:func:`seed_groups`),
    the mean over the seeds that have evaluations (their count in the legend), shaded ± one sample standard deviation,
    at the rounds every one of them evaluated. ``log_rounds``: rounds on a log scale; ``references``: accuracies
    (%) to mark, e.g. a paper's.
    """
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    if over_seeds:
        groups = seed_groups(runs)
    else:
        groups = {label: [run] for run, label in zip(runs, run_labels(runs), strict=True)}
    notes: list[str] = []
    drew_global = with_personal = False  # the title names the dashed and dotted lines only where there are some
    for label, members in groups.items():
        # a seed not evaluated yet (a sweep under way) is left out and said: intersected with it, the group's
        # rounds were none, and the finished seeds vanished from the figure without a word
        drawn: list[dict[str, Any]] = []
        pending: list[dict[str, Any]] = []
        for run in members:
            (drawn if any(m.get("client_mean_acc") is not None for m in run["metrics"]) else pending).append(run)
        rest = f"; its config's line is the mean over the other {_seeds(len(drawn))}" if drawn else ""
        notes += [f"{run['dir']} in {path.name}: no client-mean accuracy evaluated yet{rest if over_seeds else ''}"
                  for run in pending]  # fmt: skip
        if not drawn:
            continue
        rounds, mean, std = mean_and_std(drawn, "client_mean_acc")
        if not rounds:  # evaluations lost from a file (LostEvaluations) can leave the seeds no round in common
            notes.append(f"{label} in {path.name}: its {_seeds(len(drawn))} have no evaluated round in common")
            continue
        (line,) = ax.plot(rounds, mean, label=label + (f" ({_seeds(len(drawn))})" if over_seeds else ""))
        if len(drawn) > 1:
            ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        glob_rounds, glob, _ = mean_and_std(drawn, "global_acc")
        if with_global and glob_rounds:
            ax.plot(glob_rounds, glob, color=line.get_color(), linestyle="--", linewidth=1)
            drew_global = True
        personal_rounds, personal, _ = mean_and_std(drawn, "personal_acc")
        if personal_rounds:  # eval.personal on: the personalised models' client-mean, dotted
            ax.plot(personal_rounds, personal, color=line.get_color(), linestyle=":", linewidth=1.2)
            with_personal = True
    _mark_references(ax, references or {})
    _rounds_axis(ax, log_rounds)
    ax.set_ylabel("accuracy (%)")
    title = "client-mean accuracy" + (" (solid)" if drew_global or with_personal else "")
    title += ", global-model accuracy (dashed)" if drew_global else ""
    title += ", personalised client-mean (dotted)" if with_personal else ""
    ax.set_title(title + (", mean ± sample std over seeds" if over_seeds else ""), fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # none when no run is evaluated yet (said in the notes), not a warning
        ax.legend(fontsize=7, loc="best")
    _save(fig, path)
    return notes


def _seeds(count: int) -> str:
    return f"{count} seed{'s' if count != 1 else ''}"


def mean_and_std(members: list[dict[str, Any]], key: str) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Rounds every member has ``key`` at, and the mean and sample std (as the report's) of 100 · value."""
    series = [dict(_series(run, key)) for run in members]
    rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
    values = np.array([[s[r] for r in rounds] for s in series], dtype=float).reshape(len(series), len(rounds))
    return rounds, values.mean(axis=0), measure_spread(values)


def plot_final_vs(runs: list[dict[str, Any]], key: str, path: Path) -> int:
    """Final client-mean accuracy against the config value ``key`` (e.g. ``partition.beta``), one line
    per combination of the other varying keys, mean ± sample std over seeds; returns the line count."""
    others = [k for k in varying_keys(runs) if k != key]
    names = list(zip(short_keys(others), others, strict=True))
    lines: dict[str, dict[float, list[float]]] = {}
    for run in runs:
        x, acc = run["config"].get(key), run["summary"].get("final_client_mean_acc")
        if not isinstance(x, int | float) or acc is None:
            continue
        label = ", ".join(f"{name}={run['config'].get(k)}" for name, k in names) or "runs"
        lines.setdefault(label, {}).setdefault(float(x), []).append(100 * acc)
    if not lines:
        raise FedsimError(f"no finished run has a numeric {key}: name a config key the runs vary, e.g. partition.beta")
    fig = _figure(6, 4.2)
    ax = fig.add_subplot()
    for label, points in sorted(lines.items()):
        xs = sorted(points)
        ax.errorbar(xs, [np.mean(points[x]) for x in xs], yerr=[measure_spread(points[x]) for x in xs], marker="o",
                    capsize=3, label=label)  # fmt: skip
    xs = [x for points in lines.values() for x in points]
    if min(xs) > 0 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    ax.set_xlabel(key)
    ax.set_ylabel("final client-mean accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    _save(fig, path)
    return len(lines)


def plot_label_distribution(runs: list[dict[str, Any]], path: Path) -> int:
    """Training samples per client and class, one panel per distinct partition; returns the panel count."""
    panels: dict[bytes, tuple[list[str], np.ndarray, list[str]]] = {}
    for run, label in zip(runs, run_labels(runs), strict=True):
        if run["partition"] is None:
            continue
        classes, counts = run["partition"]
        train = counts["train"]
        key = "\n".join(classes).encode() + train.tobytes()
        panels.setdefault(key, (classes, train, []))[2].append(label)
    if not panels:
        return 0
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig = _figure(max(4.5, min(0.45 * max(len(p[1]) for p in panels.values()) + 2, 9)) * cols, 4.2 * rows)
    for i, (classes, train, labels) in enumerate(panels.values()):
        ax = fig.add_subplot(rows, cols, i + 1)
        num_clients, num_classes = train.shape
        client, cls = np.nonzero(train)
        # Dot area ∝ count, the largest cell about one grid cell wide whatever the client count.
        biggest = min(900.0, 18000.0 / max(num_clients, num_classes))
        ax.scatter(client, cls, s=biggest * train[client, cls] / train.max(), c=cls, cmap="tab10",
                   vmin=0, vmax=max(9, num_classes - 1), alpha=0.8, edgecolors="none")
        ax.set_xlim(-0.7, num_clients - 0.3)
        ax.set_ylim(-0.7, num_classes - 0.3)
        ax.set_yticks(range(num_classes), [c[:10] for c in classes], fontsize=7)
        step = max(1, num_clients // 20)
        ax.set_xticks(range(0, num_clients, step))
        ax.set_xlabel("client")
        ax.set_ylabel("class")
        ax.grid(alpha=0.25)
        title = "; ".join(labels[:2]) + (f" (+{len(labels) - 2})" if len(labels) > 2 else "")
        ax.set_title(f"{title}\n{int(train.sum())} training samples, largest cell {int(train.max())}", fontsize=8)
    fig.suptitle("training samples per client and class (dot area ∝ count)", fontsize=10)
    _save(fig, path)
    return len(panels)


def _spectra(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in run["metrics"] if m.get("feature_sv")]


def plot_feature_spectrum(runs: list[dict[str, Any]], path: Path, log_rounds: bool = False) -> int:
    """σ_k/σ_1 of the penultimate features (first and last evaluation) and effective rank per round.

    Returns how many runs had the diagnostics (``diagnostics: {features: true}``); nothing is
    written when none had.
    """
    found = [(r, label) for r, label in zip(runs, run_labels(runs), strict=True) if _spectra(r)]
    if not found:
        return 0
    fig = _figure(11, 4.5)
    spec, erank = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for run, label in found:
        lines = _spectra(run)
        first, last = lines[0], lines[-1]
        sv = np.asarray(last["feature_sv"], dtype=float)
        (line,) = spec.semilogy(np.arange(1, len(sv) + 1), sv / sv[0])
        if first is not last:
            sv0 = np.asarray(first["feature_sv"], dtype=float)
            spec.semilogy(np.arange(1, len(sv0) + 1), sv0 / sv0[0], color=line.get_color(), linestyle=":", linewidth=1)
        pts = [(m["round"], m["feature_erank"]) for m in lines if m.get("feature_erank") is not None]
        erank.plot(*zip(*pts, strict=True), marker="o", markersize=3, color=line.get_color(), label=label)
    spec.set_xlabel("index k")
    spec.set_ylabel("σ_k / σ_1")
    spec.set_title("singular values of the penultimate features (probe batch):\neach run's last evaluation (solid) "
                   "and its first (dotted)", fontsize=9)  # fmt: skip
    spec.set_ylim(max(spec.get_ylim()[0], SPECTRUM_FLOOR), 2)  # σ_k / σ_1 <= 1; a collapsed model's 1e-200s hid all
    spec.grid(alpha=0.3, which="both")
    _rounds_axis(erank, log_rounds)
    erank.set_ylabel("effective rank exp H(σ/Σσ)")
    erank.set_title("effective rank (Roy & Vetterli 2007)", fontsize=9)
    erank.grid(alpha=0.3)
    # one legend under both panels: several runs' long labels inside an axes hid the lines, and beside it
    # stretched the figure until the panels were slivers
    fig.legend(*erank.get_legend_handles_labels(), loc="outside lower center", fontsize=7)
    _save(fig, path)
    return len(found)


def plot_local(continuations: list[Path], path: Path) -> None:
    """``fedsim local`` continuations against local steps: own-class (solid) and other-class (dashed)
    accuracy, mean feature norm ‖g_θ(x)‖ and effective rank of the features (LN-FL Figs. 2-3)."""
    fig = _figure(14, 4.2)
    acc, norm, erank = (fig.add_subplot(1, 3, i) for i in (1, 2, 3))
    several_runs = len({local.parent for local in continuations}) > 1
    for local in continuations:
        request = read_request(local)
        lines = read_metrics(local, index="step", last=request["steps"])
        label = f"client {request['client']} (classes {request['classes']})"
        label += "".join(f", {o}" for o in request.get("overrides", []))
        label = f"{local.parent.name}: {label}" if several_runs else label
        steps = [m["step"] for m in lines]
        (line,) = acc.plot(steps, [_percent(m["own_class_acc"]) for m in lines], marker="o", markersize=3,
                           label=f"{label}, own classes")  # fmt: skip
        acc.plot(steps, [_percent(m["other_class_acc"]) for m in lines], marker="o", markersize=3, linestyle="--",
                 color=line.get_color(), label="other classes")  # fmt: skip
        norm.semilogy(steps, [m.get("feature_norm_mean") or np.nan for m in lines], color=line.get_color())
        erank.plot(steps, [m.get("feature_erank") or np.nan for m in lines], color=line.get_color())
    for ax, ylabel, title in (
        (acc, "test accuracy (%)", "accuracy on the client's own classes (solid) and the others (dashed)"),
        (norm, "mean ‖g_θ(x)‖", "feature norm (probe batch)"),
        (erank, "effective rank exp H(σ/Σσ)", "effective rank of the features (probe batch)"),
    ):
        ax.set_xlabel("local step")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    acc.legend(fontsize=7, loc="best")
    _save(fig, path)


def _percent(value: float | None) -> float:
    return np.nan if value is None else 100 * value


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories (:func:`fedsim.record.paths.run_dirs`) of each path, each once."""
    return _once_each([run for p in _directories(paths) for run in run_dirs(p)])


def find_continuations(paths: list[str | Path]) -> list[Path]:
    """``fedsim local`` output directories (``local.json``): each path itself, or any below it
    (:func:`fedsim.record.paths.directories_under`)."""
    return _once_each([d for p in _directories(paths) for d in directories_under(p) if (d / LOCAL_JSON).is_file()])


def _once_each(found: list[Path]) -> list[Path]:
    """Each directory once, as first named: one given twice (``rd /abs/rd``, a symlink, a sweep and a run in
    it) was drawn twice, or refused by --mean-over-seeds as two copies of one seed to move apart."""
    first: dict[Path, Path] = {}
    for path in found:
        first.setdefault(resolved(path, "RUN_DIR"), path)
    return list(first.values())


def _directories(paths: list[str | Path]) -> list[Path]:
    return [runs_root(p, "RUN_DIR") for p in paths]


def write_plots(
    paths: list[str | Path],
    out: str | Path,
    over_seeds: bool = False,
    log_rounds: bool = False,
    references: Mapping[str, float] | None = None,
) -> tuple[list[Path], list[str]]:
    """Write every figure the runs have data for into ``out``; returns (files written, notes on skipped ones).

    ``over_seeds``: the accuracy plot draws runs that differ only in their seed as one mean line with a
    ± sample std band. ``log_rounds``: rounds on a log scale (accuracy, effective rank); ``references``:
    accuracies (%) marked on the accuracy plot."""
    runs = [read_run(p) for p in find_runs(paths)]
    continuations = find_continuations(paths)
    if not runs and not continuations:
        raise FedsimError(
            f"no run directories (config.yaml) or fedsim local results (local.json) in {', '.join(map(str, paths))}"
        )
    for local in continuations:  # a damaged file stops before any figure is written, not half-way
        read_request(local)
    if over_seeds:
        seed_groups(runs)  # runs that may not be pooled are refused before --out exists
    out = Path(out)
    make_results_dir(out, "--out", [ACCURACY, LABELS, SPECTRUM, LOCAL])
    written: list[Path] = []
    notes: list[str] = []
    if runs:
        notes += plot_accuracy(runs, out / ACCURACY, True, over_seeds, log_rounds, references)
        written.append(out / ACCURACY)
        if plot_label_distribution(runs, out / LABELS):
            written.append(out / LABELS)
        else:
            notes.append(f"{LABELS}: no partition.csv in these runs")
        if plot_feature_spectrum(runs, out / SPECTRUM, log_rounds):
            written.append(out / SPECTRUM)
        else:
            notes.append(f"{SPECTRUM}: no feature diagnostics in these runs (set diagnostics.features: true)")
    if continuations:
        plot_local(continuations, out / LOCAL)
        written.append(out / LOCAL)
    return written, notes
