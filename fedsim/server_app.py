"""fedsim's Flower ServerApp: one :func:`run_server` drives a run under every engine.

It learns which node holds which partition, builds the initial model from the seed, hands the
strategy its schedule, and lets Flower's ``Strategy.start()`` run the rounds. After each round
the ``evaluate_fn`` hook writes the metrics line and moves the progress bar.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedsim import aggregation, wire
from fedsim.arrays import to_array_record
from fedsim.checkpoint import Checkpoint, Checkpointer, ResumedStrategy, set_rng_state
from fedsim.client_app import build_model
from fedsim.config import RunConfig, load_config, validate_options
from fedsim.diagnostics import ProbeDiagnostics
from fedsim.errors import FedsimError, TrainingError
from fedsim.federation import Federation, load_federation
from fedsim.reporting import RoundProgress, console, partition_table, summary_table
from fedsim.rundir import RunDir, default_run_dir
from fedsim.server_strategy import Schedule
from fedsim.strategies import STRATEGIES
from fedsim.training import evaluate, load_arrays


def discover_partitions(grid: Grid, num_clients: int, wait_s: float = 600.0) -> dict[int, int]:
    """Ask every node for its partition id; wait until ``num_clients`` nodes are connected."""
    deadline = time.monotonic() + wait_s
    while len(node_ids := list(grid.get_node_ids())) < num_clients:
        if time.monotonic() > deadline:
            raise FedsimError(f"only {len(node_ids)} of {num_clients} client nodes connected in {wait_s:.0f} s")
        time.sleep(0.5)
    queries = [Message(RecordDict(), dst_node_id=n, message_type=wire.QUERY_PARTITION) for n in node_ids]
    mapping: dict[int, int] = {}
    for reply in grid.send_and_receive(queries, timeout=wait_s):
        if reply.has_error():
            raise FedsimError(f"node {reply.metadata.src_node_id} failed the partition query: {reply.error.reason}")
        pid = int(reply.content.metric_records[wire.METRICS][wire.PARTITION_ID])
        if pid in mapping:
            raise FedsimError(f"two nodes claim partition {pid}: check each node's partition-id")
        mapping[pid] = reply.metadata.src_node_id
    if sorted(mapping) != list(range(num_clients)):
        raise FedsimError(
            f"nodes hold partitions {sorted(mapping)}, expected 0..{num_clients - 1} (train.num_clients)"
        )
    return mapping


def resident_mb() -> float:
    """This process's resident memory now (Linux), to see growth over rounds in metrics.jsonl."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


class GlobalEvaluator:
    """The global model on the whole test set: accuracy, loss and per-class accuracy."""

    def __init__(self, cfg: RunConfig, fed: Federation) -> None:
        ds = fed.dataset
        self.model = build_model(cfg, ds.num_classes, ds.in_shape)
        self.x, self.y, self.num_classes = ds.x_test, ds.y_test, ds.num_classes
        self.batch_size = cfg.eval.batch_size
        self.prepare = fed.input_transform(cfg.data.normalize)  # the clients' inputs, exactly

    def __call__(self, arrays: ArrayRecord) -> dict[str, Any]:
        load_arrays(self.model, arrays)
        loss, correct, totals = evaluate(self.model, self.x, self.y, self.batch_size, self.num_classes, self.prepare)
        per_class = (correct.double() / totals.clamp(min=1).double()).tolist()
        return {
            "global_acc": float(correct.sum()) / len(self.y),
            "global_loss": loss / len(self.y),
            "per_class_acc": per_class,
        }


