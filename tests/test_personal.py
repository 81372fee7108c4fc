"""Personalised evaluation (``eval.personal``): each client's model fine-tuned from the global one, scored on its
test split beside the global model's client-mean accuracy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

import fedsim
from fedsim.app.cli import main
from fedsim.config import EvalConfig
from fedsim.config_file import parse_config, read_run_config
from fedsim.data.batches import BatchStream
from fedsim.engines.runner import run
from fedsim.errors import ConfigError
from fedsim.experiment.resolve import resolve
from fedsim.models import FedsimModel
from fedsim.record.checkpoint import _check_same_run as check_same_run
from fedsim.strategies import ClientHooks, StrategySpec
from fedsim.strategies.hooks import FineTune
from tests.conftest import one_line, small_config, write_config

WALL_CLOCK = ("time_s", "rss_mb")  # facts about the machine, not results


def run_lines(tmp_path: Path, name: str, **sections: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary and the metrics lines (wall-clock fields dropped) of a small run."""
    summary = run(parse_config(small_config(tmp_path, name=name, **sections)))
    lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    return summary, [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK} for line in lines]


def fine_tuned_accuracy(run_dir: Path, pid: int, steps: int, lr: float, classifier_only: bool) -> float:
    """Client ``pid``'s accuracy after fine-tuning the run's final global model by hand: ``steps`` steps of plain
    SGD (no momentum, no weight decay) on cross-entropy, on the batches fedsim draws for the fine-tuning (a seed
    sequence of the run's seed, the round, the client and 1), the body frozen when ``classifier_only``."""
    cfg = read_run_config(run_dir / "config.yaml")
    experiment = resolve(cfg)
    fed = experiment.federation()
    model = experiment.build_model()
    model.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))
    seed = int(np.random.SeedSequence([cfg.seed, cfg.train.rounds, pid, 1]).generate_state(1)[0])
    train = torch.from_numpy(fed.partition.train[pid])
    stream = BatchStream(
        fed.dataset.x_train[train], fed.dataset.y_train[train], cfg.train.batch_size,
        torch.Generator().manual_seed(seed),
    )  # fmt: skip
    tuned = list(model.classifier.parameters()) if classifier_only else list(model.parameters())
    model.train()
    for x, y in stream.batches(steps):
        if classifier_only:
            with torch.no_grad():
                z = model.eval().forward_features(x)
            loss = F.cross_entropy(model.classifier(z), y)
        else:
            loss = F.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, tuned)
        with torch.no_grad():
            for p, g in zip(tuned, grads, strict=True):
                p -= lr * g
    test = torch.from_numpy(fed.partition.test[pid])
    x_test, y_test = fed.dataset.x_test[test], fed.dataset.y_test[test]
    with torch.no_grad():
        predicted = model.eval()(fed.input_transform(cfg.data.normalize)(x_test)).argmax(1)
    return float((predicted == y_test).double().mean())


@pytest.mark.parametrize(
    ("personal", "lr", "classifier_only", "train"),
    [
        ({"steps": 4}, 0.05, False, {}),
        ({"steps": 3, "params": "classifier", "lr": 0.2}, 0.2, True, {}),
        # the rounds' steps clipped hard (a gradient norm of 1 to 3 here), the fine-tuning's not at all
        ({"steps": 4}, 0.05, False, {"max_grad_norm": 1e-3}),
    ],
    ids=["all", "classifier", "rounds-clipped"],
)
def test_personal_accuracy_is_the_hand_fine_tuned_models(
    tmp_path: Path, one_thread: None, personal: dict[str, Any], lr: float, classifier_only: bool, train: dict
) -> None:
    summary, lines = run_lines(tmp_path, "p", eval={"every": 2, "personal": personal}, train=train)
    run_dir = Path(summary["run_dir"])
    by_hand = [fine_tuned_accuracy(run_dir, pid, personal["steps"], lr, classifier_only) for pid in range(4)]
    assert lines[-1]["client_personal_acc"] == pytest.approx(by_hand, abs=1e-12)
    assert lines[-1]["personal_acc"] == pytest.approx(float(np.mean(by_hand)), abs=1e-12)
    assert lines[-1]["personal_acc"] != lines[-1]["client_mean_acc"]  # the fine-tuning changed something


