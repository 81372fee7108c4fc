"""``fedsim local RUN_DIR --client k --steps S [--every E]``: one client of a finished run, trained alone.

LN-FL Figs. 2-3 (App. D): a federated model handed to one client and trained on that client's data
alone overfits its classes: accuracy on them rises, accuracy on every other class falls, and without
normalisation the penultimate features collapse (their norm grows, their effective rank drops).
This continues a finished run's global model (``model.pt``) on client k's training data for S steps
of the run's SGD (lr, momentum, weight decay, batch size, augmentation), one continuous stream of
batches, through the one training loop with FedAvg's client half (plain local SGD, whatever the
run's strategy). Before the first step and every E steps (and after the last) it scores the model
on the whole test set, accuracy on the classes client k trains on (``own_class_acc``) and on all
the others (``other_class_acc``), and measures the feature diagnostics of :mod:`fedsim.experiment.diagnostics`
on the run's probe batch. ``--set`` changes only the local training (:data:`LOCAL_KEYS`): which data is
client k's is the run's. ``RUN_DIR/local-<k>/`` (``local-<k>,<key=value>...`` with ``--set``, cut short and
ending in a hash of the exact request where it would be too long or hold other characters, :func:`local_dir`)
holds ``local.json`` (what ran, :class:`LocalRequest`) and ``metrics.jsonl`` (one line per evaluation, flushed
as written); ``fedsim plot`` draws them. The same request again replaces them; another one is refused there.
The run's ``summary.json`` and model, and ``local.json``, are read through :mod:`fedsim.reading`
(:func:`fedsim.record.reader.read_summary`, :func:`read_request`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from fedsim.client.runtime import ClientRuntime, round_seed
from fedsim.client.training import ClientRound, train_local
from fedsim.config import MAX_LOCAL_STEPS, RunConfig
from fedsim.config_file import read_run_config
from fedsim.data.fingerprint import check_same_data
from fedsim.engines.runner import check_runnable
from fedsim.errors import ConfigError, DataError, FedsimError, brief
from fedsim.exclusive import claim_process
from fedsim.experiment.diagnostics import ProbeDiagnostics, probe_images
from fedsim.experiment.resolve import resolve
from fedsim.files import check_links, write_file
from fedsim.layout import torch_threads
from fedsim.models.evaluation import evaluate
from fedsim.names import control_character, cut, unprintable
from fedsim.norms import seed_norm_noise
from fedsim.reading import read_json
from fedsim.record.claim import claimed
from fedsim.record.layout import CONFIG, LOCAL_JSON, MODEL, SUMMARY
from fedsim.record.manifest import DATA_FINGERPRINT, FILES, SHA256, check_entry
from fedsim.record.reader import load_torch, metrics_bytes, read_summary, read_torch_bytes
from fedsim.record.schemas import Written
from fedsim.record.verify import RESTORE_HINT, check_files, check_summary
from fedsim.record.writer import RunDir
from fedsim.registry import PluginParams
from fedsim.strategies.hooks import ClientHooks, RoundInfo

# What --set may change for a continuation: its SGD, the model's form (model.norm=fn: LN-FL Fig. 2), where the run's
# data is now (its fingerprint in summary.json checks that it is the run's), where and on how many threads it runs;
# a key and the keys inside it. The partition (train.num_clients, partition, seed) decides which data is client k's,
# and the run's strategy, output, evaluation or deployment has no part in a continuation.
LOCAL_KEYS = (
    "train.lr", "train.momentum", "train.weight_decay", "train.batch_size", "data.augment", "model",
    "data.root", "data.cache_dir", "simulation.device", "simulation.threads", "eval.batch_size",
)  # fmt: skip
# what a directory name keeps of a --set item as typed; any other character (a space, '/', ',') becomes '_'
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]")


def local_dir(run_dir: str | Path, client: int, overrides: list[str] | None = None) -> Path:
    """``RUN_DIR/local-<k>``, or ``local-<k>,<override>,...`` when ``--set`` changed the config, so that a
    vanilla continuation and an FN one of the same client sit side by side (LN-FL Fig. 2). One directory per
    client and ``--set`` list: a name too long, or one whose characters had to be replaced, is cut short and
    ends in a hash of the exact list."""
    items = list(overrides or [])
    exact = ",".join([f"local-{client}", *items])
    name = ",".join([f"local-{client}", *(_UNSAFE.sub("_", item) for item in items)])  # a ',' in an item too
    return Path(run_dir) / cut(name, None if name == exact else json.dumps([client, items]))


def check_overrides(overrides: list[str]) -> None:
    """Refuse a ``--set`` item that holds a control character or a lone surrogate (it names the directory and
    is recorded in ``local.json``) or whose key is not one of :data:`LOCAL_KEYS`."""
    for item in overrides:
        if (hit := control_character(item)) is not None:
            raise ConfigError(f"--set {brief(item)}: {unprintable(hit[1])}")
        key = item.partition("=")[0].strip()  # an item without '=' is apply_overrides' to refuse
        if "=" in item and not any(key == k or key.startswith(f"{k}.") for k in LOCAL_KEYS):
            allowed = ", ".join(k if "." in k else f"{k}[.<key>]" for k in LOCAL_KEYS)  # a section and inside it
            raise ConfigError(
                f"--set {brief(key)[1:-1]}: fedsim local continues client k of the run as the run split its data, "
                f"with plain local SGD; --set changes only that training: {allowed}"
            )


def finished_run_config(
    run_dir: str | Path, client: int, steps: int, every: int, overrides: list[str] | None = None
) -> RunConfig:
    """The config of the finished run ``run_dir`` with ``overrides`` applied, once the request is known to
    be one that can run. Everything here reads only small files: bad input stops before any data is loaded.
    """
    run_dir = Path(run_dir)
    if not 1 <= steps <= MAX_LOCAL_STEPS:
        raise ConfigError(
            f"--steps {steps}: the local steps to take must be in 1..{MAX_LOCAL_STEPS:,} (as train.local_steps)"
        )
    if not 1 <= every <= steps:  # E = S: before the first step and after the last only
        raise ConfigError(f"--every {every}: evaluate every E steps with E in 1..{steps} (--steps)")
    if not (run_dir / CONFIG).is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml there)")
    # exists, not is_file: a summary or model that is something else (a FIFO) is refused by its reader, by name
    missing = [name for name in (SUMMARY, MODEL) if not (run_dir / name).exists()]
    if missing:
        raise ConfigError(
            f"{run_dir}: not a finished run with a saved model (no {' or '.join(missing)}): finish it first "
            f"(fedsim run --resume {run_dir}), with output.save_model: true"
        )
    check_overrides(overrides or [])
    cfg = read_run_config(run_dir / CONFIG, overrides)
    n = cfg.train.num_clients
    if not 0 <= client < n:
        raise ConfigError(f"--client {client} is out of range; allowed 0..{n - 1} (the run's train.num_clients)")
    return cfg


class LocalRequest(Written):
    """``local.json``: what a continuation ran (the run, the client and its classes, the SGD it took)."""

    run_dir: str
    client: int = Field(ge=0)
    steps: int = Field(ge=1)
    every: int = Field(ge=1)
    classes: list[int]
    lr: float
    momentum: float
    weight_decay: float
    batch_size: int = Field(ge=1)
    augment: bool
    overrides: list[str] = []  # absent from the first fedsim local's files
    model_sha256: str  # the SHA-256 of the model.pt it continued, as the run's summary.json lists it


def read_request(local: str | Path) -> dict[str, Any]:
    """``local.json`` of the continuation in ``local``, as written, once it is what fedsim writes, and a
    continuation of the model its run directory (``local``'s parent) holds: one left behind when the run was
    re-run in its directory, or copied into another run's, was drawn as a continuation of that run's model."""
    local = Path(local)
    request = read_json(local / LOCAL_JSON, LocalRequest, "fedsim local's request", error=FedsimError)
    summary = local.parent / SUMMARY
    model = read_summary(local.parent)[FILES].get(MODEL) if summary.exists() else None
    if model is None or model[SHA256] != request["model_sha256"]:
        raise FedsimError(
            f"{local}: a continuation of another model than its run's (model_sha256 in local.json is not the "
            f"{MODEL} in {summary}'s {FILES}: the run was run again since, or this directory was copied from another "
            "run's); move or delete it"
        )
    return request


def _check_same_request(path: Path, client: int, steps: int, every: int, overrides: list[str]) -> None:
    """Refuse to write into ``path`` if it holds the results of another request than this one."""
    if not (path / LOCAL_JSON).exists():
        return
    old = read_request(path)
    if (old["client"], old["steps"], old["every"], old.get("overrides", [])) != (client, steps, every, overrides):
        raise FedsimError(
            f"{path} holds the results of another fedsim local request (--client {old['client']} --steps "
            f"{old['steps']} --every {old['every']}, --set {' '.join(old.get('overrides', [])) or 'nothing'}); "
            "move or delete that directory to run this one"
        )


def load_model(run_dir: Path, summary: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The run's ``model.pt``, once its bytes are those its ``summary`` lists (size and SHA-256)."""
    path = run_dir / MODEL
    if MODEL not in summary[FILES]:
        raise FedsimError(f"{path}: not a file the run wrote (summary.json lists no {MODEL}): {RESTORE_HINT}")
    data = read_torch_bytes(path, "model")
    check_entry(path, data, summary[FILES][MODEL], f"summary.json's {FILES}", RESTORE_HINT)
    return load_torch(path, data, "model")


@claim_process("fedsim local")
def continue_locally(
    run_dir: str | Path, client: int, steps: int, every: int, overrides: list[str] | None = None
) -> Path:
    """Train client ``client`` alone from the run's final model for ``steps`` steps; returns ``local-<k>/``.

    ``overrides`` (``key=value``) change the run's config for the local training: ``model.norm=fn`` trains
    a vanilla run's model with FN, which has no parameters (LN-FL Fig. 2, right), ``train.lr=...``.
    """
    cfg = finished_run_config(run_dir, client, steps, every, overrides)
    path = local_dir(run_dir, client, overrides)
    check_links(Path(run_dir), [path.name], deep=False)  # local-<k> is fedsim's, in the run directory: no link
    _check_same_request(path, client, steps, every, list(overrides or []))  # before any data is read; again below
    summary = read_summary(Path(run_dir))
    # the run's config as it finished (its config.yaml edited since, a seed or the clients, would split other data)
    check_summary(Path(run_dir), read_run_config(Path(run_dir) / CONFIG, read_back=True), summary)
    check_files(Path(run_dir), summary, SUMMARY, metrics_bytes(run_dir))
    experiment = resolve(cfg)
    check_runnable(experiment)  # what fedsim run checks (a batch larger than the data), before any directory
    if experiment.federation().dataset is None:
        raise ConfigError(
            f"{run_dir}: data.dataset {cfg.data.dataset.name!r} is generated per client: fedsim local scores the "
            "client on the whole test set, which it has not"
        )
    runtime = ClientRuntime(experiment)
    # the run's model continued on other data would be no continuation of it
    check_same_data(summary.get(DATA_FINGERPRINT), runtime.fed.data_sha256, Path(run_dir) / SUMMARY, cfg.data.root)
    torch.set_num_threads(torch_threads(cfg.simulation))
    data = runtime.data(client)
    if len(data.y_train) == 0:
        raise DataError(f"--client {client} holds no training samples in this run's split: choose another client")
    state = load_model(Path(run_dir), summary)
    try:
        runtime.model.load_state_dict(state)
    except RuntimeError as err:  # --set changed the model's tensors
        first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
        raise ConfigError(
            f"{run_dir}/model.pt does not fit the model this config builds (--set {' '.join(overrides or [])}): {first}"
        ) from err
    own = data.class_counts > 0
    # one continuation at a time per directory; the same request again replaces its metrics (the same numbers:
    # its batches are seeded), another one's are never replaced
    with claimed(path, field="fedsim local's output directory", owner="local continuation", entries=[LOCAL_JSON]):
        _check_same_request(path, client, steps, every, list(overrides or []))  # what ended while this one loaded
        out = RunDir(path)
        t = cfg.train
        request = LocalRequest(
            run_dir=str(Path(run_dir).resolve()), client=client, steps=steps, every=every,
            classes=[c for c, held in enumerate(own.tolist()) if held], lr=t.lr, momentum=t.momentum,
            weight_decay=t.weight_decay, batch_size=t.batch_size, augment=cfg.data.augment,
            overrides=list(overrides or []), model_sha256=summary[FILES][MODEL][SHA256],
        )  # fmt: skip
        write_file(out.path / LOCAL_JSON, (request.model_dump_json(indent=2) + "\n").encode())

        probe = _probe(runtime)
        out.append_metrics({"step": 0, "train_loss": None, **_scores(runtime, own), **probe.measure()})
        window: list[float] = []

        def after_step(step: int, losses: torch.Tensor) -> None:
            window.append(float(losses[0]))
            if step % every == 0 or step == steps:
                loss = sum(window) / len(window)
                out.append_metrics({"step": step, "train_loss": loss, **_scores(runtime, own), **probe.measure()})
                window.clear()

        # the round after the run's last one: batches no round of the run drew
        seed = round_seed(cfg.seed, t.rounds + 1, client)
        seed_norm_noise(runtime.model, seed)
        info = RoundInfo(t.rounds + 1, client, steps, None, t.lr, t.momentum, data.class_counts, t.max_grad_norm)
        work = ClientRound(runtime.model, ClientHooks(PluginParams()), runtime.stream(client, seed), info)
        train_local([work], runtime.optimizer(1), after_step=after_step)
        out.close()
    return path


def _probe(runtime: ClientRuntime) -> ProbeDiagnostics:
    """The run's probe batch and diagnostics, with the feature diagnostics on, measuring the training model."""
    cfg = runtime.cfg.diagnostics.model_copy(update={"features": True, "grad_norms": False})
    ds = runtime.fed.dataset
    n = probe_images(cfg, len(ds.y_test))
    x = runtime.to_inputs(ds.x_test[:n]).to(runtime.device)
    return ProbeDiagnostics(cfg, runtime.model, x, ds.y_test[:n].to(runtime.device))


def _scores(runtime: ClientRuntime, own: torch.Tensor) -> dict[str, Any]:
    """Accuracy on the whole test set: on the client's own classes, on the others, overall and per class."""
    ds = runtime.fed.dataset
    x, y = ds.x_test.to(runtime.device), ds.y_test.to(runtime.device)
    _, correct, totals = evaluate(runtime.model, x, y, runtime.cfg.eval.batch_size, ds.num_classes, runtime.to_inputs)

    def share(mask: torch.Tensor) -> float | None:
        n = int(totals[mask].sum())
        return int(correct[mask].sum()) / n if n else None

    per_class = [int(c) / int(n) if n else None for c, n in zip(correct, totals, strict=True)]
    return {
        "own_class_acc": share(own), "other_class_acc": share(~own), "global_acc": share(torch.ones_like(own)),
        "per_class_acc": per_class,
    }  # fmt: skip