class RoundReporter:
    """Flower's ``evaluate_fn``: called after every round with the new global arrays."""

    def __init__(self, cfg: RunConfig, fed: Federation, schedule: Schedule, out: RunDir) -> None:
        self.cfg, self.schedule, self.out = cfg, schedule, out
        self.global_eval = GlobalEvaluator(cfg, fed) if cfg.eval.global_test else None
        self.diagnostics = ProbeDiagnostics.from_run(cfg, fed)  # None unless `diagnostics:` asks
        self.progress = RoundProgress(cfg.train.rounds, cfg.output.progress)
        self.t0 = time.perf_counter()
        self.round_ends: list[float] = []  # after aggregation, before evaluation: steady round cost
        self.last: dict[str, Any] = {}

    def seconds_per_round(self) -> float | None:
        """Mean round time after the first (which pays for imports and caches), evaluation excluded."""
        ends = self.round_ends
        return (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else None

    def resume(self, checkpoint: Checkpoint, initial_arrays: ArrayRecord) -> None:
        """Go on from a checkpoint: its clock, its last metrics line, failures not yet written, the bar."""
        self.t0 = time.perf_counter() - checkpoint.elapsed_s
        self.schedule.failed.update(checkpoint.failed)
        self.last = checkpoint.metrics[-1] if checkpoint.metrics else {}
        if not checkpoint.metrics:  # the first line, still to come, carries the initial model's diagnostics
            self(0, initial_arrays)
        self.progressed(checkpoint.round, self.last.get("train_loss"), self.last.get("client_mean_acc"))

    def progressed(self, server_round: int, loss: float | None, acc: float | None) -> None:
        self.progress.update(server_round, loss, acc)
        self.out.write_progress(server_round, loss, acc)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0:
            if self.diagnostics is not None:
                self.diagnostics.at_init(arrays, self.cfg.seed)
            return None
        self.round_ends.append(self.schedule.train_ended)
        train = self.schedule.last_train
        loss = float(train[wire.TRAIN_LOSS]) if train is not None else None
        if not self.schedule.is_eval_round(server_round):
            self.progressed(server_round, loss, None)
            return None
        evals = self.schedule.last_eval
        client_acc = {pid: evals[pid][1] / evals[pid][0] if evals.get(pid, (0,))[0] else None
                      for pid in sorted(self.schedule.node_of_partition)}  # fmt: skip
        valid = [a for a in client_acc.values() if a is not None]
        record: dict[str, Any] = {
            "round": server_round,
            "time_s": round(time.perf_counter() - self.t0, 3),
            "train_loss": loss,
            "client_mean_acc": float(np.mean(valid)) if valid else None,
        }
        if self.global_eval is not None:
            record.update(self.global_eval(arrays))
        if self.diagnostics is not None:
            record.update(self.diagnostics(arrays))
        record["client_acc"] = list(client_acc.values())  # None: no test data, or the client failed
        if self.schedule.failed:  # on_client_failure: skip, since the last line
            record["failed_clients"] = {str(r): pids for r, pids in sorted(self.schedule.failed.items())}
            self.schedule.failed.clear()
        record["rss_mb"] = resident_mb()
        self.out.append_metrics(record)
        self.last = record
        self.progressed(server_round, loss, record["client_mean_acc"])
        scalars = {k: v for k, v in record.items() if isinstance(v, float) and k != "time_s"}
        return MetricRecord(scalars)


def run_server(grid: Grid, cfg: RunConfig, resume: bool = False) -> dict[str, Any]:
    """Run every round of ``cfg`` over ``grid`` (``resume``: those after the run dir's checkpoint);
    returns the summary written to the run dir."""
    # The server's own evaluation sums in an order that depends on torch's thread count: fix it, so
    # the numbers do not depend on what ran before in this process (a test session, a sweep)
    torch.set_num_threads(cfg.simulation.threads)
    aggregation.install()  # Flower's FedAvg averaging, byte for byte, without decoding every reply twice
    fed = load_federation(cfg)
    out = RunDir(cfg.output.run_dir or default_run_dir(cfg), cfg.output.tensorboard)
    resumed = Checkpoint.load(out.path, cfg) if resume else None
    out.write_config(cfg)
    if resumed is None:
        out.reset_metrics()
    else:
        out.restore_metrics(resumed.metrics)
    ds = fed.dataset
    out.write_partition(fed.train_counts, fed.test_counts, ds.classes)
    if cfg.output.progress:
        console.print(partition_table(fed.train_counts, fed.test_counts, ds.classes))
        if fed.partition.note:
            console.print(f"[yellow]note:[/] {fed.partition.note}")

    node_of_partition = discover_partitions(grid, cfg.train.num_clients)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, ds.num_classes, ds.in_shape)
    spec = STRATEGIES.get(cfg.strategy.name)
    strategy = spec.server(validate_options(spec.Params, cfg.strategy.options, "strategy"))
    schedule = Schedule(
        node_of_partition=node_of_partition,
        num_rounds=cfg.train.rounds,
        clients_per_round=cfg.train.clients_per_round or cfg.train.num_clients,
        eval_every=cfg.eval.every,
        seed=cfg.seed,
        parameter_keys=frozenset(name for name, _ in model.named_parameters()),
        on_client_failure=cfg.train.on_client_failure,
        round_timeout_s=cfg.train.round_timeout_s,
    )
    strategy.attach(schedule)
    reporter = RoundReporter(cfg, fed, schedule, out)
    checkpoints = Checkpointer(cfg, out, grid, node_of_partition, resumed)
    arrays, done = to_array_record(model.state_dict()), 0
    if resumed is not None:
        reporter.resume(resumed, arrays)
        arrays, done = resumed.arrays, resumed.round
        strategy.load_server_state(resumed.server_state)
        checkpoints.restore_clients()
        set_rng_state(resumed.rng)

    def end_of_round(server_round: int, round_arrays: ArrayRecord) -> MetricRecord | None:
        nonlocal arrays
        arrays = round_arrays
        metrics = reporter(server_round, round_arrays)
        if checkpoints.due(server_round):
            elapsed = time.perf_counter() - reporter.t0
            checkpoints.save(server_round, round_arrays, strategy.server_state(), elapsed, schedule.failed)
        return metrics

    config = ConfigRecord({wire.RUN_CONFIG: cfg.to_json()})
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)  # Flower logs every round at INFO; the progress bar replaces it
    try:
        ResumedStrategy(strategy, done).start(
            grid,
            arrays,
            num_rounds=cfg.train.rounds - done,
            timeout=cfg.train.round_timeout_s,
            train_config=config,
            evaluate_config=ConfigRecord({wire.RUN_CONFIG: cfg.to_json()}),
            evaluate_fn=end_of_round,
        )
    except TrainingError as err:  # diverged or clients failed: say what is kept on disk
        raise TrainingError(f"{err}\n{checkpoints.describe()}") from err
    finally:
        flwr_logger.setLevel(level)
        reporter.progress.stop()
    wall = time.perf_counter() - reporter.t0
    if cfg.output.save_model:
        out.save_model(arrays.to_torch_state_dict())
    history = out.read_metrics()
    accs = [r["client_mean_acc"] for r in history if r.get("client_mean_acc") is not None]
    summary = {
        "name": cfg.name,
        "run_dir": str(out.path),
        "rounds": cfg.train.rounds,
        "wall_time_s": round(wall, 2),
        "rounds_per_s": round(cfg.train.rounds / wall, 3),
        "steady_s_per_round": reporter.seconds_per_round(),
        "resumed_from_round": done or None,
        "final_client_mean_acc": accs[-1] if accs else None,
        "best_client_mean_acc": max(accs) if accs else None,
        "final_global_acc": reporter.last.get("global_acc"),
        "final_train_loss": reporter.last.get("train_loss"),
        "per_class_acc": reporter.last.get("per_class_acc"),
    }
    checkpoints.finish()
    out.close()
    out.write_summary(summary)  # last: a finished summary means a finished run directory
    if cfg.output.progress:
        console.print(summary_table(summary))
    return summary


