"""The server's round loop (fedsim.server.loop): what a round trains, aggregates and records, when it evaluates
and checkpoints, how a client that fails, falls silent or disconnects is handled, and what ``run_server`` writes
around the rounds. A real :class:`RoundLoop` over fedsim's local grid and its ClientApp, its reporter, checkpointer
and strategies on the shipped MNIST subset; the grid's executor only logs what the server sent and, where a test
asks, leaves a node's reply out or the node off the grid (what a lost SuperNode or Ray worker does)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Message

from fedsim import wire
from fedsim.arrays import array_view, load_arrays, to_array_record
from fedsim.client.app import app
from fedsim.config_file import parse_config
from fedsim.data.batches import to_float
from fedsim.engines.local import InlineExecutor, LocalGrid, node_id_of
from fedsim.errors import ConfigError, TrainingError
from fedsim.experiment.resolve import Experiment, build_server, resolve
from fedsim.record.checkpoint import Checkpoint
from fedsim.record.manifest import DATA_FINGERPRINT, FILES, entry_of
from fedsim.record.writer import RunDir
from fedsim.server.checkpoint import Checkpointer
from fedsim.server.contract import CheckedStrategy
from fedsim.server.loop import RoundLoop, _flower_logs_quiet, run_server
from fedsim.server.reporter import ClientScore, RoundReporter
from fedsim.server.sampling import ClientSampler
from fedsim.strategies.fedprox import PROXIMAL_MU
from fedsim.strategies.server_half import ServerSetup
from tests.conftest import small_config

FLAKY = "tests.plugins.flaky_client:Flaky"
DIVERGING = "tests.plugins.diverging:Diverging"


class LoggedExecutor:
    """fedsim's inline executor (what LocalGrid delivers through), with a log of every message the server sent:
    (type, partition, round). The nodes of ``gone`` are off the grid (a SuperNode that died); the replies of
    ``silent`` never arrive."""

    def __init__(self, inner: InlineExecutor, silent: Collection[int] = (), gone: Collection[int] = ()) -> None:
        self.inner, self.silent, self.gone = inner, set(silent), set(gone)
        self.sent: list[tuple[str, int, int]] = []
        self.configs: list[dict[str, Any]] = []  # each message's config record, as sent
        self.threads: list[int] = []  # torch's intra-op threads in the server's process at each send
        self.replies: list[Message] = []  # every reply the clients sent, silenced ones too

    def node_ids(self) -> list[int]:
        return [n for n in self.inner.node_ids() if n - 1 not in self.gone]

    def execute(self, messages: Sequence[Message], timeout: float | None = None) -> list[Message]:
        self.threads.append(torch.get_num_threads())
        for m in messages:
            config = m.content.config_records[wire.CONFIG]
            at = config.get(wire.SERVER_ROUND, config.get(wire.STATE_ROUND, 0))
            self.sent.append((m.metadata.message_type, m.metadata.dst_node_id - 1, int(at)))  # type: ignore[arg-type]
            self.configs.append(dict(config))
        replies = self.inner.execute(messages, timeout)
        self.replies += replies
        return [r for r in replies if r.metadata.src_node_id - 1 not in self.silent]

    def shutdown(self) -> None:
        self.inner.shutdown()

    def partitions(self, kind: str, server_round: int) -> list[int]:
        return [pid for t, pid, r in self.sent if (t, r) == (kind, server_round)]

    def rounds(self, kind: str) -> list[int]:
        return sorted({r for t, _, r in self.sent if t == kind})


@dataclass(frozen=True)
class Reported:
    server_round: int
    arrays: dict[str, np.ndarray]
    loss: float | None
    scores: dict[int, ClientScore | None] | None


class Recording(RoundReporter):
    """fedsim's reporter, which also keeps what the loop told it each round."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.told: list[Reported] = []

    def round_done(
        self, server_round: int, arrays: ArrayRecord, loss: float | None, scores: dict[int, ClientScore | None] | None
    ) -> None:
        self.told.append(Reported(server_round, numpy_of(arrays), loss, scores))
        super().round_done(server_round, arrays, loss, scores)


@dataclass
class Setup:
    loop: RoundLoop
    log: LoggedExecutor
    reporter: Recording
    experiment: Experiment
    arrays: ArrayRecord  # the run's initial global model
    run_dir: Path


