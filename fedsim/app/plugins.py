"""Every registry by kind, for ``fedsim list`` and for plugin authors."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from fedsim.data import DATASETS
from fedsim.models import MODELS
from fedsim.norms import NORMS
from fedsim.partitions import PARTITIONERS
from fedsim.registry import Registry, accepted_values, yaml_text
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
    return "  options: " + ", ".join(describe_option(name, field) for name, field in params.model_fields.items())


def describe_option(name: str, field: FieldInfo) -> str:
    """``name=default`` as YAML writes it, with the values it accepts (:func:`fedsim.registry.accepted_values`)."""
    default = "required" if field.is_required() else yaml_text(field.get_default(call_default_factory=True))
    return f"{name}={default} ({accepted_values(field)})"


def describe(kind: str) -> str:
    lines = [f"{kind}:"]
    for entry in ALL_REGISTRIES[kind]:
        lines.append(f"  {entry.name:<16} {entry.summary}")
        if opts := _options(entry.obj):
            lines.append(f"  {'':<16}{opts}")
    return "\n".join(lines)
