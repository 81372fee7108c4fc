"""The bad-input corpus: every command given input it cannot use answers with exit status 2 and one
line, ``fedsim: error: ...``, naming the key, file or argument and what is allowed; no traceback; and,
where the input can be checked before a run starts, nothing created.

One row per case (adding a case is one line). ``{cfg}`` is a valid small config written for the case
(``CONFIG`` rows change it first), ``{tmp}`` the case's own directory (in the arguments and the expected
fragments alike); ``setup`` names a function below that makes the files a case needs (bad data, plugins, run
directories).
"""

from __future__ import annotations

import json
import shutil
import struct
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from fedsim.app.cli import main
from fedsim.record.layout import RECORD_VERSION
from tests.conftest import MNIST_SMALL, another_request, make_sweep, replace_model, small_config, write_config
from tests.data_fixtures import relabelled


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    expect: tuple[str, ...]  # fragments of the one error line
    config: dict[str, Any] = field(default_factory=dict)  # sections changed in the case's config
    setup: str | None = None
    creates: bool = False  # found only once a run is under way: its directory may exist


def run(*overrides: str, expect: tuple[str, ...], **kwargs: Any) -> Case:
    return Case(("run", "{cfg}", *(("--set", *overrides) if overrides else ())), expect, **kwargs)


