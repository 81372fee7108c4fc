"""Paths written in config files (fedsim/paths.py): relative to the file, home expanded, shipped data by name."""

from __future__ import annotations

import os
from pathlib import Path

import fedsim
from fedsim.paths import home_expanded, package_path, resolve_path


def test_a_relative_path_is_relative_to_the_config_file(tmp_path: Path) -> None:
    base = tmp_path / "configs"
    assert resolve_path("data/x.npz", base) == str(tmp_path / "configs" / "data" / "x.npz")
    assert resolve_path("../shared/x.tar.gz", base) == str(tmp_path / "shared" / "x.tar.gz")  # normalised


def test_absolute_paths_urls_home_and_shipped_data_are_left_as_written(tmp_path: Path) -> None:
    for value in ("/data/x.npz", "https://example.org/x.tar.gz", "fedsim:assets/mnist_small.npz", "~/data"):
        assert resolve_path(value, tmp_path) == value


def test_home_is_expanded_as_a_shell_would(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HOME", "/home/researcher")
    assert home_expanded("~/runs") == "/home/researcher/runs"
    assert home_expanded("runs/~") == "runs/~"  # only at the start
    assert home_expanded("~") == "/home/researcher"


def test_shipped_data_is_found_inside_the_installed_package() -> None:
    shipped = package_path("fedsim:assets/mnist_small.npz")
    assert shipped == Path(fedsim.__file__).parent / "assets" / "mnist_small.npz" and shipped.is_file()
    assert package_path("~/x") == Path(os.path.expanduser("~/x"))
    assert package_path("/abs/x") == Path("/abs/x")
