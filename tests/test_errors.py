"""fedsim's error hierarchy and the two helpers every message uses (fedsim/errors.py): a value quoted briefly, several
problems as one line."""

from __future__ import annotations

import pytest

from fedsim import errors
from fedsim.errors import FedsimError, brief, one_line


def test_brief_quotes_short_values_whole_and_long_ones_with_both_ends() -> None:
    assert brief("lr") == "'lr'" and brief([1, 2]) == "[1, 2]"
    long = brief("x" * 500)
    assert len(long) == 80 and long.startswith("'xxx") and long.endswith("...x'")
    assert len(brief(list(range(1000)), limit=20)) == 20


def test_brief_never_fails_on_a_value_without_a_printable_form() -> None:
    class Unprintable:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert brief(Unprintable()) == "<Unprintable without a printable form>"
    assert brief(10**5000) == "<int without a printable form>"  # more digits than Python prints


def test_several_problems_are_one_numbered_line() -> None:
    assert one_line(["a"]) == "a"
    assert one_line(["x: unknown key; valid keys: a, b", "y: too big"]) == (
        "2 errors: (1) x: unknown key; valid keys: a, b; (2) y: too big"
    )


@pytest.mark.parametrize(
    "name",
    ["ConfigError", "RegistryError", "DataError", "EnvironmentFault", "TrainingError", "ClusterLost", "PluginExit",
     "ProtocolError", "LinkError", "WriteError", "ChildExit"],  # fmt: skip
)
def test_every_error_fedsim_raises_on_purpose_is_a_fedsim_error(name: str) -> None:
    # the CLI says a FedsimError in one line; anything else is a bug, with its traceback
    assert issubclass(getattr(errors, name), FedsimError)


def test_errors_that_carry_facts_keep_them() -> None:
    err = errors.WriteError("cannot write x: No space left on device", "/runs/x", "No space left on device")
    assert (str(err), err.path, err.strerror) == ("cannot write x: No space left on device", "/runs/x",
                                                  "No space left on device")  # fmt: skip
    child = errors.ChildExit(3)
    assert (child.code, str(child)) == (3, "exit status 3")
    assert issubclass(errors.ClusterLost, errors.TrainingError)  # a lost cluster stops training as divergence does
