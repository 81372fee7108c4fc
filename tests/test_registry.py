"""The one registry mechanism (fedsim/registry.py), on a kind of its own: names, duplicates, dotted paths, the
Params contract and option validation naming the field. Installed plugins (entry points): tests/test_plugin_guard.py
and tests/plugins/; each built-in kind's registry rows: tests/test_option_ranges.py."""

from __future__ import annotations

import pytest
from pydantic import Field

from fedsim.errors import ConfigError, RegistryError
from fedsim.registry import PluginParams, Registry


class Widget:
    class Params(PluginParams):
        size: float = Field(1.0, gt=0)
        label: str = "w"

    def __init__(self, params: Params, scale: int = 1) -> None:
        self.params, self.scale = params, scale


class Gadget(Widget):
    """A gadget: the first line is its summary."""


class Broken(Widget):
    def __init__(self, params: Widget.Params) -> None:
        raise ValueError("size must suit the model")


class Stock:
    """Not a Widget, but something the kind knows how to adapt."""


def widgets() -> Registry[Widget]:
    registry: Registry[Widget] = Registry("widgets", Widget, adapt=lambda obj: Gadget if obj is Stock else None)
    registry.register("Fed-Gadget")(Gadget)
    registry.register("broken")(Broken)
    return registry


def test_names_are_case_and_dash_insensitive_and_listed() -> None:
    registry = widgets()
    assert registry.get("fed_gadget") is registry.get("FED-GADGET") is Gadget
    assert "fed-gadget" in registry and "nothing" not in registry
    assert registry.names() == ["broken", "fed_gadget"]
    assert [e.summary for e in registry.builtins()] == ["", "A gadget: the first line is its summary."]
    assert registry.name_of(Gadget) == "fed_gadget" and registry.name_of(Widget) == f"{__name__}:Widget"


def test_an_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(RegistryError) as err:
        widgets().get("gizmo")
    assert "'gizmo'" in str(err.value) and "broken, fed_gadget" in str(err.value)  # the wording: the corpus


def test_a_name_registered_twice_names_both_sources() -> None:
    registry = widgets()
    with pytest.raises(RegistryError) as err:
        registry.register("fed_gadget", source="x")(Widget)
    assert "'fed_gadget'" in str(err.value) and "builtin" in str(err.value) and str(err.value).endswith(" x")


def test_a_class_must_be_the_kinds_and_carry_pydantic_params() -> None:
    registry = widgets()

    class NoParams(Widget):
        Params = dict  # type: ignore[assignment]

    with pytest.raises(RegistryError, match=r"'np'.*NoParams.*Params"):
        registry.register("np")(NoParams)
    with pytest.raises(RegistryError, match=r"'str'.*tests\.test_registry\.Widget"):  # the kind it must be
        registry.register("str")(str)  # type: ignore[arg-type]
    registry.register("stock")(Stock)  # type: ignore[arg-type]  # adapted
    assert registry.get("stock") is Gadget


def test_a_dotted_path_names_a_class_of_ones_own() -> None:
    registry = widgets()
    assert registry.get(f"{__name__}:Widget") is Widget
    assert registry.get(f"{__name__}:Gadget") is Gadget


@pytest.mark.parametrize(
    ("path", "said"),
    [
        (":Widget", "write a dotted path as 'package.module:Name'"),
        (".rel:Widget", "write a dotted path as 'package.module:Name'"),
        ("a:b:c", "write a dotted path as 'package.module:Name'"),
        ("no_such_module_here:X", "cannot import module 'no_such_module_here'"),
        (f"{__name__}:Nothing", f"module '{__name__}' has no 'Nothing'"),
    ],
)
def test_a_bad_dotted_path_says_what_is_wrong(path: str, said: str) -> None:
    with pytest.raises(RegistryError) as err:
        widgets().get(path)
    assert str(err.value).startswith(f"widgets '{path}': {said}")


def test_resolve_validates_options_naming_the_yaml_field() -> None:
    registry = widgets()
    resolved = registry.resolve("fed-gadget", {"size": 2}, "model.widget")
    assert resolved.params == Gadget.Params(size=2.0) and resolved.create(3).scale == 3
    with pytest.raises(ConfigError) as err:
        registry.resolve("fed_gadget", {"sise": 2}, "model.widget")
    assert str(err.value).startswith("model.widget.sise: ") and str(err.value).endswith("size, label")  # the keys
    with pytest.raises(ConfigError, match=r"^model\.widget\.size = '0\.1' "):
        registry.resolve("fed_gadget", {"size": "0.1"}, "model.widget")
    with pytest.raises(ConfigError, match=r"model\.widget\.size = True"):  # a boolean is never a number
        registry.resolve("fed_gadget", {"size": True}, "model.widget")
    with pytest.raises(ConfigError, match=r"model\.widget\.size = 1e\+39 .*float32"):
        registry.resolve("fed_gadget", {"size": 1e39}, "model.widget")
    with pytest.raises(ConfigError, match=r"^model\.widget\.name: unknown widgets 'gizmo'"):
        registry.resolve("gizmo", {}, "model.widget")
    # (reachable from Python only: a YAML plugin block's options are a mapping by its schema)
    with pytest.raises(ConfigError, match=r"^model\.widget for widget 'fed_gadget': options must be a mapping"):
        registry.resolve("fed_gadget", [1], "model.widget")  # type: ignore[arg-type]


def test_a_plugin_that_raises_when_built_is_named_not_a_traceback() -> None:
    resolved = widgets().resolve("broken", None, "model.widget")
    with pytest.raises(ConfigError, match=r"^model\.widget: 'broken' .*ValueError.*size must suit"):
        resolved.create()
