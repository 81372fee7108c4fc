"""Every registry by kind, for ``fedsim list`` and for plugin authors."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from fedsim.data import DATASETS
from fedsim.models import MODELS
from fedsim.norms import NORMS
from fedsim.partitions import PARTITIONERS
from fedsim.registry import Registry
from fedsim.strategies import STRATEGIES
from fedsim.trackers import TRACKERS

ALL_REGISTRIES: dict[str, Registry[Any]] = {
    "strategies": STRATEGIES,
    "norms": NORMS,
    "models": MODELS,
    "datasets": DATASETS,
    "partitions": PARTITIONERS,
    "trackers": TRACKERS,
}


def _options(obj: Any) -> str:
    params = getattr(obj, "Params", None)
    if not (isinstance(params, type) and issubclass(params, BaseModel)) or not params.model_fields:
        return ""
    parts = []
    for name, field in params.model_fields.items():
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        parts.append(f"{name}={default}")
    return "  options: " + ", ".join(parts)


def describe(kind: str) -> str:
    lines = [f"{kind}:"]
    for entry in ALL_REGISTRIES[kind]:
        lines.append(f"  {entry.name:<16} {entry.summary}")
        if opts := _options(entry.obj):
            lines.append(f"  {'':<16}{opts}")
    return "\n".join(lines)
