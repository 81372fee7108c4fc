"""fedsim.deploy.warm: what a SuperNode's fork server makes warm before it forks (a run's runtime, torch's
kernels for its shapes), and that warming changes nothing a run computes."""

from __future__ import annotations

import pytest
import torch

from fedsim.client import runtime
from fedsim.config_file import load_config
from fedsim.deploy.warm import keep_warm, warm_up
from fedsim.models.evaluation import FORWARD_CHUNK
from tests.conftest import REPO


def test_the_server_builds_a_run_once_and_never_for_a_gpu() -> None:
    cfg = load_config(REPO / "configs" / "quickstart.yaml", ["simulation.threads=1"])
    runtime.prepare.cache_clear()
    try:
        keep_warm(cfg.to_json().encode())
        assert runtime.prepare.cache_info().currsize == 1
        built = runtime.prepare(cfg.to_json())
        assert runtime.prepare.cache_info().hits == 1 and built.device.type == "cpu"
        gpu = cfg.model_copy(deep=True)
        gpu.simulation.device = "cuda"
        keep_warm(gpu.to_json().encode())  # a CUDA context cannot cross a fork: children build it
        assert runtime.prepare.cache_info().currsize == 1
    finally:
        runtime.prepare.cache_clear()


@pytest.mark.parametrize("norm", ["bn", "ln_randomized"])
def test_warming_up_runs_both_shapes_and_changes_nothing_of_the_runtime(norm: str) -> None:
    """The fork server warms torch's kernels through a copy of the model (BN's running statistics would move
    if it used the runtime's own), on the training batch's and an evaluation chunk's shapes, RNG untouched
    (ln_randomized, not yet seeded by a round, draws its noise from the global RNG; BN draws nothing)."""
    from fedsim.client.runtime import ClientRuntime
    from fedsim.experiment.resolve import resolve

    cfg = load_config(REPO / "configs" / "quickstart.yaml", ["simulation.threads=1", f"model.norm={norm}"])
    rt = ClientRuntime(resolve(cfg))
    shapes: list[tuple[int, ...]] = []
    rt.model.register_forward_hook(lambda module, args, out: shapes.append(tuple(args[0].shape)))
    before = {k: v.clone() for k, v in rt.model.state_dict().items()}
    rng = torch.get_rng_state()
    warm_up(rt)
    in_shape = tuple(rt.fed.dataset.in_shape)
    assert shapes == [(cfg.train.batch_size, *in_shape), (min(cfg.eval.batch_size, FORWARD_CHUNK), *in_shape)]
    after = rt.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in rt.model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
