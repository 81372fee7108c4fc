"""One plugin contract and one registry mechanism for every pluggable kind.

**The contract.** A plugin (a strategy, a normaliser, a model, a dataset, a partitioner) is a class
that declares its YAML options once, in a nested pydantic ``Params`` model (unknown keys are
errors, defaults live there and nowhere else), and is constructed with the validated params as its
first argument: ``cls(params, ...)``, where a kind may add arguments of its own (a model takes the
number of classes, the input shape and the normaliser). In YAML every plugin is written one way,
``{name: <registered name or package.module:Class>, <options>}``, or just its name.

**The registry.** One :class:`Registry` per kind: built-ins registered with :meth:`Registry.register`,
then installed plugins from the entry-point group ``fedsim.<kind>`` (loaded lazily, on first lookup of
an unknown name), then ``"package.module:Name"`` dotted paths written straight into a YAML file. The
registry owns option validation (:meth:`Registry.params`): it is the only place options are checked,
and every error names the config field and what is allowed.
"""

from __future__ import annotations

import importlib
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, PydanticSerializationError, to_json, to_jsonable_python

from fedsim.errors import ConfigError, FedsimError, RegistryError, brief, one_line
from fedsim.plugin_guard import note_plugin

T = TypeVar("T")
P = TypeVar("P", bound=BaseModel)


# float32's largest finite number (torch.finfo(torch.float32).max), without importing torch here: fedsim trains in
# float32, so a float option finite in Python's float64 but beyond this (train.lr=1e308, FedProx's mu, a norm's
# sigma) is inf in the first tensor it reaches, and the run fails in round 1 or trains nothing
FLOAT32_MAX = 3.4028234663852886e38
# and its smallest normal number (torch.finfo(torch.float32).tiny): a nonzero option smaller than this is 0 in float32
# or a denormal, which many CPUs flush to 0 (FedAdam's tau: 1e-50 divided by 0 in round 1; a norm's eps: 1e-50, an
# lr of 1e-50 ran to exit 0 as if they were 0)
FLOAT32_TINY = 1.1754943508222875e-38


def all_floats(value: Any, test: Callable[[float], bool]) -> bool:
    """``test`` holds for ``value`` if it is a float, and for every float in it if it is a list or mapping."""
    if isinstance(value, float):
        return test(value)
    if isinstance(value, dict):
        return all(all_floats(v, test) for v in value.values())
    if isinstance(value, list | tuple):
        return all(all_floats(v, test) for v in value)
    return True


def _within_float32(x: float) -> bool:
    return x == 0 or FLOAT32_TINY <= abs(x) <= FLOAT32_MAX


class Float32Options(BaseModel):
    """Base of the models of options (the config's sections, every plugin's ``Params``): a float option, and
    every float in a list or mapping option, is 0 or a normal float32 number, refused naming the field otherwise."""

    @field_validator("*")
    @classmethod
    def _float32_range(cls, value: Any) -> Any:
        if not all_floats(value, _within_float32):
            raise PydanticCustomError(
                "float32_range",
                "Input should be 0 or a float32 number of magnitude {tiny} to {max}: fedsim trains in float32",
                {"max": f"{FLOAT32_MAX:.2g}", "tiny": f"{FLOAT32_TINY:.2g}"},
            )
        return value


class PluginParams(Float32Options):
    """Base of every plugin's ``Params``: unknown keys are errors, floats are finite in float32; validated params
    never change."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def normalise_name(name: str) -> str:
    """Names are case-insensitive and a dash is an underscore: ``FedAvg`` and ``fedavg`` are one name, as are
    ``affine-like`` and ``affine_like`` (``fed-avg`` is ``fed_avg``, not ``fedavg``)."""
    return name.strip().lower().replace("-", "_")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: type[T]
    source: str  # "builtin", "entry point <dist>", or the dotted path: named in duplicate errors

    @property
    def summary(self) -> str:
        """The docstring's first paragraph, on one line (a sentence wrapped in the source stays whole)."""
        return " ".join((self.obj.__doc__ or "").strip().split("\n\n")[0].split())


@dataclass(frozen=True)
class Resolved(Generic[T]):
    """A plugin looked up and its options validated: ``create(*args)`` builds it."""

    name: str  # as written in the config
    cls: type[T]
    params: BaseModel
    where: str = ""  # the YAML block that names it, for messages

    def create(self, *args: Any) -> T:
        try:
            return self.cls(self.params, *args)  # type: ignore[call-arg]
        except FedsimError:
            raise
        except Exception as err:  # a plugin's own bug or refusal: say whose, not a traceback
            raise ConfigError(f"{self.where}: {self.name!r} raised {type(err).__name__} when built: {err}") from err


