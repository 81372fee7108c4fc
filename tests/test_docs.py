"""The documentation: the README is a front page whose commands and links hold, every page is in the site's
navigation, and the configuration reference is generated from fedsim/config.py with a line for every key.
(``mkdocs build --strict`` in ``.ci/run`` checks the links and anchors inside the site; a test here shows that
command fails on a broken link.)"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from fedsim.config import RunConfig
from tests.conftest import REPO

DOCS = REPO / "docs"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_reference", DOCS / "gen_config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    return [page for value in nav.values() for page in _nav_pages(value)]


def test_readme_is_a_front_page_with_the_two_commands_and_working_links() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "python3 -m pip install -e . && fedsim run configs/quickstart.yaml\n" in readme
    assert 'python3 -m pip install -e ".[test]" && python3 -m pytest -q\n' in readme
    targets = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if not t.startswith("http")}
    assert {"docs/getting-started.md", "docs/configuration.md", "docs/python-api.md"} <= targets
    assert not [t for t in targets if not (REPO / t).exists()]


def test_every_page_is_in_the_navigation() -> None:
    nav = _nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    pages = {p.name for p in DOCS.glob("*.md")}
    assert sorted(nav) == sorted(pages | {"index.md"})  # index.md: the README, put there by docs/hooks.py


def test_the_configuration_reference_has_every_key_with_its_default_and_range() -> None:
    gen = _generator()
    keys = dict(gen.fields())
    undocumented = [k for k, f in keys.items() if not (f.description or gen.NOTES.get(k))]
    assert not undocumented, f"describe these in fedsim/config.py (or docs/gen_config_reference.py): {undocumented}"
    assert not set(gen.NOTES) - set(keys), "docs/gen_config_reference.py has notes for keys that are gone"
    assert gen.MARKER in (page := (DOCS / "configuration.md").read_text()) and gen.PLUGINS_MARKER in page

    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in gen.config_reference().splitlines()}
    assert set(rows) >= set(keys) and {"seed", "train.rounds", "simulation.client_resources.num_gpus"} <= set(keys)
    assert "data" not in keys and "model.norm" in keys  # sections are opened, plugin blocks are one row
    assert rows["seed"][1:4] == ["`int`", "`0`", ">= 0, < 2^63"]
    assert rows["deploy.port"][1:4] == ["`int`", "`0`", ">= 0, <= 65 535"]
    assert rows["engine"][1:3] == ["`local` / `flower`", "`local`"] and rows["data.dataset"][2] == "required"
    assert rows["deploy.certificates"][1:3] == ["`{ca, cert, key}` or `null`", "`null`"]
    assert rows["strategy"][2] == "`fedavg`" and rows["deploy.tls"][2] == "`false`"
    train = RunConfig.model_fields["train"].annotation.model_fields
    assert rows["train.rounds"][2] == f"`{train['rounds'].default}`"


def _ci_docs_command() -> str:
    """The line of ``.ci/run`` that builds the documentation site."""
    lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if "mkdocs build" in line]
    commands = [line for line in lines if not line.lstrip().startswith("#")]
    assert len(commands) == 1, commands
    return commands[0]


@pytest.mark.slow
def test_the_ci_docs_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    """CI's own command, on a copy of the site's sources with one broken link, exits non-zero naming it: a build
    that drops strict mode's warnings (``--quiet``) exits 0 there and passes any broken link."""
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    hooks = _generator_hooks(tmp_path)
    for figure in hooks.front_page_figures((REPO / "README.md").read_text()):
        (tmp_path / figure).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / figure, tmp_path / figure)
    with (tmp_path / "docs" / "speed.md").open("a") as page:
        page.write("\n[a page that is gone](no-such-page.md)\n")
    res = subprocess.run(["bash", "-c", _ci_docs_command()], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode != 0, res.stdout + res.stderr
    assert "no-such-page.md" in res.stdout + res.stderr


def _generator_hooks(root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", root / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
