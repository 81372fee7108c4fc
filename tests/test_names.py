"""What a name a user gives fedsim may be (fedsim/names.py): text without control characters or lone surrogates, one
directory name, a host. The one-line errors a run gives for each are rows of the bad-input corpus
(tests/test_bad_inputs.py); here, the rules themselves."""

from __future__ import annotations

import hashlib

import pytest
from pydantic_core import PydanticCustomError

from fedsim.errors import ConfigError
from fedsim.names import MAX_NAME, check_host, control_character, cut, host_port, is_name, printable


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ("plain name", None),
        ("line\nbreak", ("line\nbreak", "\n")),
        ("esc\x1b[2J", ("esc\x1b[2J", "\x1b")),
        ("c1\x85", ("c1\x85", "\x85")),
        ("sep\u2028", ("sep\u2028", "\u2028")),
        ("bytes\udcff", ("bytes\udcff", "\udcff")),
        (["ok", {"key\t": "v"}], ("key\t", "\t")),  # a key inside a mapping inside a list
        ({"k": ["ok", ("nul\x00",)]}, ("nul\x00", "\x00")),
        (7, None),
        ("émigré ☃ 名前", None),  # other characters are names
    ],
)
def test_control_characters_and_lone_surrogates_are_found_wherever_they_are(value: object, found: object) -> None:
    assert control_character(value) == found


def test_printable_passes_a_clean_value_and_quotes_the_text_at_fault() -> None:
    assert printable({"a": ["b"]}) == {"a": ["b"]}
    with pytest.raises(PydanticCustomError) as err:
        printable(["fine", "tab\there"])
    assert "'tab\\there'" in str(err.value) and "control character '\\t'" in str(err.value)
    with pytest.raises(PydanticCustomError, match="lone surrogate"):
        printable("x\udcff")


@pytest.mark.parametrize("name", ["run", "a b", "x" * MAX_NAME, "..a", ".hidden", "名前"])
def test_a_directory_name(name: str) -> None:
    assert is_name(name)


@pytest.mark.parametrize("name", ["", "   ", ".", "..", "a/b", "a\\b", "x" * (MAX_NAME + 1), "new\nline", "s\udcff"])
def test_not_a_directory_name(name: str) -> None:
    assert not is_name(name)


def test_cut_keeps_a_short_name_and_makes_a_long_one_unique() -> None:
    assert cut("short") == "short"
    long = "y" * 300
    short = cut(long)
    assert short == "y" * (MAX_NAME - 9) + "~" + hashlib.sha256(long.encode()).hexdigest()[:8]
    assert len(short) == MAX_NAME and is_name(short)
    assert cut("y" * 299 + "z") != short  # names that share their start stay apart
    # a name whose characters were replaced stands for its original text: named by the original's digest
    assert cut("a_b", exact="a/b") == "a_b~" + hashlib.sha256(b"a/b").hexdigest()[:8]


@pytest.mark.parametrize("host", ["superlink", "server.example.org", "node_1", "10.0.0.5", "::1", "a" * 63 + ".org."])
def test_a_host(host: str) -> None:
    assert check_host(host, "--superlink-host") == host


@pytest.mark.parametrize(
    "host", ["999.1.1.1", "1.2.3", "-lead.org", "trail-.org", "a..b", "a" * 64, "sp ace", "x" * 254, "ok/path"]
)
def test_not_a_host_names_the_option(host: str) -> None:
    with pytest.raises(ConfigError, match=r"^--superlink-host .*give a DNS name"):
        check_host(host, "--superlink-host")


def test_host_port_brackets_an_ipv6_host() -> None:
    assert host_port("10.0.0.5", 9092) == "10.0.0.5:9092"
    assert host_port("::1", 9092) == "[::1]:9092"
    assert host_port("superlink", 1) == "superlink:1"
