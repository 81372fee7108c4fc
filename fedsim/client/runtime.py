"""What a worker process keeps across rounds for one run: data slices, model, hooks, optimiser.

Each process keeps, per run config, one :class:`ClientRuntime`: the decoded dataset and its split,
one model object, the strategy's client hooks and one optimiser (one per client of a group with
``simulation.vmap_clients``). A client's data slice is cut once and kept (a dataset generated per
client: generated again each round, ``GENERATED_KEPT`` clients kept); each message only loads new
weights into the model. Client state that crosses rounds lives in the node's ``Context.state``,
so it follows the node whichever process serves it.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from torch import nn

from fedsim import wire
from fedsim.arrays import to_array_record
from fedsim.cadence import personalises
from fedsim.client.pending import hold, replace_state, settle, stage
from fedsim.client.personal import Personaliser, personal_seed
from fedsim.client.sgd import LocalSgd
from fedsim.client.training import ClientRound, TrainResult, train_local
from fedsim.config import RunConfig
from fedsim.data.batches import BatchStream
from fedsim.experiment.federation import AnyFederation
from fedsim.experiment.resolve import Experiment, resolve
from fedsim.layout import torch_threads
from fedsim.models import FedsimModel
from fedsim.models.evaluation import class_feature_stats, evaluate
from fedsim.norms import seed_norm_noise
from fedsim.strategies.hooks import ClientHooks, RoundInfo


def round_seed(seed: int, server_round: int, partition_id: int) -> int:
    """The seed of one client's batches in one round: independent of engine and process."""
    return int(np.random.SeedSequence([seed, server_round, partition_id]).generate_state(1)[0])


# the generated clients' samples a worker keeps: those of the client it is serving (a round asks for them two or
# three times in a row); a million-client federation samples a client again rarely, and keeping more would grow
# with the run and the power-law tail of client sizes, and make a small federation (its clients drawn again
# and again) cheaper per round than a large one for no reason but the cache
GENERATED_KEPT = 8


@dataclass
class ClientData:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    class_counts: torch.Tensor