LAYOUT = ("rd/config.yaml: 2 errors: (1) data: Field required; (2) dataset: unknown key",)
CASES: dict[str, Case] = {
    # --- the run's name, seed and engine
    "name-root": run("name=/", expect=("name = '/'", "directory name", "output.run_dir")),
    "name-escapes": run("name=../../x", expect=("name = '../../x'",)),
    "name-with-slash": run("name=a/b", expect=("name = 'a/b'",)),
    "name-dot": run("name=.", expect=("name = '.'",)),
    "name-empty": run("name=''", expect=("name = ''",)),
    "seed-negative": run("seed=-1", expect=("seed", "greater than or equal to 0")),
    "seed-too-big": run("seed=9223372036854775808", expect=("seed", "less than 9223372036854775808")),
    "seed-text": run("seed=abc", expect=("seed", "valid integer", "'abc'")),
    "seed-fraction": run("seed=1.5", expect=("seed", "1.5")),
    "engine-unknown": run("engine=warp", expect=("engine", "'local' or 'flower'")),
    "section-unknown": run("trian.rounds=3", expect=("trian", "unknown key")),
    "section-not-a-mapping": run("train=5", expect=("train: should be a mapping of its keys: rounds, num_clients, ",)),
    # a value of the wrong kind: pydantic's words, then what the key takes (its kind, range, choices, null)
    "wrong-kind-takes": run(
        "train.lr=true", expect=("train.lr: Input should be a valid number (got True); it takes a number > 0",)
    ),
    "wrong-kind-option-takes": run(
        "strategy={name: fedetf, etf_dim: None}",
        expect=("strategy.etf_dim = 'None' for strategy 'fedetf': Input should be a valid integer; it takes an integer "
                ">= 2 and <= 65536, or null",),
    ),  # fmt: skip
    "plugin-not-a-mapping": run(
        "strategy=5", expect=("strategy: should be a plugin's name or a mapping {name: ..., <its options>}",)
    ),
    "top-level-key-unknown": run(
        "foo=1",
        expect=("foo: unknown key (got 1); valid keys: name, seed, engine, data, partition, model, strategy, train, "
                "eval, simulation, output, diagnostics, deploy",),
    ),  # fmt: skip
    # every problem at once, numbered (a problem may hold a semicolon of its own), on one line
    "several-errors": run(
        "train.rounds=0",
        "train.lr=-1",
        "train.bogus=3",
        "eval.every=-3",
        expect=("4 errors: (1) train.rounds: Input should be greater than or equal to 1 (got 0); (2) train.lr: Input "
                "should be greater than 0 (got -1); (3) train.bogus: unknown key (got 3); valid keys: rounds, "
                "num_clients, clients_per_round, local_steps", "; (4) eval.every: Input should be greater than or "
                "equal to 1 (got -3)"),
    ),  # fmt: skip
    "several-plugin-options": run(
        "strategy={name: fedyogi, eta: -1, beta_1: 3}",
        "strategy.v0=x",
        expect=("3 errors: (1) strategy.eta = -1 for strategy 'fedyogi': Input should be greater than 0",
                "; (2) strategy.beta_1 = 3 for strategy 'fedyogi': Input should be less than 1",
                "; (3) strategy.v0 = 'x' for strategy 'fedyogi': Input should be 'tau^2' or a finite number greater "
                "than"),
    ),  # fmt: skip
    # --- train
    "rounds-zero": run("train.rounds=0", expect=("train.rounds", "greater than or equal to 1")),
    "rounds-negative": run("train.rounds=-1", expect=("train.rounds",)),
    "rounds-text": run("train.rounds=ten", expect=("train.rounds", "'ten'")),
    "rounds-unbounded": run("train.rounds=100000000", expect=("train.rounds", "less than or equal to 10000000")),
    "rounds-fraction": run("train.rounds=2.5", expect=("train.rounds", "2.5")),
    "clients-zero": run("train.num_clients=0", expect=("train.num_clients",)),
    "clients-above-data": run("train.num_clients=6000", expect=("num_clients", "6000", "5000")),
    "clients-huge": run("train.num_clients=10000000", expect=("train.num_clients", "1000000")),
    "per-round-zero": run("train.clients_per_round=0", expect=("train.clients_per_round",)),
    "per-round-above-clients": run("train.clients_per_round=99", expect=("clients_per_round", "1..num_clients (4)")),
    "steps-negative": run("train.local_steps=-1", expect=("train.local_steps",)),
    "epochs-zero": run("train.local_epochs=0", expect=("train.local_epochs",)),
    "steps-and-epochs": run(
        "train.local_epochs=2", expect=("local_steps = 3 and train.local_epochs = 2", "remove one")
    ),
    "batch-zero": run("train.batch_size=0", expect=("train.batch_size",)),
    "batch-larger-than-data": run("train.batch_size=1000000000", expect=("train.batch_size = 1000000000", "5000")),
    "lr-zero": run("train.lr=0", expect=("train.lr", "greater than 0", "(got 0)")),
    "lr-negative": run("train.lr=-0.1", expect=("train.lr", "greater than 0")),
    "lr-inf": run("train.lr=.inf", expect=("train.lr", "finite")),
    "lr-nan": run("train.lr=.nan", expect=("train.lr", "finite")),
    "lr-text": run("train.lr=fast", expect=("train.lr", "'fast'")),
    "momentum-one": run("train.momentum=1", expect=("train.momentum", "less than 1")),
    "momentum-negative": run("train.momentum=-0.1", expect=("train.momentum",)),
    "weight-decay-negative": run("train.weight_decay=-1", expect=("train.weight_decay",)),
    "max-grad-norm-zero": run("train.max_grad_norm=0", expect=("train.max_grad_norm", "greater than 0", "(got 0)")),
    "max-grad-norm-inf": run("train.max_grad_norm=.inf", expect=("train.max_grad_norm", "finite")),
    "max-grad-norm-text": run("train.max_grad_norm=ten", expect=("train.max_grad_norm", "'ten'")),
    "weight-decay-inf": run("train.weight_decay=.inf", expect=("train.weight_decay", "finite")),
    "failure-policy-unknown": run("train.on_client_failure=retry", expect=("on_client_failure", "'fail' or 'skip'")),
    "timeout-zero": run("train.round_timeout_s=0", expect=("train.round_timeout_s",)),
    "timeout-inf": run("train.round_timeout_s=.inf", expect=("train.round_timeout_s", "finite")),
    "max-loss-zero": run("train.max_loss=0", expect=("train.max_loss",)),
    "train-key-unknown": run("train.unknown=1", expect=("train.unknown", "unknown key")),
    # --- eval
    "eval-every-zero": run("eval.every=0", expect=("eval.every",)),
    "eval-batch-zero": run("eval.batch_size=0", expect=("eval.batch_size",)),
    "eval-global-not-bool": run("eval.global_test=maybe", expect=("eval.global_test", "valid boolean")),
    "eval-key-unknown": run(
        "eval.extra=1",
        expect=("eval.extra: unknown key (got 1); valid keys: every, batch_size, global_test, clients, personal",),
    ),
    "eval-personal-steps-negative": run(
        "eval.personal.steps=-1", expect=("eval.personal.steps", "greater than or equal to 0")
    ),
    "eval-personal-steps-text": run("eval.personal.steps=many", expect=("eval.personal.steps", "'many'")),
    "eval-personal-params-unknown": run(
        "eval.personal.params=body", expect=("eval.personal.params", "'all' or 'classifier'", "body")
    ),
    "eval-personal-lr-zero": run("eval.personal.lr=0", expect=("eval.personal.lr", "greater than 0")),
    "eval-personal-every-off-the-evaluations": run(
        "eval.every=2", "eval.personal.steps=3", "eval.personal.every=3",
        expect=("eval.personal.every = 3 must be a multiple of eval.every (2)",),
    ),
    "eval-personal-every-without-steps": run(
        "eval.personal.every=10", expect=("eval.personal.every = 10 is given but eval.personal.steps is null",)
    ),
    # the fine-tuning's options with the fine-tuning off: accepted and ignored, before
    "eval-personal-lr-without-steps": run(
        "eval.personal.lr=0.5",
        expect=("eval.personal.lr = 0.5 is given but eval.personal.steps is null (personalised evaluation off): set "
                "eval.personal.steps (0 or more), or remove eval.personal.lr",),
    ),  # fmt: skip
    "eval-personal-params-without-steps": run(
        "eval.personal.params=classifier",
        expect=("eval.personal.params = 'classifier' is given but eval.personal.steps is null",),
    ),
    "eval-personal-every-zero": run(
        "eval.personal.every=0", expect=("eval.personal.every", "greater than or equal to 1")
    ),
    "eval-personal-key-unknown": run("eval.personal.epochs=1", expect=("eval.personal.epochs", "unknown key")),
    # --- simulation
    "backend-unknown": run("simulation.backend=gpu", expect=("simulation.backend", "'auto', 'inline' or 'ray'")),
    "threads-zero": run("simulation.threads=0", expect=("simulation.threads", "auto or a whole number")),
    "vmap-zero": run("simulation.vmap_clients=0", expect=("simulation.vmap_clients",)),
    "device-unknown": run("simulation.device=tpu", expect=("simulation.device", "'cpu' or 'cuda'")),
    "device-cuda-without-cuda": run("simulation.device=cuda", expect=("simulation.device = 'cuda'", "no CUDA")),
    "cache-dir-control-character": run(
        'data.cache_dir="a\\tb"', expect=("data.cache_dir", "holds the control character '\\t'")
    ),
    "ray-address-malformed": run("simulation.ray_address=nohost", expect=("simulation.ray_address", "pattern")),
    "ray-address-inline": run(
        "simulation.ray_address=127.0.0.1:1",
        expect=("simulation.ray_address", "no effect", "set simulation.backend: ray"),
    ),
    "ray-address-unreachable": run(
        "simulation.backend=ray",
        "simulation.ray_address=127.0.0.1:1",
        expect=("simulation.ray_address = '127.0.0.1:1': no Ray cluster answers",),
    ),  # fmt: skip
    "client-resources-key-unknown": run(
        "simulation.client_resources.foo=1",
        expect=("simulation.client_resources.foo: unknown key (got 1); valid keys: num_cpus, num_gpus",),
    ),
    "cpus-zero": run("simulation.client_resources.num_cpus=0", expect=("client_resources.num_cpus",)),
    "gpus-negative": run("simulation.client_resources.num_gpus=-1", expect=("client_resources.num_gpus",)),
    "vmap-flower": run("simulation.vmap_clients=4", "engine=flower", expect=("vmap_clients = 4 needs engine: local",)),
    "vmap-bn": run(
        "simulation.vmap_clients=4", "model.norm=bn", expect=("vmap_clients = 4", "'bn'", "running statistics")
    ),
    # --- output
    "checkpoint-every-negative": run("output.checkpoint_every=-1", expect=("output.checkpoint_every",)),
    "output-dir-is-a-file": run("output.dir={tmp}/afile", expect=("output.dir", "is a file"), setup="a_file"),
    "run-dir-is-a-file": run("output.run_dir={tmp}/afile", expect=("output.run_dir", "is a file"), setup="a_file"),
    "run-dir-unmakeable": run("output.run_dir=/proc/fedsim-x", expect=("output.run_dir", "cannot create")),
    "output-dir-proc": run(
        "output.dir=/proc", expect=("output.dir: cannot create anything in /proc: No such file or directory",)
    ),
    "run-dir-nul": run(
        'output.run_dir="r\\0"',
        expect=("output.run_dir: holds the control character '\\x00': names, paths and addresses are printed on one "
                "line; remove it (got 'r\\x00')",),
    ),  # fmt: skip
    "run-dir-symlink-loop": run(
        "output.run_dir={tmp}/loop", expect=("output.run_dir: {tmp}/loop: Too many levels of symbolic links",),
        setup="symlink_loop",
    ),  # fmt: skip
    "output-dir-symlink-loop": run(
        "output.dir={tmp}/loop/sub", expect=("output.dir: {tmp}/loop: Too many levels of symbolic links",),
        setup="symlink_loop",
    ),  # fmt: skip
    # fedsim writes only into what is its own (tests/test_ownership.py)
    "run-dir-theirs": run(
        "output.run_dir={tmp}/theirs",
        expect=("output.run_dir {tmp}/theirs is not fedsim's: fedsim writes only into a new or empty directory or one "
                "of its own run directories (marked .fedsim); give another output.run_dir, or empty that directory",),
        setup="their_directory",
    ),  # fmt: skip
    "run-dir-a-compose-project": run(
        "output.run_dir={tmp}/project",
        expect=("output.run_dir {tmp}/project is a fedsim compose project, not a run:",),
        setup="compose_project",
    ),
    # a fresh run clears a killed run's tb/ (what is in the way there included): a resumed one keeps it
    "tensorboard-dir-is-a-file": Case(
        ("run", "--resume", "{tmp}/rd"),
        ("output.trackers (tensorboard's tb/ directory)", "is a file"),
        setup="stopped_run_tb_file",
        creates=True,
    ),  # fmt: skip
    "tracker-unknown": run(
        "output.trackers=[mlfow]", expect=("output.trackers[0].name: unknown trackers 'mlfow'; valid: ",)
    ),
    "tracker-option-unknown": run(
        "output.trackers=[{name: mlflow, uri: x}]", expect=("output.trackers[0].uri: unknown key", "tracking_uri"),
    ),
    "tracker-mode-unknown": run(
        "output.trackers=[{name: wandb, mode: sometimes}]", expect=("output.trackers[0].mode = 'sometimes'",)
    ),
    # every number would be logged twice
    "tracker-twice": run(
        "output.trackers=[tensorboard, tensorboard]", expect=("output.trackers[1]: ", "is output.trackers[0] again")
    ),
    "trackers-not-a-list": run("output.trackers=mlflow", expect=("output.trackers", "valid list")),
    # a run among another run's files: report and plot of the outer one found both, as two copies of one seed
    "run-dir-inside-a-run": run(
        "output.run_dir={tmp}/rd/inner",
        expect=("output.run_dir", "/rd/inner is inside the run directory", "give another output.run_dir"),
        setup="finished_run",
    ),
    "output-dir-a-run": run("output.dir={tmp}/rd", expect=("output.dir", "is a run directory"), setup="finished_run"),
    "run-dir-finished": run(
        "output.run_dir={tmp}/rd",
        expect=("holds a finished run (summary.json)", "another output.run_dir"),
        setup="finished_run",
    ),
    "run-dir-resumable": run("output.run_dir={tmp}/rd", expect=("fedsim run --resume",), setup="checkpointed_run"),
    "progress-not-bool": run("output.progress=maybe", expect=("output.progress", "valid boolean")),
    "output-key-unknown": run("output.unknown=1", expect=("output.unknown", "unknown key")),
    # --- diagnostics
    "probe-one": run("diagnostics.probe_size=1", expect=("diagnostics.probe_size",)),
    "isometry-above-probe": run("diagnostics.isometry_size=300", expect=("isometry_size = 300 must be <= probe_size",)),
    # a Gram of more samples than a layer's width is singular: isometry 0 recorded for any model, before
    "isometry-above-a-layer-width": run(
        "diagnostics.isometry=true",
        "model={name: mlp, hidden: [4]}",
        expect=("diagnostics.isometry_size = 10 is more than the 4 features layer 'classifier' takes (a Gram of 10 "
                "samples of 4 features is singular: isometry 0 for any model); give at most 4",),
        creates=True,  # checked on the model as the run builds its diagnostics, before round 1
    ),  # fmt: skip
    "probe-above-test-set": run(
        "diagnostics.features=true", "diagnostics.probe_size=100000", expect=("probe_size = 100000", "1000")
    ),
    "probe-above-test-set-unused": run(
        "diagnostics.probe_size=100000", expect=("probe_size = 100000 is larger than the test set (1000 images",)
    ),
    "diagnostics-key-unknown": run("diagnostics.feature=true", expect=("diagnostics.feature", "unknown key")),
    # --- deploy section (read by every command)
    "port-too-big": run("deploy.port=70000", expect=("deploy.port", "65535")),
    "address-a-name": run("deploy.address=localhost", expect=("deploy.address = 'localhost'", "IP address")),
    "certificates-without-tls": run(
        "deploy.certificates={ca: a.pem, cert: b.pem, key: c.pem}",
        expect=("deploy.certificates is given but deploy.tls is false",),
    ),
    "certificates-missing": run(
        "deploy.tls=true",
        "deploy.certificates={ca: a.pem, cert: b.pem, key: c.pem}",
        expect=("deploy.certificates.ca", "no file at"),
    ),  # fmt: skip
    "certificates-key-unknown": run(
        "deploy.certificates={ca: a, cert: b, key: c, foo: 1}",
        expect=("deploy.certificates.foo: unknown key (got 1); valid keys: ca, cert, key",),
    ),
    "startup-timeout-zero": run("deploy.startup_timeout_s=0", expect=("deploy.startup_timeout_s",)),
    # --- data
    "dataset-unknown": run(
        "data.dataset=imagenet", expect=("data.dataset.name", "unknown datasets", "imagefolder", "npz")
    ),
    "dataset-path-without-module": run("data.dataset=:Foo", expect=("data.dataset.name", "package.module:Name")),
    "dataset-path-relative": run("data.dataset=.foo:Bar", expect=("data.dataset.name", "absolute")),
    "dataset-not-a-loader": run("data.dataset=os:path", expect=("data.dataset.name", "DatasetLoader subclass")),
    "dataset-module-missing": run("data.dataset=tests.plugins.nope:X", expect=("cannot import module",)),
    "dataset-function": run("data.dataset=bad_plugins:loader_function", expect=("DatasetLoader",), setup="plugins"),
    "dataset-load-raises": run(
        "data.dataset=bad_plugins:RaisingLoader",
        expect=("dataset 'bad_plugins:RaisingLoader'", "KeyError"),
        setup="plugins",
    ),  # fmt: skip
    "dataset-load-returns-list": run(
        "data.dataset=bad_plugins:ListLoader", expect=("returned list, not an ArrayDataset",), setup="plugins"
    ),
    "data-root-a-fifo": run(
        "data.root={tmp}/data.npz",
        expect=("data.npz: a FIFO (named pipe), not a file or a directory fedsim can read",),
        setup="fifo_data",
    ),  # fmt: skip
    "data-root-a-device": run(
        "data.root=/dev/zero", expect=("data.root /dev/zero: a character device, not a file or a directory fedsim",)
    ),
    "data-root-nul": run('data.root="mnist\\0.npz"', expect=("data.root: holds the control character '\\x00'",)),
    "data-root-missing": run("data.root=nowhere.npz", expect=("npz dataset", "no file at", "nowhere.npz")),
    "download-not-bool": run("data.download=maybe", expect=("data.download", "valid boolean")),
    "data-key-unknown": run("data.extra=1", expect=("data.extra", "unknown key")),
    "data-not-a-mapping": run("data=5", expect=("data: should be a mapping of its keys: dataset, root, ",)),
    "npz-is-an-npy": run("data.root={tmp}/renamed.npz", expect=("not a .npz (zip) archive",), setup="npy_as_npz"),
    "npz-forged-header": run(
        "data.root={tmp}/forged.npz", expect=("claims (900000000000000, 28)",), setup="forged_npz"
    ),
    "npz-missing-keys": run("data.root={tmp}/partial.npz", expect=("missing keys", "y_test"), setup="partial_npz"),
    "npz-float-images": run("data.root={tmp}/floats.npz", expect=("x_train: images must be uint8",), setup="float_npz"),
    # (N, 3, 28, 28) read as 3-pixel-high images of 28 channels
    "npz-channels-first": run(
        "data.root={tmp}/nchw.npz",
        expect=(
            "x_train: shape (20, 3, 28, 28) looks channels-first (N, C, H, W); fedsim reads images as (N, H, W) or ",
            "store them as np.moveaxis(x, 1, -1), shape (20, 28, 28, 3)",
        ),
        setup="channels_first_npz",
    ),
    # an alpha channel that is 255 everywhere: dividing by its std of 0 made every input NaN; one pixel off it, a
    # std of 2e-5 blew the test images up 10^4-fold
    "normalize-a-near-constant-channel": run(
        "data.root={tmp}/rgba.npz",
        "data.normalize=true",
        expect=("data.normalize: true divides each channel of the training images by its std, and channel 2 has std ",
                ", under one grey level (1/255), channel 3 holds 255 in every pixel (std 0); set data.normalize: "
                "false"),
        setup="near_constant_npz",
    ),  # fmt: skip
    "normalize-a-constant-channel": run(
        "data.root={tmp}/rgba.npz",
        "data.normalize=true",
        expect=("data.normalize: true divides each channel of the training images by its std, and channel 3 holds "
                "255 in every pixel (std 0); set data.normalize: false",),
        setup="rgba_npz",
    ),  # fmt: skip
    # a partitioner plugin's split with a bug: accepted and trained on, before (tests/plugins/odd_partitions.py)
    "partition-index-repeated": run(
        "partition={name: 'tests.plugins.odd_partitions:Repeats'}",
        expect=("partition: 'tests.plugins.odd_partitions:Repeats' gave client 0 training index 0 ",
                " times: each image once per client"),
    ),  # fmt: skip
    "partition-index-negative": run(
        "partition={name: 'tests.plugins.odd_partitions:OffByOne'}",
        expect=("gave client 0 training index -1, outside 0..", " (the training images)"),
    ),
    "partition-boolean-masks": run(
        "partition={name: 'tests.plugins.odd_partitions:Masks'}",
        expect=("gave client 0's training indices as a bool array of shape (", "), not a 1-D array of integer "
                "indices into the training images"),
    ),  # fmt: skip
    "partition-a-client-short": run(
        "partition={name: 'tests.plugins.odd_partitions:OneShort'}",
        expect=("arrays of training indices for ", " clients (train.num_clients): one per client"),
    ),
    "npz-class-control-character": run(
        "data.root={tmp}/ctl.npz", expect=("'a\\nb'", "holds the control character"), setup="control_class_npz"
    ),
    "npz-labels-above-classes": run(
        "data.root={tmp}/few.npz",
        expect=("y_train has labels in [0, 9] but there are 2 classes",),
        setup="few_classes_npz",
    ),
    "archive-member-parent": run(
        "data.dataset=imagefolder",
        "data.root={tmp}/up.tar",
        expect=("points outside the archive", "../"),
        setup="archive_parent",
    ),  # fmt: skip
    "archive-member-absolute": run(
        "data.dataset=imagefolder",
        "data.root={tmp}/abs.tar",
        expect=("points outside the archive",),
        setup="archive_absolute",
    ),  # fmt: skip
    "image-bomb": run(
        "data.dataset=imagefolder",
        "data.root={tmp}/bomb",
        "data.cache_dir={tmp}/cache",
        expect=("cannot decode", "decompression bomb"),
        setup="image_bomb",
    ),  # fmt: skip
    "imagefolder-class-control-character": run(
        "data.dataset=imagefolder",
        "data.root={tmp}/tree",
        "data.cache_dir={tmp}/cache",
        expect=("the class name 'a\\tb' (a folder's name", "holds the control character"),
        setup="control_class_tree",
    ),  # fmt: skip
    "imagefolder-mixed-sizes": run(
        "data.dataset=imagefolder",
        "data.root={tmp}/tree",
        "data.cache_dir={tmp}/cache",
        expect=("test/b/1.png is 6x4 but", "all images must share one size"),
        setup="mixed_size_tree",
    ),  # fmt: skip
    "imagefolder-no-test-split": run(
        "data.dataset=imagefolder",
        "data.root={tmp}/tree",
        "data.cache_dir={tmp}/cache",
        expect=("no test images; expected",),
        setup="train_only_tree",
    ),  # fmt: skip
    "imagefolder-missing": run("data.dataset=imagefolder", "data.root=nothere", expect=("nothing at", "nothere")),
    "imagefolder-not-an-archive": run(
        "data.dataset=imagefolder",
        "data.root={tmp}/afile",
        expect=("not a readable directory, tar or zip",),
        setup="a_file",
    ),  # fmt: skip
    "cifar10-missing": run("data.dataset=cifar10", "data.root=tv", expect=("cifar10", "data.download")),
    "tinyimagenet-without-val": run(
        "data.dataset=tinyimagenet",
        "data.root={tmp}/tiny-imagenet-200",
        "data.cache_dir={tmp}/cache",
        expect=("no val/images/*.JPEG or no val/val_annotations.txt",),
        setup="tinyimagenet_without_val",
    ),  # fmt: skip
    "tinyimagenet-missing": run("data.dataset=tinyimagenet", "data.root=tin.zip", expect=("tinyimagenet", "Download")),
    # --- partition
    "partition-unknown": run("partition.name=bogus", expect=("partition.name", "unknown partitions", "dirichlet")),
    "partition-option-unknown": run(
        "partition.betta=0.1", expect=("partition.betta", "unknown key", "valid keys: beta, min_size, balance")
    ),
    "beta-zero": run("partition.beta=0", expect=("partition.beta", "greater than 0")),
    "beta-negative": run("partition.beta=-1", expect=("partition.beta",)),
    "beta-inf": run("partition.beta=.inf", expect=("partition", "beta = inf", "finite")),
    "classes-zero": run("partition={name: n_class, classes_per_client: 0}", expect=("classes_per_client",)),
    "classes-above-classes": run(
        "partition={name: n_class, classes_per_client: 11}", expect=("classes_per_client", "11", "1..10")
    ),
    "min-size-impossible": run("partition={name: dirichlet, min_size: 100000}", expect=("min_size=100000",)),
    "min-size-not-drawn": run(
        "partition={name: dirichlet, beta: 0.05, min_size: 1200, max_tries: 5}",
        expect=("min_size=1200", "max_tries=5 tries", "raise max_tries (at most 10,000)"),
    ),
    "n-class-chunks-above-samples": run(
        "data.root={tmp}/twenty.npz",
        "partition={name: n_class, classes_per_client: 10}",
        expect=("class 0 has 2 train samples but 4 clients",),
        setup="twenty_npz",
    ),  # fmt: skip
    "centralised-clients": run(
        "partition={name: centralised}",
        expect=("partition 'centralised' puts the whole training set on one client: train.num_clients must be 1, "
                "got 4",),
    ),  # fmt: skip
    "domains-without-domains": run(
        "partition={name: domains}",
        expect=("partition 'domains' needs a dataset that records each image's domain: data.dataset: pacs or "
                "domains (a <domain>/<class>/<image> tree)",),
    ),  # fmt: skip
    "iid-with-beta": run("partition={name: iid, beta: 1}", expect=("partition.beta", "unknown key", "'iid'")),
    "partition-not-a-partitioner": run("partition.name=os:path", expect=("Partitioner subclass",)),
    "partition-raises": run(
        "partition={name: 'bad_plugins:RaisingPartitioner'}",
        expect=("partition", "ZeroDivisionError"),
        setup="plugins",
    ),  # fmt: skip
    # --- model and normaliser
    "model-unknown": run("model.name=vgg", expect=("model.name", "unknown models", "cnn", "mlp", "resnet18")),
    "model-option-unknown": run("model.hiden=[10]", expect=("model.hiden", "unknown key", "hidden")),
    "hidden-zero": run("model.hidden=[0]", expect=("model.hidden.0",)),
    # refused before the model is built (tests/test_meaningful_values.py): the bound is this machine's memory
    "model-beyond-memory": run(
        "model.hidden=[1000000000]",
        expect=("model: 'mlp' with model.hidden=[1000000000] has 796,000,000,000 parameters and buffers (2,965.3 "
                "GiB); a run holds about 8 copies of its model, so this machine's ", " of memory allow at most ",
                "): make the model smaller"),
    ),  # fmt: skip
    "activation-unknown": run("model.activation=swish", expect=("model.activation", "'relu'")),
    "norm-position-unknown": run("model.norm_position=middle", expect=("model.norm_position", "'after'")),
    "norm-sites-unknown": run(
        "model={name: resnet18, norm: ln, norm_sites: outer}",
        expect=("model.norm_sites = 'outer' for model 'resnet18'", "'all' or 'inner'"),
    ),
    "norm-sites-for-cnn": run(
        "model={name: cnn, norm: ln, norm_sites: inner}",
        expect=("model.norm_sites: unknown key for model 'cnn'", "valid keys: bias, activation"),
    ),
    "cnn-tiny-images": run(
        "data.root={tmp}/tiny.npz",
        "model={name: cnn, norm: ln}",
        expect=("model 'cnn' needs inputs of at least 16x16 pixels, got (1, 8, 8)",),
        setup="tiny_npz",
    ),  # fmt: skip
    "bias-not-bool": run("model.bias=maybe", expect=("model.bias",)),
    "norm-unknown": run(
        "model.norm=layernorm", expect=("model.norm.name", "unknown norms 'layernorm'", "bn, fn, gn", "pln", "rms")
    ),
    "gn-groups-zero": run(
        "model.norm={name: gn, groups: 0}", expect=("model.norm.groups", "greater than or equal to 1")
    ),
    "gn-option-unknown": run(
        "model.norm={name: gn, group: 2}",
        expect=("model.norm.group: unknown key for norm 'gn'", "valid keys: groups, eps"),
    ),
    "gn-groups-zero-set-after": run(
        "model.norm=gn", "model.norm.groups=0", expect=("model.norm.groups", "greater than or equal to 1")
    ),
    "gn-groups-not-dividing": run("model.norm={name: gn, groups: 3}", expect=("model.norm.groups = 3", "divide")),
    "pln-group-of-one": run(
        "model.norm={name: pln, group_size: 1}",
        expect=("model.norm for norm 'pln': group_size = 1 with centering gives 0 everywhere (each group is its own "
                "mean); use group_size >= 2, or center: false (PLS-1)",),
    ),  # fmt: skip
    "ln-eps-negative": run("model.norm={name: ln, eps: -1}", expect=("model.norm.eps",)),
    "ln-option-unknown": run("model.norm={name: ln, epss: 1}", expect=("model.norm.epss", "unknown key")),
    "norm-not-a-normaliser": run("model.norm=torch.nn:LayerNorm", expect=("fedsim.norms.Normaliser subclass",)),
    "goldschmidt-band-reversed": run(
        "model.norm={name: ln_goldschmidt, delta_range: [2, 1]}", expect=("model.norm.delta_range",)
    ),
    "norm-given-twice": run("model.args={hidden: [8]}", expect=("model.args repeats hidden",)),
    "norm-make-raises": run(
        "model.norm=bad_plugins:RaisingNorm", expect=("model", "raised TypeError when built"), setup="plugins"
    ),
    # --- strategy
    "strategy-unknown": run("strategy.name=fedavgg", expect=("strategy.name", "unknown strategies 'fedavgg'")),
    "fedavg-option": run("strategy.name=fedavg", "strategy.mu=0.1", expect=("strategy.mu", "unknown key", "'fedavg'")),
    "fedprox-mu-negative": run("strategy={name: fedprox, mu: -1}", expect=("strategy.mu",)),
    "fedprox-mu-quoted": run(
        "strategy.name=fedprox", "strategy.mu='0.1'",
        expect=("strategy.mu = '0.1' for strategy 'fedprox': ", "that is text, not a number: write numbers unquoted"),
    ),
    "fedrs-alpha-above-one": run("strategy={name: fedrs, alpha: 2}", expect=("strategy.alpha",)),
    "fedrs-mode-unknown": run("strategy={name: fedrs, mode: hard}", expect=("strategy.mode", "'binary'")),
    "fedyogi-v0-text": run("strategy={name: fedyogi, v0: big}", expect=("strategy.v0",)),
    "fedyogi-scope-unknown": run("strategy={name: fedyogi, scope: some}", expect=("strategy.scope",)),
    "scaffold-weighting-unknown": run("strategy={name: scaffold, weighting: random}", expect=("strategy.weighting",)),
    "fedbn-evaluate-unknown": run("strategy={name: fedbn, evaluate: both}", expect=("strategy.evaluate",)),
    # FedBN on a model with no normalisation tensors: FedAvg's numbers under FedBN's name, before
    "fedbn-without-norm-tensors": run(
        "strategy.name=fedbn",
        "model.norm={name: ln, affine: false}",
        expect=("model.norm: strategy 'fedbn' keeps each client's normalisation weights and statistics, and this "
                "model has none (norm none, or a normaliser without weights or running statistics)",),
    ),  # fmt: skip
    "fedexp-epsilon-zero": run(
        "strategy={name: fedexp, epsilon: 0}",
        expect=("strategy.epsilon = 0 for strategy 'fedexp': Input should be greater than 0",),
    ),
    "fedexp-epsilon-nan": run(
        "strategy={name: fedexp, epsilon: .nan}", expect=("strategy: option epsilon = nan is not a finite number",)
    ),
    "fedexp-evaluate-unknown": run(
        "strategy={name: fedexp, evaluate: best}",
        expect=("strategy.evaluate = 'best' for strategy 'fedexp': Input should be 'average' or 'last'",),
    ),
    "fedexp-eta-g": run(
        "strategy={name: fedexp, eta_g: 2.0}",
        expect=("strategy.eta_g: unknown key for strategy 'fedexp'; valid keys: epsilon, evaluate",),
    ),
    "flower-fraction": run(
        "strategy={name: 'flwr.serverapp.strategy:FedAvg', fraction_train: 0.5}",
        expect=("fraction_train=0.5", "clients_per_round", "fraction_train: 1.0"),
    ),
    "flower-option-typo": run(
        "strategy={name: 'flwr.serverapp.strategy:FedAvg', fraction_trian: 1}",
        expect=("strategy.fraction_trian: unknown key", "fraction_train"),
    ),  # fmt: skip
    "flower-one-client": run(
        "strategy={name: 'flwr.serverapp.strategy:FedAvg'}",
        "train.num_clients=1",
        "partition={name: iid}",
        expect=("min_available_nodes=2", "num_clients = 1", "min_available_nodes: 1"),
    ),  # fmt: skip
    "plugin-raises-at-import": run(
        "strategy.name=bad_import:X", expect=("importing 'bad_import'", "RuntimeError"), setup="plugins"
    ),  # fmt: skip
    "plugin-syntax-error": run(
        "strategy.name=bad_syntax:X", expect=("importing 'bad_syntax'", "SyntaxError"), setup="plugins"
    ),  # fmt: skip
    "plugin-not-a-spec": run("strategy.name=bad_plugins:NotASpec", expect=("StrategySpec subclass",), setup="plugins"),
    "plugin-init-raises": run(
        "strategy.name=bad_plugins:RaisingSpec", expect=("raised ValueError when built",), setup="plugins"
    ),
    "plugin-server-raises": run(
        "strategy.name=bad_plugins:ServerRaises", expect=("building its server half", "RuntimeError"), setup="plugins"
    ),
    "plugin-adapt-model-raises": run(
        "strategy.name=bad_plugins:AdaptRaises",
        expect=("strategy: 'bad_plugins:AdaptRaises' raised RuntimeError adapting the model: no model change today",),
        setup="plugins",
    ),
    "plugin-adapt-model-returns-none": run(
        "strategy.name=bad_plugins:AdaptReturnsNothing",
        expect=("adapt_model returned a NoneType, not the model it was given (a FedsimModel)",),
        setup="plugins",
    ),
    # --- found in a round: the run stops, naming the round and the client
    "client-fails-under-fail": run(
        "strategy={name: 'tests.plugins.flaky_client:Flaky', fail_partition: 1, fail_from: 1}",
        "train.on_client_failure=fail",
        expect=("round 1, training: client 1: RuntimeError: injected failure of partition 1 in round 1 (at "
                "flaky_client.py:", "(train.on_client_failure: skip goes on without them)"),
        creates=True,
    ),  # fmt: skip
    "no-client-left-under-skip": run(
        "strategy={name: 'tests.plugins.flaky_client:Flaky', fail_partition: 0, fail_from: 1}",
        "train.on_client_failure=skip",
        "train.num_clients=1",
        "partition={name: iid}",
        expect=("round 1, training: no client sent a usable reply (client 0: RuntimeError: injected failure of "
                "partition 0 in round 1",),  # fmt: skip
        creates=True,
    ),  # fmt: skip
    "loss-above-max-loss": run(
        "train.max_loss=0.01",
        "train.rounds=1",
        expect=("training diverged in round 1: client 0: training loss ",
                " is above train.max_loss = 0.01; client 1: "),
        creates=True,
    ),  # fmt: skip
    "diverged-weights": run(
        "strategy={name: 'tests.plugins.diverging:Diverging', round: 1, client: 2, where: weights}",
        "train.rounds=1",
        expect=("training diverged in round 1: client 2: non-finite weights in classifier.weight",),
        creates=True,
    ),  # fmt: skip
    "diverged-after-a-checkpoint": run(
        "strategy={name: 'tests.plugins.diverging:Diverging', round: 3, client: 1}",
        "output.run_dir={tmp}/rd",
        "output.checkpoint_every=2",
        expect=("training diverged in round 3: client 1: training loss is inf; the last good checkpoint (round 2) is "
                "in {tmp}/rd; the metrics so far are in {tmp}/rd",),
        creates=True,
    ),  # fmt: skip
    # a plugin strategy's protocol key that is another's (tests/test_wire.py's plugins)
    "strategy-key-of-the-core": run(
        "strategy.name=tests.test_wire:SendsItsOwnRound",
        expect=("strategy.name: strategy 'tests.test_wire:SendsItsOwnRound': its protocol key 'server-round' "
                "(record 'config', message 'train') reuses the name 'server-round' of fedsim's core protocol",),
    ),  # fmt: skip
    "strategy-record-of-the-core": run(
        "strategy.name=tests.test_wire:KeepsARecordCalledMetrics",
        expect=("its protocol key '*' (record 'metrics', message 'Context.state') is every entry of the record "
                "'metrics' of fedsim's core protocol",),
    ),  # fmt: skip
    "strategy-record-of-another": run(
        "strategy.name=tests.test_wire:SendsScaffoldsC",
        expect=("its protocol key '*' (record 'scaffold.c', message 'train') is declared by strategy 'scaffold' too",),
    ),
    "strategy-protocol-of-strings": run(
        "strategy.name=tests.test_wire:ProtocolOfStrings",
        expect=("protocol must be a tuple of fedsim.wire.Key rows, got ('my.key',)",),
    ),
    # --- --set itself
    "set-without-value": run("train.rounds", expect=("key.path=value",)),
    "set-without-key": run("=5", expect=("key.path=value",)),
    "set-empty-part": run("train..rounds=5", expect=("key.path=value",)),
    "set-not-yaml": run("partition={name: iid", expect=("--set partition", "not valid YAML")),
    # the last value won in silence
    "set-given-twice": run(
        "train.rounds=1", "train.rounds=2", expect=("--set train.rounds is given twice ('1', then '2'): give it once",)
    ),
    # a lone surrogate passed the first validation, then was a pydantic JSON traceback (experiment.resolve)
    "name-lone-surrogate": run(
        'name="a\\udcffb"', expect=("name: holds '\\udcff', a lone surrogate", "(got 'a\\udcffb')")
    ),
    "cache-dir-lone-surrogate": run(
        'data.cache_dir="/tmp/\\udcff"', expect=("data.cache_dir: holds '\\udcff', a lone surrogate",)
    ),
    "norm-option-lone-surrogate": run(
        'model.norm={name: gn, x: "\\ud800"}', expect=("model.norm: '\\ud800' holds '\\ud800', a lone surrogate",)
    ),
    # PyYAML's composer recursed once per bracket (RecursionError)
    "set-nested-deep": run(
        "train.lr=" + "[" * 400 + "]" * 400,
        expect=("--set train.lr: nested deeper than 32 levels at line 1: a config is a few levels deep",),
    ),
    "set-keys-deep": run(
        "model." + "x." * 40 + "y=1", expect=("more than 32 levels of keys; a config is a few deep",)
    ),  # fmt: skip
    "set-into-a-value": run("train.rounds.x=1", expect=("--set train.rounds.x", "'rounds' is not a section")),
    # --- the config file
    "config-missing": Case(("run", "{tmp}/absent.yaml"), ("config file not found", "absent.yaml")),
    "config-a-directory": Case(("run", "{tmp}"), ("a directory, not a YAML file",)),
    "config-not-utf8": Case(("run", "{tmp}/latin1.yaml"), ("not UTF-8",), setup="latin1_config"),
    "config-a-list": Case(("run", "{tmp}/list.yaml"), ("top level must be a mapping",), setup="list_config"),
    "config-empty": Case(("run", "{tmp}/empty.yaml"), ("data", "Field required"), setup="empty_config"),
    "config-duplicate-section": Case(("run", "{tmp}/dup.yaml"), ("'train' is given twice",), setup="duplicate_config"),
    "config-billion-laughs": Case(
        ("run", "{tmp}/lol.yaml"), ("expand to more than 10,000 values",), setup="laughs_config"
    ),
    "config-lone-surrogate": Case(
        ("run", "{tmp}/surrogate.yaml"),
        (
            "name: holds '\\ud800', a lone surrogate, not a Unicode character (bytes that are not UTF-8, read as "
            "text): fedsim writes its files in UTF-8; give the text in UTF-8 (got 'q\\ud800')",
        ),
        setup="surrogate_config",
    ),
    "config-nested-deep": Case(
        ("run", "{tmp}/deep.yaml"), ("deep.yaml: nested deeper than 32 levels at line ",), setup="deep_config"
    ),
    "config-key-a-list": Case(
        ("run", "{tmp}/bad.yaml"), ("bad.yaml: the key at line 1 is not a plain name or number",), setup="list_key"
    ),  # fmt: skip
    "config-key-a-mapping": Case(
        ("run", "{tmp}/bad.yaml"), ("bad.yaml: the key at line 1 is not a plain name or number",),
        setup="mapping_key",
    ),  # fmt: skip
    "config-alias-inside-itself": Case(
        ("run", "{tmp}/bad.yaml"),
        ("bad.yaml: the alias at line 1 is inside the value it names: a value cannot contain itself",),
        setup="recursive_alias",
    ),
    "config-int-too-long": Case(
        ("run", "{tmp}/bad.yaml"), ("bad.yaml: a value YAML cannot read (Exceeds the limit (4300 digits)",),
        setup="long_int",
    ),  # fmt: skip
    "config-int-malformed": Case(
        ("run", "{tmp}/bad.yaml"), ("bad.yaml: a value YAML cannot read (invalid literal for int()",),
        setup="malformed_int",
    ),  # fmt: skip
    # refused unread: a FIFO or a device would be read forever, a huge file whole
    "config-a-fifo": Case(
        ("run", "{tmp}/fifo.yaml"), ("config file ", "fifo.yaml: a FIFO (named pipe), not a regular file"),
        setup="fifo_config",
    ),  # fmt: skip
    "config-a-device": Case(("run", "/dev/zero"), ("config file /dev/zero: a character device, not a regular file",)),
    "config-huge": Case(
        ("run", "{tmp}/huge.yaml"), ("huge.yaml: 50,000,000 bytes; fedsim reads at most 4,194,304 for it",),
        setup="huge_config",
    ),  # fmt: skip
    "config-a-proc-file": Case(
        ("run", "/proc/self/status"),
        ("config file /proc/self/status: a /proc or /sys file (its size is unknown in advance), not a regular file",),
    ),
    # what a config holds: plain values, anchors, aliases and merges, no other tags (a tag ran code)
    "config-python-tag": Case(
        ("run", "{tmp}/tagged.yaml"),
        ("{tmp}/tagged.yaml: could not determine a constructor for the tag "
         "'tag:yaml.org,2002:python/object/apply:os.system' at line 1: a config holds plain YAML values (mappings, "
         "lists, text, numbers, true/false, null), anchors, aliases and << merges of mappings, no other tags",),
        setup="python_tag",
    ),  # fmt: skip
    "config-custom-tag": Case(
        ("run", "{tmp}/tagged.yaml"),
        ("{tmp}/tagged.yaml: could not determine a constructor for the tag '!custom' at line 1: a config holds ",),
        setup="custom_tag",
    ),  # fmt: skip
    "config-merge-of-a-scalar": Case(
        ("run", "{tmp}/tagged.yaml"),
        ("{tmp}/tagged.yaml: expected a mapping or list of mappings for merging, but found scalar at line 2: a "
         "config holds ",),
        setup="merge_of_a_scalar",
    ),  # fmt: skip
    "config-key-twice-in-a-merge": Case(
        ("run", "{tmp}/merge.yaml"),
        ("{tmp}/merge.yaml: key 'every' is given twice (line ", "): give it once"),
        setup="merge_key_twice",
    ),  # fmt: skip
    "config-not-yaml": Case(("run", "{tmp}/broken.yaml"), ("not valid YAML",), setup="broken_config"),
    "run-nothing": Case(("run",), ("fedsim run needs a config file, or --resume RUN_DIR",)),
    "resume-with-config": Case(("run", "{cfg}", "--resume", "{tmp}"), ("takes no config file and no --set",)),
    "deploy-nothing": Case(("deploy",), ("fedsim deploy needs a config file, or --resume RUN_DIR",)),
    "deploy-resume-with-config": Case(
        ("deploy", "{cfg}", "--resume", "{tmp}"), ("fedsim deploy --resume RUN_DIR takes no config file and no --set",)
    ),
    "resume-missing-dir": Case(("run", "--resume", "{tmp}/none"), ("not a run directory",)),
    "resume-no-config": Case(("run", "--resume", "{tmp}"), ("not a run directory (no config.yaml)",)),
    "resume-finished": Case(
        ("run", "--resume", "{tmp}/rd"), ("the run already finished (summary.json exists)",), setup="finished_run"
    ),
    "resume-without-checkpoint": Case(
        ("run", "--resume", "{tmp}/rd"), ("no checkpoint.pt to resume from", "output.checkpoint_every"),
        setup="killed_run",
    ),  # fmt: skip
    "resume-config-changed": Case(
        ("run", "--resume", "{tmp}/rd"),
        ("config.yaml differs from the checkpoint's config (train.lr: 0.05 -> 0.1)",),
        setup="resumable_run_config_changed",
    ),
    # 256 bytes flipped inside a tensor's data, which torch.load reads without complaint
    "resume-checkpoint-changed": Case(
        ("run", "--resume", "{tmp}/rd"),
        ("checkpoint.pt: not the file the run wrote (its sha256 in checkpoint.pt differs",),
        setup="resumable_run_checkpoint_flipped",
    ),
    "resume-checkpoint-unversioned": Case(
        ("run", "--resume", "{tmp}/rd"),
        ("checkpoint.pt: a run record of version 0, older than", "upgrade it with `fedsim record upgrade"),
        setup="resumable_run_checkpoint_unversioned",
    ),
    # a stopped SCAFFOLD run's client_state/ (tests/test_client_states.py): partition 0's files deleted,
    # partition 1's of the checkpoint's round (round 2's left), partition 2's replaced by partition 3's, partition
    # 3's cut short
    "resume-client-state-damaged": Case(
        ("run", "--resume", "{tmp}/rd"),
        ("{tmp}/rd: cannot resume: its clients' state is not the state checkpoint.pt recorded at round 4: "
         "partition 0: {tmp}/rd/client_state/partition-0/round-4.bin is missing; ",
         "partition 1: {tmp}/rd/client_state/partition-1/round-4.bin is missing (round-2.bin there is another "
         "round's); ",
         "partition 2: {tmp}/rd/client_state/partition-2/round-4.bin is not the file this run wrote (another run's, "
         "or changed since it was written); ",
         "partition 3: {tmp}/rd/client_state/partition-3/round-4.bin is not the file this run wrote (another run's, "
         "or changed since it was written)"),
        setup="client_state_damaged",
    ),  # fmt: skip
    "record-upgrade-checkpoint-without-client-state": Case(
        ("record", "upgrade", "{tmp}/rd"),
        ("{tmp}/rd/checkpoint.pt: written by a fedsim before it recorded client_state",),
        setup="client_state_unrecorded",
    ),
    "resume-config-not-yaml": Case(
        ("run", "--resume", "{tmp}/rd"), ("config.yaml", "not valid YAML"), setup="broken_run_config"
    ),
    "resume-corrupt-checkpoint": Case(
        ("run", "--resume", "{tmp}/rd"), ("not a readable fedsim checkpoint",), setup="checkpointed_run", creates=True
    ),
    # a run directory's config.yaml that does not validate: the message named a field, not the file
    "resume-another-layout": Case(
        ("run", "--resume", "{tmp}/rd"), LAYOUT, setup="another_layout_checkpoint"
    ),
    # --- fedsim sweep
    "sweep-missing": Case(("sweep", "{tmp}/none.yaml"), ("sweep file not found",)),
    "sweep-a-directory": Case(("sweep", "{tmp}"), ("a directory, not a YAML file",)),
    "sweep-parallel-negative": Case(
        ("sweep", "{tmp}/sweep.yaml", "--parallel", "-1"), ("(or --parallel) = -1", "runs at once in 1.."),
        setup="sweep",
    ),  # fmt: skip
    "sweep-parallel-zero": Case(
        ("sweep", "{tmp}/sweep.yaml", "--parallel", "0"), ("(or --parallel) = 0",), setup="sweep"
    ),  # fmt: skip
    # a thousand fedsim processes at once on a small machine: bounded as simulation.threads is
    "sweep-parallel-a-thousand": Case(
        ("sweep", "{tmp}/sweep.yaml", "--parallel", "1000"), ("(or --parallel) = 1000", "x this machine's CPUs"),
        setup="sweep",
    ),  # fmt: skip
    "sweep-parallel-text": Case(
        ("sweep", "{tmp}/sweep.yaml", "--parallel", "two"), ("--parallel", "invalid int"), setup="sweep"
    ),  # fmt: skip
    "sweep-empty-grid": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("grid.seed is an empty list",), setup="sweep_empty_grid"
    ),  # fmt: skip
    "sweep-key-unknown": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("sweep file", "gird: unknown key", "valid keys: base, name"), setup="sweep_typo"
    ),  # fmt: skip
    "sweep-bad-cell": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("sweep cell", "unknown norms 'nope'"), setup="sweep_bad_cell"
    ),  # fmt: skip
    "sweep-set-varied-key": Case(
        ("sweep", "{tmp}/sweep.yaml", "--set", "seed=3"), ("the sweep varies 'seed'",), setup="sweep"
    ),  # fmt: skip
    "sweep-set-without-value": Case(
        ("sweep", "{tmp}/sweep.yaml", "--set", "train.rounds"), ("--set 'train.rounds': expected key.path=value",),
        setup="sweep",
    ),  # fmt: skip
    "sweep-set-key-unknown": Case(
        ("sweep", "{tmp}/sweep.yaml", "--set", "train.roundz=5"), ("train.roundz: unknown key",), setup="sweep"
    ),  # fmt: skip
    "sweep-key-in-grid-and-axes": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("model.norm set by both grid and axes.a",), setup="sweep_grid_and_axes"
    ),  # fmt: skip
    # the full budget must not take a short run for its cell
    "sweep-cell-of-other-settings": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("train.rounds: 2 there, 1 here", "--output"), setup="sweep_run_longer"
    ),  # fmt: skip
    "sweep-output-a-file": Case(
        ("sweep", "{tmp}/sweep.yaml", "--output", "{tmp}/afile"),
        ("--output (or the sweep file's output)", "a file"),
        setup="sweep_and_file",
    ),  # fmt: skip
    "sweep-output-inside-a-run": Case(
        ("sweep", "{tmp}/sweep.yaml", "--output", "{tmp}/rd"),
        ("--output (or the sweep file's output)", "/rd/sweep is inside the run directory"),
        setup="sweep_and_run",
    ),
    "sweep-lone-surrogate": Case(
        ("sweep", "{tmp}/sweep.yaml", "--output", "{tmp}/sweeps"),
        ("'a\\udcffb' holds '\\udcff', a lone surrogate",),
        setup="sweep_surrogate",
    ),
    # cells that would share or ignore a directory
    "sweep-cells-duplicate": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("two cells have the same overrides (seed=0): remove the duplicate",),
        setup="sweep_duplicate_cells",
    ),  # fmt: skip
    "sweep-cell-names-collide": Case(
        ("sweep", "{tmp}/sweep.yaml"),
        ("cells {data.cache_dir=a/b} and {data.cache_dir=a_b} differ, but their directory names collide "
         "(cache_dir=a_b: ",),
        setup="sweep_colliding_names",
    ),  # fmt: skip
    "sweep-set-run-dir": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("set sets output.run_dir: each cell's name and ",), setup="sweep_set_run_dir"
    ),  # fmt: skip
    "sweep-cells-set-name": Case(("sweep", "{tmp}/sweep.yaml"), ("cells sets name: ",), setup="sweep_cells_name"),
    "sweep-cli-set-output-dir": Case(
        ("sweep", "{tmp}/sweep.yaml", "--set", "output.dir=x"),
        ("--set output.dir=x: sets output.dir: each cell's name ",),
        setup="sweep_one_seed",
    ),
    "sweep-cells-invalid": Case(
        ("sweep", "{tmp}/sweep.yaml"),
        ("2 of 4 sweep cells are invalid, so none was run: cell norm=nope: ", "; cell lr=-1: train.lr"),
        setup="sweep_invalid_cells",
    ),
    # the section's mapping would replace the other's value: the cell named lr=0.1 would train at 0.2
    "sweep-section-and-key": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("train and train.lr set by grid",), setup="sweep_section_and_key"
    ),  # fmt: skip
    "sweep-set-and-grid": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("train.rounds set by both set and grid",), setup="sweep_set_and_grid"
    ),  # fmt: skip
    "sweep-name-a-path": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("name = '../../escape'", "is a directory name under output"),
        setup="sweep_name_a_path",
    ),  # fmt: skip
    "sweep-based-on-itself": Case(
        ("sweep", "{tmp}/sweeps/s.yaml"),
        ("base: s.yaml is this sweep file; give the run config its cells start from",),
        setup="sweep_based_on_itself",
    ),
    "sweep-too-many-cells": Case(
        ("sweep", "{tmp}/sweep.yaml"),
        ("3,003 cells (cells x axes x grid), more than max_cells = 1,000; each is validated before the first run: "
         "shrink the grid, or set max_cells: 3003 in the file",),
        setup="sweep_too_many_cells",
    ),  # fmt: skip
    # 10^20 cells: refused from the lists' lengths, and never advised past the limit max_cells has
    "sweep-cells-beyond-the-bound": Case(
        ("sweep", "{tmp}/sweep.yaml"),
        ("100,000,000,000,000,000,000 cells (cells x axes x grid), more than max_cells = 10,000; each is validated "
         "before the first run: shrink the grid, or split it into several sweep files (max_cells is at most 10,000)",),
        setup="sweep_cells_beyond_bound",
    ),  # fmt: skip
    "sweep-max-cells-above-bound": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("max_cells", "less than or equal to 10000"), setup="sweep_max_cells_huge"
    ),  # fmt: skip
    "sweep-parallel-a-boolean": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("sweep.yaml: parallel",), setup="sweep_parallel_true"
    ),  # fmt: skip
    "sweep-bad-data": Case(
        ("sweep", "{tmp}/sweep.yaml"), ("npz dataset", "(every cell of the sweep)"), setup="sweep_bad_data"
    ),  # fmt: skip
    # nothing shows it is the cell's run: a damaged run directory, never "already complete"
    "sweep-finished-cell-without-config": Case(
        ("sweep", "{tmp}/sweep.yaml"),
        ("sweep cell seed=1: ", "holds a finished run (summary.json) without a readable config.yaml (the run's "
         "config.yaml not found: ", "damaged run directory; restore its config.yaml, or delete that directory to "
         "redo the cell"),
        setup="sweep_cell_config_lost",
    ),  # fmt: skip
    "sweep-a-list": Case(("sweep", "{tmp}/list.yaml"), ("top level must be a mapping",), setup="list_config"),
    "sweep-duplicate-key": Case(("sweep", "{tmp}/dup.yaml"), ("is given twice",), setup="duplicate_config"),
    # --- fedsim report
    "report-missing-dir": Case(("report", "{tmp}/none"), ("DIR", "/none is not a directory (nothing is there)")),
    "report-a-file": Case(
        ("report", "{tmp}/afile"), ("DIR", "/afile is not a directory: give a run directory or"), setup="a_file"
    ),  # fmt: skip
    "report-no-runs": Case(("report", "{tmp}"), ("no finished runs (summary.json)",)),
    "report-corrupt-summary": Case(("report", "{tmp}"), ("summary.json", "not readable"), setup="corrupt_summary"),
    "report-summary-a-list": Case(
        ("report", "{tmp}"),
        ("summary.json: not readable as the JSON fedsim writes (the top level: Input should be a valid dictionary",),
        setup="summary_a_list",
    ),
    "report-summary-key-twice": Case(
        ("report", "{tmp}"),
        ("summary.json: not readable as the JSON fedsim writes (rounds: given twice in one object)",),
        setup="summary_key_twice",
    ),
    "report-metrics-value-wrong": Case(
        ("report", "{tmp}"),
        ("metrics.jsonl, line 2: not readable as the JSON fedsim writes (client_mean_acc: Input should be a valid",),
        setup="metrics_value_wrong",
    ),
    # a line the run could not have written: report, plot and the API drew and tabulated it
    "report-metrics-not-a-metric": Case(
        ("report", "{tmp}"),
        ("line 2: not readable as the JSON fedsim writes (train_loss: a metric is a number or null, or a list or "
         "mapping of them (got 'x'))",),
        setup="metrics_not_a_metric",
    ),  # fmt: skip
    "report-metrics-round-repeated": Case(
        ("report", "{tmp}"),
        ("line 2: not readable as the JSON fedsim writes (round: 1 after round 1; each line's round is larger "
         "than the last's",),
        setup="metrics_round_repeated",
    ),  # fmt: skip
    "plot-metrics-round-beyond": Case(
        ("plot", "{tmp}/rd", "--out", "{tmp}/out"),
        ("line 2: not readable as the JSON fedsim writes (round: round 3 is beyond the run's 2 rounds (got 3))",),
        setup="metrics_round_beyond",
    ),
    "report-metrics-key-twice": Case(
        ("report", "{tmp}"), ("line 2: not readable as the JSON fedsim writes (round: given twice in one object)",),
        setup="metrics_key_twice",
    ),  # fmt: skip
    # a copied run directory is one sample: the report read "seeds 2, 12.28 ± 0.00" for two copies
    "report-a-seed-twice": Case(
        ("report", "{tmp}", "--out", "{tmp}/rep"),
        ("are both seed 0 of one config (name, output, simulation, diagnostics, deploy aside): runs are averaged "
         "over distinct seeds; move one of them out of the directories given",),
        setup="run_copied",
    ),  # fmt: skip
    "report-corrupt-metrics": Case(("report", "{tmp}"), ("metrics.jsonl, line 2",), setup="corrupt_metrics"),
    # a finished run whose metrics were lost: its seed group's curve vanished from accuracy.png in silence
    "report-metrics-missing": Case(
        ("report", "{tmp}", "--out", "{tmp}/out"),
        ("rd/metrics.jsonl: 0 bytes where the run wrote", "in summary.json's files", "move it out"),
        setup="metrics_missing",
    ),
    # a finished run's files that disagree with each other or with the record (tests/test_run_record.py)
    "report-metrics-round-not-evaluated": Case(
        ("report", "{tmp}"),
        ("rd/metrics.jsonl, line 1: not readable as the JSON fedsim writes (round: round 1 is not one the run "
         "evaluated (eval.every: 2, and its last, 3) (got 1))",),
        setup="metrics_round_not_evaluated",
    ),  # fmt: skip
    "report-summary-forged": Case(
        ("report", "{tmp}"),
        ("rd: summary.json's final_client_mean_acc is 0.99, its metrics.jsonl's ",),
        setup="summary_forged",
    ),
    "report-summary-edited": Case(
        ("report", "{tmp}"),
        ("rd: summary.json is not the summary the run wrote (summary_sha256 differs: a field edited after the run)",),
        setup="summary_edited",
    ),
    "report-summary-rounds": Case(
        ("report", "{tmp}"),
        ("rd: summary.json says the run finished 1 rounds, its config.yaml's train.rounds is 2",),
        setup="summary_rounds",
    ),
    "report-config-missing": Case(
        ("report", "{tmp}"),
        ("rd: a run directory (partition.csv, metrics.jsonl, summary.json, progress.json) without its config.yaml",),
        setup="config_missing",
    ),
    "report-partition-edited": Case(
        ("report", "{tmp}"),
        ("rd/partition.csv: not the file the run wrote (its sha256 in summary.json's files differs",),
        setup="partition_edited",
    ),
    # seeds of one config whose data.root held other data: averaged as one row before
    "report-seeds-of-other-data": Case(
        ("report", "{tmp}/runs", "--out", "{tmp}/rep"),
        ("{tmp}/runs/s0 and {tmp}/runs/s1 are seeds of one config trained on other data (data_sha256 ",),
        setup="seeds_of_other_data",
    ),
    # a stopped run (no summary.json) is held to progress.json, and without it to its checkpoint
    "plot-stopped-run-config-edited": Case(
        ("plot", "{tmp}/rd", "--out", "{tmp}/out"),
        ("rd/config.yaml: ", " bytes where the run wrote ", " (its size in progress.json's files"),
        setup="stopped_run_config_edited",
    ),
    "plot-stopped-run-lines-edited": Case(
        ("plot", "{tmp}/rd", "--out", "{tmp}/out"),
        ("metrics.jsonl does not begin with the 2 lines its checkpoint.pt holds (edited or lost after the run",),
        setup="stopped_run_lines_edited",
    ),
    "report-target-nan": Case(("report", "{tmp}", "--target", "nan"), ("--target nan", "(0, 1]")),
    "report-target-above-one": Case(("report", "{tmp}", "--target", "2"), ("--target 2.0",)),
    "report-target-text": Case(("report", "{tmp}", "--target", "high"), ("--target", "invalid float")),
    "report-vs-unknown": Case(
        ("report", "{tmp}", "--vs", "partition.gamma"), ("--vs partition.gamma", "numeric"), setup="finished_run"
    ),  # fmt: skip
    "report-vs-dash": Case(("report", "{tmp}", "--vs", "-x"), ("argument --vs: expected one argument", "--vs=VALUE")),
    "report-out-theirs": Case(
        ("report", "{tmp}/rd", "--out", "{tmp}"),
        ("--out {tmp} is not fedsim's: fedsim writes only into a new or empty directory or one of its own results, "
         "run, sweep or local continuation directories (marked .fedsim) or one holding only such directories; give "
         "another --out, or empty that directory",),
        setup="finished_run",
    ),  # fmt: skip
    "report-dir-theirs": Case(("report", "{tmp}"), ("--out", "is not fedsim's"), setup="finished_run"),
    # --- a run record of another version, or one its files disagree with
    "report-older-record": Case(
        ("report", "{tmp}/rd", "--out", "{tmp}/rep"),
        ("rd/summary.json: a run record of version 0, older than this", "upgrade it with `fedsim record upgrade"),
        setup="older_record",
    ),
    "report-newer-record": Case(
        ("report", "{tmp}/rd", "--out", "{tmp}/rep"),
        (f"of version {RECORD_VERSION + 1}, newer than this fedsim's",),
        setup="newer_record",
    ),
    "record-upgrade-newer": Case(
        ("record", "upgrade", "{tmp}/rd"), (f"of record version {RECORD_VERSION + 1}, newer than this fedsim's",),
        setup="newer_record",
    ),  # fmt: skip
    "record-upgrade-edited-summary": Case(
        ("record", "upgrade", "{tmp}/rd"),
        ("summary.json is not the file the run wrote (summary_sha256 in summary",),
        setup="older_record_edited",
    ),
    "record-upgrade-metrics-short": Case(
        ("record", "upgrade", "{tmp}/rd"),
        ("metrics.jsonl ends at round 1 but the run finished 2 rounds",),
        setup="older_record_metrics_short",
    ),
    # --- fedsim local
    "local-missing-dir": Case(("local", "{tmp}/none", "--client", "0", "--steps", "5"), ("not a run directory",)),
    "local-steps-zero": Case(
        ("local", "{tmp}", "--client", "0", "--steps", "0"),
        ("--steps 0: the local steps to take must be in 1..1,000,000",),
    ),
    # a traceback before (std::bad_alloc building the steps' batch indices), after local-0/ was made
    "local-steps-huge": Case(
        ("local", "{tmp}", "--client", "0", "--steps", "99999999999999999999"),
        ("--steps 99999999999999999999: the local steps to take must be in 1..1,000,000 (as train.local_steps)",),
    ),
    "local-every-zero": Case(
        ("local", "{tmp}", "--client", "0", "--steps", "2", "--every", "0"),
        ("--every 0: evaluate every E steps with E in 1..2 (--steps)",),
    ),
    "local-every-past-steps": Case(
        ("local", "{tmp}", "--client", "0", "--steps", "5", "--every", "6"),
        ("--every 6: evaluate every E steps with E in 1..5 (--steps)",),
    ),
    "local-client-out-of-range": Case(
        ("local", "{tmp}/rd", "--client", "4", "--steps", "5"),
        ("--client 4 is out of range; allowed 0..3 (the run's train.num_clients)",), setup="finished_run",
    ),
    "local-client-negative": Case(
        ("local", "{tmp}/rd", "--client", "-1", "--steps", "5"), ("--client -1 is out of range; allowed 0..3",),
        setup="finished_run",
    ),
    "local-client-huge": Case(
        ("local", "{tmp}/rd", "--client", "99999999999999999999", "--steps", "5"),
        ("--client 99999999999999999999 is out of range; allowed 0..3",), setup="finished_run",
    ),
    # keys that redefine which data is client k's, or have no part in a continuation, were taken in silence
    "local-set-num-clients": Case(
        ("local", "{tmp}/rd", "--client", "0", "--steps", "2", "--set", "train.num_clients=5"),
        ("--set train.num_clients: fedsim local continues client k of the run as the run split its data, with plain "
         "local SGD; --set changes only that training: train.lr, train.momentum, train.weight_decay, "
         "train.batch_size, data.augment, model[.<key>], data.root, data.cache_dir, simulation.device, "
         "simulation.threads, eval.batch_size",), setup="finished_run",
    ),
    **{
        f"local-set-{key}": Case(
            ("local", "{tmp}/rd", "--client", "0", "--steps", "2", "--set", f"{key}={value}"),
            (f"--set {key}: fedsim local continues client k of the run",), setup="finished_run",
        )
        for key, value in [("partition.beta", "100"), ("strategy.name", "scaffold"), ("output.run_dir", "/tmp/x"),
                           ("seed", "1")]  # fmt: skip
    },
    # a control character in a --set item: a directory whose name spanned two lines
    "local-set-control-character": Case(
        ("local", "{tmp}/rd", "--client", "0", "--steps", "2", "--set", "train.lr=0.1\n#\tx"),
        ("--set 'train.lr=0.1\\n#\\tx': holds the control character '\\n'",), setup="finished_run",
    ),
    # fedsim run's own checks of the effective config: a batch of 100,000 allocated 23 GB before
    "local-set-batch-larger-than-data": Case(
        ("local", "{tmp}/rd", "--client", "0", "--steps", "2", "--set", "train.batch_size=5001"),
        ("train.batch_size = 5001 is larger than the whole training set (5000 images of",), setup="finished_run",
    ),
    "local-client-text": Case(("local", "{tmp}", "--client", "one", "--steps", "2"), ("--client", "invalid int")),
    "local-another-layout": Case(
        ("local", "{tmp}/rd", "--client", "0", "--steps", "5"), LAYOUT,
        setup="another_layout_run",
    ),
    "local-unfinished": Case(
        ("local", "{tmp}/rd", "--client", "0", "--steps", "5"), ("not a finished run", "--resume"), setup="killed_run"
    ),  # fmt: skip
    # a re-run with other --steps wrote over the last one's results in silence
    "local-another-request": Case(
        ("local", "{tmp}/rd", "--client", "2", "--steps", "2"),
        ("{tmp}/rd/local-2 holds the results of another fedsim local request (--client 2 --steps 5 --every 1, "
         "--set nothing); move or delete that directory to run this one",),
        setup="another_local_request",
    ),  # fmt: skip
    # a seed edited after the run splits the data otherwise: client k's data would be another client's
    "local-config-edited": Case(
        ("local", "{tmp}/rd", "--client", "0", "--steps", "2"),
        ("{tmp}/rd/config.yaml: not the file the run wrote (its sha256 in summary.json's files differs; edited "
         "after the run, or another run's): restore the whole run directory, or move it out of the directories "
         "given",),
        setup="config_edited",
    ),  # fmt: skip
    "local-other-data": Case(
        ("local", "{tmp}/rd", "--client", "0", "--steps", "2", "--set", "data.root={tmp}/relabelled.npz"),
        ("data.root {tmp}/relabelled.npz holds other data than the run trained on (data_sha256 ",
         "{tmp}/rd/summary.json recorded ", "...): refused; give the run the data it began with"),
        setup="relabelled_data",
    ),  # fmt: skip
    # --- fedsim plot
    # local.json records the model it continued: the run run again since, or a local-<k>/ copied into another run
    "plot-local-of-another-model": Case(
        ("plot", "{tmp}/rd/local-1"),
        ("{tmp}/rd/local-1: a continuation of another model than its run's (model_sha256 in local.json is not the "
         "model.pt in {tmp}/rd/summary.json's files: the run was run again since, or this directory was copied from "
         "another run's); move or delete it",),
        setup="local_of_another_model",
    ),  # fmt: skip
    "plot-missing-dir": Case(("plot", "{tmp}/none"), ("not a directory",)),
    "plot-no-runs": Case(("plot", "{tmp}"), ("no run directories",)),
    "plot-corrupt-metrics": Case(("plot", "{tmp}/rd"), ("metrics.jsonl, line 2",), setup="corrupt_metrics"),
    "plot-corrupt-config": Case(("plot", "{tmp}/rd"), ("config.yaml", "not valid YAML"), setup="broken_run_config"),
    "plot-corrupt-partition": Case(
        ("plot", "{tmp}/rd"), ("partition.csv", "not the partition table"), setup="corrupt_partition"
    ),  # fmt: skip
    "plot-metrics-empty": Case(
        ("plot", "{tmp}/rd", "--out", "{tmp}/out"),
        ("rd/metrics.jsonl: 0 bytes where the run wrote", "in summary.json's files"),
        setup="metrics_empty",
    ),
    # a run's config.yaml that does not validate (another version's layout, an edit) was drawn without a word
    "plot-another-layout": Case(("plot", "{tmp}/rd", "--out", "{tmp}/out"), LAYOUT, setup="another_layout_run"),
    "report-another-layout": Case(("report", "{tmp}", "--out", "{tmp}/out"), LAYOUT, setup="another_layout_run"),
    "plot-out-theirs": Case(
        ("plot", "{tmp}/rd", "--out", "{tmp}"), ("is not fedsim's", "give another --out"), setup="finished_run"
    ),  # fmt: skip
    "plot-default-out-theirs": Case(  # several runs: the current directory, the case's own
        ("plot", "{tmp}/rd", "{tmp}/rd"), ("--out . is not fedsim's",), setup="finished_run"
    ),  # fmt: skip
    "plot-out-a-file": Case(
        ("plot", "{tmp}/rd", "--out", "{tmp}/afile"),
        ("--out: {tmp}/afile is a file, not a directory; give another --out",),
        setup="finished_run_and_file",
    ),  # fmt: skip
    "report-out-a-compose-project": Case(
        ("report", "{tmp}/rd", "--out", "{tmp}/project"),
        ("--out {tmp}/project is a fedsim compose project, not a results, run, sweep or local continuation:",),
        setup="finished_run_and_compose_project",
    ),
    # --- fedsim compose
    "compose-nodes-zero": Case(
        ("compose", "{cfg}", "--nodes", "0", "--out", "{tmp}/c"), ("--nodes 0: train.num_clients",)
    ),
    "compose-nodes-text": Case(("compose", "{cfg}", "--nodes", "abc"), ("--nodes", "invalid int")),
    "compose-memory-unknown": Case(("compose", "{cfg}", "--node-memory", "lots"), ("--node-memory 'lots'", "4g")),
    # argparse takes a value starting with '-' for an option: "expected one argument", and no way out
    "compose-memory-dash": Case(
        ("compose", "{cfg}", "--node-memory", "-4g"), ("--node-memory: expected one argument", "--node-memory=VALUE")
    ),
    "compose-out-a-file": Case(("compose", "{cfg}", "--out", "{tmp}/afile"), ("--out", "is a file"), setup="a_file"),
    # Flower's SuperLink refuses to start (exit 104) and the SuperNodes exit 303: refused up front
    "compose-supernode-auth-without-tls": Case(
        ("compose", "{cfg}", "--out", "{tmp}/p", "--set", "deploy.supernode_auth=true"),
        ("deploy.supernode_auth is true but deploy.tls is false",),
    ),
    "compose-out-theirs": Case(
        ("compose", "{cfg}", "--out", "{tmp}/theirs"),
        (
            "/theirs is not fedsim's: fedsim writes only into a new or empty directory or one of its own compose "
            "project directories (marked .fedsim); give another --out, or empty that directory",
        ),
        setup="their_directory",
    ),
    "compose-no-data-root": Case(("compose", "{cfg}", "--out", "{tmp}/c", "--set", "data.root="), ("data.root",)),
    # a project Docker Compose could not run as fedsim meant it (tests/test_compose.py)
    "compose-nodes-above-bound": Case(
        ("compose", "{cfg}", "--nodes", "1001", "--out", "{tmp}/p"),
        ("--nodes 1001: fedsim compose writes one SuperNode container per client, at most 1,000 (one Docker "
         "network); run more clients with fedsim run",),
    ),  # fmt: skip
    "compose-host-not-a-name": Case(
        ("compose", "{cfg}", "--out", "{tmp}/p", "--set", "deploy.tls=true", "--superlink-host=a b"),
        ("--superlink-host 'a b': give a DNS name (dot-separated labels of 1 to 63 letters, digits, '-' or '_', none "
         "starting or ending with '-', not digits and dots only; at most 253 characters) or an IP address, e.g. "
         "superlink, server.example.org, 10.0.0.5",),
    ),  # fmt: skip
    "compose-memory-below-a-gibibyte": Case(
        ("compose", "{cfg}", "--out", "{tmp}/p", "--node-memory", "1023m"),
        ("--node-memory '1023m': from 1g (a SuperNode's warm ClientApp process alone holds torch, Flower and fedsim, "
         "about 750 MB) to 1024g (1 TiB) per SuperNode, e.g. 4g, 1536m",),
    ),  # fmt: skip
    "compose-data-unmountable": Case(
        ("compose", "{cfg}", "--out", "{tmp}/p", "--set", "data.root={tmp}/a}b/mnist_small.npz"),
        ("data.root: Compose cannot mount '{tmp}/a}b', a path holding '}'; move or link the data to a directory "
         "whose path has no $ or } or :",),
        setup="data_in_a_brace",
    ),  # fmt: skip
    "compose-out-with-a-colon": Case(
        ("compose", "{cfg}", "--out", "{tmp}/a:b"),
        ("--out: Compose cannot mount '{tmp}/a:b', a path holding ':'; write the project to a directory whose path "
         "has no :",),
    ),  # fmt: skip
    # --- fedsim deploy
    "deploy-vmap": Case(("deploy", "{cfg}", "--set", "simulation.vmap_clients=2"), ("each SuperNode trains",)),
    "deploy-supernode-auth-without-tls": Case(
        ("deploy", "{cfg}", "--set", "deploy.supernode_auth=true"), ("SuperNode authentication needs TLS",)
    ),
    "deploy-address-elsewhere": Case(
        ("deploy", "{cfg}", "--set", "deploy.address=192.0.2.77"), ("deploy.address = '192.0.2.77'", "this host")
    ),
    "deploy-bad-data": Case(("deploy", "{cfg}", "--set", "data.root=nowhere.npz"), ("no file at",)),
    # --- the command line itself
    "list-empty-kind": Case(
        ("list", ""), ("unknown kind ''; valid: strategies, norms, models, datasets, partitions, trackers",)
    ),
    "list-unknown-kind": Case(("list", "planets"), ("unknown kind 'planets'", "strategies")),
    "command-unknown": Case(("fly",), ("invalid choice: 'fly'",)),
    # argparse kept the last of two values and dropped the first in silence
    "option-given-twice": Case(
        ("report", "{tmp}", "--target", "0.5", "--target", "0.9"),
        ("report: argument --target", ": given twice (0.5, then 0.9): give it once (see fedsim report --help)"),
    ),
    # an unset shell variable is an empty path, which Python reads as the current directory
    "path-empty": Case(("report", ""), ("report: argument dir: an empty path: give a file or directory",)),
    "option-unknown": Case(("run", "{cfg}", "--fast"), ("unrecognized arguments: --fast",)),
}