class Registry(Generic[T]):
    """A name -> plugin class table for one kind, whose classes derive from ``base``.

    ``adapt`` may turn an object a dotted path names that is not a ``base`` subclass into one (a
    stock Flower strategy into a fedsim strategy); it returns None for objects it does not know.
    ``check(name, cls, registered)`` refuses a class whose declarations the kind does not accept (a
    strategy's protocol keys) by raising :class:`~fedsim.errors.RegistryError`; every class is checked
    whichever way it comes in (built-in, entry point or dotted path), against the entries registered so far.
    """

    def __init__(
        self,
        kind: str,
        base: type[T],
        adapt: Callable[[object], type[T] | None] | None = None,
        check: Callable[[str, type[T], list[Entry[T]]], None] | None = None,
    ) -> None:
        self.kind = kind
        self.base = base
        self.group = f"fedsim.{kind}"
        self._adapt = adapt
        self._check = check
        self._entries: dict[str, Entry[T]] = {}
        self._plugins_loaded = False
        self._plugin_names: set[str] = set()

    def register(self, name: str, source: str = "builtin") -> Callable[[type[T]], type[T]]:
        """Class decorator: ``@NORMS.register("ln")``. A duplicate name raises, naming both sources."""

        def add(cls: type[T]) -> type[T]:
            self._add(name, self._checked(cls, name), source)
            return cls

        return add

    def _checked(self, obj: object, name: str) -> type[T]:
        if isinstance(obj, type) and issubclass(obj, self.base):
            params = getattr(obj, "Params", None)
            if not (isinstance(params, type) and issubclass(params, BaseModel)):
                raise RegistryError(f"{self.kind} {name!r}: {obj.__qualname__} has no pydantic Params class")
            cls = obj
        else:
            adapted = self._adapt(obj) if self._adapt is not None else None
            if adapted is None:
                package = self.base.__module__.removesuffix(".base")  # where plugin authors import the base from
                raise RegistryError(
                    f"{self.kind} {name!r} is {obj!r}, not a {package}.{self.base.__qualname__} subclass"
                )
            cls = adapted
        if self._check is not None:
            self._check(name, cls, list(self._entries.values()))
        return cls

    def _add(self, name: str, cls: type[T], source: str) -> None:
        key = normalise_name(name)
        if key in self._entries:
            raise RegistryError(
                f"duplicate {self.kind} name {key!r}: registered by {self._entries[key].source} and again by {source}"
            )
        self._entries[key] = Entry(key, cls, source)

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=self.group):
            dist = ep.dist.name if ep.dist is not None else "unknown distribution"
            try:
                obj = ep.load()
            except Exception as err:  # a broken plugin must name itself, whatever it raised
                raise RegistryError(
                    f"{self.kind} plugin {ep.name!r} ({ep.value}, from {dist}) failed to load: {err}"
                ) from err
            self._add(ep.name, self._checked(obj, ep.name), f"entry point {ep.value} ({dist})")
            self._plugin_names.add(normalise_name(ep.name))

    def reset_plugins(self) -> None:
        """Forget the loaded entry points; the next unknown name reads them again.

        For a process whose installed distributions changed (a test, a notebook after
        ``pip install``); built-ins and their registrations are kept.
        """
        for name in self._plugin_names:
            self._entries.pop(name, None)
        self._plugin_names.clear()
        self._plugins_loaded = False

    def get(self, name: str) -> type[T]:
        """The plugin class for a registered name, an entry point or a ``package.module:Name`` path."""
        if ":" in name:
            return self._checked(load_dotted(name, self.kind), name)
        key = normalise_name(name)
        if key not in self._entries:
            self._load_plugins()
        if key not in self._entries:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())} "
                f"(or 'package.module:Name' for your own)"
            )
        return self._entries[key].obj

    def name_of(self, cls: type) -> str:
        """The registered name of ``cls`` (for messages), else the ``module:Class`` path a YAML file would use."""
        for entry in self._entries.values():
            if entry.obj is cls:
                return entry.name
        return f"{cls.__module__}:{cls.__qualname__}"

    def resolve(self, name: str, options: Mapping[str, Any] | None, where: str) -> Resolved[T]:
        """Look ``name`` up and validate ``options`` against its ``Params``; errors name ``where`` (the
        YAML block, e.g. ``model.norm``)."""
        try:
            cls = self.get(name)
        except RegistryError as err:
            raise ConfigError(f"{where}.name: {err}") from err
        one = self.kind[:-3] + "y" if self.kind.endswith("ies") else self.kind.removesuffix("s")  # strategies
        owner = f"{one} {name!r}"
        params = validate_options(cls.Params, options, where, owner)  # type: ignore[attr-defined]
        note_plugin(cls.__module__, f"{where} {name!r}")  # who a sys.exit / os._exit in that module is
        return Resolved(name, cls, params, where)

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        if ":" in name:
            return True
        self._load_plugins()
        return normalise_name(name) in self._entries

    def builtins(self) -> list[Entry[T]]:
        """The entries fedsim registers itself, by name, without loading installed plugins."""
        return sorted((e for e in self._entries.values() if e.source == "builtin"), key=lambda e: e.name)

    def __iter__(self) -> Iterator[Entry[T]]:
        self._load_plugins()
        return iter(sorted(self._entries.values(), key=lambda e: e.name))


