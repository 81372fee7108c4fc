"""fedsim's default beside LN-FL's own code at the paper setting, interleaved, timed the same way in both.

    git clone https://github.com/huawei-noah/Federated-Learning /tmp/lnfl   # the authors' code, not fedsim's
    pip install tqdm                                                       # the one package it adds
    python benchmarks/against_lnfl.py --lnfl /tmp/lnfl/Layer_Normalization [--repeats 2] [--rounds 25]

The setting: CIFAR-10 (JPEG q75, the config's data.root), the paper CNN without normalisation, FedAvg, one
class per client, 10 clients, 10 local steps of batch 32, lr 0.01, augmentation on; fedsim with
``configs/cifar10_1class_fedavg.yaml`` as shipped (its default layout), LN-FL with its defaults.

LN-FL's ``run_fl.py`` runs as written but for one line: its device, ``cuda:N``, falls back to the CPU
when there is no CUDA; the substitution is made on the source in memory, its files are not touched.
Its CIFAR-10 is the same q75 set, written in torchvision's pickle layout and split by its own
``data/preprocess_vision.py`` (``class_part``, 1 class per client), with torchvision's md5 check off
(the pickles hold the q75 images, not the original archive's bytes).

Both are timed from outside, in the same way: the end of each round's aggregation (rounds 5 to the
last, so start-up and the first rounds' warm-up do not count), and the evaluation after the last round
(LN-FL's every ``log_interval`` rounds; fedsim's every ``eval.every``). Runs alternate, LN-FL first.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "cifar10_1class_fedavg.yaml"
SPLIT = "10_clients_class_per_client_1_Full"  # the directory name LN-FL's preprocess_vision.py writes
CPU_FALLBACK = (
    "device = torch.device(f'cuda:{args.device}')",
    "device = torch.device(f'cuda:{args.device}' if torch.cuda.is_available() else 'cpu')",
)
FIRST_TIMED_ROUND = 5


def write_cifar_pickles(out: Path) -> None:
    """fedsim's decoded q75 CIFAR-10 in torchvision's layout (``cifar-10-batches-py``: 5 train batches,
    the test batch, the class names)."""
    from fedsim.config_file import load_config
    from fedsim.experiment.resolve import resolve

    ds = resolve(load_config(CONFIG)).federation().dataset
    out.mkdir(parents=True, exist_ok=True)
    x_train, x_test = ds.x_train.reshape(len(ds.x_train), -1).numpy(), ds.x_test.reshape(len(ds.x_test), -1).numpy()
    batches = {f"data_batch_{i + 1}": slice(i * 10000, (i + 1) * 10000) for i in range(5)}
    for name, rows in batches.items():
        batch = {"data": x_train[rows], "labels": ds.y_train[rows].tolist(), "batch_label": name}
        (out / name).write_bytes(pickle.dumps(batch))
    (out / "test_batch").write_bytes(pickle.dumps({"data": x_test, "labels": ds.y_test.tolist()}))
    (out / "batches.meta").write_bytes(pickle.dumps({"label_names": list(ds.classes)}))


def unchecked_torchvision_cifar() -> None:
    import torchvision.datasets.cifar as cifar

    cifar.check_integrity = lambda *args, **kwargs: True  # type: ignore[assignment]
    cifar.CIFAR10._check_integrity = lambda self: True  # type: ignore[method-assign]


def lnfl_prepare(lnfl: Path, work: Path) -> None:
    """Child process: the pickles, then LN-FL's own split of them into ``work/CIFAR10/<SPLIT>``."""
    write_cifar_pickles(work / "data" / "CIFAR10" / "cifar-10-batches-py")
    unchecked_torchvision_cifar()
    os.chdir(work)
    sys.argv = ["preprocess_vision.py", f"--data_dir={work / 'data'}", "--dataset=CIFAR10", "--iid_type=class_part",
                "--class_per_client=1", "--num_clients=10", "--num_classes=10"]  # fmt: skip
    sys.path.insert(0, str(lnfl / "data"))
    runpy.run_path(str(lnfl / "data" / "preprocess_vision.py"), run_name="__main__")


