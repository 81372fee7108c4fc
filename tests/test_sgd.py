"""Clients' local SGD (fedsim.client.sgd) is torch.optim.SGD's update to the bit, without importing
torch._dynamo (about a second of CPU in every process that trains)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedsim.client.sgd import LocalSgd
from tests.conftest import REPO


def trained(make: str, momentum: float, weight_decay: float) -> list[torch.Tensor]:
    """Parameters after 12 steps in 2 rounds, then the last one as it started: it never gets a gradient."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(30, 10), (10, 10), (10,), (5,)]
    params = [torch.nn.Parameter(torch.randn(*shape, generator=gen)) for shape in shapes]
    unused = params[3].detach().clone()
    opt: torch.optim.SGD | LocalSgd
    if make == "torch":
        opt = torch.optim.SGD(params, lr=0.05, momentum=momentum, weight_decay=weight_decay)
    else:
        opt = LocalSgd(params, lr=0.05, momentum=momentum, weight_decay=weight_decay)
    for _ in range(2):
        opt.state.clear() if isinstance(opt, torch.optim.SGD) else opt.reset()  # a new round: momentum forgotten
        for _ in range(6):
            x = torch.randn(8, 30, generator=gen)
            loss = ((x @ params[0] @ params[1] + params[2]).tanh() ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [p.detach().clone() for p in params] + [unused]


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.9, 5e-4), (0.0, 0.0), (0.5, 0.0), (0.0, 1e-3)])
def test_local_sgd_is_torch_sgd_to_the_bit(momentum: float, weight_decay: float) -> None:
    ours, theirs = trained("fedsim", momentum, weight_decay), trained("torch", momentum, weight_decay)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert not torch.equal(ours[0], trained("fedsim", momentum, weight_decay + 0.1)[0])  # the options count
    assert torch.equal(ours[3], ours[4])  # a parameter without a gradient is left alone, as torch leaves it


@pytest.mark.slow
def test_a_run_never_imports_torch_dynamo(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from fedsim.config_file import load_config\n"
        "from fedsim.engines.runner import run\n"
        f"run(load_config('configs/quickstart.yaml', ['train.rounds=1', 'train.local_steps=2', "
        f"'output.progress=false', 'simulation.backend=inline', 'simulation.threads=1', 'output.dir={tmp_path}']))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"
