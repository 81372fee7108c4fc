"""Golden metrics: every engine's numbers for a fixed set of runs, recorded from an earlier main.

A refactoring must not change a single number: each run below is the quickstart (short) under one
strategy, and its ``metrics.jsonl`` (wall-clock fields aside) is compared with the file recorded in
``tests/golden/`` (``FEDSIM_GOLDEN_DIR`` points the test at another set, e.g.
``../shared/golden-other-cpu``). ``FEDSIM_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` records them
anew, for a change that is meant to change numbers (say so in the commit).

How much of the file a machine can check depends on its CPU, and the comparison follows from that:

- **The CPU kind the files were recorded on** (``meta.json``: torch's CPU capability, AVX2 or AVX512,
  and the vendor, whose kernels MKL and oneDNN choose by): every number bit for bit, every engine.
- **Another kind** picks other kernels, which sum in another order: the first round's numbers differ
  by float rounding, and training amplifies that chaotically (measured between an AVX512 and an AVX2
  machine, ``../shared/golden-other-cpu/README.md``: 1e-6 relative in round 1, up to 5e-3 in a loss
  and 0.14 in a per-class accuracy by round 3). No tolerance both holds on every CPU for round 3 and
  still catches a change, so the files are held to what is bounded:

  * round 1 against the file: one round of ``local_steps`` SGD steps from the same seeded initial
    model, the same batches and the same test images; only the order of float32 sums differs.
    Rounding errors of a sum of n float32 terms, taken in another order, grow like √n·2⁻²⁴ (Higham's
    probabilistic bound; n·2⁻²⁴ is the worst case); the longest sums here are LayerNorm's over a conv
    output and a conv weight's gradient over a batch (64·24·24 = 36,864 and 32·24·24 terms), √n·2⁻²⁴ ≈
    1.1e-5, and a round composes a few steps of a few layers of them: each loss is held to
    ``ROUND1_LOSS_RTOL`` = 1e-4 relative (measured: at most 2.4e-6). An image's prediction changes only
    when its top two logits are closer than that rounding, so each accuracy may move by at most one of
    the images behind it (1/n, n a client's or a class's test images; measured: none moved in round 1);
  * every round against the file: the same rounds and keys, every value of the same type, accuracies
    whole multiples of an image;
  * every engine but inline against inline on this machine, bit for bit (the engines route
    arrays and client state differently; they must not change a number on any CPU).

  Resume against an uninterrupted run, bit for bit on the machine that runs it, is
  ``tests/test_resume.py``'s. ``.ci/run`` runs this file under both instruction sets of its machine
  (the plain run and ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``),
  so the bit-for-bit path and the other-CPU path both run on every landing.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.app.cli import main as cli_main
from tests.conftest import MNIST_SMALL, REPO

GOLDEN = Path(os.environ.get("FEDSIM_GOLDEN_DIR") or REPO / "tests" / "golden")
QUICKSTART = REPO / "configs" / "quickstart.yaml"
SHORT = [
    "train.rounds=3", "train.local_steps=2", "eval.every=1", "simulation.threads=1",
    "output.progress=false", "output.save_model=false",
]
CASES: dict[str, list[str]] = {
    "fedavg": ["strategy.name=fedavg"],
    "fedprox": ["strategy.name=fedprox", "strategy.mu=0.1"],
    "scaffold-partial": ["strategy.name=scaffold", "train.clients_per_round=4"],
    "fedyogi": ["strategy.name=fedyogi"],
    "fedbn": ["strategy.name=fedbn", "model.norm=bn"],
    "fedlc": ["strategy.name=fedlc"],
    "fedadam": ["strategy.name=fedadam", "strategy.eta=0.01"],
    "fedavgm-partial": ["strategy.name=fedavgm", "strategy.server_momentum=0.9", "train.clients_per_round=5"],
}
ENGINES: dict[str, list[str]] = {
    "inline": ["simulation.backend=inline"],
    "ray-pool": ["simulation.backend=ray"],
    "flower": ["engine=flower"],
}
# Every case inline; the other engines on the cases whose state they route differently (SCAFFOLD's control
# variates and FedBN's local tensors, partial participation). The other cases send FedAvg's Messages, whose
# engines agree (tests/test_engines.py), and differ only in the server's arithmetic, the same code under every
# engine; every strategy with Messages of its own is tests/test_strategy_engines.py's. The README's quick suite
# runs FedAvg and SCAFFOLD inline, the rest is `slow` (CI runs it after the quick suite).
QUICK = {("fedavg", "inline"), ("scaffold-partial", "inline")}
OTHER_ENGINES = [("scaffold-partial", "ray-pool"), ("fedbn", "ray-pool"), ("scaffold-partial", "flower"),
                 ("fedavgm-partial", "flower")]  # fmt: skip
GRID = [
    pytest.param(case, engine, marks=() if (case, engine) in QUICK else pytest.mark.slow)
    for case, engine in [(case, "inline") for case in CASES] + OTHER_ENGINES
]
WALL_CLOCK = ("time_s", "rss_mb")  # facts about the machine, not results
UPDATE = os.environ.get("FEDSIM_UPDATE_GOLDEN") == "1"


ROUND1_LOSS_RTOL = 1e-4  # float32 rounding of one round, taken in another order (module docstring)


def run_metrics(tmp_path: Path, overrides: list[str]) -> tuple[list[dict[str, Any]], Path]:
    """The run's metrics lines (wall clock left out) and its run directory."""
    run_dir = tmp_path / "run"
    given = {o.split("=", 1)[0] for o in overrides}  # fedsim refuses a key given twice in one --set
    short = [o for o in SHORT if o.split("=", 1)[0] not in given]
    assert cli_main(["run", str(QUICKSTART), "--set", *short, *overrides, f"output.run_dir={run_dir}"]) == 0
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK} for line in lines], run_dir


