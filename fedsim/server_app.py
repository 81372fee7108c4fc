"""fedsim's Flower ServerApp: one :func:`run_server` drives a run under every engine.

It learns which node holds which partition, builds the initial model from the seed, hands the
strategy its schedule, and lets Flower's ``Strategy.start()`` run the rounds. After each round
the ``evaluate_fn`` hook writes the metrics line and moves the progress bar.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedsim import wire
from fedsim.arrays import to_array_record
from fedsim.client_app import build_model
from fedsim.config import RunConfig, load_config, validate_options
from fedsim.diagnostics import ProbeDiagnostics
from fedsim.errors import FedsimError
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

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0:
            if self.diagnostics is not None:
                self.diagnostics.at_init(arrays, self.cfg.seed)
            return None
        self.round_ends.append(self.schedule.train_ended)
        train = self.schedule.last_train
        loss = float(train[wire.TRAIN_LOSS]) if train is not None else None
        if not self.schedule.is_eval_round(server_round):
            self.progress.update(server_round, loss, None)
            return None
        evals = self.schedule.last_eval
        client_acc = {pid: (c / n if n else None) for pid, (n, c, _) in sorted(evals.items())}
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
        record["client_acc"] = list(client_acc.values())
        record["rss_mb"] = resident_mb()
        self.out.append_metrics(record)
        self.last = record
        self.progress.update(server_round, loss, record["client_mean_acc"])
        scalars = {k: v for k, v in record.items() if isinstance(v, float) and k != "time_s"}
        return MetricRecord(scalars)


def run_server(grid: Grid, cfg: RunConfig) -> dict[str, Any]:
    """Run every round of ``cfg`` over ``grid``; returns the summary written to the run dir."""
    fed = load_federation(cfg)
    out = RunDir(cfg.output.run_dir or default_run_dir(cfg), cfg.output.tensorboard)
    out.write_config(cfg)
    out.reset_metrics()
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
    )
    strategy.attach(schedule)
    reporter = RoundReporter(cfg, fed, schedule, out)
    config = ConfigRecord({wire.RUN_CONFIG: cfg.to_json()})
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)  # Flower logs every round at INFO; the progress bar replaces it
    t0 = time.perf_counter()
    try:
        result = strategy.start(
            grid,
            to_array_record(model.state_dict()),
            num_rounds=cfg.train.rounds,
            train_config=config,
            evaluate_config=ConfigRecord({wire.RUN_CONFIG: cfg.to_json()}),
            evaluate_fn=reporter,
        )
    finally:
        flwr_logger.setLevel(level)
        reporter.progress.stop()
    wall = time.perf_counter() - t0
    if cfg.output.save_model:
        out.save_model(result.arrays.to_torch_state_dict())
    history = out.read_metrics()
    accs = [r["client_mean_acc"] for r in history if r.get("client_mean_acc") is not None]
    summary = {
        "name": cfg.name,
        "run_dir": str(out.path),
        "rounds": cfg.train.rounds,
        "wall_time_s": round(wall, 2),
        "rounds_per_s": round(cfg.train.rounds / wall, 3),
        "steady_s_per_round": reporter.seconds_per_round(),
        "final_client_mean_acc": accs[-1] if accs else None,
        "best_client_mean_acc": max(accs) if accs else None,
        "final_global_acc": reporter.last.get("global_acc"),
        "final_train_loss": reporter.last.get("train_loss"),
        "per_class_acc": reporter.last.get("per_class_acc"),
    }
    out.write_summary(summary)
    out.close()
    if cfg.output.progress:
        console.print(summary_table(summary))
    return summary


def config_from_context(context: Context) -> RunConfig:
    """The run config: inline JSON (``fedsim-config``) or a YAML path (``config``) in the run config."""
    run_config = context.run_config
    if wire.RUN_CONFIG in run_config:
        return RunConfig.from_json(str(run_config[wire.RUN_CONFIG]))
    if "config" in run_config:
        return load_config(Path(str(run_config["config"])))
    raise FedsimError("the run config has neither 'fedsim-config' nor 'config' (a YAML path)")


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_server(grid, config_from_context(context))
