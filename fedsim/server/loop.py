"""The server's round loop: one run, every engine, over any Flower ``Strategy``.

Each round: the sampler picks the clients (:mod:`fedsim.server.sampling`); the strategy configures
their messages (``configure_train``); the grid delivers them; the reply checks
(:mod:`fedsim.server.replies`) apply the failure policy and sort the good replies by partition; the
strategy aggregates them (``aggregate_train``); a NaN / inf stops the run. On evaluation rounds the
same for ``configure_evaluate`` / ``aggregate_evaluate`` on every client, of the model the strategy names
to score (``scored_arrays``: the global model, unless it is a ``ScoredModel``); then the reporter writes
the round, and every ``output.checkpoint_every`` rounds the checkpointer saves it. A resumed run
starts at the round after its checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedsim import wire
from fedsim.arrays import to_array_record
from fedsim.cadence import EvalCadence, personalises
from fedsim.config import RunConfig
from fedsim.data.fingerprint import check_same_data
from fedsim.errors import ClusterLost, ConfigError, PluginExit, TrainingError
from fedsim.experiment.resolve import Experiment, build_server
from fedsim.layout import torch_threads
from fedsim.plugin_guard import plugin_code
from fedsim.record.checkpoint import Checkpoint
from fedsim.record.layout import CHECKPOINT
from fedsim.record.manifest import DATA_FINGERPRINT
from fedsim.record.paths import default_run_dir
from fedsim.record.writer import RunDir
from fedsim.server.checkpoint import Checkpointer, set_rng_state
from fedsim.server.console import console, show_partition, summary_table
from fedsim.server.contract import CheckedStrategy
from fedsim.server.discovery import discover_partitions, invert
from fedsim.server.polling import OfferedGrid
from fedsim.server.replies import describe_failures, divergence, good_replies, missing_replies
from fedsim.server.reporter import ClientScore, RoundReporter
from fedsim.server.sampling import EVAL_STREAM, ClientSampler
from fedsim.strategies.server_half import ServerSetup, check_strategy
from fedsim.trackers import open_trackers


class RoundLoop:
    """Rounds ``first .. train.rounds`` of one run over ``grid`` with ``strategy``."""

    def __init__(
        self,
        cfg: RunConfig,
        grid: Grid,
        strategy: CheckedStrategy,
        node_of_partition: Mapping[int, int],
        reporter: RoundReporter,
        checkpoints: Checkpointer,
    ) -> None:
        self.cfg, self.grid, self.strategy = cfg, grid, strategy
        self.node_of_partition = node_of_partition
        self.partition_of_node = invert(node_of_partition)
        self.reporter, self.checkpoints = reporter, checkpoints
        t = cfg.train
        self.sampler = ClientSampler(t.num_clients, t.clients_per_round or t.num_clients, cfg.seed)
        self.scored = ClientSampler(t.num_clients, cfg.eval.clients or t.num_clients, cfg.seed, EVAL_STREAM)
        self.cadence = EvalCadence(cfg.eval.every, t.rounds)
        self.config_json = cfg.to_json()

    def run(self, arrays: ArrayRecord, first: int) -> tuple[ArrayRecord, ArrayRecord]:
        """The global model after the last round, and the model its evaluation scored (the last round is always
        evaluated)."""
        scored = arrays
        for server_round in range(first, self.cfg.train.rounds + 1):
            arrays, loss = self.train(server_round, arrays)
            self.reporter.trained()
            scored, scores = arrays, None
            if self.cadence.is_eval_round(server_round):
                scored = self.strategy.scored_arrays(arrays)
                if self.strategy.calibrates:
                    stats = self.feature_stats(server_round, scored)
                    scored = self.strategy.calibrated_arrays(server_round, scored, stats)
                scores = self.evaluate(server_round, scored)
            self.reporter.round_done(server_round, scored, loss, scores)
            if self.checkpoints.due(server_round):
                state = self.strategy.server_state()
                failures = self.reporter.pending_failures
                self.checkpoints.save(server_round, arrays, state, self.reporter.elapsed_s(), failures)
        return arrays, scored

    def train(self, server_round: int, arrays: ArrayRecord) -> tuple[ArrayRecord, float | None]:
        """One round of training: the new global model and the aggregated training loss."""
        chosen = self.sampler.sample(server_round)
        messages = self.strategy.configure("configure_train", server_round, arrays, self._config(), self._offer(chosen))
        replies = self._exchange(messages, chosen, server_round, "training")
        # a server step that overflows (FedYogi's Δ², η·m/√v) is a divergence, said in the run's one error line
        # below: numpy's RuntimeWarnings about it printed lines of their own before that line
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            new, metrics = self.strategy.aggregate_train(server_round, replies)
        if problems := divergence(replies, new, self.cfg.train.max_loss):
            raise TrainingError(f"training diverged in round {server_round}: " + "; ".join(problems))
        self.checkpoints.deliveries.accept(server_round, replies)
        loss = float(metrics[wire.TRAIN_LOSS]) if metrics is not None and wire.TRAIN_LOSS in metrics else None
        return new, loss

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> dict[int, ClientScore | None]:
        """Every client's evaluation of the global model (and of its personalised one, with ``eval.personal``); with
        ``eval.clients``, a sample's."""
        scored = self.scored.sample(server_round)
        messages = self.strategy.configure(
            "configure_evaluate", server_round, arrays, self._config(), self._offer(scored)
        )
        replies = self._exchange(messages, scored, server_round, "evaluation")
        self.strategy.aggregate_evaluate(server_round, replies)  # the strategy's own bookkeeping, if any
        personal = personalises(self.cfg, server_round)
        return dict.fromkeys(scored) | {  # None: the client failed (on_client_failure: skip)
            wire.partition_of(m): ClientScore(
                int(wire.reply_metric(m, wire.NUM_EXAMPLES)),
                int(wire.reply_metric(m, wire.CORRECT)),
                float(wire.reply_metric(m, wire.EVAL_LOSS)),
                int(wire.reply_metric(m, wire.PERSONAL_CORRECT)) if personal else None,
            )
            for m in replies
        }

    def feature_stats(self, server_round: int, arrays: ArrayRecord) -> list[ArrayRecord]:
        """Every client's per-class statistics of its training features under ``arrays`` (``query.feature_stats``),
        sorted by partition; under ``on_client_failure: skip``, of the clients that answered."""
        everyone = list(range(self.cfg.train.num_clients))
        live = self._connected()
        config = ConfigRecord({wire.SERVER_ROUND: server_round, wire.RUN_CONFIG: self.config_json})
        messages = [  # a RecordDict each: the delivery record stamped into it is the node's own
            Message(RecordDict({wire.ARRAYS: arrays, wire.CONFIG: config}), node, wire.FEATURE_STATS)
            for p in everyone
            if (node := self.node_of_partition[p]) in live
        ]
        replies = self._exchange(messages, everyone, server_round, "feature statistics")
        return [m.content.array_records[wire.FEATURES] for m in replies]

    def _offer(self, partitions: list[int]) -> OfferedGrid:
        """The grid as the strategy sees it: the nodes of ``partitions`` still connected (a strategy configures every
        node it is offered; a million-client round builds the messages of the clients it sampled, not a million)."""
        live = self._connected()
        return OfferedGrid(self.grid, [node for p in partitions if (node := self.node_of_partition[p]) in live])

    def _connected(self) -> Container[int]:
        """The grid's nodes, for membership (a range, as the local grid lists its nodes, kept one)."""
        connected = self.grid.get_node_ids()
        return connected if isinstance(connected, range) else set(connected)

    def _config(self) -> ConfigRecord:
        # a fresh record per round: Flower's strategies write the round into the one they are given
        return ConfigRecord({wire.RUN_CONFIG: self.config_json})

    def _exchange(
        self, messages: Iterable[Message], partitions: list[int], server_round: int, what: str
    ) -> list[Message]:
        """Send the strategy's messages for ``partitions`` and return the good replies, sorted by partition.

        A client that failed, or sent nothing within the round timeout, stops the run
        (``on_client_failure: fail``) or is left out and recorded (``skip``)."""
        addressed = {m.metadata.dst_node_id: m for m in messages}
        unaddressed = [p for p in partitions if self.node_of_partition[p] not in addressed]
        connected = self._connected() if unaddressed else set()
        if strangers := [p for p in unaddressed if self.node_of_partition[p] in connected]:
            raise ConfigError(
                f"round {server_round}, {what}: the strategy ({self.strategy.name}) configured no "
                f"message for clients {strangers}; fedsim samples the clients, so a strategy must configure "
                "every node it is offered"
            )
        # a node the grid no longer lists (a SuperNode that died) was offered nothing: it failed
        gone = {p: f"node {self.node_of_partition[p]} is no longer connected" for p in unaddressed}
        sent = [p for p in partitions if p not in gone]
        timeout = self.cfg.train.round_timeout_s
        ordered = self.checkpoints.deliveries.stamp(addressed[self.node_of_partition[p]] for p in sent)
        try:
            replies = list(self.grid.send_and_receive(ordered, timeout=timeout))
        except ClusterLost as err:
            raise TrainingError(f"round {server_round}, {what}: {err}") from None
        good = good_replies(replies)
        if missing := {**missing_replies(replies, sent, self.partition_of_node, timeout), **gone}:
            why = describe_failures(missing)
            if self.cfg.train.on_client_failure == "fail":
                raise TrainingError(
                    f"round {server_round}, {what}: {why} (train.on_client_failure: skip goes on without them)"
                )
            self.reporter.left_out(server_round, sorted(missing))
            if not good and what != "evaluation":  # every client failed: nothing to aggregate or calibrate on
                raise TrainingError(f"round {server_round}, {what}: no client sent a usable reply ({why})")
        return good


