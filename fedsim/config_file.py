"""Reading a run config: YAML as fedsim reads it, ``--set`` overrides, and every validation problem on one line.

The schemas are :mod:`fedsim.config`'s; this module turns a config file (or a run directory's ``config.yaml``, or
a mapping) into a validated :class:`~fedsim.config.RunConfig`, and its errors into one :class:`ConfigError` line
that names the field, what it got and what is allowed. Sweep files and run records read their YAML here too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from fedsim.config import READ_BACK, RunConfig
from fedsim.errors import ConfigError, brief, one_line
from fedsim.ownership import unusable
from fedsim.paths import package_path, resolve_path
from fedsim.reading import CONFIG_BYTES, check_source, read_text
from fedsim.registry import accepted_values, number_as_text

MAX_ALIAS_NODES = 10_000  # the values a document's aliases may expand to in all: a sweep's anchors stay far below
MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_DEPTH = 32  # how deep a YAML value (and a --set key) may nest: a config is a few levels deep


class _Refused(yaml.YAMLError):
    """Valid YAML that a config must not be (a key given twice, an alias bomb)."""


class _ConfigLoader(yaml.SafeLoader):
    """YAML as ``safe_load`` reads it, but a key given twice is an error (the second would silently replace
    the first, a whole section at the top level), and so are: aliases that expand to more than
    ``MAX_ALIAS_NODES`` nodes in all (a "billion laughs" document nests aliases to blow a few lines up
    into gigabytes; a sweep's anchors for repeated settings stay far below it), an alias inside the value
    it names (a value that contains itself), and nesting deeper than ``MAX_DEPTH`` (PyYAML's composer
    recurses, so a few hundred bytes of brackets would exhaust Python's stack)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.expanded = 0
        self.composing: list[yaml.Node | None] = []  # the parents of the node being composed, outermost first

    def compose_node(self, parent: Any, index: Any) -> Any:
        alias = self.check_event(yaml.AliasEvent)
        line = self.peek_event().start_mark.line + 1
        if len(self.composing) >= MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels at line {line}: a config is a few levels deep")
        self.composing.append(parent)
        try:
            node = super().compose_node(parent, index)
            if alias and any(node is outer for outer in self.composing):
                raise _Refused(f"the alias at line {line} is inside the value it names: a value cannot contain itself")
        finally:
            self.composing.pop()
        if alias:
            self.expanded += _size(node, {})
            if self.expanded > MAX_ALIAS_NODES:
                raise _Refused(
                    f"aliases (*name) expand to more than {MAX_ALIAS_NODES:,} values by line {line}: write the "
                    "values out"
                )
        return node


def _size(node: yaml.Node, seen: dict[int, int]) -> int:
    """How many nodes ``node`` stands for once every alias in it is expanded (shared subtrees counted once
    each, so a bomb is measured without being expanded)."""
    if id(node) not in seen:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        seen[id(node)] = 1 + sum(_size(child, seen) for child in children)
    return seen[id(node)]


def _mapping_without_duplicates(loader: _ConfigLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    _check_keys(loader, node)
    return loader.construct_mapping(node, deep)  # merge keys (``<<: *base``) merged: the mapping's own keys win


def _check_keys(loader: _ConfigLoader, node: yaml.MappingNode) -> None:
    """Refuse a key given twice in the mapping ``node`` or one that is not a name or a number; a merge key's
    mappings (``<<: *base``, ``<<: [*a, *b]``) may give keys the mapping gives again: that is what they are for."""
    seen: set[Any] = set()
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):  # `? [a, b]`: a key that is a list or a mapping
            raise _Refused(f"the key at line {key_node.start_mark.line + 1} is not a plain name or number")
        if key_node.tag == MERGE_TAG:
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for mapping in merged:  # its keys once each too (an anchored mapping was checked where it stands)
                if isinstance(mapping, yaml.MappingNode):
                    _check_keys(loader, mapping)
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise _Refused(f"key {brief(key)} is given twice (line {key_node.start_mark.line + 1}): give it once")
        seen.add(key)


_ConfigLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
# YAML 1.2's floats: PyYAML (YAML 1.1) reads 1e-3 and 1.0e6 (no dot, or no exponent sign) as text, which the
# strict number fields refuse; a researcher's ``lr: 1e-3`` is a number. Quoted '1e-3' stays text.
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_yaml(text: str, what: str) -> Any:
    """``text`` as YAML (duplicate keys, alias bombs, self-containing values, deep nesting and keys that
    are not names refused); errors name ``what`` it was."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
    except _Refused as err:
        raise ConfigError(f"{what}: {err}") from err
    except yaml.constructor.ConstructorError as err:  # YAML, but not plain values: a tag such as !!python/object
        where = f" at line {err.problem_mark.line + 1}" if err.problem_mark else ""
        raise ConfigError(
            f"{what}: {err.problem}{where}: a config holds plain YAML values (mappings, lists, text, numbers, "
            "true/false, null), anchors, aliases and << merges of mappings, no other tags"
        ) from err
    except yaml.YAMLError as err:
        problem = " ".join(str(err).split())
        raise ConfigError(f"{what}: not valid YAML ({problem[:300]}); quote a value that holds ': ' or braces") from err
    except ValueError as err:  # a scalar its tag cannot hold: `!!int 0x`, a 2001-13-45 date, 5,000 digits
        raise ConfigError(f"{what}: a value YAML cannot read ({str(err)[:200]}); quote it to give it as text") from err


def read_yaml(path: Path, what: str = "config file") -> Any:
    """A YAML file's content, read through :func:`fedsim.reading.read_text` (a regular UTF-8 file of at most
    ``CONFIG_BYTES``); anything else is an error naming it."""
    return parse_yaml(read_text(path, what, CONFIG_BYTES), str(path))


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    if len(parents) >= MAX_DEPTH:  # as deep as a YAML value may nest (parse_yaml)
        raise ConfigError(f"--set {brief(dotted)}: more than {MAX_DEPTH} levels of keys; a config is a few deep")
    for key in parents:
        child = node.setdefault(key, {})
        if isinstance(child, str):  # a plugin given by its name alone is {name: <it>}: set one of its options
            child = node[key] = {"name": child}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {key!r} is not a section")
        node = child
    node[leaf] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides; values are parsed as YAML (``5``, ``ln``, ``[1,2]``)."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
            raise ConfigError(f"--set {brief(item)}: expected key.path=value, e.g. train.rounds=5")
        value = parse_yaml(text, f"--set {key.strip()}")
        _set_dotted(raw, key.strip(), value)
    return raw


def keys_overlap(a: str, b: str) -> bool:
    """True when setting dotted keys ``a`` and ``b`` touch the same value (equal, or one inside the other)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def check_keys_once(overrides: list[str]) -> None:
    """Refuse a key given twice in one ``--set`` list (the last would win in silence, as a YAML key given twice
    would: refused too), naming it and both values, whether alone or inside a section's mapping given before
    (``strategy={name: moon, mu: 1} strategy.mu=2``); and a section given after a key inside it, whose value would
    drop that key in silence (``strategy.mu=2 strategy=fedrod``). A section, then keys inside it that it does not
    hold, refines it in order (``model.norm=gn model.norm.groups=4``)."""
    seen: dict[str, str] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            continue
        if key in seen:
            raise ConfigError(f"--set {key} is given twice ({brief(seen[key])}, then {brief(text)}): give it once")
        if (inner := next((k for k in seen if k.startswith(key + ".")), None)) is not None:
            raise ConfigError(
                f"--set {key}={brief(text)} replaces the section that holds --set {inner}, given before it, which "
                f"would be dropped in silence: give {key} first, then {inner}"
            )
        for outer in (k for k in seen if key.startswith(k + ".")):
            held: Any = parse_yaml(seen[outer], f"--set {outer}")
            for part in key.removeprefix(outer + ".").split("."):
                held = {"name": held} if isinstance(held, str) else held  # a plugin given by its name alone
                held = held.get(part, _ABSENT) if isinstance(held, dict) else _ABSENT
            if held is not _ABSENT:
                raise ConfigError(
                    f"--set {key} is given twice ({brief(held)} inside --set {outer}, then {brief(text)}): give it once"
                )
        seen[key] = text


_ABSENT = object()


def format_validation_error(err: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """Every problem of validating ``model`` on one line, each naming its field, what it got and what is allowed
    (for an unknown key, the valid keys of its section)."""
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {brief(value)})"
        msg, takes = e["msg"], ""
        if e["type"] == "value_error":  # fedsim's own validators: the message names its fields
            lines.append(str(e["ctx"]["error"]))
            continue
        if e["type"] == "extra_forbidden":
            msg = f"unknown key{shown}; valid keys: {', '.join(section_keys(model, e['loc'][:-1]))}"
            shown = ""
        elif e["type"] in ("model_type", "model_attributes_type", "dict_type"):  # not pydantic's class names
            keys = section_keys(model, e["loc"])
            msg = (
                "should be a plugin's name or a mapping {name: ..., <its options>} (fedsim list)"
                if keys == ["name"]
                else f"should be a mapping of its keys: {', '.join(keys)}"
            )
        elif e["type"].endswith(("_type", "_parsing")) and (field := field_at(model, e["loc"])) is not None:
            takes = f"; it takes {accepted_values(field)}"  # a value of the wrong kind: what the key takes
        lines.append(f"{where or '<config>'}: {msg}{shown}{number_as_text(e)}{takes}")
    return one_line(lines)


def section_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys of the section at ``loc`` (a pydantic error's location: keys and list indices) in ``model``."""
    kinds: list[Any] = [model]
    for key in loc:
        if isinstance(key, str):  # a list index keeps the list's type: its models are found inside it below
            kinds = [m.model_fields[key].annotation for m in _models(kinds) if key in m.model_fields]
    return [name for m in _models(kinds) for name in m.model_fields]


def field_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> FieldInfo | None:
    """The field at ``loc`` (a pydantic error's location: keys and list indices) in ``model``, where one model
    declares it."""
    owners: list[type[BaseModel]] = [model]
    field = None
    for key in loc:
        if not isinstance(key, str):  # a list index: the list's models, found inside its type below
            continue
        found = [o.model_fields[key] for o in owners if key in o.model_fields]
        if len(found) != 1:
            return None
        field = found[0]
        owners = _models([field.annotation])
    return field if loc and isinstance(loc[-1], str) else None


def _models(kinds: list[Any]) -> list[type[BaseModel]]:
    """The pydantic models in type annotations ``kinds``, however nested (``X | None``, ``list[X]``)."""
    found = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
    inner = [arg for k in kinds for arg in get_args(k)]
    return found + (_models(inner) if inner else [])


def _read_sections(path: Path, what: str, overrides: list[str] | None) -> dict[str, Any]:
    """The YAML file ``path`` (``what`` it is, for errors) as a mapping of sections, ``overrides`` applied."""
    raw = read_yaml(path, what) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return apply_overrides(raw, overrides or [])


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a config file, apply ``--set`` overrides and validate its sections; paths in it are made
    relative to the file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path}: a directory, not a YAML file")
    cfg = parse_config(_read_sections(path, "config file", overrides))
    for field, value in (("output.dir", cfg.output.dir), ("output.run_dir", cfg.output.run_dir)):
        if value and (error := unusable(Path(value), field)):
            raise error  # a file, a symlink loop: said before any work
    if cfg.data.root:
        cfg.data.root = resolve_path(cfg.data.root, path.parent)
        check_source(package_path(cfg.data.root), "data.root")  # a FIFO or a device would hang or never end
    if cfg.deploy.certificates is not None:
        certs = cfg.deploy.certificates
        certs.ca, certs.cert, certs.key = (resolve_path(p, path.parent) for p in (certs.ca, certs.cert, certs.key))
        for field, file in (("ca", certs.ca), ("cert", certs.cert), ("key", certs.key)):
            if not Path(file).is_file():
                raise ConfigError(f"deploy.certificates.{field}: no file at {file} (PEM; relative to the config file)")
    return cfg


def read_run_config(path: Path, overrides: list[str] | None = None, read_back: bool = False) -> RunConfig:
    """A run directory's ``config.yaml``, with ``overrides``: an error names the file, which its reader did not
    write (a run directory of another fedsim version's layout, or edited) and could not tell from the message.
    ``read_back``: read only, not to run here (:data:`fedsim.config.READ_BACK`)."""
    raw = _read_sections(path, "the run's config.yaml", overrides)
    try:
        return parse_config(raw, read_back)
    except ConfigError as err:
        raise ConfigError(f"{path}{' with --set' if overrides else ''}: {err}") from err


def parse_config(raw: dict[str, Any], read_back: bool = False) -> RunConfig:
    """Validate a config mapping's sections (plugin options: :func:`fedsim.experiment.resolve.resolve`); ``read_back``:
    a run directory's, read only (:data:`fedsim.config.READ_BACK`)."""
    try:
        return RunConfig.model_validate(raw, context={READ_BACK: read_back})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, RunConfig)) from err
