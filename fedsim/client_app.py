"""fedsim's Flower ClientApp: train and evaluate handlers over the one training loop.

Each process keeps, per run config, one :class:`ClientRuntime`: the decoded dataset, the split,
one model object and one optimiser (one per client of a group with ``simulation.vmap_clients``). A
client's data slice is cut once and kept; each message only loads new weights into the model.
Client state that crosses rounds lives in the node's ``Context.state``, so it follows the node
whichever process serves it.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from flwr.app import Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsim import wire
from fedsim.checkpoint import state_query
from fedsim.config import RunConfig, validate_options
from fedsim.data.batches import BatchStream
from fedsim.federation import Federation, load_federation
from fedsim.models import FedsimModel, create_model
from fedsim.norms import create_norm
from fedsim.norms.ln_variants import seed_norm_noise
from fedsim.strategies import STRATEGIES
from fedsim.training import ClientHooks, Lane, RoundInfo, TrainResult, evaluate, train_local
from fedsim.vectorized import StackedForward

CLIENT_APP_RAISED_EXCEPTION = 1  # Flower's ErrorCode of that name


def build_model(cfg: RunConfig, num_classes: int, in_shape: tuple[int, int, int]) -> FedsimModel:
    norm = create_norm(cfg.model.norm, cfg.model.norm_args)
    return create_model(cfg.model.name, num_classes, in_shape, norm, cfg.model.args)


def round_seed(seed: int, server_round: int, partition_id: int) -> int:
    """The seed of one client's batches in one round: independent of engine and process."""
    return int(np.random.SeedSequence([seed, server_round, partition_id]).generate_state(1)[0])


@dataclass
class ClientData:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    class_counts: torch.Tensor


class ClientRuntime:
    """Everything a worker process keeps across rounds for one run config.

    Slot 0 is the model, hooks and optimiser every message uses; training several clients at once
    (``simulation.vmap_clients``) gives client k of a group slot k, a model and hooks of its own.
    """

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        torch.set_num_threads(cfg.simulation.threads)
        self.device = torch.device(cfg.simulation.device)
        self.fed: Federation = load_federation(cfg)
        ds = self.fed.dataset
        self.model = build_model(cfg, ds.num_classes, ds.in_shape).to(self.device)
        if self.device.type == "cpu" and len(ds.in_shape) == 3:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.spec = STRATEGIES.get(cfg.strategy.name)
        self.strategy_params = validate_options(self.spec.Params, cfg.strategy.options, "strategy")
        self.hooks: ClientHooks = self.spec.client(self.strategy_params)
        self._slots: list[tuple[FedsimModel, ClientHooks]] = [(self.model, self.hooks)]
        self._optimizers: dict[int, torch.optim.Optimizer] = {}
        self._clients: dict[int, ClientData] = {}
        self.prepare = self.fed.input_transform(cfg.data.normalize)

    def data(self, pid: int) -> ClientData:
        if pid not in self._clients:
            ds, part = self.fed.dataset, self.fed.partition
            tr, te = torch.from_numpy(part.train[pid]), torch.from_numpy(part.test[pid])
            self._clients[pid] = ClientData(
                x_train=ds.x_train[tr].to(self.device),
                y_train=ds.y_train[tr].to(self.device),
                x_test=ds.x_test[te].to(self.device),
                y_test=ds.y_test[te].to(self.device),
                class_counts=torch.from_numpy(self.fed.train_counts[pid]),
            )
        return self._clients[pid]

    def _slot(self, k: int) -> tuple[FedsimModel, ClientHooks]:
        while len(self._slots) <= k:  # the same architecture; every round loads its weights anew
            self._slots.append((copy.deepcopy(self.model), self.spec.client(self.strategy_params)))
        return self._slots[k]

    def _optimizer(self, lanes: int) -> torch.optim.Optimizer:
        """One SGD over the first ``lanes`` slots' parameters (its state is cleared every round)."""
        if lanes not in self._optimizers:
            t = self.cfg.train
            params = [p for k in range(lanes) for p in self._slot(k)[0].parameters()]
            self._optimizers[lanes] = torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        return self._optimizers[lanes]

    def train(self, msg: Message, context: Context) -> Message:
        lane = self._lane(0, msg, context)
        (result,) = train_local([lane], self._optimizer(1))
        return self._reply(lane, msg, context, result)

    def train_together(self, jobs: Sequence[tuple[Message, Context]]) -> list[Message]:
        """Train several nodes' messages of one round at once, one vmapped forward per step.

        A client whose own set-up or reply raises gets an error reply and the others go on; an error
        in the shared steps is every client's.
        """
        replies: dict[int, Message] = {}
        lanes: dict[int, Lane] = {}
        for i, (msg, context) in enumerate(jobs):
            try:
                lanes[i] = self._lane(len(lanes), msg, context)
            except Exception as err:  # the server's failure policy decides, per client
                replies[i] = error_reply(msg, err)
        if lanes:
            models = [lane.model for lane in lanes.values()]
            forward = StackedForward(models) if len(models) > 1 else None
            results = train_local(list(lanes.values()), self._optimizer(len(lanes)), forward)
            for (i, lane), result in zip(lanes.items(), results, strict=True):
                msg, context = jobs[i]
                try:
                    replies[i] = self._reply(lane, msg, context, result)
                except Exception as err:
                    replies[i] = error_reply(msg, err)
        return [replies[i] for i in range(len(jobs))]

    def _lane(self, k: int, msg: Message, context: Context) -> Lane:
        """Slot ``k`` set up for the client ``context`` holds: its weights, batches and hooks."""
        pid = int(context.node_config[wire.PARTITION_ID])
        server_round = int(msg.content.config_records[wire.CONFIG][wire.SERVER_ROUND])
        model, hooks = self._slot(k)
        data, t = self.data(pid), self.cfg.train
        info = RoundInfo(server_round, pid, t.local_steps, t.local_epochs, t.lr, data.class_counts)
        seed = round_seed(self.cfg.seed, server_round, pid)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        seed_norm_noise(model, seed)  # ln_randomized's noise: per client and round, any process
        stream = BatchStream(
            data.x_train, data.y_train, t.batch_size, gen, augment=self.cfg.data.augment,
            normalize=self.prepare.stats, device=self.device,
        )
        hooks.load_global(model, msg.content.array_records[wire.ARRAYS], context.state)
        hooks.begin_round(model, msg.content, context.state, info)
        return Lane(model, hooks, stream, info)

    def _reply(self, lane: Lane, msg: Message, context: Context, result: TrainResult) -> Message:
        reply = lane.hooks.end_round(lane.model, context.state, lane.info, result.steps)
        reply[wire.ARRAYS] = lane.hooks.reply_arrays(lane.model, context.state)
        reply[wire.METRICS] = MetricRecord(
            {
                wire.NUM_EXAMPLES: lane.stream.num_samples,
                wire.TRAIN_LOSS: result.mean_loss,
                wire.PARTITION_ID: lane.info.partition_id,
            }
        )
        return Message(reply, reply_to=msg)

    def evaluate(self, msg: Message, context: Context) -> Message:
        pid = int(context.node_config[wire.PARTITION_ID])
        data = self.data(pid)
        self.hooks.load_for_eval(self.model, msg.content.array_records[wire.ARRAYS], context.state)
        loss, correct, _ = evaluate(
            self.model, data.x_test, data.y_test, self.cfg.eval.batch_size,
            self.fed.dataset.num_classes, self.prepare,
        )
        metrics = MetricRecord(
            {
                wire.NUM_EXAMPLES: len(data.y_test),
                wire.CORRECT: int(correct.sum()),
                wire.EVAL_LOSS: loss,
                wire.PARTITION_ID: pid,
            }
        )
        return Message(RecordDict({wire.METRICS: metrics}), reply_to=msg)


