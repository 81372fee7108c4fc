"""What a run reports: one ``metrics.jsonl`` line per evaluation round, the progress bar, the summary.

The round loop hands the reporter each round's facts as arguments (the aggregated training loss,
every client's test counts, the partitions left out); the reporter adds the global model's
evaluation and the diagnostics, and writes.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from fedsim.arrays import load_arrays
from fedsim.cadence import personalises
from fedsim.errors import FedsimWarning, TrainingError
from fedsim.experiment.diagnostics import ProbeDiagnostics
from fedsim.experiment.resolve import Experiment
from fedsim.models.evaluation import evaluate
from fedsim.record.reader import final_accuracies
from fedsim.record.writer import RunDir
from fedsim.server.console import RoundProgress
from fedsim.server.replies import evaluation_divergence

SHOWN_ROUNDS = 5  # rounds named in the warning on clients left out; the rest are counted


class ClientsLeftOut(FedsimWarning):
    """A run under ``train.on_client_failure: skip`` finished without some clients in some rounds."""


def resident_mb() -> float:
    """This process's resident memory now (Linux), to see growth over rounds in metrics.jsonl."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


@dataclass(frozen=True)
class ClientScore:
    """One client's evaluation reply: its test samples, how many it got right, its summed loss, and how many its
    personalised model got right (``eval.personal``; None: off)."""

    num_examples: int
    correct: int
    loss: float
    personal_correct: int | None = None


def _mean(accuracies: dict[int, float | None]) -> float | None:
    """The unweighted mean over the clients that have an accuracy (the client-mean accuracy of docs/algorithms.md)."""
    valid = [a for a in accuracies.values() if a is not None]
    return float(np.mean(valid)) if valid else None


class GlobalEvaluator:
    """The global model on the whole test set: accuracy, loss and per-class accuracy."""

    def __init__(self, experiment: Experiment) -> None:
        fed = experiment.federation()
        ds = fed.dataset
        self.model = experiment.build_model()
        self.x, self.y, self.num_classes = ds.x_test, ds.y_test, ds.num_classes
        self.batch_size = experiment.config.eval.batch_size
        self.to_inputs = fed.input_transform(experiment.config.data.normalize)  # the clients' inputs, exactly

    def __call__(self, arrays: ArrayRecord) -> dict[str, Any]:
        load_arrays(self.model, arrays)
        loss, correct, totals = evaluate(self.model, self.x, self.y, self.batch_size, self.num_classes, self.to_inputs)
        per_class = (correct.double() / totals.clamp(min=1).double()).tolist()
        return {
            "global_acc": float(correct.sum()) / len(self.y),
            "global_loss": loss / len(self.y),
            "per_class_acc": per_class,
        }


