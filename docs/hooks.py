"""MkDocs hooks (``mkdocs.yml``): the site's front page is the repository's README (with the figures it shows
from outside ``docs/``), and the configuration reference (every key, and every built-in plugin's options) is
generated from the code at every build, so neither can drift from its source."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).parent))
from gen_config_reference import MARKER, PLUGINS_MARKER, config_reference, plugin_reference  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def front_page(readme: str) -> str:
    """The README as the site's ``index.md``: its ``docs/`` links become the site's own pages, and a link to a
    file outside ``docs/`` (which the site does not hold) becomes its path in code."""

    def relink(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if target.startswith(("http://", "https://", "#")):
            return match.group(0)
        if target.startswith("docs/"):
            return f"[{text}]({target.removeprefix('docs/')})"
        return text if text.strip("`") == target else f"{text} (`{target}`)"

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", relink, readme)


def front_page_figures(readme: str) -> list[str]:
    """The images the README shows from the repository outside ``docs/`` (``results/.../accuracy.png``): the site
    carries each at the same path, so the front page's image links hold there as on GitHub."""
    targets = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", readme)
    return [t for t in targets if not t.startswith(("http://", "https://", "docs/"))]


def on_files(files: Files, config: Any) -> Files:
    readme = (REPO / "README.md").read_text()
    files.append(File.generated(config, "index.md", content=front_page(readme)))
    for figure in front_page_figures(readme):
        files.append(File.generated(config, figure, abs_src_path=str(REPO / figure)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri == "configuration.md":
        for marker in (MARKER, PLUGINS_MARKER):
            if marker not in markdown:
                raise ValueError(f"docs/configuration.md lost its marker {marker}")
        return markdown.replace(MARKER, config_reference()).replace(PLUGINS_MARKER, plugin_reference())
    return markdown