# --- what the cases need ---------------------------------------------------------------------------

PLUGINS = '''
from fedsim.data import DatasetLoader
from fedsim.norms import Normaliser
from fedsim.partitions import Partitioner
from fedsim.strategies import StrategySpec


def loader_function(root, download, cache_dir):
    """A loader written as the old contract had it: a function."""


class RaisingLoader(DatasetLoader):
    def load(self, source):
        return {}["x_train"]


class ListLoader(DatasetLoader):
    def load(self, source):
        return []


class RaisingPartitioner(Partitioner):
    def assign(self, labels, num_clients, rng):
        return 1 / 0


class RaisingNorm(Normaliser):
    def make(self, site, num_features):
        raise TypeError("this normaliser cannot be built")


class NotASpec:
    class Params:
        pass


class RaisingSpec(StrategySpec):
    def __init__(self, params):
        raise ValueError("this strategy cannot be built")


class ServerRaises(StrategySpec):
    def server(self, setup):
        raise RuntimeError("no server half today")


class AdaptRaises(StrategySpec):
    def adapt_model(self, model, seed):
        raise RuntimeError("no model change today")


class AdaptReturnsNothing(StrategySpec):
    def adapt_model(self, model, seed):
        model.classifier = None
'''


def _a_file(tmp: Path) -> None:
    (tmp / "afile").write_text("not a directory")