def cpu_kind() -> dict[str, str]:
    """What decides the kernels torch runs here: its CPU capability (AVX2, AVX512, ...; lowered by
    ATEN_CPU_CAPABILITY), the vendor and the microarchitecture (family and model: MKL's and oneDNN's
    dispatch differ between Intel and AMD, and between generations of one vendor's cores)."""
    fields = {"vendor_id": "vendor", "cpu family": "cpu_family", "model": "cpu_model"}
    kind = {"cpu_capability": torch.backends.cpu.get_cpu_capability()}
    path = Path("/proc/cpuinfo")
    for line in path.read_text().splitlines() if path.exists() else []:
        key, _, value = line.partition(":")
        if key.strip() in fields and fields[key.strip()] not in kind:
            kind[fields[key.strip()]] = value.strip()
    return kind


NAMED_FOR_BIT_FOR_BIT = ("torch", "cpu_capability", "vendor")  # what files must name to be held bit for bit


def same_cpu_kind(meta: dict[str, str]) -> bool:
    """True where the files' kernels run here: they name torch's version, the CPU capability and the vendor
    (MKL and oneDNN choose kernels by vendor under one capability: AVX2 on an Intel and on an AMD core round
    differently), and every fact of :func:`cpu_kind` they name is this machine's. Files that name less are
    compared as another kind's."""
    here = {**cpu_kind(), "torch": torch.__version__}
    named = all(key in meta for key in NAMED_FOR_BIT_FOR_BIT)
    return named and all(meta[key] == value for key, value in here.items() if key in meta)


def test_files_held_bit_for_bit_name_this_cpus_vendor() -> None:
    """Recordings that name the capability alone (../shared/golden-other-cpu: an AMD AVX2 core) are compared as
    another kind's here, whoever's core this is: under one capability the vendors' kernels round differently."""
    here = {**cpu_kind(), "torch": torch.__version__}
    assert same_cpu_kind(here)
    assert not same_cpu_kind({k: v for k, v in here.items() if k != "vendor"})
    assert not same_cpu_kind({**here, "vendor": "another vendor"})


def images_behind(run_dir: Path) -> dict[str, Any]:
    """How many test images each accuracy of the run counts: per client (its test split in the run's
    ``partition.csv``), per class and overall (the quickstart's test set)."""
    with (run_dir / "partition.csv").open() as f:
        per_client = {int(r["client"]): int(r["total"]) for r in csv.DictReader(f) if r["split"] == "test"}
    with np.load(MNIST_SMALL) as d:
        per_class = np.bincount(d["y_test"]).tolist()
    clients = [per_client[c] for c in sorted(per_client)]
    return {"client_acc": clients, "per_class_acc": per_class, "global_acc": sum(per_class),
            "client_mean_acc": clients}  # fmt: skip


def one_image(key: str, index: int | None, counts: dict[str, Any]) -> float:
    """The largest change of an accuracy when each set of test images behind it changes one prediction."""
    n = counts[key]
    if key == "client_mean_acc":  # a mean over the clients, each of which may change one image
        return sum(1 / c for c in n if c) / len(n)
    return 1 / (n[index] if index is not None else n)