def test_personal_evaluation_leaves_every_other_number_as_it_was(tmp_path: Path, one_thread: None) -> None:
    off_summary, off = run_lines(tmp_path, "off")
    default_summary, default = run_lines(tmp_path, "default", eval={"every": 2, "personal": {"steps": None}})
    on_summary, on = run_lines(tmp_path, "on", eval={"every": 2, "personal": {"steps": 5}})
    zero_summary, zero = run_lines(tmp_path, "zero", eval={"every": 2, "personal": {"steps": 0}})
    assert default == off  # off (null), written or not: the same lines, bit for bit
    assert "personal_acc" not in off[-1] and "final_personal_acc" not in off_summary
    personal = ("personal_acc", "client_personal_acc")
    assert [{k: v for k, v in line.items() if k not in personal} for line in on] == off  # training untouched
    assert [line["round"] for line in on] == [2, 4]
    # no fine-tuning: the personalised model is the global one a client trains from (FedAvg: the one it is scored on)
    assert [line["client_personal_acc"] for line in zero] == [line["client_acc"] for line in zero]
    assert zero[-1]["personal_acc"] == zero[-1]["client_mean_acc"]
    assert on_summary["final_personal_acc"] == on[-1]["personal_acc"]
    assert on_summary["best_personal_acc"] == max(line["personal_acc"] for line in on)
    assert on_summary["final_client_mean_acc"] == off_summary["final_client_mean_acc"]


def test_personal_evaluation_every_k_rounds_scores_those_rounds_and_the_last(tmp_path: Path, one_thread: None) -> None:
    train = {"rounds": 5}
    _, every = run_lines(tmp_path, "every", train=train, eval={"every": 1, "personal": {"steps": 4}})
    sparse_eval = {"every": 1, "personal": {"steps": 4, "every": 2}}
    summary, sparse = run_lines(tmp_path, "sparse", train=train, eval=sparse_eval)
    personal = ("personal_acc", "client_personal_acc")
    assert [[k in line for k in personal] for line in sparse] == [[r in (2, 4, 5)] * 2 for r in range(1, 6)]
    # rounds 2, 4 and the last: the numbers personalising at every evaluation gives; the other lines as they were
    assert [line for line in sparse if "personal_acc" in line] == [line for line in every if line["round"] in (2, 4, 5)]
    assert [{k: v for k, v in line.items() if k not in personal} for line in sparse] == [
        {k: v for k, v in line.items() if k not in personal} for line in every
    ]
    assert summary["final_personal_acc"] == every[-1]["personal_acc"]
    assert summary["best_personal_acc"] == max(line["personal_acc"] for line in every if line["round"] in (2, 4, 5))


def test_personal_accuracy_reaches_the_report_and_the_api(tmp_path: Path, one_thread: None) -> None:
    summary, lines = run_lines(tmp_path, "p", eval={"every": 2, "personal": {"steps": 5}})
    run_dir = Path(summary["run_dir"])
    found = fedsim.open_run(run_dir)
    assert found.summary["final_personal_acc"] == lines[-1]["personal_acc"]
    assert found.metrics["personal_acc"].tolist() == [line["personal_acc"] for line in lines]
    assert found.metrics["client_personal_acc"].tolist() == [line["client_personal_acc"] for line in lines]
    assert main(["report", str(run_dir.parent)]) == 0
    header, row = (line.strip("|").split(" | ") for line in (run_dir.parent / "results.md").read_text().splitlines()
                   if "---" not in line)  # fmt: skip
    shown = dict(zip([h.strip() for h in header], [c.strip() for c in row], strict=True))
    assert shown["final personal acc %"] == f"{100 * summary['final_personal_acc']:.2f}"
    assert shown["best personal acc %"] == f"{100 * summary['best_personal_acc']:.2f}"
    assert shown["final client-mean acc %"] == f"{100 * summary['final_client_mean_acc']:.2f}"
    table = fedsim.open_sweep(run_dir.parent).table()
    assert table["final personal acc %"].tolist() == [shown["final personal acc %"]]


class KeepsGlobalClient(ClientHooks):
    """A personalisation of its own: the model as loaded for training, not fine-tuned."""

    def personalize(self, model: FedsimModel, state: RecordDict, fine_tune: FineTune) -> FedsimModel:
        return model