def _their_directory(tmp: Path) -> None:
    (tmp / "theirs").mkdir()
    (tmp / "theirs" / "compose.yaml").write_text("services: {mine: {image: busybox}}\n")


def _symlink_loop(tmp: Path) -> None:
    (tmp / "loop").symlink_to(tmp / "loop")


def _compose_project(tmp: Path) -> None:
    (tmp / "project").mkdir()
    (tmp / "project" / ".fedsim").write_text("compose project\n")


def _data_in_a_brace(tmp: Path) -> None:
    from tests.conftest import MNIST_SMALL

    (tmp / "a}b").mkdir()
    (tmp / "a}b" / "mnist_small.npz").symlink_to(MNIST_SMALL)


def _plugins(tmp: Path) -> None:
    (tmp / "bad_plugins.py").write_text(PLUGINS)
    (tmp / "bad_import.py").write_text("raise RuntimeError('this module cannot be imported')\n")
    (tmp / "bad_syntax.py").write_text("def broken(:\n")


def _npz(path: Path, **arrays: np.ndarray) -> None:
    x = np.zeros((20, 28, 28), np.uint8)
    y = np.arange(20, dtype=np.int64) % 10
    np.savez(path, **{"x_train": x, "y_train": y, "x_test": x, "y_test": y, **arrays})


