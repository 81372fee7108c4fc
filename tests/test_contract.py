"""A strategy plugin is checked where its hooks return into fedsim: an aggregate that is not the whole model
(tensors left out or added, another dtype, None) and a hook that raises each stop the run with one line
naming the plugin, the hook and what is wrong; no model.pt is written from a broken aggregate."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedsim.app.cli import main
from fedsim.arrays import to_array_record
from fedsim.errors import DEBUG_ENV
from fedsim.server.contract import model_mismatch, shapes_of
from tests.conftest import small_config, write_config

PLUGIN = "tests.plugins.broken_aggregation:BrokenAggregation"
HOOK = f"strategy '{PLUGIN}': BrokenFedAvg"


@pytest.mark.parametrize(
    ("breaks", "says"),
    [
        (
            "one_tensor",
            "aggregate_train returned 1 of the model's 4 tensors (missing fc_norms.0.weight, "
            "fc_norms.0.bias, classifier.weight); it must return every tensor of the model",
        ),
        ("none", "aggregate_train returned None as the model; it must return every tensor of the model"),
        (
            "int64",
            "aggregate_train returned fcs.0.weight as int64; the model's is float32; it must return every "
            "tensor of the model",
        ),
        ("raises", f"aggregate_train raised ValueError: the replies disagree ({DEBUG_ENV}=1 shows where)"),
        ("configure_raises", f"configure_train raised KeyError: 'learning_rate' ({DEBUG_ENV}=1 shows where)"),
    ],
)
def test_a_broken_strategy_is_one_line_naming_plugin_and_hook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], breaks: str, says: str
) -> None:
    raw = small_config(tmp_path, strategy={"name": PLUGIN, "breaks": breaks}, train={"rounds": 1, "local_steps": 1})
    raw["output"]["run_dir"] = str(tmp_path / "r")
    assert main(["run", str(write_config(tmp_path, raw))]) == 2
    err = capsys.readouterr().err
    assert err == f"fedsim: error: {HOOK}.{says}\n"
    assert not (tmp_path / "r" / "model.pt").exists() and not (tmp_path / "r" / "summary.json").exists()


def test_the_debug_switch_lets_the_traceback_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEBUG_ENV, "")  # fedsim --debug sets it for the processes it starts; undone after the test
    raw = small_config(tmp_path, strategy={"name": PLUGIN, "breaks": "raises"}, train={"rounds": 1, "local_steps": 1})
    with pytest.raises(ValueError, match="the replies disagree"):
        main(["--debug", "run", str(write_config(tmp_path, raw))])
    assert os.environ[DEBUG_ENV] == "1"


MODEL = to_array_record({"w": torch.zeros(2, 3), "b": torch.zeros(3), "n": torch.zeros((), dtype=torch.int64)})


def record(**changes: Array | None) -> ArrayRecord:
    arrays = {k: a for k, a in MODEL.items() if k not in changes}
    return ArrayRecord({**arrays, **{k: a for k, a in changes.items() if a is not None}})


@pytest.mark.parametrize(
    ("aggregate", "says"),
    [
        (MODEL, ""),
        # Flower's FedAvg averages an integer counter (BatchNorm's num_batches_tracked) into a float
        (record(n=Array(np.array(1.0))), ""),
        ({"w": 1}, "returned a dict as the model"),
        (record(b=None), "returned 2 of the model's 3 tensors (missing b)"),
        (record(x=Array(np.zeros(1, np.float32))), "returned tensors the model does not have (x)"),
        (record(b=Array(np.zeros(4, np.float32))), "returned b of shape (4,); the model's is (3,)"),
        # Flower's FedAdam steps float32 weights in float64
        (record(w=Array(np.zeros((2, 3)))), ""),
        (record(w=Array(np.zeros((2, 3), np.int64))), "returned w as int64; the model's is float32"),
    ],
)
def test_an_aggregate_must_be_the_whole_model(aggregate: object, says: str) -> None:
    assert model_mismatch(shapes_of(MODEL), aggregate) == says
