"""Meaningful values only: a config or dataset that would run to a number that means nothing is refused up front.

Rows of the bad-input corpus (:mod:`tests.test_bad_inputs`: exit status 2, one ``fedsim: error:`` line,
nothing created), grouped by the audit of issue 25 that found them, each of which ran to exit 0 before:
booleans and text taken as numbers (``train.num_clients=true`` trained 1 client, ``train.lr=true`` at 1.0),
``train.local_steps=0`` recorded ``train_loss: 0.0`` for rounds of no training, ``simulation.threads=1000000``
crashed torch (SIGSEGV), an npz label of 1,000,000 built a 1,000,001-class model, a one-class dataset scored
accuracy 1.0 and loss 0, a test label absent from training was scored, and zero test images failed with
ZeroDivisionError after training.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torch import nn

from fedsim.app.cli import main
from fedsim.errors import ConfigError
from fedsim.experiment.resolve import load_experiment
from fedsim.models import FedsimModel, size
from tests import test_bad_inputs as corpus
from tests.conftest import small_config, write_config
from tests.test_option_ranges import corpus_rows

run = corpus.run
FLOWER = "flwr.serverapp.strategy"
LABELS = np.arange(20, dtype=np.int64) % 10  # the corpus npz: 20 images, two of each of 10 classes


def _labels(**changes: int) -> np.ndarray:
    """The corpus labels with ``i<index>=<label>`` changes."""
    y = LABELS.copy()
    for index, label in changes.items():
        y[int(index.removeprefix("i"))] = label
    return y


SETUPS = {
    "label_a_million": lambda tmp: corpus._npz(tmp / "d.npz", y_train=_labels(i0=1_000_000)),
    "label_far_beyond": lambda tmp: corpus._npz(tmp / "d.npz", y_train=_labels(i0=50_000)),
    "test_label_untrained": lambda tmp: corpus._npz(tmp / "d.npz", y_train=_labels(i9=8, i19=8)),
    "class_untested": lambda tmp: corpus._npz(tmp / "d.npz", y_test=_labels(i3=4, i13=4)),
    "one_class": lambda tmp: corpus._npz(tmp / "d.npz", y_train=LABELS * 0, y_test=LABELS * 0),
    "no_test_images": lambda tmp: corpus._npz(
        tmp / "d.npz", x_test=np.zeros((0, 28, 28), np.uint8), y_test=np.zeros(0, np.int64)
    ),
    "one_class_imagefolder": lambda tmp: _one_class_tree(tmp / "one"),
    "sweep_named": lambda tmp: corpus._sweep(tmp, {"base": "base.yaml", "name": "a\nb", "grid": {"seed": [0]}}),
    "sweep_cell": lambda tmp: corpus._sweep(tmp, {"base": "base.yaml", "cells": [{"data.cache_dir": "x\x1by"}]}),
    "sweep_output": lambda tmp: corpus._sweep(
        tmp, {"base": "base.yaml", "output": f"{tmp}/a\tb", "grid": {"seed": [0]}}
    ),
}
CONTROL = "holds the control character "


def _one_class_tree(root: Path) -> None:
    for split in ("train", "test"):
        (root / split / "cat").mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (4, 4), (i, i, i)).save(root / split / "cat" / f"{i}.png")


NPZ = "data.root={tmp}/d.npz"

CASES: dict[str, corpus.Case] = {
    # --- strict types: no booleans or text as numbers, in the config and in every plugin's options
    "num-clients-bool": run("train.num_clients=true", expect=("train.num_clients", "valid integer", "(got True)")),
    "lr-bool": run("train.lr=true", expect=("train.lr: Input should be a valid number (got True)",)),
    "lr-quoted": run(
        "train.lr='0.1'", expect=("train.lr", "(got '0.1'); that is text, not a number: write numbers unquoted")
    ),
    "rounds-whole-float": run("train.rounds=2.0", expect=("train.rounds", "valid integer", "(got 2.0)")),
    "global-test-one": run("eval.global_test=1", expect=("eval.global_test", "valid boolean", "(got 1)")),
    "checkpoint-every-bool": run("output.checkpoint_every=false", expect=("output.checkpoint_every", "(got False)")),
    "num-cpus-bool": run("simulation.client_resources.num_cpus=true", expect=("num_cpus", "valid number")),
    "fedprox-mu-bool": run(
        "strategy={name: fedprox, mu: true}", expect=("strategy.mu = True for strategy 'fedprox'", "valid number")
    ),
    "flower-momentum-bool": run(
        f"strategy={{name: '{FLOWER}:FedAvgM', server_momentum: true}}",
        expect=("strategy.server_momentum = True", "valid number"),
    ),
    "flower-min-nodes-whole-float": run(
        f"strategy={{name: '{FLOWER}:FedAvg', min_train_nodes: 2.0}}",
        expect=("strategy.min_train_nodes = 2.0", "valid integer"),
    ),
    "gn-groups-bool": run("model.norm={name: gn, groups: true}", expect=("model.norm.groups = True", "valid integer")),
    "beta-quoted": run("partition.beta='0.5'", expect=("partition.beta = '0.5'", "text, not a number")),
    "min-size-float": run("partition.min_size=2.0", expect=("partition.min_size = 2.0", "valid integer")),
    "hidden-bool": run("model.hidden=[true]", expect=("model.hidden.0 = True", "valid integer")),
    "pacs-fraction-bool": run(
        "data.dataset={name: pacs, test_fraction: true}", expect=("data.dataset.test_fraction = True", "valid number")
    ),
    # --- zero work
    "local-steps-zero": run("train.local_steps=0", expect=("train.local_steps", "greater than or equal to 1")),
    "round-may-train-nothing": run(
        "train.num_clients=3000",
        "train.clients_per_round=2",
        expect=(
            "partition: ",
            " of 3,000 clients get no training images (client ",
            "a round samples 2 (train.clients_per_round): a round may train nothing",
        ),
    ),
    "round-may-score-nothing": run(
        "train.num_clients=3000",
        "eval.clients=2",
        expect=(
            " of 3,000 clients get no test images (client ",
            "a round samples 2 (eval.clients): a round may score nothing; score more clients per round",
        ),
    ),
    # --- resources bounded by the machine
    "threads-a-million": run(
        "simulation.threads=1000000",
        expect=(
            f"simulation.threads = 1000000: give auto or a whole number of threads in 1..{4 * (os.cpu_count() or 1)}",
            f"(4 x this machine's {os.cpu_count()} CPUs)",
        ),
    ),
    # waits Python cannot hold: round_timeout_s=1e30 was an OverflowError traceback (threading.TIMEOUT_MAX)
    "round-timeout-beyond-a-week": run(
        "train.round_timeout_s=1e30", expect=("train.round_timeout_s", "less than or equal to 604800")
    ),
    "startup-timeout-beyond-a-week": run(
        "deploy.startup_timeout_s=604801", expect=("deploy.startup_timeout_s", "less than or equal to 604800")
    ),
    # a model no machine holds: counted on the meta device (fedsim.models.size), never allocated; it was built
    # for real, the allocator's refusal wrapped as the model's own error ('mlp' raised RuntimeError), and a
    # size the allocator grants ended in the OOM killer
    "model-796-billion-weights": run(
        "model.hidden=[1000000000]",
        expect=(
            "model: 'mlp' with model.hidden=[1000000000] has 796,000,000,000 parameters and buffers (2,965.3 GiB); "
            "a run holds about 8 copies of its model, so this machine's ",
            " GiB of memory allow at most ",
            "make the model smaller",
        ),
    ),
    "cnn-a-trillion-weights": run(
        "model={name: cnn, norm: ln, hidden: [1000000, 1000000], activation: tanh}",
        expect=(
            "model: 'cnn' with model.activation=tanh, model.hidden=[1000000, 1000000] has 1,001,038,104,256 "
            "parameters and buffers (3,729.2 GiB)",
        ),
    ),
    # --- a Flower strategy a config cannot build (it wraps another): refused by name, not a SchemaError traceback
    "flower-dp-wrapper": run(
        f"strategy={FLOWER}:DifferentialPrivacyServerSideFixedClipping",
        expect=("strategy.name: DifferentialPrivacyServerSideFixedClipping needs 'strategy' (Strategy)",),
    ),
    # --- the data's labels and classes, with counts
    "label-a-million": run(
        NPZ,
        expect=("y_train: 1 of 20 labels are 100,000 or more (the largest 1,000,000)", "class indices 0..C-1"),
        setup="label_a_million",
    ),
    "label-far-beyond-classes": run(
        NPZ,
        expect=(
            "dataset 'd': 49,990 of 50,001 classes without training images ('10', '11', '12', ...)",
            "its 20 training images cover 11",
        ),
        setup="label_far_beyond",
    ),
    "test-label-not-trained": run(
        NPZ, expect=("1 of 10 classes without training images ('9')", "cover 9"), setup="test_label_untrained"
    ),
    "class-without-test-images": run(
        NPZ, expect=("1 of 10 classes without test images ('3'); its 20 test images cover 9",), setup="class_untested"
    ),
    "one-class": run(
        NPZ,
        expect=("dataset 'd': 20 training and 20 test images of 1 class(es) ('0'); a run needs 2 to 100,000 classes",),
        setup="one_class",
    ),
    "no-test-images": run(
        NPZ, expect=("dataset 'd': 20 training and 0 test images; a run needs both",), setup="no_test_images"
    ),
    "one-class-imagefolder": run(
        "data.dataset=imagefolder",
        "data.root={tmp}/one",
        "data.cache_dir={tmp}/cache",
        "train.batch_size=4",
        expect=("dataset 'one': 8 training and 8 test images of 1 class(es) ('cat')",),
        setup="one_class_imagefolder",
        creates=True,  # the decoded images' cache
    ),
    # --- names, paths and addresses are printed on one line: a control character in one is refused by its field
    "name-newline": run('name="a\\nb"', expect=(f"name: {CONTROL}'\\n'",)),
    "name-escape": run('name="a\\e[2Jb"', expect=(f"name: {CONTROL}'\\x1b'",)),
    "name-line-separator": run('name="a\\u2028b"', expect=(f"name: {CONTROL}'\\u2028'",)),
    "run-dir-tab": run('output.run_dir="{tmp}/a\\tb"', expect=(f"output.run_dir: {CONTROL}'\\t'",)),
    "output-dir-nul": run('output.dir="{tmp}/a\\0b"', expect=(f"output.dir: {CONTROL}'\\x00'",)),
    "data-root-newline": run('data.root="{tmp}/a\\nb"', expect=(f"data.root: {CONTROL}'\\n'",)),
    "ray-address-escape": run('simulation.ray_address="h\\e:1"', expect=(f"simulation.ray_address: {CONTROL}",)),
    "ray-address-not-a-host": run(
        "simulation.backend=ray", "simulation.ray_address=-x:6379",
        expect=("simulation.ray_address = '-x:6379': the host '-x': give a DNS name",),
    ),  # fmt: skip
    "ray-address-port-beyond": run(
        "simulation.backend=ray", "simulation.ray_address=127.0.0.1:99999",
        expect=("simulation.ray_address = '127.0.0.1:99999' is not a Ray address",),
    ),  # fmt: skip
    "tracker-name-newline": run(
        'output.trackers=["tensorboard\\n"]', expect=(f"output.trackers.0.name: {CONTROL}'\\n'",)
    ),
    "mlflow-experiment-newline": run(
        'output.trackers=[{name: mlflow, experiment: "a\\nb"}]',
        expect=(f"output.trackers.0: 'a\\nb' {CONTROL}'\\n'",),
    ),
    "wandb-project-tab": run(
        'output.trackers=[{name: wandb, project: "a\\tb"}]', expect=(f"output.trackers.0: 'a\\tb' {CONTROL}'\\t'",)
    ),
    "sweep-name-newline": corpus.Case(
        ("sweep", "{tmp}/sweep.yaml"), ("sweep file ", f"name: {CONTROL}'\\n'"), setup="sweep_named"
    ),
    "sweep-cell-value-escape": corpus.Case(
        ("sweep", "{tmp}/sweep.yaml"), ("sweep file ", f"cells: 'x\\x1by' {CONTROL}'\\x1b'"), setup="sweep_cell"
    ),
    "sweep-output-tab": corpus.Case(("sweep", "{tmp}/sweep.yaml"), (f"output: {CONTROL}'\\t'",), setup="sweep_output"),
    # --- a knob that would never act
    "checkpoint-every-beyond-rounds": run(
        "output.checkpoint_every=5",
        expect=(
            "output.checkpoint_every = 5 is more than train.rounds (4): no round would write a checkpoint; "
            "give 0 (off) or 1..4",
        ),
    ),  # fmt: skip
}
CASES = {f"meaningful-{k}": v for k, v in CASES.items()}
assert not CASES.keys() & corpus.CASES.keys()


test_meaningless_value_is_one_line_before_training = corpus_rows(CASES, SETUPS)


@pytest.mark.parametrize(
    ("override", "where", "expected"),
    [
        ("train.lr=1", "train", {"lr": 1.0}),  # an int is a float
        ("simulation.client_resources.num_cpus=2", "simulation.client_resources", {"num_cpus": 2.0}),
        ("partition.beta=1", "partition", {"beta": 1.0}),
        ("strategy={name: fedprox, mu: 0}", "strategy", {"mu": 0.0}),
        ("model.norm={name: ln_goldschmidt, delta_range: [0.5, 2]}", "model.norm", {"delta_range": (0.5, 2.0)}),
        (f"strategy={{name: '{FLOWER}:FedAvgM', server_learning_rate: 2}}", "strategy", {"server_learning_rate": 2.0}),
        (f"simulation.threads={4 * (os.cpu_count() or 1)}", "simulation", {"threads": 4 * (os.cpu_count() or 1)}),
        # YAML 1.2 exponents (PyYAML alone reads them as text, which strict fields refuse)
        ("train.lr=1e-3", "train", {"lr": 0.001}),
        ("train.max_loss=1.0e6", "train", {"max_loss": 1e6}),
        ("strategy={name: fedyogi, tau: 1E-9}", "strategy", {"tau": 1e-9}),
    ],
)
def test_ints_are_floats_and_lists_are_tuples(
    tmp_path: Path, override: str, where: str, expected: dict[str, object]
) -> None:
    experiment = load_experiment(write_config(tmp_path, small_config(tmp_path)), [override])
    resolved = {
        "partition": experiment.partitioner.params,
        "strategy": experiment.strategy.params,
        "model.norm": experiment.normaliser.params,
    }
    section = resolved.get(where) or experiment.config
    if where not in resolved:
        for part in where.split("."):
            section = getattr(section, part)
    got = {k: getattr(section, k) for k in expected}
    assert got == expected and all(type(v) is type(expected[k]) for k, v in got.items())


def test_a_model_too_large_is_refused_at_once_and_never_allocated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size check builds the model on the meta device only: no model with storage is made (a spy on every
    model built), and the refusal comes at once, after the small dataset's load, not after an allocation."""
    built: list[str] = []
    real_init = FedsimModel.__init__

    def spy(self: FedsimModel, *args: object) -> None:
        real_init(self, *args)
        built.append(next(self.parameters()).device.type)

    monkeypatch.setattr(FedsimModel, "__init__", spy)
    cfg = write_config(tmp_path, small_config(tmp_path))
    start = time.monotonic()
    code = main(["run", str(cfg), "--set", "model.hidden=[1000000000]"])
    seconds = time.monotonic() - start
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("fedsim: error: model: 'mlp' ") and "model.hidden=[1000000000]" in err[0], err
    assert "796,000,000,000" in err[0], err  # the model, its option and its size (wording: tests/test_bad_inputs.py)
    assert built == ["meta"]
    assert seconds < 60  # generous for a loaded machine: a load of 6,000 small images and a count
    assert not (tmp_path / "runs").exists()