def _npy_as_npz(tmp: Path) -> None:
    np.save(tmp / "renamed.npy", np.zeros((2, 28, 28), np.uint8))
    (tmp / "renamed.npy").rename(tmp / "renamed.npz")


def _forged_npz(tmp: Path) -> None:
    import zipfile

    header = b"{'descr': '|u1', 'fortran_order': False, 'shape': (900000000000000, 28), }"
    header += b" " * (127 - 10 - len(header)) + b"\n"
    member = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(64)
    with zipfile.ZipFile(tmp / "forged.npz", "w") as archive:
        for key in ("x_train", "y_train", "x_test", "y_test"):
            archive.writestr(f"{key}.npy", member)


def _partial_npz(tmp: Path) -> None:
    np.savez(tmp / "partial.npz", x_train=np.zeros((2, 28, 28), np.uint8), y_train=np.zeros(2, np.int64))


def _float_npz(tmp: Path) -> None:
    _npz(tmp / "floats.npz", x_train=np.zeros((20, 28, 28), np.float32))


def _channels_first_npz(tmp: Path) -> None:
    _npz(tmp / "nchw.npz", x_train=np.zeros((20, 3, 28, 28), np.uint8))


def _rgba_npz(tmp: Path) -> None:
    x = np.random.default_rng(0).integers(0, 256, (20, 8, 8, 4), dtype=np.uint8)
    x[..., 3] = 255
    _npz(tmp / "rgba.npz", x_train=x, x_test=x)


