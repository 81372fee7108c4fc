"""What a SuperNode's fork server (:mod:`fedsim.deploy.forkserver`) makes warm before it forks, so that each
ClientApp process it forks starts with it instead of setting it up per Message: the imports every ClientApp
process needs, torch's first-use set-up, and each run's :class:`~fedsim.client.runtime.ClientRuntime` (data,
split, model) with torch's kernels for its shapes.

Nothing here starts a thread pool or CUDA, which a forked child could not use: torch runs single-threaded
(a child sets the run's threads on its first Message), and a run's runtime is built only when the run
trains on the CPU.
"""

from __future__ import annotations

import copy
import sys

import torch

from fedsim.client import runtime
from fedsim.client.runtime import ClientRuntime
from fedsim.models.evaluation import FORWARD_CHUNK


def preload() -> None:
    """Import what every ClientApp process imports, once: Flower's client runtime and its HTTP stack,
    fedsim's ClientApp, and torch's kernels' first-use set-up (one SGD step of fedsim's)."""
    import httpcore  # noqa: F401 (imported by the Runtime API's client when it opens its transport)
    from flwr.supernode.cli import flwr_clientapp  # noqa: F401

    import fedsim.deploy.clientapp  # noqa: F401
    from fedsim.client.sgd import LocalSgd

    torch.set_num_threads(1)
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.ones(1)
    LocalSgd([param], lr=0.1, momentum=0.9, weight_decay=0.0).step()


def keep_warm(config_json: bytes) -> None:
    """Build the runtime for a run config a child announced, and warm its kernels (:func:`warm_up`)."""
    try:
        config = config_json.decode()
        if runtime.config_of(config).simulation.device != "cpu":
            return  # a CUDA context cannot cross a fork: each child builds its runtime on the GPU itself
        warm_up(runtime.prepare(config))
    except Exception as err:  # noqa: BLE001 (children build it themselves, and report what fails)
        print(f"fedsim fork server: not keeping this run warm for the tasks it forks: {err}", file=sys.stderr)


def warm_up(rt: ClientRuntime) -> None:
    """A training step's forward and backward and an evaluation chunk's forward, on zeros, through a copy of
    ``rt``'s model: torch's kernels for these shapes and its allocator's pools are set up, nothing of the
    runtime changes (its model, the global CPU RNG: only CPU runs are kept warm)."""
    shape = rt.fed.in_shape
    model = copy.deepcopy(rt.model)
    with torch.random.fork_rng(devices=[]):
        model.train()
        model(torch.zeros(rt.cfg.train.batch_size, *shape, device=rt.device)).sum().backward()
        model.eval()
        with torch.no_grad():
            model(torch.zeros(min(rt.cfg.eval.batch_size, FORWARD_CHUNK), *shape, device=rt.device))
