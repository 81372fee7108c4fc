"""Every registry by kind, for ``fedsim list`` and for plugin authors."""

from __future__ import annotations

import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

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
    return "  options: " + ", ".join(describe_option(name, field) for name, field in params.model_fields.items())


def describe_option(name: str, field: FieldInfo) -> str:
    """``name=default`` as YAML writes it, with what the option accepts where it is bounded: its range, its
    choices, and the other kinds of value a union takes (a number, null)."""
    default = "required" if field.is_required() else _yaml(field.get_default(call_default_factory=True))
    bounds = {
        attribute: getattr(m, attribute)
        for attribute in BOUNDS
        for m in field.metadata
        if isinstance(getattr(m, attribute, None), int | float)
    }
    accepts = [" and ".join(f"{BOUNDS[a]} {_yaml(v)}" for a, v in bounds.items())] if bounds else []
    kinds = typing.get_args(field.annotation) if typing.get_origin(field.annotation) in UNIONS else (field.annotation,)
    choices = [_yaml(v) for kind in kinds if typing.get_origin(kind) is typing.Literal for v in typing.get_args(kind)]
    if choices:
        accepts.append("one of " + ", ".join(choices))
        accepts += ["or a number"] if any(kind in (int, float) for kind in kinds) else []  # FedYogi's v0
    accepts += ["or null"] if len(kinds) > 1 and type(None) in kinds else []
    return f"{name}={default}" + (f" ({', '.join(accepts)})" if accepts else "")


UNIONS = (typing.Union, types.UnionType)
BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}  # pydantic's Field bounds (annotated_types)


def _yaml(value: Any) -> str:
    """``value`` as it is written in a config file (null, true, 0.01, average)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()


def describe(kind: str) -> str:
    lines = [f"{kind}:"]
    for entry in ALL_REGISTRIES[kind]:
        lines.append(f"  {entry.name:<16} {entry.summary}")
        if opts := _options(entry.obj):
            lines.append(f"  {'':<16}{opts}")
    return "\n".join(lines)
