"""What a name a user gives fedsim may be: text without control characters, a directory name, a host.

One rule each, used wherever such a name comes in (the run config, a sweep file, ``fedsim compose``'s
options): a control character (a newline, a tab, ESC, NUL) in a name, a path or an address is never
meant, and it makes the run directory fedsim prints span lines or a terminal obey it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import TypeVar

from pydantic_core import PydanticCustomError

from fedsim.errors import ConfigError, brief

T = TypeVar("T")
MAX_NAME = 200  # a directory name, with room for the suffixes fedsim adds (the run's start time)
# C0 and C1 controls, DEL, and Unicode's line and paragraph separators: what moves a terminal's cursor or
# breaks a line
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# a DNS label (RFC 1123, and '_', which Docker's service names may hold): no leading or trailing '-'
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
MAX_HOST = 253


def control_character(value: object) -> tuple[str, str] | None:
    """The first text in ``value`` (a string, or a key or value anywhere in its lists and mappings) that holds
    a control character, and that character; None if there is none."""
    if isinstance(value, str):
        found = CONTROL.search(value)
        return (value, found.group()) if found else None
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    if isinstance(items, list | tuple):
        return next((hit for item in items if (hit := control_character(item)) is not None), None)
    return None


def printable(value: T) -> T:
    """A pydantic validator: ``value`` as it is, or an error (the field's name goes before it) quoting the text
    in it that holds a control character."""
    if (hit := control_character(value)) is not None:
        text, char = hit
        where = "" if text is value else f"{brief(text)} "
        raise PydanticCustomError(
            "control_character",
            "{where}holds the control character {char}: names, paths and addresses are printed on one line; remove it",
            {"where": where, "char": repr(char)},
        )
    return value


def is_name(name: str) -> bool:
    """True if ``name`` is one directory name: never a path, never '.' or '..', no control character, at most
    ``MAX_NAME`` characters."""
    return (
        bool(name.strip())
        and name not in (".", "..")
        and not set(name) & set("/\\")
        and CONTROL.search(name) is None
        and len(name) <= MAX_NAME
    )


NAME_RULE = f"1 to {MAX_NAME} characters without '/', '\\' or control characters, not '.' or '..'"


def check_host(host: str, what: str) -> str:
    """``host`` if it is an IP address or a DNS name (dot-separated labels of letters, digits, '-' and '_');
    else an error naming ``what`` (the option) and the allowed forms."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    # digits and dots only is an IPv4 address or nothing: 999.1.1.1 is no address, and resolvers (inet_aton) read
    # such a name as one rather than look it up; no top-level domain is all digits (RFC 3696, section 2)
    numeric = all(label.isdigit() for label in labels)
    if not numeric and len(host) <= MAX_HOST and all(_LABEL.fullmatch(label) for label in labels):
        return host
    raise ConfigError(
        f"{what} {brief(host)}: give a DNS name (dot-separated labels of 1 to 63 letters, digits, '-' or '_', "
        f"none starting or ending with '-', not digits and dots only; at most {MAX_HOST} characters) or an IP "
        "address, e.g. superlink, server.example.org, 10.0.0.5"
    )
