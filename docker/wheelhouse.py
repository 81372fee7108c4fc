"""A wheelhouse for building fedsim's image without network: one wheel per distribution that the
installed fedsim needs, at exactly the installed version.

    python3 docker/wheelhouse.py docker/wheels          # then: docker build ... (see docs/deployment.md)

Run it where fedsim and its dependencies are installed (the versions you tested with) and a package
index is reachable; copy ``docker/wheels`` with the repository to the air-gapped host. The Dockerfile
installs what it finds there with ``pip --no-index``, so the script leaves nothing else there: wheels
already present are kept when they match, other versions and other distributions are removed.

PyPI's torch is a CUDA build: its ``nvidia-*`` libraries (2.5 GB of wheels) come along, since
``libtorch_cuda.so`` links against them and ``import torch`` fails without them, on a CPU too. Only
``triton`` (torch.compile's GPU kernels, never imported by a fedsim run) is left out unless
``--triton`` is given; the container test trains the quickstart in an image built without it.
For a smaller image build on an index with CPU wheels instead (docs/deployment.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename

LEFT_OUT = {"triton"}
# pyproject.toml's build backend, for the image's `pip install --no-build-isolation`; 70.1 brings bdist_wheel
BUILD = {"setuptools": ">=70.1"}


def canonical(name: str) -> str:
    return str(canonicalize_name(name))


def installed_closure(root: str, left_out: set[str]) -> dict[str, str]:
    """Every distribution that ``root`` needs (its extras included), as installed here: name -> version
    specifier (``==`` the installed version)."""
    found: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (canonical(name), extras) in seen:
            continue
        seen.add((canonical(name), extras))
        dist = metadata.distribution(name)
        found[canonical(name)] = f"=={dist.version}"
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in wanted):
                continue
            if canonical(req.name) in left_out:
                continue
            todo.append((req.name, frozenset(req.extras)))
    found.pop(canonical(root))  # built from the repository in the image
    return found | BUILD


def prune(directory: Path, pins: dict[str, str]) -> set[str]:
    """Remove every wheel that no pin asks for (one per distribution kept); returns the names kept."""
    kept = set()
    for wheel in sorted(directory.glob("*.whl"), reverse=True):  # the newest of several matching versions
        name, version, *_ = parse_wheel_filename(wheel.name)
        if name in pins and name not in kept and version in SpecifierSet(pins[name]):
            kept.add(name)
        else:
            wheel.unlink()
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", default="docker/wheels", type=Path)
    parser.add_argument("--triton", action="store_true", help="also triton (torch.compile on GPUs)")
    args = parser.parse_args(argv)
    args.directory.mkdir(parents=True, exist_ok=True)
    pins = installed_closure("fedsim", set() if args.triton else LEFT_OUT)
    kept = prune(args.directory, pins)
    missing = [f"{name}{spec}" for name, spec in sorted(pins.items()) if name not in kept]
    if missing:  # one pip: downloads wheels, builds the few that come as sources only
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(args.directory), *missing],
            check=True,
        )
    print(f"{len(pins)} wheels in {args.directory} ({len(missing)} new)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
