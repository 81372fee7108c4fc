"""``fedsim list``'s text (fedsim/app/plugins.py): every registry by kind, and :func:`describe`'s table of one kind,
each plugin on a line of its own (its registered name in a column 16 wide, the first paragraph of its docstring) and
its options with their defaults on the next, as YAML writes them, each with the range, choices or null it accepts. The
exact layout on a registry of this file's own; the built-in kinds read back here, each default parsed from the text as
the YAML value it is and compared with its ``Params``' own, and each range with its field's."""

from __future__ import annotations

import re
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, Field
from pydantic_core import to_jsonable_python

from fedsim.app import plugins
from fedsim.app.plugins import ALL_REGISTRIES, describe
from fedsim.data import DATASETS
from fedsim.models import MODELS
from fedsim.norms import NORMS
from fedsim.partitions import PARTITIONERS
from fedsim.registry import BOUNDS, PluginParams, Registry, yaml_text
from fedsim.strategies import STRATEGIES
from fedsim.trackers import TRACKERS


class Widget:
    class Params(PluginParams):
        pass

    def __init__(self, params: PluginParams) -> None:
        self.params = params


class Plain(Widget):
    """A plain widget: no options.

    The rest of the docstring is no part of the summary."""


class Sized(Widget):
    """Sized: options with defaults of every kind,
    its summary wrapped in the source."""

    class Params(PluginParams):
        size: float = Field(1.5, gt=0, le=10)
        label: str = "w"
        ratio: float  # required: no default
        shape: tuple[int, int] = (2, 3)
        tags: list[str] = Field(default_factory=lambda: ["a", "b"])
        limit: int | None = Field(None, ge=1)
        mode: Literal["fast", "exact"] | float = "fast"


class Undocumented(Widget):
    pass


@pytest.fixture
def widgets(monkeypatch: pytest.MonkeyPatch) -> Registry[Widget]:
    """A kind ``widgets`` among ALL_REGISTRIES for the test, registered out of name order."""
    registry: Registry[Widget] = Registry("widgets", Widget)
    registry.register("Sized")(Sized)
    registry.register("undocumented")(Undocumented)
    registry.register("plain")(Plain)
    registry.register("A-Very-Long-Widget-Name")(Plain)
    monkeypatch.setitem(ALL_REGISTRIES, "widgets", registry)
    return registry


def test_every_kind_is_its_own_registry_in_the_order_fedsim_list_prints_them() -> None:
    assert list(ALL_REGISTRIES) == ["strategies", "norms", "models", "datasets", "partitions", "trackers"]
    expected = [STRATEGIES, NORMS, MODELS, DATASETS, PARTITIONERS, TRACKERS]
    assert all(ALL_REGISTRIES[kind] is registry for kind, registry in zip(ALL_REGISTRIES, expected, strict=True))
    assert all(registry.kind == kind for kind, registry in ALL_REGISTRIES.items())


OPTIONS = (  # as YAML writes each default, with the range, choices or null it accepts
    "options: size=1.5 (a number > 0 and <= 10), label=w (text), ratio=required (a number), shape=[2, 3] (a list), "
    "tags=[a, b] (a list), limit=null (an integer >= 1, or null), mode=fast (one of fast, exact, or a number)"
)


def test_a_kind_is_one_line_per_plugin_by_name_with_its_options_and_their_defaults_below(
    widgets: Registry[Widget],
) -> None:
    # names from column 2 in a column of 16, then one space and the summary (column 19); options from column 20
    assert describe("widgets").split("\n") == [
        "widgets:",
        "  a_very_long_widget_name A plain widget: no options.",  # wider than the column: one space still
        "  plain" + " " * 12 + "A plain widget: no options.",
        "  sized" + " " * 12 + "Sized: options with defaults of every kind, its summary wrapped in the source.",
        " " * 20 + OPTIONS,
        "  undocumented" + " " * 5,  # no docstring: an empty summary, and no options line (Params has no fields)
    ]


def test_a_default_factory_is_shown_by_the_value_it_makes_afresh(widgets: Registry[Widget]) -> None:
    made: list[int] = []

    class Counted(Widget):
        """Counted."""

        class Params(PluginParams):
            n: list[int] = Field(default_factory=lambda: made.append(1) or [len(made)])

    widgets.register("counted")(Counted)
    assert " " * 20 + "options: n=[1] (a list)" in describe("widgets").split("\n")
    assert " " * 20 + "options: n=[2] (a list)" in describe("widgets").split("\n")  # made each time, not kept


@pytest.mark.parametrize("obj", [object, type("NoPydantic", (), {"Params": dict}), type("Bare", (), {})])
def test_an_object_without_pydantic_params_has_no_options_line(obj: Any) -> None:
    assert plugins._options(obj) == ""


def test_a_kind_that_is_not_listed_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="planets"):  # the CLI refuses an unknown kind before it asks
        describe("planets")


REQUIRED = object()


def parse_options(text: str) -> dict[str, tuple[Any, str]]:
    """``a=1 (> 0), b=x, c=[1, 2] (or null)`` as each option's YAML value and what it accepts (the parenthesis)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if depth == 0 and text.startswith(", ", i):
            parts.append(text[start:i])
            start = i + 2
    values = {}
    for part in [*parts, text[start:]]:
        name, _, rest = part.partition("=")
        value, _, accepts = rest.partition(" (")
        values[name] = (REQUIRED if value == "required" else yaml.safe_load(value), accepts.removesuffix(")"))
    return values


@pytest.mark.parametrize("kind", list(ALL_REGISTRIES))
def test_every_built_in_kind_reads_back_as_its_plugins_summaries_and_defaults(kind: str) -> None:
    registry = ALL_REGISTRIES[kind]
    header, *lines = describe(kind).split("\n")
    assert header == f"{kind}:"
    listed: dict[str, tuple[str, dict[str, Any]]] = {}
    for line in lines:
        if options := re.fullmatch(r" {20}options: (.+)", line):
            name = list(listed)[-1]  # the options of the plugin on the line above
            assert listed[name][1] == {}, line
            listed[name] = (listed[name][0], parse_options(options.group(1)))
        else:
            entry = re.fullmatch(r"  (\S+) +(.*)", line)
            assert entry is not None and len(entry.group(0)) - len(entry.group(2)) >= 19, line
            listed[entry.group(1)] = (entry.group(2), {})
    assert list(listed) == registry.names()
    for name, (summary, options) in listed.items():
        cls = registry.get(name)
        doc = (cls.__doc__ or "").strip()
        assert summary == " ".join(doc.split("\n\n")[0].split()), name
        params: type[BaseModel] = cls.Params  # type: ignore[attr-defined]
        defaults = params.model_construct()  # the defaults without validation, factories called
        fields = params.model_fields
        jsonable = {f: to_jsonable_python(getattr(defaults, f)) for f in fields}  # as YAML writes them
        expected = {f: REQUIRED if info.is_required() else jsonable[f] for f, info in fields.items()}
        assert {f: value for f, (value, _) in options.items()} == expected, name
        assert list(options) == list(fields), name  # in the order Params declares them
        for f, (_, accepts) in options.items():  # each bound the field has, as the text says it
            for bound in fields[f].metadata:
                for attribute, sign in BOUNDS.items():
                    if isinstance(value := getattr(bound, attribute, None), int | float):
                        assert f"{sign} {yaml_text(value)}" in accepts, f