class ClientRuntime:
    """One run's clients as a worker serves them.

    Slot 0 is the model and hooks every message uses; training several clients at once
    (``simulation.vmap_clients``) gives client k of a group slot k, a model and hooks of its own.
    """

    def __init__(self, experiment: Experiment) -> None:
        self.experiment = experiment
        self.cfg = cfg = experiment.config
        self.device = torch.device(cfg.simulation.device)
        self.fed: AnyFederation = experiment.federation()
        self.model = experiment.build_model().to(self.device)
        if self.device.type == "cpu" and self.fed.dataset is not None:  # images: convolutions run channels last
            self.model = self.model.to(memory_format=torch.channels_last)
        self.hooks: ClientHooks = experiment.strategy.client()
        self._slots: list[tuple[FedsimModel, ClientHooks]] = [(self.model, self.hooks)]
        self._optimizers: dict[int, LocalSgd] = {}
        self._clients: OrderedDict[int, ClientData] = OrderedDict()  # least recently used first
        self._personaliser: Personaliser | None = None  # built on the first personalised evaluation
        self.to_inputs = self.fed.input_transform(cfg.data.normalize)

    def data(self, pid: int) -> ClientData:
        """Client ``pid``'s train and test samples on the training device, cut (or generated) once."""
        if pid in self._clients:
            self._clients.move_to_end(pid)
            return self._clients[pid]
        arrays = self.fed.client(pid)
        self._clients[pid] = data = ClientData(
            x_train=arrays.x_train.to(self.device),
            y_train=arrays.y_train.to(self.device),
            x_test=arrays.x_test.to(self.device),
            y_test=arrays.y_test.to(self.device),
            class_counts=torch.bincount(arrays.y_train, minlength=self.fed.num_classes),
        )
        if self.fed.dataset is None and len(self._clients) > GENERATED_KEPT:
            self._clients.popitem(last=False)
        return data

    def slot(self, k: int) -> tuple[FedsimModel, ClientHooks]:
        while len(self._slots) <= k:  # the same architecture; every round loads its weights anew
            self._slots.append((copy.deepcopy(self.model), self.experiment.strategy.client()))
        return self._slots[k]

    def optimizer(self, clients: int) -> LocalSgd:
        """One SGD over the first ``clients`` slots' parameters, their models' and their hooks' own (its momentum is
        cleared every round)."""
        if clients not in self._optimizers:
            t = self.cfg.train
            slots = [self.slot(k) for k in range(clients)]
            params = [p for model, hooks in slots for p in (*model.parameters(), *hooks.own_parameters(model))]
            self._optimizers[clients] = LocalSgd(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        return self._optimizers[clients]

    def train(self, msg: Message, context: Context) -> Message:
        work = self.begin(0, msg, context)
        (result,) = train_local([work], self.optimizer(1))
        return self.reply(work, msg, context, result)

    def round_info(self, msg: Message, context: Context) -> RoundInfo:
        """The round of ``msg`` for the client ``context`` holds, as the run's training takes it."""
        pid, t = wire.node_partition(context), self.cfg.train
        server_round = int(msg.content.config_records[wire.CONFIG][wire.SERVER_ROUND])
        counts = self.data(pid).class_counts
        return RoundInfo(server_round, pid, t.local_steps, t.local_epochs, t.lr, t.momentum, counts, t.max_grad_norm)

    def begin(self, k: int, msg: Message, context: Context) -> ClientRound:
        """Slot ``k`` set up for the client ``context`` holds: its weights, batches and hooks."""
        info = self.round_info(msg, context)
        server_round, pid = info.server_round, info.partition_id
        model, hooks = self.slot(k)
        seed = round_seed(self.cfg.seed, server_round, pid)
        seed_norm_noise(model, seed)  # a normaliser's own noise: per client and round, whatever process
        stream = self.stream(pid, seed)
        settle(context.state, msg)
        hooks.load_global(model, msg.content.array_records[wire.ARRAYS], context.state)
        hooks.begin_round(model, msg.content, context.state, info)
        return ClientRound(model, hooks, stream, info)

    def stream(self, pid: int, seed: int) -> BatchStream:
        """Client ``pid``'s training batches (the run's batch size and augmentation), drawn from ``seed``."""
        data = self.data(pid)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        return BatchStream(
            data.x_train, data.y_train, self.cfg.train.batch_size, gen, augment=self.cfg.data.augment,
            normalize=self.to_inputs.stats, device=self.device,
        )  # fmt: skip

    def reply(self, work: ClientRound, msg: Message, context: Context, result: TrainResult) -> Message:
        """The training reply; the state changes of its hooks apply only with a reply the server keeps
        (:mod:`fedsim.client.pending`)."""
        staged = stage(context.state)
        reply = work.hooks.end_round(work.model, staged, work.info, result.steps)
        reply[wire.ARRAYS] = work.hooks.reply_arrays(work.model, staged)
        reply[wire.METRICS] = MetricRecord(
            {
                wire.NUM_EXAMPLES: work.stream.num_samples,
                wire.TRAIN_LOSS: result.mean_loss,
                wire.PARTITION_ID: work.info.partition_id,
            }
        )
        if self.cfg.train.on_client_failure == "skip":
            hold(context.state, staged, work.info.server_round)
        else:
            replace_state(context.state, staged)
        return Message(reply, reply_to=msg)

    def evaluate(self, msg: Message, context: Context) -> Message:
        """The client's scores: the global model's (as its hooks load it for evaluation) and, with
        ``eval.personal`` on, its personalised model's (:meth:`personalised`)."""
        pid = wire.node_partition(context)
        data = self.data(pid)
        settle(context.state, msg)
        self.hooks.load_for_eval(self.model, msg.content.array_records[wire.ARRAYS], context.state)
        loss, correct = self.score(self.model, data)
        metrics = MetricRecord(
            {
                wire.NUM_EXAMPLES: len(data.y_test),
                wire.CORRECT: correct,
                wire.EVAL_LOSS: loss,
                wire.PARTITION_ID: pid,
            }
        )
        if personalises(self.cfg, int(msg.content.config_records[wire.CONFIG][wire.SERVER_ROUND])):
            metrics[wire.PERSONAL_CORRECT] = self.score(self.personalised(msg, context), data)[1]
        return Message(RecordDict({wire.METRICS: metrics}), reply_to=msg)

    def feature_stats(self, msg: Message, context: Context) -> Message:
        """The per-class count, mean and covariance of the features of the client's training samples under the
        model the message carries, as its hooks load it for evaluation (CCVR's calibration; the features never
        leave the client)."""
        pid = wire.node_partition(context)
        data = self.data(pid)
        settle(context.state, msg)
        self.hooks.load_for_eval(self.model, msg.content.array_records[wire.ARRAYS], context.state)
        counts, means, covariances = class_feature_stats(
            self.model, data.x_train, data.y_train, self.fed.num_classes, self.to_inputs
        )
        stats = {wire.CLASS_COUNTS: counts, wire.CLASS_MEANS: means, wire.CLASS_COVARIANCES: covariances}
        reply = {wire.FEATURES: to_array_record(stats), wire.METRICS: MetricRecord({wire.PARTITION_ID: pid})}
        return Message(RecordDict(reply), reply_to=msg)

    def score(self, model: nn.Module, data: ClientData) -> tuple[float, int]:
        """``model``'s summed loss and correct count on the client's test split."""
        loss, correct, _ = evaluate(
            model, data.x_test, data.y_test, self.cfg.eval.batch_size, self.fed.num_classes, self.to_inputs
        )
        return loss, int(correct.sum())

    def personalised(self, msg: Message, context: Context) -> nn.Module:
        """The client's personalised model: its hooks' ``personalize`` of the worker's spare copy, loaded as for
        training, with the generic fine-tuning on batches of :func:`personal_seed` (never the training's)."""
        if self._personaliser is None:
            self._personaliser = Personaliser(self.model, self.cfg)
        tuner, info = self._personaliser, self.round_info(msg, context)
        seed = personal_seed(self.cfg.seed, info.server_round, info.partition_id)
        self.hooks.load_global(tuner.model, msg.content.array_records[wire.ARRAYS], context.state)
        fine_tune = tuner.fine_tune(self.stream(info.partition_id, seed), info, seed)
        return self.hooks.personalize(tuner.model, context.state, fine_tune)


@lru_cache(maxsize=2)
def config_of(config_json: str) -> RunConfig:
    return RunConfig.from_json(config_json)


@lru_cache(maxsize=2)
def prepare(config_json: str) -> ClientRuntime:
    """The process's runtime for a run config (JSON), built on first use. An ``lru_cache`` by contract:
    ``prepare.cache_info().misses`` counts the runtimes this process built, which a SuperNode's fork server reads
    to tell a runtime a task built from one it inherited (fedsim.deploy.clientapp)."""
    return ClientRuntime(resolve(config_of(config_json)))


def runtime_for(msg: Message) -> ClientRuntime:
    """The process's runtime for the run config the message carries, with the run's intra-op threads (set
    on every message: a forked process inherits a runtime its parent built with one thread)."""
    runtime = prepare(wire.run_config_json(msg))
    torch.set_num_threads(torch_threads(runtime.cfg.simulation))
    return runtime