def _near_constant_npz(tmp: Path) -> None:
    x = np.random.default_rng(0).integers(0, 256, (20, 8, 8, 4), dtype=np.uint8)
    x[..., 2:] = 255
    x[0, 0, 0, 2] = 254
    _npz(tmp / "rgba.npz", x_train=x, x_test=x)


def _control_class_npz(tmp: Path) -> None:
    _npz(tmp / "ctl.npz", classes=np.array(["a\nb", *"bcdefghij"]))


def _twenty_npz(tmp: Path) -> None:
    _npz(tmp / "twenty.npz")  # 2 images of each class


def _tiny_npz(tmp: Path) -> None:
    x = np.zeros((20, 8, 8), np.uint8)
    _npz(tmp / "tiny.npz", x_train=x, x_test=x)


def _few_classes_npz(tmp: Path) -> None:
    _npz(tmp / "few.npz", classes=np.array(["a", "b"]))


def _tree(tmp: Path, files: dict[str, tuple[int, int]]) -> None:
    """An image folder of real PNGs: path under tmp/tree -> (width, height)."""
    from PIL import Image

    for name, size in files.items():
        (tmp / "tree" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size, (9, 9, 9)).save(tmp / "tree" / name)


def _tree_files(classes: tuple[str, str] = ("a", "b")) -> dict[str, tuple[int, int]]:
    return {f"{split}/{cls}/{i}.png": (5, 4) for split in ("train", "test") for cls in classes for i in range(2)}


