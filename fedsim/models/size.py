"""The bound on a model's size: a model this machine cannot hold is refused before any weight is allocated.

A model option such as ``model.hidden: [1000000000]`` would otherwise end in a MemoryError, or in the
kernel's OOM killer half-way through initialising the weights. :func:`check_size` builds the model on
torch's ``meta`` device (shapes, no storage: microseconds, whatever the size), counts its parameters and
buffers, and refuses more than the machine's memory divided by the copies of the model a run holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedsim.errors import ConfigError, FedsimError
from fedsim.reading import GIB, MIB
from fedsim.registry import Resolved

# A run holds its model about this many times over: the server's global model and the copy it sends, the
# aggregate it sums replies into, a client's model, its gradients and its optimiser's momentum, and a strategy's
# model-sized state (SCAFFOLD's c and c_i, FedYogi's m and v). More clients in flight hold more: the bound
# refuses what cannot fit; it does not promise that what passes does.
COPIES = 8


# where a container's memory limit is, under cgroup v2 and v1 (a container sees its host's physical memory)
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def machine_memory() -> int:
    """The memory this process may use, in bytes: the machine's physical memory, or its container's limit
    where that is lower."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        try:
            memory = min(memory, int(path.read_text()))
        except (OSError, ValueError):  # no such cgroup, or "max": no limit
            continue
    return memory


def counted(build: Callable[[], nn.Module]) -> tuple[int, int] | None:
    """The elements and bytes of the parameters and buffers of what ``build`` makes, built on the meta device;
    None where it cannot be built there (a plugin's own tensors made on the CPU): the real build then decides."""
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):  # the run's seeded draw stays untouched
            model = build()
    except FedsimError:
        raise  # the model's own refusal (inputs too small for it): the same on any device
    except Exception:  # noqa: BLE001 (whatever a plugin raises on meta tensors: it is built for real next)
        return None
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def _amount(nbytes: float) -> str:
    return f"{nbytes / GIB:,.1f} GiB" if nbytes >= GIB else f"{nbytes / MIB:,.1f} MiB"


def check_size(model: Resolved[nn.Module], *args: Any) -> None:
    """Refuse ``model`` built with ``args`` (as :meth:`Resolved.create` takes them) where this machine's memory
    cannot hold :data:`COPIES` of it: one line naming the options set, the count, the bytes and the limit."""
    size = counted(lambda: model.cls(model.params, *args))  # type: ignore[call-arg]  # not create: it wraps errors
    limit = machine_memory() // COPIES
    if size is None or size[1] <= limit:
        return
    elements, nbytes = size
    options = model.params.model_dump(exclude_unset=True)
    named = ", ".join(f"{model.where}.{k}={v}" for k, v in options.items()) or "its default options"
    per_element = nbytes / elements
    raise ConfigError(
        f"{model.where}: {model.name!r} with {named} has {elements:,} parameters and buffers ({_amount(nbytes)}); "
        f"a run holds about {COPIES} copies of its model, so this machine's {_amount(machine_memory())} of memory "
        f"allow at most {int(limit / per_element):,} ({_amount(limit)}): make the model smaller"
    )
