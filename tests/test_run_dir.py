"""A run leaves a complete, readable run directory, and the shipped configs run as a user runs them."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.layout import usable_cores
from tests.conftest import CIFAR_Q75, REPO, small_config, write_config


def test_run_directory_contents(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, output={"trackers": ["tensorboard"]}, train={"rounds": 5}))
    summary = run(cfg)
    run_dir = Path(summary["run_dir"])
    assert run_dir.parent == tmp_path / "runs" and run_dir.name.startswith("t-")

    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["train"]["rounds"] == 5 and resolved["output"]["run_dir"] == str(run_dir)

    with open(run_dir / "partition.csv") as f:
        rows = list(csv.DictReader(f))
    train_rows = [r for r in rows if r["split"] == "train"]
    assert len(train_rows) == 4 and len(rows) == 8
    assert sum(int(r["total"]) for r in train_rows) == 5000  # every training sample placed once
    assert all(int(r["total"]) == sum(int(r[str(c)]) for c in range(10)) for r in rows)

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [2, 4, 5]  # every 2 rounds and after the last
    last = lines[-1]
    assert len(last["client_acc"]) == 4 and len(last["per_class_acc"]) == 10
    assert last["client_mean_acc"] == pytest.approx(np.mean(last["client_acc"]))
    assert 0.3 < last["global_acc"] <= 1.0

    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["final_client_mean_acc"] == last["client_mean_acc"]
    assert saved["best_client_mean_acc"] == max(m["client_mean_acc"] for m in lines)
    state = torch.load(run_dir / "model.pt")
    assert set(state) >= {"classifier.weight"} and state["classifier.weight"].shape == (10, 64)
    assert any((run_dir / "tb").iterdir())
    assert not list(run_dir.glob(".*.tmp"))  # atomic writes leave no temp files


@pytest.mark.parametrize("normalize", [False, True])
def test_global_model_file_reproduces_global_accuracy(tmp_path: Path, normalize: bool) -> None:
    from fedsim.arrays import to_array_record
    from fedsim.data.batches import to_float
    from fedsim.experiment.resolve import resolve
    from fedsim.layout import torch_threads
    from fedsim.server.reporter import GlobalEvaluator

    cfg = parse_config(small_config(tmp_path, data={"normalize": normalize}))
    summary = run(cfg)
    run_dir = Path(summary["run_dir"])
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    saved = torch.load(run_dir / "model.pt")
    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads(cfg.simulation))  # the server's: the same kernels, the same sums
    try:
        # model.pt through the server's own evaluation (the same inputs, eval batches and forward chunks):
        # the same float sums, so the same numbers bit for bit
        again = GlobalEvaluator(resolve(cfg))(to_array_record(saved))
        assert (again["global_acc"], again["global_loss"]) == (summary["final_global_acc"], last["global_loss"])

        # and recomputed independently: the whole test set in one forward pass, the inputs standardised here
        fed = resolve(cfg).federation()
        model = resolve(cfg).build_model()
        model.load_state_dict(saved)
        model.eval()
        x = to_float(fed.dataset.x_test)
        if normalize:  # standardised with the training set's per-channel statistics, computed here
            train = fed.dataset.x_train.double() / 255
            x = ((x.double() - train.mean()) / train.std()).float()  # MNIST: one channel
        with torch.no_grad():
            pred = model(x).argmax(1)
    finally:
        torch.set_num_threads(threads)
    # Other float sums (a batch of 1,000 rows blocks its matrix products otherwise than the server's
    # chunks of 50; the statistics rounded once in float64 here, in float32 there): logits within float
    # rounding, so a prediction changes only where an image's top two logits are that close, by one image
    # of the 1,000 (measured here: logits at most 1e-6 apart, no prediction changed, plain and under AVX2)
    n = len(fed.dataset.y_test)
    correct = int((pred == fed.dataset.y_test).sum())
    assert abs(correct - round(summary["final_global_acc"] * n)) <= 1


def _fedsim(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "fedsim.app.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


@pytest.mark.slow
def test_quickstart_runs_to_completion_as_documented(tmp_path: Path) -> None:
    proc = _fedsim("run", "configs/quickstart.yaml", "--set", f"output.dir={tmp_path}", cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 10
    assert summary["final_client_mean_acc"] > 0.8  # MNIST subset, LN CNN: learns well within 10 rounds
    assert "round" in proc.stderr and "client-mean acc" in proc.stderr  # the progress bar was shown
    # the default layout, chosen for this machine and written down for a resume
    cores = usable_cores()
    layout = {"backend": "ray", "threads": 1} if cores >= 2 else {"backend": "inline", "threads": 1}
    simulation = yaml.safe_load((run_dir / "config.yaml").read_text())["simulation"]
    assert {k: simulation[k] for k in layout} == layout


@pytest.mark.slow
@pytest.mark.skipif(not CIFAR_Q75.exists(), reason="../shared/datasets/cifar10_jpg_q75.tar.gz is not present")
def test_cifar10_paper_config_runs(tmp_path: Path, cifar_cache: Path) -> None:
    proc = _fedsim(
        "run", "configs/cifar10_1class_fedavg.yaml", "--set",
        "train.rounds=1", "eval.every=1", f"output.dir={tmp_path}", f"data.cache_dir={cifar_cache}",
        "simulation.backend=inline", "simulation.threads=1",  # the default layout is the quickstart test's
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    counts = list(csv.reader(open(run_dir / "partition.csv")))[1:11]
    # one class per client, all of it: 5,000 training images each, every class used once
    assert sorted(int(r[-1]) for r in counts) == [5000] * 10
    assert sorted(int(np.argmax([int(v) for v in r[2:-1]])) for r in counts) == list(range(10))
    metrics = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["round"] == 1 and len(metrics["per_class_acc"]) == 10


@pytest.mark.slow
def test_built_wheel_installs_strategies_and_partitions_as_subpackages(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(tmp_path.glob("fedsim-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "fedsim/strategies/fedavg.py" in names and "fedsim/partitions/dirichlet.py" in names
    assert "fedsim/assets/mnist_small.npz" in names
    assert not any(n.startswith(("strategies/", "partitions/")) for n in names)  # no generic top-level packages
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import fedsim.strategies as s, fedsim.partitions as p, fedsim; "
        "print(s.STRATEGIES.names(), p.PARTITIONERS.names(), fedsim.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "fedavg" in out.stdout and "dirichlet" in out.stdout and str(site) in out.stdout


def test_editable_install_imports_subpackages_from_the_repo() -> None:
    import fedsim.partitions
    import fedsim.strategies

    assert Path(fedsim.strategies.__file__).resolve() == REPO / "strategies" / "__init__.py"
    assert Path(fedsim.partitions.__file__).resolve() == REPO / "partitions" / "__init__.py"


# --- one live run per directory; a fresh run inherits nothing --------------------------------------


def run_into(tmp_path: Path, run_dir: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> tuple[int, str]:
    from fedsim.app.cli import main

    path = write_config(tmp_path, small_config(tmp_path, train={"rounds": 2}, eval={"every": 1}))
    code = main(["run", str(path), "--set", f"output.run_dir={run_dir}", *overrides])
    return code, capsys.readouterr().err


def test_a_run_directory_is_owned_by_one_live_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedsim.record.claim import claimed

    run_dir = tmp_path / "shared"
    # another live run holds it (the lock is per open file, so this process stands in for another one)
    with claimed(run_dir):
        code, err = run_into(tmp_path, run_dir, capsys)
        assert code == 2 and err.count("\n") == 1
        assert f"output.run_dir {run_dir} " in err and f"pid {os.getpid()}" in err  # the key, its value, the owner
        assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.yaml").exists()
    # released when its owner ends, however it ends: the next run gets it
    code, err = run_into(tmp_path, run_dir, capsys)
    assert code == 0, err
    assert [json.loads(x)["round"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_fresh_run_never_inherits_another_runs_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "r"
    assert run_into(tmp_path, run_dir, capsys)[0] == 0
    finished = (run_dir / "summary.json").read_text()
    # a finished run is never overwritten nor mixed with a new one
    code, err = run_into(tmp_path, run_dir, capsys, "train.lr=0.01")
    assert code == 2 and str(run_dir) in err and "summary.json" in err  # the wording: tests/test_bad_inputs.py
    assert (run_dir / "summary.json").read_text() == finished
    # a run that could resume is not thrown away either
    (run_dir / "summary.json").unlink()
    (run_dir / "checkpoint.pt").write_bytes(b"a checkpoint")
    code, err = run_into(tmp_path, run_dir, capsys)
    assert code == 2 and f"fedsim run --resume {run_dir}" in err
    # the leftovers of a run killed with nothing to resume are cleared: the new run's files only
    (run_dir / "checkpoint.pt").unlink()
    (run_dir / "metrics.jsonl").write_text('{"round": 7}\n{"round": 9}\n')
    (run_dir / "error.txt").write_text("an old error")
    assert run_into(tmp_path, run_dir, capsys, "train.lr=0.02")[0] == 0
    assert [json.loads(x)["round"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert not (run_dir / "error.txt").exists()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["lr"] == 0.02