def _control_class_tree(tmp: Path) -> None:
    _tree(tmp, _tree_files(("a\tb", "b")))


def _mixed_size_tree(tmp: Path) -> None:
    _tree(tmp, {**_tree_files(), "test/b/1.png": (6, 4)})


def _train_only_tree(tmp: Path) -> None:
    _tree(tmp, {k: v for k, v in _tree_files().items() if k.startswith("train/")})


def _png(width: int, height: int) -> bytes:
    """A PNG header claiming ``width`` x ``height`` (the pixels are never decoded)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def _tar(path: Path, members: dict[str, bytes]) -> None:
    import io

    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _archive_parent(tmp: Path) -> None:
    _tar(tmp / "up.tar", {"../escape.png": _png(4, 4), "train/0/a.png": _png(4, 4)})


def _archive_absolute(tmp: Path) -> None:
    _tar(tmp / "abs.tar", {"/etc/evil.png": _png(4, 4)})


def _image_bomb(tmp: Path) -> None:
    for split in ("train", "test"):
        (tmp / "bomb" / split / "0").mkdir(parents=True)
        (tmp / "bomb" / split / "0" / "big.png").write_bytes(_png(30000, 30000))  # 900 megapixels


def _write(tmp: Path, name: str, text: str | bytes) -> None:
    (tmp / name).write_bytes(text if isinstance(text, bytes) else text.encode())


def _latin1_config(tmp: Path) -> None:
    _write(tmp, "latin1.yaml", "name: caf\xe9\n".encode("latin-1"))


def _list_config(tmp: Path) -> None:
    _write(tmp, "list.yaml", "- train\n- rounds\n")


def _empty_config(tmp: Path) -> None:
    _write(tmp, "empty.yaml", "")


def _duplicate_config(tmp: Path) -> None:
    _write(tmp, "dup.yaml", "train: {rounds: 2}\nbase: x\ntrain: {lr: 0.1}\n")


def _laughs_config(tmp: Path) -> None:
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    _write(tmp, "lol.yaml", "\n".join(lines) + "\n")


def _surrogate_config(tmp: Path) -> None:
    text = (tmp / "cfg.yaml").read_text()
    assert "\nname: t\n" in text
    _write(tmp, "surrogate.yaml", text.replace("\nname: t\n", '\nname: "q\\ud800"\n'))  # YAML's escape for it


DEEP = "[" * 400 + "]" * 400


def _deep_config(tmp: Path) -> None:
    _write(tmp, "deep.yaml", (tmp / "cfg.yaml").read_text() + f"extra: {DEEP}\n")


def _list_key(tmp: Path) -> None:
    _write(tmp, "bad.yaml", "? [a, b]\n: 1\n")  # was a TypeError (unhashable)


def _mapping_key(tmp: Path) -> None:
    _write(tmp, "bad.yaml", "{? {a: 1}: 2}\n")


def _recursive_alias(tmp: Path) -> None:
    _write(tmp, "bad.yaml", "train: &t {x: *t}\n")


def _long_int(tmp: Path) -> None:
    _write(tmp, "bad.yaml", "seed: " + "1" * 5000 + "\n")  # a ValueError


def _malformed_int(tmp: Path) -> None:
    _write(tmp, "bad.yaml", "seed: !!int 0x\n")


def _fifo_config(tmp: Path) -> None:
    from tests.test_reading import make_fifo  # a reader that waits on it gets an empty file, not a hang

    make_fifo(tmp / "fifo.yaml")


def _fifo_data(tmp: Path) -> None:
    from tests.test_reading import make_fifo

    make_fifo(tmp / "data.npz")


def _huge_config(tmp: Path) -> None:
    with open(tmp / "huge.yaml", "wb") as f:  # 50 MB, none of it written: refused by its size, before a byte is read
        f.truncate(50_000_000)


def _python_tag(tmp: Path) -> None:
    _write(tmp, "tagged.yaml", f"seed: !!python/object/apply:os.system ['touch {tmp}/pwned']\n")


def _custom_tag(tmp: Path) -> None:
    _write(tmp, "tagged.yaml", "seed: !custom 1\n")


def _merge_of_a_scalar(tmp: Path) -> None:
    _write(tmp, "tagged.yaml", "train:\n  <<: 5\n")


def _merge_key_twice(tmp: Path) -> None:
    text = (tmp / "cfg.yaml").read_text()
    assert "\neval:\n  every: 2\n" in text
    merged = "\neval:\n  every: 1\n  <<: {every: 2, every: 3}\n"
    _write(tmp, "merge.yaml", text.replace("\neval:\n  every: 2\n", merged))


def _broken_config(tmp: Path) -> None:
    _write(tmp, "broken.yaml", "train: {rounds: 2\n")


def _run_dir(tmp: Path, rounds: int = 2, every: int = 1, **output: Any) -> Path:
    """A run directory as a short run leaves it: config, partition table, metrics, summary."""
    run_dir = tmp / "rd"
    output = {"run_dir": str(run_dir), **output}
    cfg = small_config(tmp, train={"rounds": rounds}, eval={"every": every}, output=output)
    assert main(["run", str(write_config(tmp, cfg, "rd.yaml"))]) == 0
    return run_dir


def _finished_run(tmp: Path) -> None:
    _run_dir(tmp)


def _finished_run_and_compose_project(tmp: Path) -> None:
    _run_dir(tmp)
    _compose_project(tmp)


def _finished_run_and_file(tmp: Path) -> None:
    _run_dir(tmp)
    _a_file(tmp)


# what a summary of record version 1 and 2 holds that a fedsim before record versions did not write
CHECKSUMS = ("config_sha256", "partition_sha256", "metrics_sha256", "metrics_lines", "summary_sha256", "files")


def _older_record(tmp: Path) -> None:
    path = _run_dir(tmp) / "summary.json"
    summary = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in summary.items() if k not in (*CHECKSUMS, "record_version")}))


def _older_record_edited(tmp: Path) -> None:
    path = _run_dir(tmp) / "summary.json"
    summary = {k: v for k, v in json.loads(path.read_text()).items() if k != "record_version"}
    path.write_text(json.dumps({**summary, "final_client_mean_acc": 0.99}))  # edited after the run


def _older_record_metrics_short(tmp: Path) -> None:
    _older_record(tmp)
    lines = (tmp / "rd" / "metrics.jsonl").read_text().splitlines()
    (tmp / "rd" / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # its last evaluation lost


def _newer_record(tmp: Path) -> None:
    path = _run_dir(tmp) / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "record_version": RECORD_VERSION + 1}))


def _another_local_request(tmp: Path) -> None:
    another_request(_run_dir(tmp), 2)


def _local_of_another_model(tmp: Path) -> None:
    run_dir = _run_dir(tmp)
    assert main(["local", str(run_dir), "--client", "1", "--steps", "2"]) == 0
    replace_model(run_dir)


def _config_edited(tmp: Path) -> None:
    config = _run_dir(tmp) / "config.yaml"
    config.write_text(config.read_text().replace("seed: 0\n", "seed: 1\n", 1))


def _relabelled_data(tmp: Path) -> None:
    _run_dir(tmp)
    relabelled(MNIST_SMALL, tmp / "relabelled.npz")


def _killed_run(tmp: Path) -> None:
    (_run_dir(tmp) / "summary.json").unlink()


def _checkpointed_run(tmp: Path) -> None:
    run_dir = _run_dir(tmp)
    (run_dir / "summary.json").unlink()
    (run_dir / "checkpoint.pt").write_bytes(b"half a checkpoint")


def _resumable_run(tmp: Path) -> Path:
    """A run killed after its last checkpoint: a real checkpoint.pt, no summary.json."""
    run_dir = tmp / "rd"
    cfg = small_config(tmp, train={"rounds": 2}, output={"run_dir": str(run_dir), "checkpoint_every": 2})
    assert main(["run", str(write_config(tmp, cfg, "rd.yaml"))]) == 0
    (run_dir / "summary.json").unlink()
    return run_dir


def _resumable_run_config_changed(tmp: Path) -> None:
    config = _resumable_run(tmp) / "config.yaml"
    assert "lr: 0.05" in config.read_text()
    config.write_text(config.read_text().replace("lr: 0.05", "lr: 0.1"))


def _resumable_run_checkpoint_flipped(tmp: Path) -> None:
    path = _resumable_run(tmp) / "checkpoint.pt"
    saved = path.read_bytes()
    middle = len(saved) // 2
    path.write_bytes(saved[:middle] + bytes(b ^ 0xFF for b in saved[middle : middle + 256]) + saved[middle + 256 :])


def _resumable_run_checkpoint_unversioned(tmp: Path) -> None:
    path = _resumable_run(tmp) / "checkpoint.pt"
    unversioned = torch.load(path, weights_only=True)
    del unversioned["record_version"]  # as an older fedsim wrote it
    torch.save(unversioned, path)


def _stopped_scaffold_run(tmp: Path) -> Path:
    """A SCAFFOLD run stopped in round 5 (a client failed) after its checkpoints of rounds 2 and 4: its clients'
    state files of both rounds are there."""
    run_dir = tmp / "rd"
    strategy = {"name": "tests.plugins.flaky_scaffold:FlakyScaffold", "fail_round": 5, "when": "before"}
    train = {"rounds": 6, "on_client_failure": "fail"}
    cfg = small_config(tmp, strategy=strategy, train=train, output={"run_dir": str(run_dir), "checkpoint_every": 2})
    assert main(["run", str(write_config(tmp, cfg, "rd.yaml"))]) == 2
    return run_dir


def _client_state_damaged(tmp: Path) -> None:
    states = _stopped_scaffold_run(tmp) / "client_state"
    shutil.rmtree(states / "partition-0")
    (states / "partition-1" / "round-4.bin").unlink()
    shutil.copy(states / "partition-3" / "round-4.bin", states / "partition-2" / "round-4.bin")  # another's state
    own = states / "partition-3" / "round-4.bin"
    own.write_bytes(own.read_bytes()[: own.stat().st_size // 2])  # cut short: no longer decodes


def _client_state_unrecorded(tmp: Path) -> None:
    from fedsim.record.checkpoint import CLIENT_STATE_RECORD
    from tests.test_client_states import as_version_1

    as_version_1(_stopped_scaffold_run(tmp), CLIENT_STATE_RECORD)


def _another_layout_run(tmp: Path) -> None:
    """A finished run's files, and a checkpoint, beside a config.yaml of a layout fedsim does not read."""
    run_dir = _run_dir(tmp)
    (run_dir / "checkpoint.pt").write_bytes(b"a checkpoint")
    (run_dir / "config.yaml").write_text("dataset: mnist\ntrain: {rounds: 2}\n")


