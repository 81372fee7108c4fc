"""Every strategy end to end, FedBN's local state in a real ClientRuntime, user strategies from
the user's own module and from an installed entry point, and client state across Ray processes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ConfigRecord, Message, RecordDict
from torch.nn.modules.batchnorm import _BatchNorm

from fedsim import wire
from fedsim.app.cli import main as cli_main
from fedsim.arrays import to_array_record
from fedsim.client.app import app
from fedsim.client.runtime import ClientRuntime
from fedsim.config import RunConfig
from fedsim.config_file import load_config, parse_config
from fedsim.engines.local import InlineExecutor, LocalGrid, node_context
from fedsim.engines.runner import run
from fedsim.errors import ConfigError
from fedsim.experiment.resolve import resolve
from fedsim.registry import yaml_text
from fedsim.strategies import STRATEGIES
from fedsim.strategies.fedbn import FEDBN_LOCAL
from tests import strategy_rows
from tests.conftest import small_config, write_config

BUILTINS = list(strategy_rows.ROWS)
COMPARED = ("round", "train_loss", "client_mean_acc", "global_acc", "client_acc")  # deterministic fields


def run_cfg(cfg: RunConfig) -> tuple[list[dict[str, Any]], Path]:
    summary = run(cfg)
    run_dir = Path(summary["run_dir"])
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: json.loads(line).get(k) for k in COMPARED} for line in lines], run_dir


_runs: dict[tuple[Any, ...], tuple[list[dict[str, Any]], Path]] = {}


def run_strategy(tmp_path_factory: pytest.TempPathFactory, name: str, norm: str, **options: Any):
    """One small run per (strategy, norm, options), shared by the tests of this module."""
    key = (name, norm, *sorted(options.items()))
    if key not in _runs:
        tmp = tmp_path_factory.mktemp(f"{name}-{norm}")
        cfg = small_config(tmp, name=name, strategy={"name": name, **options}, model={"norm": norm})
        _runs[key] = run_cfg(parse_config(cfg))
    return _runs[key]


def initial_model(cfg: RunConfig) -> dict[str, torch.Tensor]:
    """The global model run_server starts from (seeded the same way)."""
    return resolve(cfg).initial_model().state_dict()


@pytest.mark.parametrize("norm", ["ln", "bn"])
@pytest.mark.parametrize("name", BUILTINS)
def test_every_strategy_runs_end_to_end(tmp_path_factory: pytest.TempPathFactory, name: str, norm: str) -> None:
    metrics, run_dir = run_strategy(tmp_path_factory, name, norm)
    assert [m["round"] for m in metrics] == [2, 4]
    assert all(math.isfinite(m["train_loss"]) for m in metrics)
    assert metrics[-1]["client_mean_acc"] > 0.3  # it learned: 10 classes, chance is 0.1
    assert (run_dir / "model.pt").is_file()


def test_strategies_change_training_where_they_should(tmp_path_factory: pytest.TempPathFactory) -> None:
    fedavg, _ = run_strategy(tmp_path_factory, "fedavg", "ln")
    # Flower's FedAvgM with its defaults (lr 1, momentum 0) is FedAvg
    assert run_strategy(tmp_path_factory, "fedavgm", "ln")[0] == fedavg
    # μ = 0 and no server momentum: the same numbers as FedAvg, so the defaults' differences are real
    mu0, _ = run_strategy(tmp_path_factory, "fedprox", "ln", mu=0.0)
    assert mu0 == fedavg
    assert run_strategy(tmp_path_factory, "fedntd", "ln", beta=0.0)[0] == fedavg  # β = 0: no distillation
    # every client takes train.local_steps: equal ‖a_i‖₁, and FedNova is FedAvg bit for bit
    assert run_strategy(tmp_path_factory, "fednova", "ln")[0] == fedavg
    for name in ("fedprox", "scaffold", "fedyogi", "fedlc", "fedrs", "feddecorr", "fedntd", "fedadam", "feddyn"):
        assert run_strategy(tmp_path_factory, name, "ln")[0][-1]["train_loss"] != fedavg[-1]["train_loss"], name


def test_fedbn_server_never_changes_bn_tensors(tmp_path_factory: pytest.TempPathFactory) -> None:
    _, fedbn_dir = run_strategy(tmp_path_factory, "fedbn", "bn")
    _, fedavg_dir = run_strategy(tmp_path_factory, "fedavg", "bn")
    cfg = parse_config(small_config(fedbn_dir, strategy={"name": "fedbn"}, model={"norm": "bn"}))
    start = initial_model(cfg)
    fedbn = torch.load(fedbn_dir / "model.pt")
    fedavg = torch.load(fedavg_dir / "model.pt")
    model = resolve(cfg).build_model()
    bn = {f"{n}.{k}" for n, m in model.named_modules() if isinstance(m, _BatchNorm) for k in m.state_dict()}
    assert bn
    for k in bn:
        assert torch.equal(fedbn[k].to(start[k].dtype), start[k]), k
    assert not torch.equal(fedavg["fc_norms.0.running_var"], start["fc_norms.0.running_var"])
    assert not torch.equal(fedbn["classifier.weight"], start["classifier.weight"])


@pytest.mark.parametrize("scored", ["local", "shared"])
def test_fedbn_client_evaluates_with_its_own_or_the_shared_bn(tmp_path: Path, scored: str) -> None:
    strategy = {"name": "fedbn", "evaluate": scored}
    cfg = parse_config(small_config(tmp_path, strategy=strategy, model={"norm": "bn"}))
    # the identity Messages are sent under
    LocalGrid(InlineExecutor(app, run_id=1, num_partitions=4, state_memory_mb=64))
    runtime = ClientRuntime(resolve(cfg))
    context = node_context(1, 0, 4)
    start = initial_model(cfg)
    config = ConfigRecord({wire.SERVER_ROUND: 1, wire.RUN_CONFIG: cfg.to_json()})
    content = RecordDict({wire.ARRAYS: to_array_record(start), wire.CONFIG: config})
    train = Message(content, dst_node_id=1, message_type="train")
    runtime.train(train, context)
    local = context.state[FEDBN_LOCAL]
    assert "fc_norms.0.running_var" in local

    losses = []
    for garbage in (3.0, 50.0):  # whatever BN tensors the server holds
        arrays = {k: torch.full_like(v, garbage) if k in local else v for k, v in start.items()}
        content = RecordDict({wire.ARRAYS: to_array_record(arrays), wire.CONFIG: config})
        evaluate = Message(content, dst_node_id=1, message_type="evaluate")
        reply = runtime.evaluate(evaluate, context)
        losses.append(reply.content[wire.METRICS][wire.EVAL_LOSS])
        for k, v in runtime.model.state_dict().items():
            expected = torch.tensor(local[k].numpy()) if k in local and scored == "local" else arrays[k]
            assert torch.equal(v, expected.to(v.dtype)), k
    # personalised scores ignore the server's BN tensors; the shared model is scored with them
    assert (losses[0] == losses[1]) == (scored == "local")


# --- user strategies ---------------------------------------------------------------------------

PLUGIN = "tests.plugins.my_strategy:FrozenHead"


def assert_head_frozen(cfg: RunConfig, run_dir: Path) -> None:
    start, final = initial_model(cfg), torch.load(run_dir / "model.pt")
    # equal up to FedAvg's float rounding of sum_i (n_i / n) x; the trained layer moved far more
    head = (final["classifier.weight"] - start["classifier.weight"]).abs().max()
    body = (final["fcs.0.weight"] - start["fcs.0.weight"]).abs().max()
    assert head < 1e-6 < 1e-3 < body


def test_user_strategy_from_yaml_module_path(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = write_config(tmp_path, small_config(tmp_path, name="plugin", strategy={"name": PLUGIN}))
    cfg = load_config(path)
    metrics, run_dir = run_cfg(cfg)
    assert_head_frozen(cfg, run_dir)
    # its option reaches the client half: scale 1 is plain FedAvg
    cfg1 = load_config(write_config(tmp_path, small_config(
        tmp_path, name="plugin1", strategy={"name": PLUGIN, "head_lr_scale": 1.0}), "one.yaml"))
    assert run_cfg(cfg1)[0] == run_strategy(tmp_path_factory, "fedavg", "ln")[0]


def test_a_stock_flower_strategy_runs_by_dotted_path(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Flower's own FedAvg, named in YAML: fedsim's loop samples and evaluates; the numbers are FedAvg's."""
    flower = {"name": "flwr.serverapp.strategy:FedAvg"}
    metrics, _ = run_cfg(parse_config(small_config(tmp_path, name="flower", strategy=flower)))
    assert metrics == run_strategy(tmp_path_factory, "fedavg", "ln")[0]
    # its constructor's keyword arguments are its options, validated before the run
    bad = {**flower, "fraction_trian": 0.5}
    with pytest.raises(ConfigError, match=r"strategy\.fraction_trian\b.*fraction_train"):
        run_cfg(parse_config(small_config(tmp_path, name="typo", strategy=bad)))
    # a Flower strategy must configure every node: fedsim samples the clients itself
    half = {**flower, "fraction_train": 0.5}
    with pytest.raises(ConfigError, match=r"fraction_train=0\.5.*clients_per_round.*fraction_train: 1\.0"):
        run_cfg(parse_config(small_config(tmp_path, name="half", strategy=half)))
    # Flower's default of two nodes at least, for a federation of one: named, with the fix
    one = small_config(tmp_path, name="one", strategy=flower, train={"num_clients": 1})
    with pytest.raises(ConfigError, match=r"min_available_nodes=2.*num_clients = 1.*min_available_nodes: 1"):
        run_cfg(parse_config(one))


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A distribution on sys.path with a ``fedsim.strategies`` entry point, as pip would leave it."""
    dist = tmp_path / "site" / "fedsim_frozen_head-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fedsim-frozen-head\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[fedsim.strategies]\nfrozen_head = {PLUGIN}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    STRATEGIES.reset_plugins()
    yield "frozen_head"
    STRATEGIES.reset_plugins()


def test_user_strategy_from_entry_point(
    tmp_path: Path, installed_plugin: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert installed_plugin in STRATEGIES.names()
    assert cli_main(["list", "strategies"]) == 0
    assert "frozen_head" in capsys.readouterr().out
    cfg = parse_config(small_config(tmp_path, name="ep", strategy={"name": installed_plugin}))
    _, run_dir = run_cfg(cfg)
    assert_head_frozen(cfg, run_dir)


def test_list_shows_every_strategy_with_summary_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["list", "strategies"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in BUILTINS:
        spec = STRATEGIES.get(name)
        i = next(i for i, line in enumerate(lines) if line.split()[:1] == [name])
        assert spec.__doc__.strip().splitlines()[0] in lines[i]
        for field, info in spec.Params.model_fields.items():
            assert f"{field}={yaml_text(info.default)} (" in lines[i + 1], (name, field)
    assert "v0=tau^2 (one of tau^2, or a number)" in "\n".join(lines) and "mu=0.01 (a number >= 0)" in "\n".join(lines)


# --- client state across processes -------------------------------------------------------------


@pytest.mark.slow
def test_scaffold_client_state_across_ray_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # 3 of 4 clients per round: a client's c_i must wait in its own actor's Context.state
    section = {"strategy": {"name": "scaffold"}, "train": {"clients_per_round": 3}}
    inline, _ = run_cfg(parse_config(small_config(tmp_path / "inline", **section)))
    pool, _ = run_cfg(parse_config(small_config(
        tmp_path / "ray", simulation={"backend": "ray", "client_resources": {"num_cpus": 1}}, **section)))
    assert pool == inline  # two actor processes (2 CPUs), same numbers as one process
    assert inline[-1]["client_mean_acc"] > 0.3