def lnfl_run(lnfl: Path, work: Path, rounds: int, times: dict[str, list[float]]) -> None:
    """Child process: LN-FL's run_fl.py (CPU fallback in memory), its round ends and evaluations timed."""
    sys.path.insert(0, str(lnfl))
    import algs.algorithms as algorithms  # LN-FL's modules, from its checkout
    import utils.io as io

    aggregate, log_global_epoch = algorithms.FedAvg.aggregate, io.log_global_epoch

    def timed_aggregate(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = aggregate(self, *args, **kwargs)
        times["round_end"].append(time.perf_counter())
        return out

    def timed_log(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = log_global_epoch(*args, **kwargs)
        if times["round_end"] and len(times["round_end"]) % rounds == 0:  # the round that evaluates
            times["eval_s"].append(time.perf_counter() - t0)
        return out

    algorithms.FedAvg.aggregate, io.log_global_epoch = timed_aggregate, timed_log
    source = (lnfl / "run_fl.py").read_text()
    if CPU_FALLBACK[0] not in source:
        raise SystemExit(f"{lnfl / 'run_fl.py'} has no line {CPU_FALLBACK[0]!r}: another version of LN-FL's code")
    sys.argv = ["run_fl.py", "--name=bench", f"--num_rounds={rounds}", f"--log_interval={rounds}",
                f"--logdir={work / 'logs'}", f"--datadir={work / 'CIFAR10'}", f"--data_split={SPLIT}"]  # fmt: skip
    shutil.rmtree(work / "logs", ignore_errors=True)  # run_fl.py resumes from a model.pth it finds there
    os.chdir(lnfl)
    exec(compile(source.replace(*CPU_FALLBACK), str(lnfl / "run_fl.py"), "exec"), {"__name__": "__main__"})


def fedsim_run(work: Path, rounds: int, times: dict[str, list[float]]) -> None:
    """Child process: ``fedsim run`` of the shipped config, its round ends and evaluation timed."""
    from fedsim.config_file import load_config
    from fedsim.engines.runner import run
    from fedsim.server.reporter import RoundReporter

    trained, round_done = RoundReporter.trained, RoundReporter.round_done

    def timed_trained(self: RoundReporter) -> None:
        trained(self)
        times["round_end"].append(time.perf_counter())

    def timed_round_done(self: RoundReporter, server_round: int, arrays: Any, loss: Any, scores: Any) -> None:
        if scores is not None:  # evaluated: the time since this round's aggregation ended
            times["eval_s"].append(time.perf_counter() - times["round_end"][-1])
        round_done(self, server_round, arrays, loss, scores)

    RoundReporter.trained, RoundReporter.round_done = timed_trained, timed_round_done  # type: ignore[method-assign]
    overrides = [f"train.rounds={rounds}", f"eval.every={rounds}", "output.save_model=false",
                 "output.progress=false", f"output.run_dir={work / f'fedsim-run-{os.getpid()}'}"]  # fmt: skip
    run(load_config(CONFIG, overrides))


def child(args: argparse.Namespace) -> None:
    times: dict[str, list[Any]] = {"round_end": [], "eval_s": []}
    try:
        if args.child == "prepare":
            lnfl_prepare(args.lnfl, args.work)
        elif args.child == "lnfl":
            lnfl_run(args.lnfl, args.work, args.rounds, times)
        else:
            fedsim_run(args.work, args.rounds, times)
    finally:
        (args.work / f"{args.child}.json").write_text(json.dumps(times))


def timed(args: argparse.Namespace, side: str, work: Path) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", side, "--lnfl", str(args.lnfl), "--work", str(work),
           "--rounds", str(args.rounds)]  # fmt: skip
    with open(work / f"{side}.log", "w") as log:
        if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode:
            raise SystemExit(f"{side} failed: see {work / f'{side}.log'}")
    times = json.loads((work / f"{side}.json").read_text())
    ends = times["round_end"]
    return {
        "s_per_round": (ends[-1] - ends[FIRST_TIMED_ROUND - 1]) / (len(ends) - FIRST_TIMED_ROUND),
        "eval_s": times["eval_s"][-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lnfl", type=Path, required=True, help="LN-FL's Layer_Normalization directory")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=["prepare", "lnfl", "fedsim"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.lnfl = args.lnfl.resolve()
    if args.child:
        return child(args)
    if args.rounds <= FIRST_TIMED_ROUND:
        raise SystemExit(f"--rounds {args.rounds}: rounds {FIRST_TIMED_ROUND} to the last are timed; give more")
    work = Path(tempfile.mkdtemp(prefix="fedsim-vs-lnfl-"))
    from fedsim.config_file import load_config
    from fedsim.layout import choose_layout

    sim = choose_layout(load_config(CONFIG)).simulation
    print(f"work directory: {work}; fedsim's default here: backend {sim.backend}, {sim.threads} thread(s)", flush=True)
    prepare = [sys.executable, __file__, "--child", "prepare", "--lnfl", str(args.lnfl), "--work", str(work)]
    with open(work / "prepare.log", "w") as log:
        if subprocess.run(prepare, stdout=log, stderr=subprocess.STDOUT).returncode:
            raise SystemExit(f"preparing LN-FL's data failed: see {work / 'prepare.log'}")
    results: dict[str, list[dict[str, float]]] = {"lnfl": [], "fedsim": []}
    for repeat in range(args.repeats):
        for side in ("lnfl", "fedsim"):
            results[side].append(timed(args, side, work))
            r = results[side][-1]
            print(f"  {side:6s} run {repeat + 1}: {r['s_per_round']:.3f} s/round, evaluation {r['eval_s']:.1f} s",
                  flush=True)  # fmt: skip
    mean = {side: statistics.mean(r["s_per_round"] for r in runs) for side, runs in results.items()}
    evals = {side: statistics.mean(r["eval_s"] for r in runs) for side, runs in results.items()}
    print(f"rounds {FIRST_TIMED_ROUND}-{args.rounds}, mean of {args.repeats} interleaved runs each:")
    print(f"  LN-FL's code   {mean['lnfl']:.3f} s/round, evaluation {evals['lnfl']:.1f} s")
    print(f"  fedsim default {mean['fedsim']:.3f} s/round, evaluation {evals['fedsim']:.1f} s")
    print(f"  fedsim is {mean['lnfl'] / mean['fedsim']:.2f}x faster per round")


if __name__ == "__main__":
    main()