def _another_layout_checkpoint(tmp: Path) -> None:
    _another_layout_run(tmp)
    (tmp / "rd" / "summary.json").unlink()


def _stopped_run_tb_file(tmp: Path) -> None:
    """A run stopped after its last checkpoint, with a file where its tensorboard tracker's tb/ directory was."""
    run_dir = tmp / "rd"
    output = {"run_dir": str(run_dir), "checkpoint_every": 1, "trackers": ["tensorboard"]}
    cfg = small_config(tmp, train={"rounds": 2}, eval={"every": 1}, output=output)
    assert main(["run", str(write_config(tmp, cfg, "rd.yaml"))]) == 0
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "tb")
    (run_dir / "tb").write_text("not a directory")


def _broken_run_config(tmp: Path) -> None:
    run_dir = _run_dir(tmp)
    (run_dir / "summary.json").unlink()
    (run_dir / "config.yaml").write_text("train: {rounds: 2\n")


def _corrupt_summary(tmp: Path) -> None:
    (_run_dir(tmp) / "summary.json").write_text('{"rounds": 2')


def _summary_a_list(tmp: Path) -> None:
    (_run_dir(tmp) / "summary.json").write_text("[]")


def _summary_key_twice(tmp: Path) -> None:
    (_run_dir(tmp) / "summary.json").write_text('{"rounds": 2, "rounds": 3}')  # the last won


def _metrics_value_wrong(tmp: Path) -> None:
    path = _run_dir(tmp) / "metrics.jsonl"
    path.write_text(path.read_text().splitlines()[0] + '\n{"round": 2, "client_mean_acc": "high"}\n')


def _last_metrics_line(tmp: Path, line: str) -> None:
    path = _run_dir(tmp) / "metrics.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n" + line + "\n")


def _metrics_not_a_metric(tmp: Path) -> None:
    _last_metrics_line(tmp, '{"round": 2, "train_loss": "x"}')


def _metrics_round_repeated(tmp: Path) -> None:
    _last_metrics_line(tmp, '{"round": 1, "client_mean_acc": 0.4}')


def _metrics_round_beyond(tmp: Path) -> None:
    _last_metrics_line(tmp, '{"round": 3, "client_mean_acc": 0.5}')


def _metrics_key_twice(tmp: Path) -> None:
    _last_metrics_line(tmp, '{"round": 2, "round": 1}')  # the last won


def _metrics_round_not_evaluated(tmp: Path) -> None:
    path = _run_dir(tmp, rounds=3, every=2) / "metrics.jsonl"  # lines of rounds 2 and 3
    first, last = path.read_text().splitlines()
    path.write_text(json.dumps({**json.loads(first), "round": 1}) + "\n" + last + "\n")


def _summary_forged(tmp: Path) -> None:
    """A summary edited, its own checksum made again to match: held to the metrics lines."""
    from fedsim.record.manifest import summary_checksum

    path = _run_dir(tmp) / "summary.json"
    summary = {**json.loads(path.read_text()), "final_client_mean_acc": 0.99}
    path.write_text(json.dumps({**summary, "summary_sha256": summary_checksum(summary)}))


def _summary_edited(tmp: Path) -> None:
    path = _run_dir(tmp) / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "final_client_mean_acc": 0.99}))


def _summary_rounds(tmp: Path) -> None:
    path = _run_dir(tmp) / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rounds": 1}))


def _config_missing(tmp: Path) -> None:
    (_run_dir(tmp) / "config.yaml").unlink()


def _partition_edited(tmp: Path) -> None:
    """A count of partition.csv changed, its size kept."""
    path = _run_dir(tmp) / "partition.csv"
    rows = [line.split(",") for line in path.read_text().splitlines()]
    rows[1][2] = rows[1][2][:-1] + str((int(rows[1][2][-1]) + 1) % 10)
    path.write_text("".join(",".join(row) + "\n" for row in rows))


def _seeds_of_other_data(tmp: Path) -> None:
    from tests.conftest import MNIST_SMALL

    arrays = dict(np.load(MNIST_SMALL))
    for seed in (0, 1):
        if seed == 1:  # the same path, other data: the training labels rotated
            arrays["y_train"] = (arrays["y_train"] + 1) % 10
        np.savez(tmp / "mnist.npz", **arrays)
        output = {"run_dir": str(tmp / "runs" / f"s{seed}")}
        cfg = small_config(tmp, seed=seed, train={"rounds": 1}, data={"root": str(tmp / "mnist.npz")}, output=output)
        assert main(["run", str(write_config(tmp, cfg, f"s{seed}.yaml"))]) == 0


def _stopped_run_config_edited(tmp: Path) -> None:
    _killed_run(tmp)
    config = tmp / "rd" / "config.yaml"
    assert "lr: 0.05" in config.read_text()
    config.write_text(config.read_text().replace("lr: 0.05", "lr: 0.5"))


def _stopped_run_lines_edited(tmp: Path) -> None:
    """A run stopped after its last checkpoint and before its progress.json, a line the checkpoint holds edited."""
    run_dir = _run_dir(tmp, checkpoint_every=2)
    (run_dir / "summary.json").unlink()
    (run_dir / "progress.json").unlink()
    first, last = (run_dir / "metrics.jsonl").read_text().splitlines()
    edited = json.dumps({**json.loads(first), "client_mean_acc": 0.99})
    (run_dir / "metrics.jsonl").write_text(edited + "\n" + last + "\n")


def _run_copied(tmp: Path) -> None:
    shutil.copytree(_run_dir(tmp), tmp / "rd-copy")


def _corrupt_metrics(tmp: Path) -> None:
    path = _run_dir(tmp) / "metrics.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n{not json\n")


def _metrics_missing(tmp: Path) -> None:
    (_run_dir(tmp) / "metrics.jsonl").unlink()


def _metrics_empty(tmp: Path) -> None:
    (_run_dir(tmp) / "metrics.jsonl").write_text("")


def _corrupt_partition(tmp: Path) -> None:
    (_run_dir(tmp) / "partition.csv").write_text("split,client,0,total\ntrain,0,five,5\n")


def _sweep(tmp: Path, sweep: dict[str, Any] | None = None) -> None:
    write_config(tmp, small_config(tmp, train={"rounds": 1}), "base.yaml")
    body = sweep or {"base": "base.yaml", "output": str(tmp / "sweeps"), "grid": {"seed": [0, 1]}}
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(body))


def _sweep_empty_grid(tmp: Path) -> None:
    _sweep(tmp, {"base": "base.yaml", "grid": {"seed": []}})


def _sweep_typo(tmp: Path) -> None:
    _sweep(tmp, {"base": "base.yaml", "gird": {"seed": [0]}})


def _sweep_bad_cell(tmp: Path) -> None:
    _sweep(tmp, {"base": "base.yaml", "output": str(tmp / "sweeps"), "cells": [{"model.norm": "nope"}]})


def _sweep_surrogate(tmp: Path) -> None:
    write_config(tmp, small_config(tmp), "base.yaml")
    (tmp / "sweep.yaml").write_text(f'base: {tmp / "base.yaml"}\ngrid:\n  data.cache_dir: ["a\\udcffb"]\n')


def _sweep_grid_and_axes(tmp: Path) -> None:
    _sweep(tmp, {"base": "base.yaml", "grid": {"model.norm": ["ln"]}, "axes": {"a": [{"model.norm": "fn"}]}})


def _sweep_run_longer(tmp: Path) -> None:
    _sweep(tmp)
    assert main(["sweep", str(tmp / "sweep.yaml"), "--set", "train.rounds=2", "eval.every=1"]) == 0


def _tinyimagenet_without_val(tmp: Path) -> None:
    from PIL import Image

    (tmp / "tiny-imagenet-200" / "train" / "n01" / "images").mkdir(parents=True)
    Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp / "tiny-imagenet-200" / "train" / "n01" / "images" / "a.JPEG")


def _sweep_duplicate_cells(tmp: Path) -> None:
    make_sweep(tmp, {"seed": [0, 0]})


def _sweep_colliding_names(tmp: Path) -> None:
    make_sweep(tmp, {"data.cache_dir": ["a/b", "a_b"]})


def _sweep_set_run_dir(tmp: Path) -> None:
    make_sweep(tmp, {"seed": [0]}, set={"output.run_dir": "x"})  # each cell went to <sweep>/<cell> whatever it said


def _sweep_cells_name(tmp: Path) -> None:
    make_sweep(tmp, {"seed": [0]}, cells=[{"name": "mine"}])


def _sweep_one_seed(tmp: Path) -> None:
    make_sweep(tmp, {"seed": [0]})


def _sweep_invalid_cells(tmp: Path) -> None:
    make_sweep(tmp, {}, cells=[{"model.norm": "ln"}, {"model.norm": "nope"}, {"train.lr": -1}, {"model.norm": "none"}])


def _sweep_section_and_key(tmp: Path) -> None:
    make_sweep(tmp, {"train.lr": [0.1], "train": [{"lr": 0.2}]})


def _sweep_set_and_grid(tmp: Path) -> None:
    make_sweep(tmp, {"train.rounds": [1, 2]}, set={"train.rounds": 1})


def _sweep_name_a_path(tmp: Path) -> None:
    make_sweep(tmp, {"seed": [0]}, name="../../escape")


def _sweep_based_on_itself(tmp: Path) -> None:
    (tmp / "sweeps").mkdir()
    body = {"base": "s.yaml", "output": str(tmp / "out"), "grid": {"seed": [0, 1]}}
    (tmp / "sweeps" / "s.yaml").write_text(yaml.safe_dump(body))


def _sweep_too_many_cells(tmp: Path) -> None:
    make_sweep(tmp, {"seed": list(range(1001)), "model.norm": ["no1", "no2", "no3"]})


def _sweep_cells_beyond_bound(tmp: Path) -> None:
    make_sweep(tmp, {f"x{i}": list(range(10)) for i in range(20)}, max_cells=10_000)


def _sweep_max_cells_huge(tmp: Path) -> None:
    make_sweep(tmp, {"seed": [0, 1]}, max_cells=10_000_000)


def _sweep_parallel_true(tmp: Path) -> None:
    make_sweep(tmp, {"seed": [0]}, parallel=True)


def _sweep_bad_data(tmp: Path) -> None:
    (tmp / "bad.npz").write_bytes(b"not an archive")
    make_sweep(tmp, {"seed": [0, 1]}, set={"data.root": str(tmp / "bad.npz")})


def _sweep_cell_config_lost(tmp: Path) -> None:
    make_sweep(tmp, {"seed": [0, 1]})
    assert main(["sweep", str(tmp / "sweep.yaml")]) == 0
    shutil.rmtree(tmp / "sweeps" / "s" / "seed=0")  # a cell still to run: it must not start
    (tmp / "sweeps" / "s" / "seed=1" / "config.yaml").unlink()


def _sweep_and_run(tmp: Path) -> None:
    _sweep(tmp)
    _run_dir(tmp)


def _sweep_and_file(tmp: Path) -> None:
    _sweep(tmp)
    _a_file(tmp)


# every _name above is the setup "name"
SETUPS: dict[str, Callable[[Path], None]] = {
    name[1:]: f for name, f in list(globals().items()) if name.startswith("_") and not name.startswith("__")
}


def test_every_setup_exists_and_the_corpus_is_large() -> None:
    assert {c.setup for c in CASES.values() if c.setup} <= set(SETUPS)
    assert len(CASES) >= 150


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input_gets_one_clear_line(
    case_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[case_id]
    if case_id == "device-cuda-without-cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.chdir(tmp_path)  # relative paths of a case stay in its own directory
    monkeypatch.syspath_prepend(str(tmp_path))  # its plugin modules
    cfg = small_config(tmp_path, **case.config)
    write_config(tmp_path, cfg)
    if case.setup:
        SETUPS[case.setup](tmp_path)
        capsys.readouterr()
    before = {p for p in tmp_path.rglob("*")}
    argv = [a.replace("{cfg}", str(tmp_path / "cfg.yaml")).replace("{tmp}", str(tmp_path)) for a in case.argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own exit, through fedsim's one-line error
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, f"exit status {code}: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedsim: error: "), err
    assert "Traceback" not in err
    for fragment in (f.replace("{tmp}", str(tmp_path)) for f in case.expect):
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    if not case.creates:  # checked before anything ran: nothing new on disk but Python's own caches
        made = {p for p in tmp_path.rglob("*") if "__pycache__" not in p.parts} - before
        assert not made, sorted(map(str, made))


def test_non_finite_metrics_are_written_as_valid_json(tmp_path: Path) -> None:
    """A loss that overflows is recorded as null, never as NaN (which no JSON reader accepts)."""
    from fedsim.record.reader import read_metrics
    from fedsim.record.writer import RunDir

    out = RunDir(tmp_path)
    out.append_metrics({"round": 1, "global_loss": float("nan"), "per_class_acc": [0.5, float("inf")]})
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert read_metrics(tmp_path) == [{"round": 1, "global_loss": None, "per_class_acc": [0.5, None]}]
    json.loads(text)