@lru_cache(maxsize=2)
def _config(config_json: str) -> RunConfig:
    return RunConfig.from_json(config_json)


@lru_cache(maxsize=2)
def _runtime(config_json: str) -> ClientRuntime:
    return ClientRuntime(_config(config_json))


def _config_json(msg: Message) -> str:
    return str(msg.content.config_records[wire.CONFIG][wire.RUN_CONFIG])


def runtime_for(msg: Message) -> ClientRuntime:
    """The process's runtime for the run config the message carries (built on first use)."""
    return _runtime(_config_json(msg))


def error_reply(message: Message, err: Exception) -> Message:
    """The reply to a message whose handling raised, as Flower's runtime makes it."""
    reason = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
    return Message(Error(code=CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)


def train_groups(jobs: Sequence[tuple[Message, Context]]) -> list[list[int]]:
    """Which of ``jobs`` train together: up to ``simulation.vmap_clients`` train messages of one run at a
    time, in order, as lists of two or more indices. Every other job goes alone through the ClientApp,
    a client without training data too (it takes no step, and clients training together take equal
    step counts)."""
    runs: dict[int, tuple[int, list[int]]] = {}
    for i, (msg, context) in enumerate(jobs):
        try:
            if msg.metadata.message_type != MessageType.TRAIN:
                continue
            if _config(_config_json(msg)).simulation.vmap_clients == 1:  # read without building a runtime
                continue
            runtime = runtime_for(msg)
            has_data = len(runtime.data(int(context.node_config[wire.PARTITION_ID])).y_train) > 0
        except Exception:  # a message this cannot read, or a runtime that cannot start: the ClientApp reports it
            continue
        if has_data:
            runs.setdefault(id(runtime), (runtime.cfg.simulation.vmap_clients, []))[1].append(i)
    groups = [ids[k : k + width] for width, ids in runs.values() for k in range(0, len(ids), width)]
    return [g for g in groups if len(g) > 1]


def train_together(jobs: Sequence[tuple[Message, Context]]) -> list[Message]:
    """One group of :func:`train_groups`, trained at once (Flower's ClientApp takes one message)."""
    return runtime_for(jobs[0][0]).train_together(jobs)


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    return runtime_for(msg).train(msg, context)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    return runtime_for(msg).evaluate(msg, context)


@app.query("partition")
def query_partition(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds (node ids are random; partition ids not)."""
    return partition_reply(msg, context)


def partition_reply(msg: Message, context: Context) -> Message:
    """A reply carrying only this node's partition id: how the server knows who answered."""
    pid = int(context.node_config[wire.PARTITION_ID])
    return Message(RecordDict({wire.METRICS: MetricRecord({wire.PARTITION_ID: pid})}), reply_to=msg)


@app.query("save_state")
def save_state(msg: Message, context: Context) -> Message:
    """A checkpoint: write this node's Context.state to its state directory (fedsim.checkpoint)."""
    state_query(msg, context)
    return partition_reply(msg, context)


@app.query("load_state")
def load_state(msg: Message, context: Context) -> Message:
    """A resumed run: replace this node's Context.state with its state as of the checkpoint."""
    state_query(msg, context)
    return partition_reply(msg, context)