@contextmanager
def _flower_logs_quiet() -> Iterator[None]:
    """Flower logs every message at INFO; the progress bar replaces that."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def run_server(grid: Grid, experiment: Experiment, resume: bool = False, show: bool | None = None) -> dict[str, Any]:
    """Run every round of ``experiment`` over ``grid`` (``resume``: those after the run dir's checkpoint);
    returns the summary written to the run dir. ``show``: the partition table, progress bar and summary
    table on this process's console (default ``output.progress``; the config written keeps the user's)."""
    cfg = experiment.config
    # The server's own evaluation sums in an order that depends on torch's thread count: fix it, so
    # the numbers do not depend on what ran before in this process (a test session, a sweep)
    torch.set_num_threads(torch_threads(cfg.simulation))
    out = RunDir(
        cfg.output.run_dir or default_run_dir(cfg), lambda path: open_trackers(cfg.output.trackers, path, cfg.name)
    )
    try:
        with plugin_code():  # the normaliser and model in the server's diagnostics, trackers, the data
            return _run_rounds(grid, experiment, out, resume, cfg.output.progress if show is None else show)
    finally:
        out.close()  # its trackers get the run's files and are closed, however the run ended


def _run_rounds(grid: Grid, experiment: Experiment, out: RunDir, resume: bool, show: bool) -> dict[str, Any]:
    cfg = experiment.config
    fed = experiment.federation()
    data_sha256 = fed.data_sha256
    resumed = Checkpoint.load(out.path, cfg) if resume else None
    if resumed is not None:
        check_same_data(resumed.data_sha256, data_sha256, out.path / CHECKPOINT, cfg.data.root)
    out.write_config(cfg)
    if fed.counts is not None:  # a dataset generated per client has no table: each client is drawn when trained
        out.write_partition(*fed.counts, fed.classes)
    if resumed is not None:
        out.restore_metrics(resumed.metrics)
    if show:
        show_partition(fed)

    node_of_partition = discover_partitions(grid, cfg, data_sha256)
    model = experiment.initial_model()
    setup = ServerSetup(cfg.train.num_clients, frozenset(name for name, _ in model.named_parameters()), cfg.seed)
    server = build_server(experiment, setup)
    check_strategy(server, cfg.train.num_clients)
    reporter = RoundReporter(experiment, out, show)
    checkpoints = Checkpointer(cfg, out, grid, node_of_partition, resumed, data_sha256)
    arrays, done = to_array_record(model.state_dict()), 0
    strategy = CheckedStrategy(server, cfg.strategy.name, arrays, cfg.train.round_timeout_s)
    if resumed is None:
        reporter.start(arrays)
    else:
        reporter.resume(resumed.elapsed_s, resumed.metrics, resumed.failed, resumed.round, arrays)
        arrays, done = resumed.arrays, resumed.round
        strategy.load_server_state(resumed.server_state)
        checkpoints.restore_clients()
        set_rng_state(resumed.rng)

    loop = RoundLoop(cfg, grid, strategy, node_of_partition, reporter, checkpoints)
    try:
        with _flower_logs_quiet():
            arrays, scored = loop.run(arrays, done + 1)
    except (TrainingError, PluginExit) as err:  # diverged, clients failed, a hook overran or exited: what is kept
        raise type(err)(f"{err}; {checkpoints.describe()}") from err  # one line, as every error is
    finally:
        reporter.progress.stop()
    summary = reporter.summary(done)
    reporter.say_left_out()
    summary[DATA_FINGERPRINT] = data_sha256
    if cfg.output.save_model:
        out.save_model(scored.to_torch_state_dict())  # the model the metrics scored
    checkpoints.finish()
    summary = out.write_summary(summary)  # last: a finished summary means a finished run directory
    if show:
        console.print(summary_table(summary))
    return summary
