"""``fedsim report DIR``: a results table (Markdown + CSV) and an accuracy plot for a sweep.

Runs are grouped by every config value that differs between them except the seed; each group
reports mean +- std over its seeds of the final and best client-mean accuracy and the final
global accuracy, and the first evaluated round reaching ``--target`` client-mean accuracy.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedsim.errors import FedsimError


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


_IGNORED = ("name", "seed", "output.", "simulation.")


def load_runs(root: Path) -> list[dict[str, Any]]:
    runs = []
    for summary_path in sorted(root.rglob("summary.json")):
        run_dir = summary_path.parent
        config = _flatten(yaml.safe_load((run_dir / "config.yaml").read_text()))
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        runs.append({"dir": run_dir, "config": config, "summary": json.loads(summary_path.read_text()), "metrics": metrics})
    if not runs:
        raise FedsimError(f"no finished runs (summary.json) under {root}")
    return runs


def varying_keys(runs: list[dict[str, Any]]) -> list[str]:
    keys = sorted({k for r in runs for k in r["config"]})
    return [
        k for k in keys
        if not k.startswith(_IGNORED) and len({json.dumps(r["config"].get(k)) for r in runs}) > 1
    ]


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{100 * values[0]:.2f}"
    return f"{100 * np.mean(values):.2f} ± {100 * np.std(values):.2f}"


def rounds_to(metrics: list[dict[str, Any]], target: float) -> int | None:
    return next((m["round"] for m in metrics if (m.get("client_mean_acc") or 0) >= target), None)


def table(runs: list[dict[str, Any]], target: float) -> tuple[list[str], list[list[str]]]:
    keys = varying_keys(runs)
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(tuple(str(r["config"].get(k)) for k in keys), []).append(r)
    header = [k.split(".")[-1] if k != "model.norm" else "norm" for k in keys] + [
        "seeds", "rounds", "final client-mean acc %", "best client-mean acc %", "final global acc %",
        f"rounds to {100 * target:.0f}%",
    ]
    rows = []
    for values, members in groups.items():
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
    return header, rows


def plot_accuracy(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = varying_keys(runs)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        label = ", ".join(f"{k.split('.')[-1]}={r['config'].get(k)}" for k in keys) or r["dir"].name
        ax.plot([m["round"] for m in r["metrics"]], [100 * m["client_mean_acc"] for m in r["metrics"]], label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("client-mean accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(root: str | Path, target: float = 0.5) -> Path:
    root = Path(root)
    runs = load_runs(root)
    header, rows = table(runs, target)
    with open(root / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    (root / "results.md").write_text("\n".join(md) + "\n")
    plot_accuracy(runs, root / "accuracy.png")
    return root / "results.md"
