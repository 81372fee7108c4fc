"""What a name a user gives fedsim may be: text without control characters, a directory name, a host.

One rule each, used wherever such a name comes in (the run config, a sweep file, ``fedsim compose``'s
options): a control character (a newline, a tab, ESC, NUL) in a name, a path or an address is never
meant, and it makes the run directory fedsim prints span lines or a terminal obey it. Nor is a lone
surrogate ('\\udcff': what Python makes of bytes that are not UTF-8, in a file name or an argument), which
no UTF-8 file (config.yaml, metrics.jsonl) can hold.
"""

from __future__ import annotations

import hashlib
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
# UTF-16's surrogate halves: never a character on their own, and a str holds no pairs (a pair is one code point)
SURROGATE = re.compile("[\ud800-\udfff]")
# a DNS label (RFC 1123, and '_', which Docker's service names may hold): no leading or trailing '-'
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
MAX_HOST = 253


def control_character(value: object) -> tuple[str, str] | None:
    """The first text in ``value`` (a string, or a key or value anywhere in its lists and mappings) that holds
    a control character or a lone surrogate, and that character; None if there is none."""
    if isinstance(value, str):
        found = CONTROL.search(value) or SURROGATE.search(value)
        return (value, found.group()) if found else None
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    if isinstance(items, list | tuple):
        return next((hit for item in items if (hit := control_character(item)) is not None), None)
    return None


def unprintable(char: str) -> str:
    """Why ``char`` (found by :func:`control_character`) is refused: the end of an error message."""
    if SURROGATE.fullmatch(char):
        return (
            f"holds {char!r}, a lone surrogate, not a Unicode character (bytes that are not UTF-8, read as text): "
            "fedsim writes its files in UTF-8; give the text in UTF-8"
        )
    return f"holds the control character {char!r}: names, paths and addresses are printed on one line; remove it"


def printable(value: T) -> T:
    """A pydantic validator: ``value`` as it is, or an error (the field's name goes before it) quoting the text
    in it that holds a control character or a lone surrogate."""
    if (hit := control_character(value)) is not None:
        text, char = hit
        where = "" if text is value else f"{brief(text)} "
        raise PydanticCustomError("control_character", "{where}{why}", {"where": where, "why": unprintable(char)})
    return value


def cut(name: str, exact: str | None = None) -> str:
    """``name`` as one directory name of at most ``MAX_NAME`` characters: itself if it is that short and stands
    for itself (``exact`` None), else its start, ``~`` and 8 hex digits of the SHA-256 of ``exact`` (the text it
    stands for, when ``name`` had characters replaced) or of ``name``: one name per text still."""
    if exact is None and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256((name if exact is None else exact).encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}~{digest}"


def is_name(name: str) -> bool:
    """True if ``name`` is one directory name: never a path, never '.' or '..', no control character or lone
    surrogate, at most ``MAX_NAME`` characters."""
    return (
        bool(name.strip())
        and name not in (".", "..")
        and not set(name) & set("/\\")
        and control_character(name) is None
        and len(name) <= MAX_NAME
    )


NAME_RULE = f"1 to {MAX_NAME} characters without '/', '\\', control characters or lone surrogates, not '.' or '..'"


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


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
