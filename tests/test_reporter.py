"""What a run reports (fedsim/server/reporter.py): the global model scored on the whole test set (accuracy, mean
loss, per-class accuracy), a metrics.jsonl line per evaluation round (each scored client's accuracy in partition
order, their unweighted mean, personalised accuracies on their rounds, the clients sampled, the clients left out
since the last line, diagnostics), progress.json every round, a divergence stopping the run before any line, a
resume going on from its checkpoint's clock and line, the steady round time, the summary, the warning on clients
left out, and the process's resident memory. The reporter is fedsim's, on the shipped MNIST subset; the global model
is built so that every image's logits are one vector chosen here, whose accuracies and loss are known exactly."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

import fedsim.server.reporter as reporter_module
from fedsim.arrays import array_view, to_array_record
from fedsim.config_file import parse_config
from fedsim.errors import TrainingError
from fedsim.experiment.resolve import Experiment, resolve
from fedsim.record.writer import RunDir
from fedsim.server.reporter import ClientScore, ClientsLeftOut, GlobalEvaluator, RoundReporter, resident_mb
from tests.conftest import small_config
from tests.fault_lines import fault_line

LOGITS = [0.0, 0.5, 0.0, 2.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0]  # every image's: class 3 predicted


class Clock:
    """time.perf_counter as the reporter reads it, moved by the test."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def perf_counter(self) -> float:
        return self.now


class Diagnostics:
    """A run's diagnostics as the reporter calls them: what it was asked, and a metric of its own."""

    def __init__(self) -> None:
        self.at_init_calls: list[tuple[ArrayRecord, int]] = []

    def at_init(self, arrays: ArrayRecord, seed: int = 0) -> None:
        self.at_init_calls.append((arrays, seed))

    def __call__(self, arrays: ArrayRecord) -> dict[str, Any]:
        return {"feature_erank": 3.5}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The reporter's clock, at 100 s until the test moves it."""
    fake = Clock(100.0)
    monkeypatch.setattr(reporter_module, "time", fake)
    return fake


def experiment(tmp_path: Path, **sections: Any) -> Experiment:
    """A run of 6 rounds evaluated every 2, without the global test set unless ``sections`` ask."""
    base: dict[str, Any] = {"train": {"rounds": 6}, "eval": {"every": 2, "global_test": False}}
    for key, value in sections.items():
        base[key] = {**base[key], **value} if key in base else value
    return resolve(parse_config(small_config(tmp_path, **base)))


def reporter(tmp_path: Path, **sections: Any) -> RoundReporter:
    return RoundReporter(experiment(tmp_path, **sections), RunDir(tmp_path / "run"), False)