class RoundReporter:
    """Writes the metrics lines and moves the progress bar; holds the failures not yet written."""

    def __init__(self, experiment: Experiment, out: RunDir, show: bool) -> None:
        cfg = experiment.config
        self.cfg, self.out = cfg, out
        self.global_eval = GlobalEvaluator(experiment) if cfg.eval.global_test else None
        self.diagnostics = ProbeDiagnostics.from_experiment(experiment)  # None unless `diagnostics:` asks
        self.progress = RoundProgress(cfg.train.rounds, show)
        self.t0 = time.perf_counter()
        self.round_ends: list[float] = []  # after aggregation, before evaluation: steady round cost
        self.pending_failures: dict[int, list[int]] = {}  # round -> partitions left out, for the next line
        self.last: dict[str, Any] = {}

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0

    def seconds_per_round(self) -> float | None:
        """Mean round time after the first (which pays for imports and caches), evaluation excluded."""
        ends = self.round_ends
        return (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else None

    def start(self, arrays: ArrayRecord) -> None:
        """Round 0: the initial model's diagnostics, for the first metrics line."""
        if self.diagnostics is not None:
            self.diagnostics.at_init(arrays, self.cfg.seed)

    def resume(self, elapsed_s: float, metrics: list[dict[str, Any]], failed: dict[int, list[int]],
               done: int, initial: ArrayRecord) -> None:  # fmt: skip
        """Go on from a checkpoint: its clock, its last metrics line, failures not yet written, the bar."""
        self.t0 = time.perf_counter() - elapsed_s
        self.pending_failures.update(failed)
        self.last = metrics[-1] if metrics else {}
        if not metrics:  # the first line, still to come, carries the initial model's diagnostics
            self.start(initial)
        self._progressed(done, self.last.get("train_loss"), self.last.get("client_mean_acc"))

    def left_out(self, server_round: int, partitions: list[int]) -> None:
        """Partitions left out of a round (``on_client_failure: skip``), listed in the next metrics line."""
        self.pending_failures[server_round] = sorted(set(self.pending_failures.get(server_round, [])) | set(partitions))

    def trained(self) -> None:
        """A round's aggregation is done (its time, without evaluation, is the steady round cost)."""
        self.round_ends.append(time.perf_counter())

    def round_done(
        self, server_round: int, arrays: ArrayRecord, loss: float | None, scores: dict[int, ClientScore | None] | None
    ) -> None:
        """After the round's training (``loss``: the aggregated training loss) and, on evaluation rounds,
        ``scores``: each scored client's evaluation (None: it failed)."""
        if scores is None:
            self._progressed(server_round, loss, None)
            return
        client_acc = self._client_accuracies(scores, "correct")
        record: dict[str, Any] = {
            "round": server_round,
            "time_s": round(self.elapsed_s(), 3),
            "train_loss": loss,
            "client_mean_acc": _mean(client_acc),
        }
        client_personal_acc = None
        if personalises(self.cfg, server_round):
            client_personal_acc = self._client_accuracies(scores, "personal_correct")
            record["personal_acc"] = _mean(client_personal_acc)
        if self.global_eval is not None:
            record.update(self.global_eval(arrays))
        client_losses = {pid: score.loss for pid, score in scores.items() if score is not None}
        if why := evaluation_divergence(client_losses, record.get("global_loss"), arrays):  # before any line
            raise TrainingError(f"training diverged in round {server_round}: {why}")
        if self.diagnostics is not None:
            record.update(self.diagnostics(arrays))
        if self.cfg.eval.clients is not None:  # a sample: which clients client_acc lists
            record["eval_clients"] = list(client_acc)
        record["client_acc"] = list(client_acc.values())  # None: no test data, or the client failed
        if client_personal_acc is not None:
            record["client_personal_acc"] = list(client_personal_acc.values())
        if self.pending_failures:  # on_client_failure: skip, since the last line
            record["failed_clients"] = {str(r): pids for r, pids in sorted(self.pending_failures.items())}
            self.pending_failures.clear()
        record["rss_mb"] = resident_mb()
        self.out.append_metrics(record)
        self.last = record
        self._progressed(server_round, loss, record["client_mean_acc"])

    def _client_accuracies(self, scores: dict[int, ClientScore | None], field: str) -> dict[int, float | None]:
        """Each scored partition's accuracy from its score's ``field`` (correct counts), in partition order; None: no
        test data, or the client failed."""
        return {
            pid: getattr(score, field) / score.num_examples if score is not None and score.num_examples else None
            for pid, score in sorted(scores.items())
        }

    def _progressed(self, server_round: int, loss: float | None, acc: float | None) -> None:
        self.progress.update(server_round, loss, acc)
        self.out.write_progress(server_round, loss, acc)

    def say_left_out(self) -> None:
        """Once, at the end of a run: which rounds went on without which clients (``failed_clients`` in the
        metrics lines, a resumed run's earlier lines included)."""
        rounds = [(r, pids) for line in self.out.read_metrics() for r, pids in line.get("failed_clients", {}).items()]
        if not rounds:
            return
        shown = "; ".join(f"round {r}: {', '.join(map(str, pids))}" for r, pids in rounds[:SHOWN_ROUNDS])
        more = f"; and {len(rounds) - SHOWN_ROUNDS} more rounds" if len(rounds) > SHOWN_ROUNDS else ""
        warnings.warn(
            f"rounds that went on without clients that failed (train.on_client_failure: skip; failed_clients in "
            f"metrics.jsonl): {shown}{more}",
            ClientsLeftOut,
            stacklevel=2,
        )

    def summary(self, done_before: int) -> dict[str, Any]:
        """The run's summary (``summary.json``); ``done_before``: rounds a resumed run started after."""
        wall = self.elapsed_s()
        return {
            "name": self.cfg.name,
            "run_dir": str(self.out.path),
            "rounds": self.cfg.train.rounds,
            "wall_time_s": round(wall, 2),
            "rounds_per_s": round(self.cfg.train.rounds / wall, 3),
            "steady_s_per_round": self.seconds_per_round(),
            "resumed_from_round": done_before or None,
            **final_accuracies(self.out.read_metrics()),  # what fedsim report checks them against
            "final_train_loss": self.last.get("train_loss"),
            "per_class_acc": self.last.get("per_class_acc"),
        }
