"""What a person watching a run sees: the partition table at start, a progress bar, a final table."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from fedsim.experiment.federation import AnyFederation
from fedsim.record.manifest import CHECKS

console = Console(stderr=True)


def partition_table(train_counts: np.ndarray, test_counts: np.ndarray, classes: list[str], limit: int = 20) -> Table:
    """Clients x classes train counts (first ``limit`` clients), with train / test totals."""
    table = Table(title="partition (train samples per class)", show_edge=False, pad_edge=False)
    table.add_column("client", justify="right")
    for name in classes[:20]:
        table.add_column(name[:6], justify="right")
    table.add_column("train", justify="right", style="bold")
    table.add_column("test", justify="right")
    for cid in range(min(limit, len(train_counts))):
        row = train_counts[cid]
        cells = [str(int(v)) if v else "." for v in row[:20]]
        table.add_row(str(cid), *cells, str(int(row.sum())), str(int(test_counts[cid].sum())))
    if len(train_counts) > limit:
        table.caption = f"... {len(train_counts) - limit} more clients in partition.csv"
    return table


def show_partition(fed: AnyFederation) -> None:
    """The partition table and the partitioner's note; for a dataset generated per client, what it is instead."""
    if fed.counts is None:
        console.print(f"{fed.name}: each client's samples generated from the dataset's seed and the client's id")
        return
    console.print(partition_table(*fed.counts, fed.classes))
    if fed.note:
        console.print(f"[yellow]note:[/] {fed.note}")


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title="fedsim run summary", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if key in CHECKS:
            continue
        if isinstance(value, float):
            value = f"{value:.4f}"
        if not isinstance(value, (list, dict)):
            table.add_row(key, str(value))
    return table


class RoundProgress:
    """A rich progress bar over rounds, showing the latest loss and accuracy; silent if disabled."""

    def __init__(self, num_rounds: int, enabled: bool) -> None:
        self._progress = None
        if enabled:
            self._progress = Progress(
                TextColumn("[bold]round"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("loss {task.fields[loss]}  client-mean acc {task.fields[acc]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console,
            )
            self._task = self._progress.add_task("rounds", total=num_rounds, loss="-", acc="-")
            self._progress.start()

    def update(self, server_round: int, loss: float | None, acc: float | None) -> None:
        if self._progress is None:
            return
        fields: dict[str, str] = {}
        if loss is not None:
            fields["loss"] = f"{loss:.4f}"
        if acc is not None:
            fields["acc"] = f"{acc:.4f}"
        self._progress.update(self._task, completed=server_round, **fields)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