def lines(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def progress(tmp_path: Path) -> tuple[int, float | None, float | None]:
    written = json.loads((tmp_path / "run" / "progress.json").read_text())
    return written["round"], written["loss"], written["acc"]


def constant_logits(exp: Experiment, logits: list[float]) -> ArrayRecord:
    """The run's MLP with every image's logits ``logits``: its hidden norm's gain 0 and bias the first unit vector,
    so every image's feature is that vector, and the classifier's first column ``logits``."""
    state = exp.initial_model().state_dict()
    hidden = state["fc_norms.0.weight"].numel()
    state["fc_norms.0.weight"] = torch.zeros(hidden)
    state["fc_norms.0.bias"] = torch.eye(hidden)[0]
    state["classifier.weight"] = torch.zeros(len(logits), hidden)
    state["classifier.weight"][:, 0] = torch.tensor(logits)
    model = exp.build_model()
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():  # what the arrays make of three images
        x = exp.federation().dataset.x_test[:3].float() / 255
        assert torch.equal(model(x), torch.tensor([logits] * 3))
    return to_array_record(state)


def expected_scores(y: torch.Tensor, logits: list[float]) -> tuple[float, float, list[float]]:
    """Accuracy, mean cross-entropy and per-class accuracy of one ``logits`` vector for every image of labels ``y``,
    in float64 here: the argmax class is right on its own images, every other class on none."""
    counts = np.bincount(y.numpy(), minlength=len(logits))
    predicted = int(np.argmax(logits))
    lse = math.log(sum(math.exp(v) for v in logits))
    loss = sum(int(n) * (lse - logits[c]) for c, n in enumerate(counts)) / len(y)
    per_class = [1.0 if c == predicted and counts[c] else 0.0 for c in range(len(logits))]
    return counts[predicted] / len(y), loss, per_class


# --- the global model on the whole test set -------------------------------------------------


def test_the_global_evaluator_scores_the_whole_test_set(tmp_path: Path, one_thread: None) -> None:
    exp = experiment(tmp_path, eval={"global_test": True})
    evaluator = GlobalEvaluator(exp)
    scored = evaluator(constant_logits(exp, LOGITS))
    acc, loss, per_class = expected_scores(evaluator.y, LOGITS)
    assert len(evaluator.y) == 1000 and acc == 0.1  # 100 images of class 3 in the subset's 1,000
    assert scored["global_acc"] == acc and scored["per_class_acc"] == per_class
    assert scored["global_loss"] == pytest.approx(loss, rel=1e-5)


def test_a_class_without_test_images_scores_zero_not_nan(tmp_path: Path, one_thread: None) -> None:
    exp = experiment(tmp_path)
    evaluator = GlobalEvaluator(exp)
    kept = torch.nonzero((evaluator.y != 9) & (evaluator.y != 3)).flatten()[:150]  # no 9, no 3: the class predicted
    evaluator.x, evaluator.y = evaluator.x[kept], evaluator.y[kept]
    logits = [0.0] * 9 + [1.5]  # class 9 predicted, which has no image
    scored = evaluator(constant_logits(exp, logits))
    acc, loss, per_class = expected_scores(evaluator.y, logits)
    assert scored["per_class_acc"] == per_class == [0.0] * 10 and scored["global_acc"] == acc == 0.0
    assert scored["global_loss"] == pytest.approx(loss, rel=1e-5)


# --- a round's line ---------------------------------------------------------------------------


def test_a_round_without_evaluation_moves_the_progress_and_writes_no_line(tmp_path: Path) -> None:
    r = reporter(tmp_path)
    r.round_done(1, ArrayRecord(), 0.75, None)
    assert progress(tmp_path) == (1, 0.75, None)
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and r.last == {}


def test_a_line_lists_each_clients_accuracy_by_partition_and_their_unweighted_mean(
    tmp_path: Path, clock: Clock
) -> None:
    r = reporter(tmp_path)
    clock.now = 102.25
    scores = {3: ClientScore(40, 30, 12.0), 0: ClientScore(50, 10, 20.0), 2: None, 1: ClientScore(0, 0, 0.0)}
    r.round_done(2, ArrayRecord(), 1.25, scores)
    (line,) = lines(tmp_path)
    assert set(line) == {"round", "time_s", "train_loss", "client_mean_acc", "client_acc", "rss_mb"}
    # partition order; None: no test data (1) or failed (2); the mean over the clients scored, not by samples
    assert line["client_acc"] == [10 / 50, None, None, 30 / 40]
    assert line["client_mean_acc"] == (0.2 + 0.75) / 2 != (10 + 30) / (50 + 40)
    assert (line["round"], line["time_s"], line["train_loss"]) == (2, 2.25, 1.25)
    assert isinstance(line["rss_mb"], float) and line["rss_mb"] > 0
    assert progress(tmp_path) == (2, 1.25, 0.475) and r.last == line


def test_a_line_without_a_client_scored_has_no_mean(tmp_path: Path) -> None:
    reporter(tmp_path).round_done(2, ArrayRecord(), None, {0: None, 1: ClientScore(0, 0, 0.0)})
    (line,) = lines(tmp_path)
    assert (line["client_acc"], line["client_mean_acc"], line["train_loss"]) == ([None, None], None, None)
    assert progress(tmp_path) == (2, None, None)


def test_a_line_adds_the_global_models_scores_and_the_diagnostics(tmp_path: Path, one_thread: None) -> None:
    exp = experiment(tmp_path, eval={"global_test": True})
    r = RoundReporter(exp, RunDir(tmp_path / "run"), False)
    r.diagnostics = Diagnostics()  # type: ignore[assignment]
    r.round_done(2, constant_logits(exp, LOGITS), 0.5, {0: ClientScore(10, 5, 3.0)})
    (line,) = lines(tmp_path)
    acc, loss, per_class = expected_scores(exp.federation().dataset.y_test, LOGITS)
    assert (line["global_acc"], line["per_class_acc"], line["feature_erank"]) == (acc, per_class, 3.5)
    assert line["global_loss"] == pytest.approx(loss, rel=1e-5)


def test_personalised_rounds_add_the_personal_accuracies(tmp_path: Path) -> None:
    r = reporter(tmp_path, eval={"personal": {"steps": 0, "every": 4}})  # rounds 4 and 6 (the last)
    for server_round in (2, 4, 6):
        personal = None if server_round == 2 else 3 * server_round
        r.round_done(server_round, ArrayRecord(), 0.5, {1: ClientScore(40, 8, 1.0, personal), 0: None})
    first, *personalised = lines(tmp_path)
    assert "personal_acc" not in first and "client_personal_acc" not in first
    for line, correct in zip(personalised, (12, 18), strict=True):
        assert line["client_personal_acc"] == [None, correct / 40] and line["personal_acc"] == correct / 40
        assert line["client_acc"] == [None, 0.2]


def test_a_sample_of_clients_lists_which_clients_it_scored(tmp_path: Path) -> None:
    reporter(tmp_path, eval={"clients": 2}).round_done(2, ArrayRecord(), 0.5, {3: ClientScore(10, 1, 1.0), 1: None})
    (line,) = lines(tmp_path)
    assert (line["eval_clients"], line["client_acc"], line["client_mean_acc"]) == ([1, 3], [None, 0.1], 0.1)


def test_clients_left_out_are_listed_once_in_the_next_line(tmp_path: Path) -> None:
    r = reporter(tmp_path, train={"rounds": 14})
    r.left_out(10, [2, 0])
    r.left_out(10, [0, 3])  # training and evaluation of one round: one sorted list
    r.left_out(9, [1])
    assert r.pending_failures == {10: [0, 2, 3], 9: [1]}
    r.round_done(11, ArrayRecord(), 0.5, None)  # not an evaluation: kept for the next line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    r.round_done(12, ArrayRecord(), 0.5, {0: ClientScore(10, 1, 1.0)})
    r.round_done(14, ArrayRecord(), 0.5, {0: ClientScore(10, 1, 1.0)})
    first, second = lines(tmp_path)
    assert list(first["failed_clients"].items()) == [("9", [1]), ("10", [0, 2, 3])]  # by round, as numbers
    assert "failed_clients" not in second and r.pending_failures == {}


def test_a_non_finite_client_loss_stops_the_run_before_its_line(tmp_path: Path) -> None:
    r = reporter(tmp_path)
    r.round_done(1, ArrayRecord(), 0.5, None)
    arrays = to_array_record({"w": torch.tensor([0.5, -7.25]), "v": torch.tensor([3.0])})
    scores = {0: ClientScore(10, 1, 5.0), 1: ClientScore(10, 1, math.inf), 2: None, 3: ClientScore(10, 1, math.nan)}
    with pytest.raises(TrainingError) as err:
        r.round_done(2, arrays, 0.5, scores)
    message = str(err.value)  # the round, the clients and the largest weight (wording: fault_lines.py)
    assert re.search(r"\bround 2\b", message), message
    assert re.search(fault_line("evaluation", where="clients 1, 3", largest="7.25"), message), message
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and progress(tmp_path) == (1, 0.5, None)


def test_a_global_model_too_large_for_a_forward_pass_stops_the_run_naming_the_test_set(
    tmp_path: Path, one_thread: None
) -> None:
    exp = experiment(tmp_path, eval={"global_test": True})
    r = RoundReporter(exp, RunDir(tmp_path / "run"), False)
    arrays = constant_logits(exp, [3e38, -3e38] + [0.0] * 8)  # finite weights, logits 6e38 apart: an inf loss
    largest = max(float(np.abs(array_view(a)).max()) for a in arrays.values())
    with pytest.raises(TrainingError) as err:
        r.round_done(4, arrays, 0.5, {0: ClientScore(10, 1, math.inf), 1: ClientScore(10, 1, 2.0)})
    where = fault_line("evaluation", where="clients 0 and on the whole test set", largest=re.escape(f"{largest:.3g}"))
    assert re.search(r"\bround 4\b", str(err.value)) and re.search(where, str(err.value)), str(err.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# --- resume, time and summary -----------------------------------------------------------------


def test_a_resume_goes_on_from_the_checkpoints_clock_line_and_failures(tmp_path: Path, clock: Clock) -> None:
    r = reporter(tmp_path)
    r.diagnostics = Diagnostics()  # type: ignore[assignment]
    before = {"round": 2, "train_loss": 0.9, "client_mean_acc": 0.4}
    r.resume(40.0, [{"round": 1}, before], {3: [1]}, 3, ArrayRecord())
    assert r.elapsed_s() == 40.0 and r.last == before and r.pending_failures == {3: [1]}
    assert progress(tmp_path) == (3, 0.9, 0.4)
    assert r.diagnostics.at_init_calls == []  # type: ignore[union-attr]  # the first line was written before
    clock.now += 2.5
    r.round_done(4, ArrayRecord(), 0.8, {0: ClientScore(10, 5, 1.0)})
    (line,) = lines(tmp_path)
    assert line["time_s"] == 42.5 and line["failed_clients"] == {"3": [1]}


def test_a_resume_before_the_first_line_takes_the_initial_models_diagnostics(tmp_path: Path, clock: Clock) -> None:
    r = reporter(tmp_path, seed=5)
    r.diagnostics = Diagnostics()  # type: ignore[assignment]
    initial = to_array_record({"w": torch.ones(2)})
    r.resume(3.0, [], {}, 1, initial)
    assert r.diagnostics.at_init_calls == [(initial, 5)] and r.last == {}  # type: ignore[union-attr]
    assert progress(tmp_path) == (1, None, None) and r.elapsed_s() == 3.0


def test_the_steady_round_time_leaves_out_the_first_round(tmp_path: Path, clock: Clock) -> None:
    r = reporter(tmp_path)
    assert r.seconds_per_round() is None
    for now in (110.0, 112.0, 116.5):
        clock.now = now
        r.trained()
        if now == 110.0:
            assert r.seconds_per_round() is None  # one round: no steady cost yet
    assert r.round_ends == [110.0, 112.0, 116.5] and r.seconds_per_round() == 3.25


@pytest.mark.parametrize(("done_before", "resumed_from"), [(0, None), (4, 4)])
def test_the_summary_holds_the_runs_times_and_final_numbers(
    tmp_path: Path, clock: Clock, done_before: int, resumed_from: int | None
) -> None:
    r = reporter(tmp_path)
    for server_round, correct, loss in ((2, 6, 1.5), (4, 3, 1.25), (6, 5, 1.0)):
        clock.now += 1.0
        r.trained()
        r.round_done(server_round, ArrayRecord(), loss, {0: ClientScore(10, correct, 1.0)})
    clock.now = 107.0
    summary = r.summary(done_before)
    assert summary == {
        "name": "t", "run_dir": str(tmp_path / "run"), "rounds": 6, "wall_time_s": 7.0,
        "rounds_per_s": 0.857,  # 6 / 7
        "steady_s_per_round": 1.0, "resumed_from_round": resumed_from,
        "final_client_mean_acc": 0.5, "best_client_mean_acc": 0.6, "final_global_acc": None,
        "final_train_loss": 1.0, "per_class_acc": None,
    }  # fmt: skip


def test_clients_left_out_are_said_once_at_the_end_the_first_rounds_named(tmp_path: Path) -> None:
    r = reporter(tmp_path, train={"rounds": 14})
    for server_round in (2, 4, 6, 8, 10, 12, 14):  # every line with failures, of 7 rounds
        r.left_out(server_round - 1, [server_round % 3])
        if server_round == 6:
            r.left_out(6, [0, 3])
        r.round_done(server_round, ArrayRecord(), 0.5, {0: ClientScore(10, 1, 1.0)})
    with pytest.warns(ClientsLeftOut) as said:
        r.say_left_out()
    (warning,) = said
    shown = re.escape("round 1: 2; round 3: 1; round 5: 0; round 6: 0, 3; round 7: 2")  # the first five of eight
    row = fault_line("rounds skipped", rounds=shown + r"\D*\b3\b\D*").removeprefix("fedsim: warning: ")
    assert re.fullmatch(row, str(warning.message)), str(warning.message)


def test_a_run_without_clients_left_out_says_nothing(tmp_path: Path) -> None:
    r = reporter(tmp_path)
    r.round_done(2, ArrayRecord(), 0.5, {0: ClientScore(10, 1, 1.0)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r.say_left_out()


def test_resident_memory_is_the_processes_rss_in_mib() -> None:
    kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:"))
    mib = resident_mb()
    assert mib == round(mib, 1) and abs(mib - kib / 1024) < 64  # the same measure, read apart; within 64 MiB
    assert mib > 50  # this process holds torch