def app_file(path: str) -> Path:
    """A path given in the run config: as is, else inside the Flower App bundle (``flwr run`` installs
    it in the SuperLink's FLWR_HOME and puts its directory on ``sys.path``)."""
    candidates = [Path(path)] + [Path(entry) / path for entry in sys.path if entry and not Path(path).is_absolute()]
    return next((c for c in candidates if c.is_file()), Path(path))


def config_from_context(context: Context) -> RunConfig:
    """The run config: inline JSON (``fedsim-config``) or a YAML path (``config``) in the run config."""
    run_config = context.run_config
    if run_config.get(wire.RUN_CONFIG):
        return RunConfig.from_json(str(run_config[wire.RUN_CONFIG]))
    if "config" in run_config:
        return load_config(app_file(str(run_config["config"])))
    raise FedsimError("the run config has neither 'fedsim-config' nor 'config' (a YAML path)")


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = config_from_context(context)
    cfg.output.run_dir = str(default_run_dir(cfg))  # fixed once: an error lands in the run's own directory
    try:
        run_server(grid, cfg)
    except Exception as err:  # under a SuperLink nobody sees this process's traceback: leave the reason
        message = str(err) if isinstance(err, FedsimError) else f"{type(err).__name__}: {err}"
        RunDir(cfg.output.run_dir).write_error(message)
        raise
