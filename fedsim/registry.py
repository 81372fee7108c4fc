"""One registry mechanism for every pluggable kind (strategies, partitioners, norms, models, datasets).

Lookup order: built-ins registered with :meth:`Registry.register`, then installed plugins
from the entry-point group ``fedsim.<kind>`` (loaded lazily, on first lookup of an unknown
name), then ``"package.module:Name"`` dotted paths written straight into a YAML file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from fedsim.errors import RegistryError

T = TypeVar("T")


def normalise_name(name: str) -> str:
    """Names are case- and dash-insensitive: ``FedAvg``, ``fed-avg`` and ``fedavg`` are one name."""
    return name.strip().lower().replace("-", "_")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    source: str  # "builtin", "entry point <dist>", or the dotted path: named in duplicate errors

    @property
    def summary(self) -> str:
        doc = getattr(self.obj, "__doc__", None) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


class Registry(Generic[T]):
    """A name -> object table for one kind of plugin."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.group = f"fedsim.{kind}"
        self._entries: dict[str, Entry[T]] = {}
        self._plugins_loaded = False
        self._plugin_names: set[str] = set()

    def register(self, name: str, source: str = "builtin") -> Callable[[T], T]:
        """Decorator: ``@NORMS.register("ln")``. A duplicate name raises, naming both sources."""

        def add(obj: T) -> T:
            self._add(name, obj, source)
            return obj

        return add

    def _add(self, name: str, obj: T, source: str) -> None:
        key = normalise_name(name)
        if key in self._entries:
            raise RegistryError(
                f"duplicate {self.kind} name {key!r}: registered by {self._entries[key].source} "
                f"and again by {source}"
            )
        self._entries[key] = Entry(key, obj, source)

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
            self._add(ep.name, obj, f"entry point {ep.value} ({dist})")
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

    def get(self, name: str) -> T:
        """The registered object for ``name`` or a ``package.module:Name`` path."""
        if ":" in name:
            return load_dotted(name, self.kind)
        key = normalise_name(name)
        if key not in self._entries:
            self._load_plugins()
        if key not in self._entries:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())} "
                f"(or 'package.module:Name' for your own)"
            )
        return self._entries[key].obj

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        if ":" in name:
            return True
        self._load_plugins()
        return normalise_name(name) in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        self._load_plugins()
        return iter(sorted(self._entries.values(), key=lambda e: e.name))


def load_dotted(path: str, kind: str) -> object:
    """Import ``package.module:Name`` (attribute paths like ``mod:Outer.Inner`` allowed)."""
    module_name, _, attr = path.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as err:
        raise RegistryError(f"{kind} {path!r}: cannot import module {module_name!r}: {err}") from err
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as err:
            raise RegistryError(f"{kind} {path!r}: module {module_name!r} has no {attr!r}") from err
    return obj