@pytest.fixture
def make_loop(tmp_path: Path, one_thread: None) -> Iterator[Callable[..., Setup]]:
    """A RoundLoop as run_server builds it, for a small_config with ``sections``."""
    logs: list[LoggedExecutor] = []

    def make(silent: Collection[int] = (), gone: Collection[int] = (), **sections: Any) -> Setup:
        cfg = parse_config(small_config(tmp_path, **sections))
        experiment = resolve(cfg)
        n = cfg.train.num_clients
        log = LoggedExecutor(InlineExecutor(app, 1, n, 64), silent, gone)
        logs.append(log)
        grid = LocalGrid(log)  # type: ignore[arg-type]
        node_of_partition = {p: node_id_of(p) for p in range(n)}
        model = experiment.initial_model()
        arrays = to_array_record(model.state_dict())
        server = build_server(experiment, ServerSetup(n, frozenset(k for k, _ in model.named_parameters())))
        strategy = CheckedStrategy(server, cfg.strategy.name, arrays, cfg.train.round_timeout_s)
        out = RunDir(tmp_path / f"run{len(logs)}")
        reporter = Recording(experiment, out, False)
        data = experiment.federation().data_sha256
        checkpoints = Checkpointer(cfg, out, grid, node_of_partition, None, data)
        loop = RoundLoop(cfg, grid, strategy, node_of_partition, reporter, checkpoints)
        return Setup(loop, log, reporter, experiment, arrays, out.path)

    yield make
    for log in logs:
        log.shutdown()


def numpy_of(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: array_view(a).astype(np.float64) for k, a in record.items()}


def weighted_mean(replies: list[Message]) -> tuple[dict[str, np.ndarray], float]:
    """FedAvg of ``replies``, computed here in float64: the arrays and the training loss, weighted by samples."""
    weights = np.array([m.content[wire.METRICS][wire.NUM_EXAMPLES] for m in replies], dtype=np.float64)
    weights /= weights.sum()
    arrays = [numpy_of(m.content.array_records[wire.ARRAYS]) for m in replies]
    mean = {k: sum(w * a[k] for w, a in zip(weights, arrays, strict=True)) for k in arrays[0]}
    loss = sum(w * m.content[wire.METRICS][wire.TRAIN_LOSS] for w, m in zip(weights, replies, strict=True))
    return mean, float(loss)


def train_replies(s: Setup, partitions: Collection[int]) -> list[Message]:
    return [
        r for r in s.log.replies
        if r.metadata.message_type == wire.TRAIN and not r.has_error() and wire.partition_of(r) in partitions
    ]  # fmt: skip


def assert_arrays_close(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(got) == set(expected)
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-5, atol=1e-7, err_msg=k)


# --- one round -------------------------------------------------------------------------------


def test_a_round_trains_the_sampled_clients_and_returns_their_weighted_average(make_loop: Callable[..., Setup]) -> None:
    s = make_loop(train={"clients_per_round": 2})
    sampler = ClientSampler(4, 2, 0)
    arrays = s.arrays
    for server_round in (1, 2, 3):
        s.log.replies.clear()
        new, loss = s.loop.train(server_round, arrays)
        chosen = s.log.partitions(wire.TRAIN, server_round)
        assert chosen == sampler.sample(server_round) and len(chosen) == 2  # only the sampled ones are sent
        mean, mean_loss = weighted_mean(train_replies(s, chosen))
        assert_arrays_close(numpy_of(new), mean)
        assert loss == pytest.approx(mean_loss, rel=1e-9)
        arrays = new
    assert [s.log.partitions(wire.TRAIN, r) for r in (1, 2, 3)] == [[1, 3], [0, 1], [2, 3]]  # seed 0's samples


def test_every_message_carries_its_round_and_the_run_config_in_a_record_of_its_hooks_own(
    make_loop: Callable[..., Setup],
) -> None:
    s = make_loop(strategy={"name": "fedprox", "mu": 0.25})
    arrays, _ = s.loop.train(1, s.arrays)
    s.loop.evaluate(1, arrays)
    s.loop.train(2, arrays)
    assert s.log.sent == [(kind, pid, r) for kind, r in [(wire.TRAIN, 1), (wire.EVALUATE, 1), (wire.TRAIN, 2)]
                          for pid in range(4)]  # fmt: skip
    assert [c[wire.RUN_CONFIG] for c in s.log.configs] == [s.experiment.config.to_json()] * 12
    # Flower's strategies write into the record they are given (the round; FedProx its μ for training): each hook
    # gets a fresh one, so the evaluation's messages do not carry what the training's hook wrote
    assert [c.get(PROXIMAL_MU) for c in s.log.configs] == [0.25] * 4 + [None] * 4 + [0.25] * 4


