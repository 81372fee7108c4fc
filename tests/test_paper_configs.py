"""configs/paper: every LN-FL sweep plans at the paper's budget; missing data fails before training,
naming dataset, path and source; ``fedsim sweep --set / --output`` turn a sweep into a short run
elsewhere; a finished run of other settings is never reused; a paper cell reruns to identical numbers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from fedsim.app.cli import build_parser, main
from fedsim.data import load_dataset
from fedsim.engines.runner import run
from fedsim.errors import ConfigError, DataError, TrainingError
from fedsim.layout import choose_layout
from fedsim.sweep.execute import run_sweep
from fedsim.sweep.plan import plan
from tests.conftest import CIFAR_Q75, MNIST_SMALL, REPO, small_config, write_config

PAPER = REPO / "configs" / "paper"
SHARED = REPO.parent / "shared" / "datasets"
CIFAR100_SETTINGS = {("n_class", 2, 50), ("n_class", 5, 20), ("dirichlet", 0.1, 20)}

# file: (runs, dataset, clients, local steps, learning rates)
EXPECTED: dict[str, tuple[int, str, set[int], set[int], set[float]]] = {
    "table1_cifar10.yaml": (27, "imagefolder", {10}, {10}, {0.01}),
    "table1_cifar100.yaml": (27, "cifar100", {50, 20}, {10}, {0.01}),
    "table1_tinyimagenet.yaml": (27, "tinyimagenet", {200}, {10}, {0.01}),
    "table2_cnn_resnet.yaml": (12, "imagefolder", {10}, {10}, {0.01}),
    "table3_last_layer.yaml": (30, "imagefolder", {10}, {10}, {0.01}),
    "table4_norms.yaml": (18, "imagefolder", {10}, {10}, {0.01}),
    "table6_ln_variants.yaml": (9, "imagefolder", {10}, {10}, {0.01}),
    "table10_local_steps.yaml": (81, "imagefolder", {10}, {1, 10, 20}, {0.01}),
    "table11_cifar100_local_steps.yaml": (81, "cifar100", {50, 20}, {1, 10, 20}, {0.1, 0.01}),
    "table12_yogi.yaml": (18, "imagefolder", {10}, {10}, {0.01}),
    "table14_seeds.yaml": (24, "imagefolder", {10}, {10}, {0.01}),
    "fig5_beta.yaml": (18, "imagefolder", {10}, {10}, {0.01}),
    "fig7_lr.yaml": (15, "imagefolder", {10}, {10}, {0.001, 0.003, 0.01, 0.03, 0.1}),
    "table5_pacs.yaml": (15, "pacs", {12}, {10}, {0.001}),
    "table13_inner_site.yaml": (12, "imagefolder", {10}, {10}, {0.01}),
    "fig4_centralised.yaml": (6, "imagefolder", {10, 1}, {10}, {0.01}),
    "fig6_centralised_norms.yaml": (5, "imagefolder", {1}, {1000}, {0.001}),
}
# Centralised training (LN-FL App. D): Fig. 4 feeds the federation's data per round (batch 320 = 10 x 32),
# Fig. 6 trains with momentum 0.9 in long rounds (no optimiser state crosses rounds).
CENTRALISED = {"fig4_centralised.yaml": (10000, 320, 0.0), "fig6_centralised_norms.yaml": (100, 32, 0.9)}
DEFAULT_ROOTS = {
    "imagefolder": CIFAR_Q75,
    "cifar100": SHARED,
    "tinyimagenet": SHARED / "tiny-imagenet-200.zip",
    "pacs": SHARED / "PACS",
}


def test_every_paper_sweep_is_checked() -> None:
    files = {p.name for p in PAPER.glob("*.yaml") if not p.name.startswith("base_")}
    assert files == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.slow
def test_paper_sweep_plans_at_the_paper_budget(name: str) -> None:
    runs, dataset, clients, steps, lrs = EXPECTED[name]
    out, cells = plan(PAPER / name)
    sweep = yaml.safe_load((PAPER / name).read_text())
    assert out == Path("runs/paper") / sweep["name"] and len(cells) == runs
    for cname, cfg in cells:
        assert cfg.output.run_dir == str(out / cname)
        budget = CENTRALISED[name] if cfg.partition.name == "centralised" else (10000, 32, 0.0)
        assert (cfg.train.rounds, cfg.train.batch_size, cfg.train.momentum, cfg.train.weight_decay) == (*budget, 0)
        assert (cfg.partition.name == "centralised") == (cfg.train.num_clients == 1)
        assert cfg.train.clients_per_round is None and cfg.train.local_epochs is None  # full participation, K steps
        assert (cfg.data.augment, cfg.data.normalize, cfg.data.download) == (True, False, False)
        assert cfg.data.dataset.name == dataset and Path(cfg.data.root) == DEFAULT_ROOTS[dataset].resolve()
        assert cfg.train.num_clients in clients and cfg.train.local_steps in steps and cfg.train.lr in lrs
        assert cfg.model.options.get("bias", False) == ("bias=True" in cname)
        if cfg.strategy.name == "fedyogi":  # App. C.4
            assert cfg.strategy.options == {"eta": 0.01, "beta_1": 0.9, "beta_2": 0.99, "tau": 0.001, "v0": 1e-6}
        if cfg.strategy.name == "feddecorr":
            assert cfg.strategy.options == {"beta": 0.5}
        if dataset == "cifar100":  # clients and partition change together (axes)
            p = cfg.partition
            assert (p.name, p.options.get("classes_per_client", p.options.get("beta")), cfg.train.num_clients) in (
                CIFAR100_SETTINGS
            )
        if name == "table13_inner_site.yaml":  # Table 13: inner-site rows are FN + a normaliser inside each block
            inner = cfg.model.options.get("norm_sites") == "inner"
            assert cfg.model.name == "resnet18" and inner == ("inside" in cfg.model.norm.options)
            assert (cfg.model.norm.name, cfg.model.norm.options.get("inside")) in (
                {("fn", "ln"), ("fn", "scale")} if inner else {("ln", None), ("fn", None)}
            )
        if dataset == "pacs":  # Table 5: each domain split among 3 of the 12 clients
            assert cfg.partition.name == "domains" and cfg.partition.options["clients_per_domain"] == 3
            assert cfg.model.name == "resnet18"
        if name == "table11_cifar100_local_steps.yaml":
            assert cfg.train.lr == (0.1 if cfg.train.local_steps == 1 else 0.01)
    if dataset == "imagefolder" and CIFAR_Q75.exists():  # CIFAR-10: the offline copy is what it reads
        assert all(Path(cfg.data.root).is_file() for _, cfg in cells)


TABLES = REPO / "configs" / "tables"
INLINE = ["simulation.backend=inline", "simulation.threads=1"]  # no Ray pool to start for a 2-round run


@pytest.mark.parametrize("path", sorted(TABLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_measured_table_plans_and_scores_fedbn_as_lnfl(path: Path) -> None:
    _, cells = plan(path)
    assert cells and all(cfg.data.dataset.name == "imagefolder" for _, cfg in cells)
    fedbn = [cfg.strategy.options for _, cfg in cells if cfg.strategy.name == "fedbn"]
    # Beside LN-FL's FedBN number only the shared model's score belongs (LN-FL reports FedBN that way);
    # a personalised score is a cell of its own, named so.
    assert all("evaluate" in options for options in fedbn)
    assert not fedbn or {"evaluate": "shared"} in fedbn


def test_the_headline_table_is_the_200_round_three_seed_sweep() -> None:
    out, cells = plan(TABLES / "headline_200rounds.yaml")
    assert out == Path("runs/sweeps/headline-200rounds") and len(cells) == 27
    methods: dict[int, set[tuple[str, str]]] = {1: set(), 2: set()}
    for _, cfg in cells:
        assert (cfg.train.rounds, cfg.eval.every, cfg.train.num_clients, cfg.train.local_steps) == (200, 10, 10, 10)
        assert (cfg.train.batch_size, cfg.train.lr, cfg.data.augment, cfg.model.name) == (32, 0.01, True, "cnn")
        for cores in (1, 2, 16):  # one torch thread per client, whatever the machine: the numbers of threads 1
            assert choose_layout(cfg, cores).simulation.threads == 1
        assert cfg.partition.name == "n_class" and "assign" not in cfg.partition.options  # LN-FL's draw
        methods[cfg.partition.options["classes_per_client"]].add((cfg.strategy.name, cfg.model.norm.name))
    assert sorted(cfg.seed for _, cfg in cells) == [0] * 9 + [1] * 9 + [2] * 9
    assert methods[1] == {("fedavg", n) for n in ("none", "ln", "fn", "gn")} | {
        ("fedyogi", "none"),
        ("fedyogi", "ln_reduced"),  # Table 12's FedLN + Yogi (table12_yogi.yaml)
    }
    assert methods[2] == {("fedavg", n) for n in ("none", "ln", "fn")}


def test_the_personalised_comparison_is_the_four_and_fedavg_at_the_headline_setting() -> None:
    out, cells = plan(TABLES / "personal_200rounds.yaml")
    assert out == Path("results/personal-200rounds") and len(cells) == 30
    for _, cfg in cells:
        assert (cfg.train.rounds, cfg.eval.every, cfg.train.num_clients, cfg.train.local_steps) == (200, 10, 10, 10)
        assert (cfg.train.batch_size, cfg.train.lr, cfg.train.momentum, cfg.model.name) == (32, 0.01, 0.0, "cnn")
        assert cfg.partition.options["classes_per_client"] == 1
        # FedBABU's fine-tuning: 5 epochs over a client's 5,000 images at B = 32, once, after the last round; FedRoD's
        # personal head and FedETF's local adaptation read no steps (0: personalised evaluation on)
        steps = 0 if cfg.strategy.name in ("fedrod", "fedetf") else 780
        assert (cfg.eval.personal.steps, cfg.eval.personal.params, cfg.eval.personal.every) == (steps, "all", 200)
        assert cfg.strategy.options == {}  # each strategy at its paper's defaults
    methods = {(cfg.strategy.name, cfg.model.norm.name, cfg.seed) for _, cfg in cells}
    strategies = ("fedavg", "ccvr", "fedbabu", "fedrod", "fedetf")
    assert methods == {(s, n, seed) for s in strategies for n in ("none", "ln") for seed in (0, 1, 2)}


@pytest.mark.parametrize(
    ("name", "dataset", "source"),
    [
        ("table1_cifar100.yaml", "cifar100", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
        ("table1_tinyimagenet.yaml", "tinyimagenet", "http://cs231n.stanford.edu/tiny-imagenet-200.zip"),
        ("table5_pacs.yaml", "pacs", "PACS not found at"),
        ("table5_pacs.yaml", "pacs", "get it from https://domaingeneralization.github.io/#data"),
    ],
)
def test_missing_dataset_fails_before_training_saying_where_and_how(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, dataset: str, source: str
) -> None:
    missing = tmp_path / "no-data-here"
    argv = ["sweep", str(PAPER / name), "--set", f"data.root={missing}", "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedsim: error: {dataset}") and str(missing) in err and source in err
    assert not list((tmp_path / "out").rglob("metrics.jsonl"))  # nothing trained, nothing written


def test_set_overrides_every_cell_and_output_moves_them(tmp_path: Path) -> None:
    full_out, full = plan(PAPER / "table4_norms.yaml")
    out, short = plan(PAPER / "table4_norms.yaml", ["train.rounds=20", "eval.every=10"], output=tmp_path)
    assert out == tmp_path / "table4-norms" and [n for n, _ in short] == [n for n, _ in full]
    for (name, cfg), (_, ref) in zip(short, full, strict=True):
        assert (cfg.train.rounds, cfg.eval.every) == (20, 10) and cfg.output.run_dir == str(out / name)
        same = {"train", "eval", "output"}
        assert cfg.model_dump(exclude=same) == ref.model_dump(exclude=same)
    args = build_parser().parse_args(["sweep", "f.yaml", "--set", "train.rounds=20", "eval.every=10", "--output", "o"])
    assert (args.set, args.output) == (["train.rounds=20", "eval.every=10"], "o")


@pytest.mark.parametrize(
    ("name", "override", "field"),
    [
        ("table4_norms.yaml", "partition.beta=0.5", "'partition'"),
        ("table3_last_layer.yaml", "model.bias=true", "'model.bias'"),
        ("table1_cifar100.yaml", "train.num_clients=10", "'train.num_clients'"),
        ("table4_norms.yaml", "train.rounds", "'train.rounds'"),
        ("table4_norms.yaml", "train.roundz=5", "train.roundz"),
    ],
)
def test_bad_override_fails_at_plan(name: str, override: str, field: str) -> None:
    """The key each names; the wording: tests/test_bad_inputs.py."""
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        plan(PAPER / name, [override])


def test_a_key_set_in_two_places_is_an_error(tmp_path: Path) -> None:
    write_config(tmp_path, small_config(tmp_path), "base.yaml")
    sweep = {"base": "base.yaml", "grid": {"model.norm": ["ln"]}, "axes": {"a": [{"model.norm": "fn"}]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    with pytest.raises(ConfigError, match=r"model\.norm\b.*\bgrid\b.*\baxes\.a\b"):
        plan(tmp_path / "s.yaml")


def mnist_sweep(tmp_path: Path) -> Path:
    write_config(tmp_path, small_config(tmp_path, train={"rounds": 2, "local_steps": 1}, eval={"every": 1}), "b.yaml")
    sweep = {"base": "b.yaml", "name": "s", "output": str(tmp_path / "sweeps"), "grid": {"model.norm": ["ln", "fn"]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    return tmp_path / "s.yaml"


def test_a_finished_run_of_other_settings_is_not_taken_for_the_cell(tmp_path: Path) -> None:
    path = mnist_sweep(tmp_path)
    out = run_sweep(path, log=lambda _: None, overrides=["train.rounds=1"])
    with pytest.raises(ConfigError, match=r"train\.rounds\b.*\b1\b.*\b2\b") as err:
        run_sweep(path, log=lambda _: None)  # the full budget must not skip the short runs
    assert str(out / "norm=ln") in str(err.value) and "--output" in str(err.value)
    lines: list[str] = []  # differing only where results do not change: the runs are reused
    overrides = ["train.rounds=1", "output.save_model=false", "diagnostics.features=true"]
    run_sweep(path, log=lines.append, overrides=overrides)
    assert lines == [f"sweep {out}: 2 runs, 2 already complete"]


def test_a_diverged_cell_does_not_stop_the_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def fake_run(cfg_json: str, resume: bool = False) -> dict[str, float]:
        name = json.loads(cfg_json)["name"]
        ran.append(name)
        if name == "norm=ln":
            raise TrainingError("training diverged in round 1: client 0: training loss is nan")
        return {"final_client_mean_acc": 0.5}

    monkeypatch.setattr("fedsim.sweep.execute._run_one", fake_run)
    lines: list[str] = []
    with pytest.raises(TrainingError, match="1 of 2 sweep runs failed .*: norm=ln"):
        run_sweep(mnist_sweep(tmp_path), log=lines.append)
    assert ran == ["norm=ln", "norm=fn"]
    assert "norm=ln: failed: training diverged" in lines[1] and "norm=fn: client-mean acc 0.5" in lines[2]


@pytest.mark.slow
def test_a_paper_cell_reruns_to_identical_numbers(tmp_path: Path) -> None:
    """One cell of Table 10 (SCAFFOLD: client state across rounds), shrunk to MNIST and 2 rounds, run by
    the sweep's planner and then again in a fresh process with docs/paper.md's rerun command."""
    shrink = ["train.rounds=2", "eval.every=1", "data.dataset=npz", f"data.root={MNIST_SMALL}", *INLINE]
    _, cells = plan(PAPER / "table10_local_steps.yaml", shrink, output=tmp_path)
    cfg = dict(cells)["strategy=scaffold,norm=none,local_steps=1,partition=dirichlet+beta=0.1"]
    first = Path(run(cfg)["run_dir"])
    second = tmp_path / "rerun"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    argv = ["-m", "fedsim.app.cli", "run", str(first / "config.yaml"), "--set", f"output.run_dir={second}"]
    rerun = subprocess.run([sys.executable, *argv], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr

    def numbers(run_dir: Path) -> list[dict[str, object]]:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k not in ("time_s", "rss_mb")} for line in lines]

    assert len(numbers(first)) == 2 and numbers(first) == numbers(second)
    a, b = (torch.load(d / "model.pt", weights_only=True) for d in (first, second))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------- the tinyimagenet loader


def jpeg(rgb: tuple[int, int, int], mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (8, 8), rgb if mode == "RGB" else rgb[0]).save(buf, format="JPEG", quality=100)
    return buf.getvalue()


def test_tinyimagenet_reads_the_official_zip(tmp_path: Path) -> None:
    wnids = ["n02", "n01"]
    files = {"tiny-imagenet-200/wnids.txt": "\n".join(wnids).encode()}
    for label, wnid in enumerate(sorted(wnids)):
        for i in range(3):
            files[f"tiny-imagenet-200/train/{wnid}/images/{wnid}_{i}.JPEG"] = jpeg((200 * label, 0, 0))
        files[f"tiny-imagenet-200/train/{wnid}/{wnid}_boxes.txt"] = b"ignored"
    files["tiny-imagenet-200/train/n02/images/n02_9.JPEG"] = jpeg((200, 0, 0), mode="L")  # grayscale
    annotations = ["val_0.JPEG\tn02\t0\t0\t8\t8", "val_1.JPEG\tn01\t0\t0\t8\t8"]
    files["tiny-imagenet-200/val/val_annotations.txt"] = "\n".join(annotations).encode()
    files["tiny-imagenet-200/val/images/val_0.JPEG"] = jpeg((200, 0, 0))
    files["tiny-imagenet-200/val/images/val_1.JPEG"] = jpeg((0, 0, 0))
    files["tiny-imagenet-200/test/images/test_0.JPEG"] = jpeg((9, 9, 9))  # unlabelled: not loaded
    archive = tmp_path / "tiny-imagenet-200.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    ds = load_dataset("tinyimagenet", archive, cache_dir=tmp_path / "cache")
    assert ds.classes == ["n01", "n02"] and ds.x_train.shape == (7, 3, 8, 8) and ds.x_test.shape == (2, 3, 8, 8)
    assert ds.y_train.tolist() == [0, 0, 0, 1, 1, 1, 1] and ds.y_test.tolist() == [0, 1]
    assert ds.x_test[1, 0].float().mean() > 150 and ds.x_test[0, 0].float().mean() < 50  # val_0 is n02
    again = load_dataset("tinyimagenet", archive, cache_dir=tmp_path / "cache")  # from the cache
    assert torch.equal(again.x_train, ds.x_train) and len(list((tmp_path / "cache").glob("tinyimagenet-*.npz"))) == 1


def test_tinyimagenet_without_val_labels_says_what_it_expects(tmp_path: Path) -> None:
    root = tmp_path / "tiny-imagenet-200"
    (root / "train" / "n01" / "images").mkdir(parents=True)
    (root / "train" / "n01" / "images" / "a.JPEG").write_bytes(jpeg((1, 2, 3)))
    with pytest.raises(DataError, match=r"val/images/\*\.JPEG.*val/val_annotations\.txt"):  # the files it looked for
        load_dataset("tinyimagenet", root, cache_dir=tmp_path / "cache")


def test_imagefolder_reads_a_zip(tmp_path: Path) -> None:
    archive = tmp_path / "tree.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for split, cls, rgb in (("train", "a", (0, 0, 0)), ("train", "b", (250, 0, 0)), ("test", "b", (250, 0, 0))):
            zf.writestr(f"tree/{split}/{cls}/0.jpg", jpeg(rgb))
    ds = load_dataset("imagefolder", archive, cache_dir=tmp_path / "cache")
    assert ds.name == "tree" and ds.classes == ["a", "b"]
    assert ds.y_train.tolist() == [0, 1] and ds.y_test.tolist() == [1]