def test_the_bound_is_this_machines_memory_over_the_copies_a_run_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model of exactly memory / COPIES bytes is built; one byte less memory refuses it, and the limit the
    message gives is one parameter short of the model (float32: 4 bytes each)."""
    experiment = load_experiment(write_config(tmp_path, small_config(tmp_path)))  # MLP 784-64-10, LN
    tensors = [*experiment.build_model().parameters(), *experiment.build_model().buffers()]
    count = sum(t.numel() for t in tensors)
    assert count == 784 * 64 + 2 * 64 + 64 * 10  # the weights, LN's gain and bias, the classifier
    monkeypatch.setattr(size, "machine_memory", lambda: size.COPIES * 4 * count)
    assert sum(p.numel() for p in experiment.build_model().parameters()) == count
    monkeypatch.setattr(size, "machine_memory", lambda: size.COPIES * 4 * count - 1)
    with pytest.raises(ConfigError) as refused:
        experiment.build_model()
    message = str(refused.value)  # the model, its size, the memory and the bound (wording: tests/test_bad_inputs.py)
    assert message.startswith("model: 'mlp' ") and "model.hidden=[64]" in message and "\n" not in message, message
    assert re.search(rf"\b{count:,} .*\b8 copies\b.*\b1\.6 MiB\b.*\b{count - 1:,} ", message), message


def test_a_containers_memory_limit_bounds_the_model_below_the_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a container the machine's physical memory is its host's: the cgroup's limit is what the run may
    use. A limit file says "max" where there is none (cgroup v2), or a number of bytes."""
    physical = size.machine_memory()
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(size, "CGROUP_LIMITS", (v2, v1))
    assert size.machine_memory() == physical  # neither file
    v2.write_text("max\n")
    v1.write_text(f"{physical * 2}\n")  # a limit above the machine's memory changes nothing
    assert size.machine_memory() == physical
    v2.write_text("1073741824\n")
    assert size.machine_memory() == 1 << 30


def test_a_model_that_cannot_be_built_on_the_meta_device_is_built_for_real() -> None:
    """A plugin's model may make tensors the meta device cannot hold values of (.item()): its size is then
    unknown in advance, and the real build decides, not a refusal of the plugin."""

    def build() -> nn.Module:
        nn.Linear(2, 2).weight.sum().item()
        return nn.Linear(2, 2)

    assert size.counted(build) is None
    assert size.counted(lambda: nn.Linear(3, 2)) == (8, 32)  # 6 weights and 2 biases, float32