def test_evaluation_scores_every_client_on_its_own_test_split(make_loop: Callable[..., Setup]) -> None:
    s = make_loop(train={"clients_per_round": 1})
    scores = s.loop.evaluate(1, s.arrays)
    assert s.log.partitions(wire.EVALUATE, 1) == [0, 1, 2, 3]  # every client, whoever trained
    assert sorted(scores) == [0, 1, 2, 3]
    fed = s.experiment.federation()
    model = s.experiment.build_model()
    load_arrays(model, s.arrays)
    model.eval()
    for pid, score in scores.items():
        idx = torch.from_numpy(fed.partition.test[pid])
        x, y = fed.dataset.x_test[idx], fed.dataset.y_test[idx]
        with torch.no_grad():
            logits = model(to_float(x))
        assert score.num_examples == len(y) == fed.test_counts[pid].sum()
        assert score.correct == int((logits.argmax(1) == y).sum())
        assert score.loss == pytest.approx(F.cross_entropy(logits, y, reduction="sum").item(), rel=1e-5)


# --- the rounds of a run ---------------------------------------------------------------------


def test_the_loop_reports_every_round_and_evaluates_on_the_cadence(make_loop: Callable[..., Setup]) -> None:
    s = make_loop(train={"rounds": 5}, eval={"every": 2})
    final, scored = s.loop.run(s.arrays, 1)
    told = s.reporter.told
    assert [t.server_round for t in told] == [1, 2, 3, 4, 5]
    assert [t.scores is not None for t in told] == [False, True, False, True, True]  # every 2, and the last
    assert s.log.rounds(wire.TRAIN) == [1, 2, 3, 4, 5] and s.log.rounds(wire.EVALUATE) == [2, 4, 5]
    assert all(isinstance(t.loss, float) and np.isfinite(t.loss) for t in told)
    assert told[-1].loss < told[0].loss  # it learns
    assert len(s.reporter.round_ends) == 5  # each round's training timed
    lines = [json.loads(x) for x in (s.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [2, 4, 5]
    assert [m["train_loss"] for m in lines] == [told[1].loss, told[3].loss, told[4].loss]
    assert [len(m["client_acc"]) for m in lines] == [4, 4, 4]
    assert_arrays_close(numpy_of(final), told[-1].arrays)
    assert scored is final  # FedAvg scores the model it trains
    for before, after in zip(told, told[1:], strict=False):  # each round starts from the last one's model
        assert not np.array_equal(before.arrays["classifier.weight"], after.arrays["classifier.weight"])


def test_checkpoints_follow_checkpoint_every_and_hold_that_rounds_model(make_loop: Callable[..., Setup]) -> None:
    s = make_loop(train={"rounds": 5}, output={"checkpoint_every": 2})
    s.loop.run(s.arrays, 1)
    assert s.log.rounds(wire.SAVE_STATE) == [2, 4]  # at each checkpoint, every client saves its state
    assert all(s.log.partitions(wire.SAVE_STATE, r) == [0, 1, 2, 3] for r in (2, 4))
    checkpoint = Checkpoint.load(s.run_dir)
    assert checkpoint.round == 4
    assert_arrays_close(numpy_of(checkpoint.arrays), s.reporter.told[3].arrays)
    assert [m["round"] for m in checkpoint.metrics] == [2, 4]  # the lines up to it, not round 5's


def test_no_checkpoint_when_checkpoint_every_is_zero(make_loop: Callable[..., Setup]) -> None:
    s = make_loop(train={"rounds": 2}, output={"checkpoint_every": 0})
    s.loop.run(s.arrays, 1)
    assert s.log.rounds(wire.SAVE_STATE) == [] and not (s.run_dir / "checkpoint.pt").exists()


def test_a_resumed_loop_runs_from_the_round_it_is_given_to_the_last(make_loop: Callable[..., Setup]) -> None:
    s = make_loop(train={"rounds": 5}, eval={"every": 2})
    s.loop.run(s.arrays, 4)
    assert [t.server_round for t in s.reporter.told] == [4, 5]
    assert s.log.rounds(wire.TRAIN) == [4, 5] and s.log.rounds(wire.EVALUATE) == [4, 5]


# --- failures --------------------------------------------------------------------------------

# how each kind of failure is set up, which client it hits, and how the loop names it
FAILURES = {
    "raised": ({"strategy": {"name": FLAKY, "fail_partition": 1, "fail_from": 1}}, 1,
               ("client 1: ", "RuntimeError", "injected failure of partition 1 in round 1")),
    "silent": ({"silent": [2]}, 2, ("client 2: ", "train.round_timeout_s", "3600")),
    "gone": ({"gone": [3]}, 3, ("client 3: ", "node 4 ")),
}  # fmt: skip


@pytest.mark.parametrize("kind", FAILURES)
def test_under_skip_a_failed_client_is_left_out_of_the_average_and_recorded(
    make_loop: Callable[..., Setup], kind: str
) -> None:
    setup, failed, _ = FAILURES[kind]
    s = make_loop(train={"on_client_failure": "skip"}, **setup)
    new, loss = s.loop.train(1, s.arrays)
    others = [p for p in range(4) if p != failed]
    mean, mean_loss = weighted_mean(train_replies(s, others))
    assert_arrays_close(numpy_of(new), mean)
    assert loss == pytest.approx(mean_loss, rel=1e-9)
    assert s.reporter.pending_failures == {1: [failed]}  # for the next metrics line


@pytest.mark.parametrize("kind", FAILURES)
def test_under_fail_a_failed_client_stops_the_round_naming_it(make_loop: Callable[..., Setup], kind: str) -> None:
    setup, _, named = FAILURES[kind]
    s = make_loop(train={"on_client_failure": "fail"}, **setup)
    with pytest.raises(TrainingError) as err:
        s.loop.train(1, s.arrays)
    message = str(err.value)  # the round, the client and why, and the policy that goes on (wording: the corpus)
    assert re.match(r"round 1\b.*\btraining\b", message) and all(n in message for n in named), message
    assert "train.on_client_failure" in message and "\n" not in message


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_a_client_silent_in_evaluation_is_left_out_or_stops_the_run(
    make_loop: Callable[..., Setup], policy: str
) -> None:
    s = make_loop(silent=[0, 2], train={"on_client_failure": policy})
    if policy == "fail":
        with pytest.raises(TrainingError, match=r"^round 3\b.*\bevaluation\b.*\bclients 0, 2\b.*round_timeout_s"):
            s.loop.evaluate(3, s.arrays)
        return
    scores = s.loop.evaluate(3, s.arrays)
    assert {p: v is not None for p, v in scores.items()} == {0: False, 1: True, 2: False, 3: True}  # None: failed
    assert s.reporter.pending_failures == {3: [0, 2]}


def test_a_round_without_a_usable_reply_stops_the_run_under_skip_too(make_loop: Callable[..., Setup]) -> None:
    s = make_loop(silent=[0, 1, 2, 3], train={"on_client_failure": "skip"})
    # the reasons in the line itself: nothing else says why the clients failed
    with pytest.raises(TrainingError, match=r"^round 1\b.*\btraining\b.*\bclients 0, 1, 2, 3: no reply\b"):
        s.loop.train(1, s.arrays)
    assert s.reporter.pending_failures == {1: [0, 1, 2, 3]}


def test_a_strategy_that_configures_no_message_for_a_sampled_client_is_refused(
    make_loop: Callable[..., Setup],
) -> None:
    # Flower's FedAvg sampling half the nodes itself, where fedsim offered it all four
    half = {"name": "flwr.serverapp.strategy:FedAvg", "fraction_train": 0.5, "min_train_nodes": 1,
            "min_available_nodes": 1, "min_evaluate_nodes": 1}  # fmt: skip
    s = make_loop(strategy=half)
    with pytest.raises(ConfigError, match=r"^round 1\b.*\btraining\b.*\(FedAvg\).*\bclients \[\d, \d\]"):
        s.loop.train(1, s.arrays)
    assert s.log.partitions(wire.TRAIN, 1) == []  # refused before anything was sent


@pytest.mark.parametrize(
    ("setup", "why"),
    [
        ({"strategy": {"name": DIVERGING, "round": 1, "client": 2}}, r"\bclient 2\b.*\binf$"),
        ({"strategy": {"name": DIVERGING, "round": 1, "client": 2, "where": "weights"}},
         r"\bclient 2\b.*\bclassifier\.weight$"),
    ],
)  # fmt: skip
def test_a_diverged_round_stops_the_run_naming_the_client(
    make_loop: Callable[..., Setup], setup: dict[str, Any], why: str
) -> None:
    s = make_loop(train={"on_client_failure": "skip"}, **setup)  # a divergence stops the run whatever the policy
    with pytest.raises(TrainingError) as err:
        s.loop.train(1, s.arrays)
    assert re.search(rf"\bround 1\b.*{why}", str(err.value)), str(err.value)  # wording: the corpus


def test_a_training_loss_above_max_loss_is_a_divergence_naming_each_such_client(
    make_loop: Callable[..., Setup],
) -> None:
    s = make_loop(train={"max_loss": 2.0})
    with pytest.raises(TrainingError) as err:
        s.loop.train(1, s.arrays)
    losses = {wire.partition_of(r): float(r.content[wire.METRICS][wire.TRAIN_LOSS]) for r in train_replies(s, range(4))}
    above = [p for p, loss in sorted(losses.items()) if loss > 2.0]
    assert 0 < len(above) < 4  # clients 0 and 1 (2.128, 2.207) of seed 0, not 2 and 3 (1.88, 1.926)
    message = str(err.value)  # each such client, its loss and the bound (wording: the corpus)
    assert re.search(r"\bround 1\b", message) and "train.max_loss" in message and "\n" not in message, message
    assert [p for p in range(4) if f"client {p}: " in message] == above, message
    assert all(f"{losses[p]:.4g}" in message for p in above), message


def test_flower_logs_are_quiet_inside_and_as_they_were_after_even_on_an_error() -> None:
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with _flower_logs_quiet():
            assert logger.level == logging.WARNING
        assert logger.level == logging.DEBUG
        with pytest.raises(RuntimeError), _flower_logs_quiet():
            raise RuntimeError
        assert logger.level == logging.DEBUG
    finally:
        logger.setLevel(level)


# --- run_server ------------------------------------------------------------------------------


def serve(cfg_raw: dict[str, Any], **kwargs: Any) -> tuple[dict[str, Any], LoggedExecutor]:
    experiment = resolve(parse_config(cfg_raw))
    log = LoggedExecutor(InlineExecutor(app, 1, experiment.config.train.num_clients, 64))
    try:
        return run_server(LocalGrid(log), experiment, **kwargs), log  # type: ignore[arg-type]
    finally:
        log.shutdown()


@pytest.mark.parametrize("show", [False, True])
def test_run_server_writes_the_run_and_returns_the_summary_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_thread: None, show: bool
) -> None:
    run_dir = tmp_path / "r"
    raw = small_config(tmp_path, output={"run_dir": str(run_dir)})
    torch.set_num_threads(3)
    summary, log = serve(raw, show=show)
    # the run's threads from its first message on (the partition query, before any ClientApp set them)
    assert log.sent[0][0] == wire.QUERY_PARTITION and set(log.threads) == {1}
    assert summary == json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 4 and summary["run_dir"] == str(run_dir) and summary["resumed_from_round"] is None
    assert summary[DATA_FINGERPRINT] == resolve(parse_config(raw)).federation().data_sha256
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [2, 4]
    assert summary["final_client_mean_acc"] == lines[-1]["client_mean_acc"]
    assert summary["final_train_loss"] == lines[-1]["train_loss"]
    model = torch.load(run_dir / "model.pt")
    assert summary[FILES]["model.pt"] == entry_of((run_dir / "model.pt").read_bytes())
    assert model.keys() == resolve(parse_config(raw)).build_model().state_dict().keys()
    assert {p.name for p in run_dir.iterdir()} >= {"config.yaml", "partition.csv", "progress.json"}
    assert log.rounds(wire.SAVE_STATE) == []  # output.checkpoint_every: 0
    err = capsys.readouterr().err
    assert ("partition (train samples per class)" in err and "fedsim run summary" in err) == show
    assert err == "" or show  # output.progress: false in the config, and show=False: silent


def test_run_server_without_save_model_writes_no_model(tmp_path: Path, one_thread: None) -> None:
    run_dir = tmp_path / "r"
    summary, _ = serve(small_config(tmp_path, output={"run_dir": str(run_dir), "save_model": False}))
    assert "model.pt" not in summary[FILES] and not (run_dir / "model.pt").exists()
    assert (run_dir / "summary.json").is_file()


def test_a_run_stopped_in_a_round_says_in_one_line_where_it_stands_on_disk(tmp_path: Path, one_thread: None) -> None:
    run_dir = tmp_path / "r"
    raw = small_config(
        tmp_path,
        strategy={"name": DIVERGING, "round": 3, "client": 1},
        output={"run_dir": str(run_dir), "checkpoint_every": 2},
    )
    logger = logging.getLogger("flwr")
    level = logger.level
    with pytest.raises(TrainingError) as err:
        serve(raw)
    message = str(err.value)  # the round, the client, and the checkpoint's round and place (wording: the corpus)
    assert re.search(r"\bround 3\b.*\bclient 1\b", message) and "\n" not in message, message
    assert re.search(rf"\bround 2\b.*{re.escape(str(run_dir))}\b", message), message
    assert logger.level == level
    assert Checkpoint.load(run_dir).round == 2 and not (run_dir / "summary.json").exists()
