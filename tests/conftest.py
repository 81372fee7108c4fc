"""Shared fixtures: every test gets its own FLWR_HOME and an offline Flower."""

from __future__ import annotations

import errno
import ipaddress
import itertools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fedsim.app.local import local_dir
from fedsim.record.layout import RECORD_VERSION
from fedsim.record.manifest import entry_of, summary_checksum

REPO = Path(__file__).resolve().parents[1]
MNIST_SMALL = REPO / "fedsim" / "assets" / "mnist_small.npz"
CIFAR_Q75 = REPO.parent / "shared" / "datasets" / "cifar10_jpg_q75.tar.gz"


@pytest.fixture(autouse=True)
def _offline_flower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FLWR_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture
def seeded() -> None:
    """torch's global generator at seed 0: a test's random models and data the same on every run."""
    torch.manual_seed(0)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread for the test (runs in the test's own process compare numbers bit for bit, and
    the sum order of torch's kernels depends on its thread count), then as it was."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def cifar_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One decode cache for the CIFAR-10 q75 archive, shared by the tests that read it and by pytest-xdist's
    workers (the directory above each worker's own): it is decoded once, not once per test (~14 s each).
    The cache's files are written whole and renamed into place, so workers may race to fill it."""
    path = tmp_path_factory.getbasetemp().parent / "cifar-cache"
    path.mkdir(exist_ok=True)
    return path


def small_config(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    """A fast run: MLP on the shipped MNIST subset, 4 clients, few rounds, inline on one thread."""
    cfg: dict[str, Any] = {
        "name": "t",
        "seed": 0,
        "data": {"dataset": "npz", "root": str(MNIST_SMALL), "augment": False},
        "partition": {"name": "dirichlet", "beta": 0.5},
        "model": {"name": "mlp", "norm": "ln", "hidden": [64]},
        "train": {"rounds": 4, "num_clients": 4, "local_steps": 3, "batch_size": 16, "lr": 0.05},
        "eval": {"every": 2},
        "output": {"dir": str(tmp_path / "runs"), "progress": False},
        # tests compare numbers across engines and runs: one thread, and no Ray pool unless a test asks
        "simulation": {"backend": "inline", "threads": 1},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def host_address() -> str:
    """This host's address on its network, where another machine reaches it: the first address outside
    127.0.0.0/8 among those the kernel routes to this host itself (the ``/32 host LOCAL`` entries of
    /proc/net/fib_trie, what ``ip -4 addr`` lists). A host with none is reachable from no other, and a test
    of what another machine sees cannot run on it: it fails."""
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    own = [prev.split()[-1] for prev, line in itertools.pairwise(lines) if line.strip() == "/32 host LOCAL"]
    for address in own:
        if not ipaddress.ip_address(address).is_loopback:
            return address
    pytest.fail(f"this host has no IPv4 address but loopback ({sorted(set(own))}): no other host could reach it")


def disk_full_at(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The disk fills while fedsim writes the file ``name``: its temp file (fedsim.files: ``.<name>.<...>.tmp``)
    gets half of what is written into it, then the write fails as on a full disk."""
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(f".{name}."):
            real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def write_config(tmp_path: Path, cfg: dict[str, Any], name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def pytest_configure(config: pytest.Config) -> None:
    """``pytest -m fuzz``: the fuzzer's long run (tests/test_fuzz.py reads this when it is imported)."""
    if "fuzz" in (config.option.markexpr or ""):
        os.environ["FEDSIM_FUZZ_LONG"] = "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end tests (marked ``slow``: tens of seconds, much of it waiting on Flower's fixed timings
    and process start-up) first, and of those the ones marked ``long`` (a minute or more) before the rest:
    pytest-xdist's workers start on the longest and steal the short ones from each other's queues at the
    end, instead of ending on one long test while the other worker idles (measured, loaded: slow tests in
    file order left one worker idle for the last 80 s, 4% of the run)."""
    items.sort(key=lambda item: (item.get_closest_marker("long") is None, item.get_closest_marker("slow") is None))


def run_cli(capsys: pytest.CaptureFixture[str], path: Path, *overrides: str) -> tuple[int, str]:
    """``fedsim run PATH [--set OVERRIDES]`` in this process: its exit status and what it wrote to stderr."""
    from fedsim.app.cli import main

    argv = ["run", str(path)] + (["--set", *overrides] if overrides else [])
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def make_sweep(tmp_path: Path, grid: dict, **extra) -> Path:  # type: ignore[no-untyped-def]
    """A sweep file over a two-round base config in ``tmp_path``: ``grid``, and ``extra`` keys of the file."""
    write_config(tmp_path, small_config(tmp_path, train={"rounds": 2}, eval={"every": 1}), "base.yaml")
    sweep = {"base": "base.yaml", "name": "s", "output": str(tmp_path / "sweeps"), "grid": grid, **extra}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def one_line(err: str) -> str:
    """The single line a refused command prints (fedsim: error: ...), asserted to be the only one."""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedsim: error: "), err[-2000:]
    return lines[0]


def written(**fields: object) -> str:
    """``fields`` as progress.json or summary.json holds them: of this record version, with the checksums it
    records (of no files: a poll shows them unchecked)."""
    stamp = {"record_version": RECORD_VERSION, "files": {"metrics.jsonl": {"size": 1, "sha256": "0" * 64}}}
    return json.dumps({**fields, **{key: value for key, value in stamp.items() if key not in fields}})


MODEL_SHA256 = "ab" * 32  # the model.pt of continued_run's summary


def continued_run(run_dir: Path) -> Path:
    """``run_dir`` with the summary.json of a finished run whose model.pt's SHA-256 is :data:`MODEL_SHA256`:
    what a ``fedsim local`` continuation's local.json in it is checked against (nothing else of the run)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    scores = {"rounds": 1, "final_client_mean_acc": 0.5, "best_client_mean_acc": 0.5, "final_global_acc": 0.5,
              "summary_sha256": "0" * 64}  # fmt: skip
    (run_dir / "summary.json").write_text(written(**scores, files={"model.pt": {"size": 1, "sha256": MODEL_SHA256}}))
    return run_dir


def another_request(run_dir: Path, client: int) -> dict[str, Any]:
    """A ``fedsim local`` request for ``client`` of the finished run ``run_dir`` (--steps 5, other than the tests'
    own), written as the local.json of the directory that request made; the request."""
    model = json.loads((run_dir / "summary.json").read_text())["files"]["model.pt"]
    request = {"run_dir": str(run_dir), "client": client, "steps": 5, "every": 1, "classes": [7], "lr": 0.05,
               "momentum": 0.0, "weight_decay": 0.0, "batch_size": 32, "augment": True, "overrides": [],
               "model_sha256": model["sha256"]}  # fmt: skip
    out = local_dir(run_dir, client)
    out.mkdir()
    (out / "local.json").write_text(json.dumps(request))
    return request


def replace_model(run_dir: Path) -> None:
    """Another model as the finished run's own: every weight of its model.pt moved by 1, the summary's entry and
    checksum made anew (the run run again since, as a continuation made before would see it)."""
    state = torch.load(run_dir / "model.pt", weights_only=True)
    torch.save({k: v + 1 for k, v in state.items()}, run_dir / "model.pt")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["files"]["model.pt"] = entry_of((run_dir / "model.pt").read_bytes())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "summary_sha256": summary_checksum(summary)}))


def ip_command(*args: str) -> None:
    """``ip ARGS`` (iproute2), raising PermissionError with its message where it fails (a machine that forbids
    network namespaces: the multi-host tests skip there)."""
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise PermissionError(f"ip {' '.join(args)}: {res.stderr.strip()}")