class KeepsGlobal(StrategySpec):
    """FedAvg whose personalised model is the global one (test strategy)."""

    Client = KeepsGlobalClient


def test_a_strategy_personalises_through_its_hook(tmp_path: Path, one_thread: None) -> None:
    strategy = {"name": f"{__name__}:KeepsGlobal"}
    _, own = run_lines(tmp_path, "own", strategy=strategy, eval={"every": 2, "personal": {"steps": 5}})
    _, generic = run_lines(tmp_path, "generic", eval={"every": 2, "personal": {"steps": 5}})
    assert [line["client_personal_acc"] for line in own] == [line["client_acc"] for line in own]
    assert generic[-1]["personal_acc"] != generic[-1]["client_mean_acc"]



@pytest.mark.parametrize(
    ("strategy", "personal", "named"),
    [
        # FedRoD scores its personal head and FedETF its local adaptation: no fine-tuning steps, params or lr
        ({"name": "fedrod"}, {"steps": 3}, "eval.personal.steps = 3: strategy 'fedrod' personalises its own way"),
        ({"name": "fedrod"}, {"steps": 0, "lr": 0.5}, "eval.personal.lr = 0.5: strategy 'fedrod'"),
        ({"name": "fedetf"}, {"steps": 0, "params": "classifier"}, "eval.personal.params = 'classifier': strategy"),
        # the local adaptation's own options, with personalised evaluation off or the adaptation off
        ({"name": "fedetf", "adapt_epochs": 5}, {}, "strategy.adapt_epochs is read only by fedetf's personalisation"),
        ({"name": "fedetf", "adaptation": False}, {}, "strategy.adaptation is read only by fedetf's"),
        (
            {"name": "fedetf", "adaptation": False, "adapt_alternations": 500}, {"steps": 2},
            "strategy.adapt_alternations = 500 for strategy 'fedetf': read only by the local adaptation",
        ),
        # a strategy that fine-tunes, for no step
        ({"name": "fedavg"}, {"steps": 0, "lr": 0.5}, "eval.personal.lr = 0.5: eval.personal.steps is 0, so no"),
        ({"name": "fedetf", "adaptation": False}, {"steps": 0, "params": "classifier"}, "eval.personal.params = "),
    ],
)  # fmt: skip
def test_what_personalised_evaluation_would_not_read_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], strategy: dict, personal: dict, named: str
) -> None:
    """A value that changes nothing would be a measurement believed made, as eval.personal.lr without steps is."""
    config = write_config(tmp_path, small_config(tmp_path, strategy=strategy, eval={"personal": personal}))
    assert main(["run", str(config)]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"fedsim: error: {named}")
    assert not list(tmp_path.rglob("metrics.jsonl"))


@pytest.mark.parametrize(
    ("strategy", "personal"),
    [
        ({"name": "fedrod"}, {"steps": 0, "every": 2}),  # on, scored every 2 rounds
        ({"name": "fedetf", "adapt_epochs": 5}, {"steps": 0}),
        ({"name": "fedetf", "adaptation": False}, {"steps": 3, "params": "classifier", "lr": 0.5}),  # generic
        ({"name": f"{__name__}:KeepsGlobal"}, {"steps": 5}),  # a plugin's own personalize: fedsim cannot tell
    ],
)
def test_what_personalised_evaluation_reads_is_accepted(tmp_path: Path, strategy: dict, personal: dict) -> None:
    resolve(parse_config(small_config(tmp_path, strategy=strategy, eval={"every": 2, "personal": personal})))

def test_a_checkpoint_written_before_personal_evaluation_resumes_under_its_default() -> None:
    cfg = parse_config(small_config(Path("/nonexistent")))
    saved = json.loads(cfg.to_json())
    del saved["eval"]["personal"]  # the config a checkpoint of an earlier fedsim holds
    check_same_run(cfg, json.dumps(saved))  # the same run: no error
    with pytest.raises(ConfigError, match=r"eval.personal.steps: None -> 5"):
        check_same_run(cfg.model_copy(update={"eval": EvalConfig(personal={"steps": 5})}), json.dumps(saved))