def validate_options(params_cls: type[P], options: Mapping[str, Any] | None, where: str, owner: str = "") -> P:
    """Validate a plugin's YAML options against its ``Params`` model.

    ``where`` is the YAML block (``model.norm``), ``owner`` what the options belong to (``norm 'gn'``);
    every error names ``where.<field>``, and an unknown key lists the valid ones.
    """
    owner = f" for {owner}" if owner else ""
    if options is None:
        options = {}
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ConfigError(f"{where}{owner}: options must be a mapping with string keys, got {brief(options)}")
    try:
        # Validated as the JSON they are (YAML scalars, lists, mappings) in pydantic's strict mode, for every
        # plugin alike, its Params' own config aside: a boolean or a string is never a number (``true`` is not
        # 1, ``'0.1'`` not 0.1), while an int still is a float and a list still a tuple.
        return params_cls.model_validate_json(to_json(dict(options)), strict=True)
    except PydanticSerializationError as err:
        raise ConfigError(
            f"{where}{owner}: options must be YAML values (numbers, text, lists, mappings): {err}"
        ) from err
    except ValidationError as err:
        problems = []
        for e in err.errors():
            field = ".".join(str(p) for p in (where, *e["loc"]))
            if e["type"] == "extra_forbidden":
                valid = ", ".join(params_cls.model_fields) or "(none)"
                problems.append(f"{field}: unknown key{owner}; valid keys: {valid}")
            elif e["type"] == "value_error" and not e["loc"]:  # a Params validator across fields
                problems.append(f"{where}{owner}: {e['ctx']['error']}")
            elif e["type"] == "value_error":  # a field validator's ValueError: its text alone
                msg = e["msg"].removeprefix("Value error, ")
                problems.append(f"{field} = {brief(e['input'])}{owner}: {msg}")
            else:  # pydantic's own words; for a value of the wrong kind, what the option takes
                name = e["loc"][0] if e["loc"] else None
                wrong_kind = e["type"].endswith(("_type", "_parsing")) and name in params_cls.model_fields
                takes = f"; it takes {accepted_values(params_cls.model_fields[name])}" if wrong_kind else ""
                problems.append(f"{field} = {brief(e['input'])}{owner}: {e['msg']}{number_as_text(e)}{takes}")
        raise ConfigError(one_line(problems)) from err


UNIONS = (typing.Union, types.UnionType)
BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}  # pydantic's Field bounds (annotated_types)
KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "text"}


def accepted_values(field: FieldInfo) -> str:
    """What an option takes, as a config writes it: its kind and range (``a number > 0``, ``an integer >= 2 and
    <= 65536``), its choices (``one of average, last``), ``or null``: for ``fedsim list`` and type errors alike."""
    kinds = typing.get_args(field.annotation) if typing.get_origin(field.annotation) in UNIONS else (field.annotation,)
    choices = [
        yaml_text(v) for kind in kinds if typing.get_origin(kind) is typing.Literal for v in typing.get_args(kind)
    ]
    named = [KINDS.get(kind, "a list" if typing.get_origin(kind) in (list, tuple) else "a value") for kind in kinds
             if typing.get_origin(kind) is not typing.Literal and kind is not type(None)]  # fmt: skip
    bounds = " and ".join(
        f"{sign} {yaml_text(getattr(m, attribute))}"
        for attribute, sign in BOUNDS.items()
        for m in field.metadata
        if isinstance(getattr(m, attribute, None), int | float)
    )
    parts = ["one of " + ", ".join(choices)] if choices else []
    parts += [f"{kind} {bounds}".strip() for kind in dict.fromkeys(named)]
    parts += ["null"] if type(None) in kinds else []
    return ", or ".join(parts)


def yaml_text(value: Any) -> str:
    """``value`` as a config file writes it (null, true, 0.01, average, [2, 3])."""
    return (
        yaml.safe_dump(to_jsonable_python(value), default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()
    )


def number_as_text(error: Mapping[str, Any]) -> str:
    """A hint for a pydantic ``error`` whose input is text that reads as a number where a number belongs: a quoted
    number (fedsim's YAML reader takes ``1e-3`` unquoted as a number, as YAML 1.2 does: fedsim.config_file)."""
    value = error.get("input")
    if error["type"] not in ("int_type", "float_type") or not isinstance(value, str):
        return ""
    try:
        float(value)
    except ValueError:
        return ""
    return "; that is text, not a number: write numbers unquoted"


def load_dotted(path: str, kind: str) -> object:
    """Import ``package.module:Name`` (attribute paths like ``mod:Outer.Inner`` allowed)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr or module_name.startswith(".") or ":" in attr:
        raise RegistryError(f"{kind} {path!r}: write a dotted path as 'package.module:Name' (absolute, one ':')")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as err:
        raise RegistryError(f"{kind} {path!r}: cannot import module {module_name!r}: {err}") from err
    except Exception as err:  # the user's module raised while importing: say where, not a traceback
        raise RegistryError(f"{kind} {path!r}: importing {module_name!r} raised {type(err).__name__}: {err}") from err
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as err:
            raise RegistryError(f"{kind} {path!r}: module {module_name!r} has no {attr!r}") from err
    return obj