def assert_round1_close(got: dict[str, Any], want: dict[str, Any], counts: dict[str, Any], case: str) -> None:
    """Round 1 on another CPU kind: losses within float rounding, accuracies within one image."""
    for key, w in want.items():
        g, where = got[key], f"{case}[round 1].{key}"
        if key == "round":
            assert g == w, where
        elif "loss" in key:
            assert g is not None and math.isclose(g, w, rel_tol=ROUND1_LOSS_RTOL), f"{where}: {g} != {w}"
        elif isinstance(w, list):
            for i, (gi, wi) in enumerate(zip(g, w, strict=True)):
                tol = one_image(key, i, counts) + 1e-12
                near = gi is not None and wi is not None and abs(gi - wi) <= tol
                assert gi == wi or near, f"{where}[{i}]: {gi} != {wi}"
        else:
            tol = one_image(key, None, counts) + 1e-12
            assert g is not None and abs(g - w) <= tol, f"{where}: {g} != {w} (one image: {tol:.4f})"


def assert_same_shape(got: Any, want: Any, counts: dict[str, Any], where: str) -> None:
    """What holds on every CPU in every round: the same keys, lengths and types, and every accuracy a
    whole number of images out of the images behind it."""
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for k in want:
            assert_same_shape(got[k], want[k], counts, f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_shape(g, w, counts, f"{where}[{i}]")
    else:
        assert type(got) is type(want), f"{where}: {got!r} is not a {type(want).__name__} like {want!r}"
    key = where.rsplit(".", 1)[-1].split("[")[0]
    if key in ("client_acc", "per_class_acc", "global_acc") and isinstance(got, float):
        index = int(where.rsplit("[", 1)[1].rstrip("]")) if where.endswith("]") else None
        n = counts[key][index] if index is not None else counts[key]
        assert abs(got * n - round(got * n)) < 1e-6 * n, f"{where}: {got} is not a whole number of {n} images"


@pytest.mark.parametrize(("case", "engine"), GRID)
def test_metrics_equal_the_golden_files(tmp_path: Path, case: str, engine: str) -> None:
    got, run_dir = run_metrics(tmp_path, CASES[case] + ENGINES[engine])
    path = GOLDEN / f"{case}.jsonl"
    if UPDATE and engine == "inline":
        path.write_text("".join(json.dumps(r) + "\n" for r in got))
        (GOLDEN / "meta.json").write_text(json.dumps({"torch": torch.__version__, **cpu_kind()}, indent=2) + "\n")
    want = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["round"] for r in got] == [1, 2, 3]
    if same_cpu_kind(json.loads((GOLDEN / "meta.json").read_text())):
        assert got == want
        return
    counts = images_behind(run_dir)
    assert_same_shape(got, want, counts, case)
    assert_round1_close(got[0], want[0], counts, case)
    if engine != "inline":  # the engines against each other, on this CPU: bit for bit
        inline, _ = run_metrics(tmp_path / "inline", CASES[case] + ENGINES["inline"])
        assert got == inline


OTHER_CPU = REPO.parent / "shared" / "golden-other-cpu"


@pytest.mark.skipif(not OTHER_CPU.is_dir(), reason=f"no {OTHER_CPU} (recordings of these cases on another CPU)")
@pytest.mark.slow
def test_two_cpu_kinds_recordings_pass_the_other_kind_comparison(tmp_path: Path) -> None:
    """The comparison for another CPU kind accepts what another kind really computes (the same cases
    recorded on an AVX2 machine beside this directory's), and still refuses a change of the numbers
    that float rounding cannot make (a loss 1e-3 off, an accuracy two images off)."""
    _, run_dir = run_metrics(tmp_path, ["train.rounds=1", "train.local_steps=1", "simulation.backend=inline"])
    counts = images_behind(run_dir)  # the quickstart's split: the runs below recorded it too
    for path in sorted(GOLDEN.glob("*.jsonl")):
        ours = [json.loads(line) for line in path.read_text().splitlines()]
        theirs = [json.loads(line) for line in (OTHER_CPU / path.name).read_text().splitlines()]
        assert_same_shape(theirs, ours, counts, path.stem)
        assert_round1_close(theirs[0], ours[0], counts, path.stem)
        with pytest.raises(AssertionError, match="train_loss"):
            assert_round1_close({**theirs[0], "train_loss": ours[0]["train_loss"] * 1.001}, ours[0], counts, "")
        with pytest.raises(AssertionError, match="global_acc"):
            assert_round1_close({**theirs[0], "global_acc": ours[0]["global_acc"] + 0.002}, ours[0], counts, "")
