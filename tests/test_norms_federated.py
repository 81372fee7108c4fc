"""Every registered normaliser trains under FedAvg on the Ray actor pool, and only true
parameters and running statistics travel between server and clients."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import ray
import torch

from fedsim.arrays import array_view
from fedsim.client.runtime import ClientRuntime
from fedsim.config_file import parse_config
from fedsim.engines.runner import run
from fedsim.experiment.resolve import resolve
from fedsim.norms import NORMS
from tests.conftest import small_config


def fedavg_run(tmp_path: Path, norm: str, backend: str) -> dict:  # type: ignore[type-arg]
    cfg = parse_config(
        small_config(
            tmp_path,
            name=norm,
            model={"name": "cnn", "norm": norm, "hidden": [32]},
            train={"rounds": 2, "num_clients": 2, "local_steps": 2},
            eval={"every": 2, "global_test": False},
            simulation={"backend": backend, "client_resources": {"num_cpus": 1}},
        )
    )
    summary = run(cfg)
    return json.loads((Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()[-1])


@pytest.mark.parametrize("norm", [e.name for e in NORMS])
@pytest.mark.slow
def test_every_norm_trains_under_fedavg(tmp_path: Path, norm: str) -> None:
    metrics = fedavg_run(tmp_path, norm, "inline")
    assert math.isfinite(metrics["train_loss"]) and metrics["client_mean_acc"] is not None


@pytest.mark.slow
@pytest.mark.long
def test_norm_families_on_the_ray_pool_match_inline(tmp_path: Path) -> None:
    # one of each family: running statistics, per-pixel groups, smoothed scale, layer replacement
    norms = ["ln_goldschmidt", "pln", "ln_weierstrass", "patchnorm"]
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:  # one Ray session: the pool joins it instead of starting and stopping its own each run
        pooled = {n: fedavg_run(tmp_path / "ray", n, "ray") for n in norms}
    finally:
        ray.shutdown()
    for n in norms:
        inline = fedavg_run(tmp_path / "inline", n, "inline")
        assert {k: v for k, v in pooled[n].items() if k not in ("time_s", "rss_mb")} == {
            k: v for k, v in inline.items() if k not in ("time_s", "rss_mb")
        }


@pytest.mark.parametrize("norm", ["ln_goldschmidt", "pln", "ln_weierstrass", "patchnorm", "bn"])
def test_a_client_sends_exactly_the_model_state_and_no_hyper_parameters(tmp_path: Path, norm: str) -> None:
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedsim import wire
    from fedsim.arrays import to_array_record

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # the sender, as a grid sets it
    cfg = parse_config(small_config(tmp_path, model={"name": "cnn", "norm": norm, "hidden": [32]}))
    runtime = ClientRuntime(resolve(cfg))
    state = runtime.model.state_dict()
    content = RecordDict(
        {wire.ARRAYS: to_array_record(state), wire.CONFIG: ConfigRecord({wire.SERVER_ROUND: 1})}
    )
    ctx = Context(run_id=1, node_id=1, node_config={wire.PARTITION_ID: 0}, state=RecordDict(), run_config={})
    reply = runtime.train(Message(content, dst_node_id=1, message_type="train"), ctx)
    sent = reply.content.array_records[wire.ARRAYS]
    params = {k for k, _ in runtime.model.named_parameters()}
    stats = {k for k, _ in runtime.model.named_buffers() if "running" in k or "num_batches" in k}
    assert set(sent) == params | stats  # nothing else: sigma, steps, group_size, eps stay config
    for key in params:  # and what is sent is what the client trained
        assert torch.equal(torch.from_numpy(array_view(sent[key]).copy()), runtime.model.state_dict()[key].cpu())
