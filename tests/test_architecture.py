"""The architecture, checked from the code: no import cycle between modules or between packages (the top-level
folder a floor that imports no subpackage), the client and server packages apart, deployment on top of the core
and never loaded by ``fedsim run``, no reliance on Flower's private names or writes into Flower's modules, the
protocol document equal to its source, and every document a docstring cites present in the repository."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import flwr
import pytest
import yaml

from fedsim import wire
from tests.conftest import REPO, small_config

# The source tree as it is installed: the top-level strategies/ and partitions/ are fedsim subpackages
ROOTS = {"fedsim": REPO / "fedsim", "fedsim.strategies": REPO / "strategies", "fedsim.partitions": REPO / "partitions"}


def modules() -> dict[str, Path]:
    """Every fedsim module name -> its file."""
    found = {}
    for package, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


MODULES = modules()


def imported(path: Path, name: str) -> set[str]:
    """The fedsim modules ``path`` imports anywhere in it (top level and inside functions)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:  # `from x import y` imports x.y when y is a module, else x
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: imported(path, name) for name, path in MODULES.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of ``graph``: its strongly connected components of two or more nodes (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_among_fedsims_modules() -> None:
    cycles = strongly_connected(GRAPH)
    assert not cycles, f"import cycles: {cycles}"


def subpackage(name: str) -> str:
    """``fedsim.x`` for a module anywhere in the subpackage x; ``fedsim`` for the top-level modules (fedsim/*.py)."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or MODULES[name].name == "__init__.py" else "fedsim"


# The top-level folder (fedsim/*.py) is the floor every subpackage stands on (errors, wire, config, files,
# reading, registry, ...): it imports no subpackage, and is one package of the cycle check like the others.
# The one exception is fedsim/__init__.py, the package's face: it re-exports the Python API of fedsim/app/
# (fedsim.run, fedsim.open_run, ...), and no module imports it for anything but that.
TOP = "fedsim"
FACE = "fedsim"  # fedsim/__init__.py


def test_the_top_level_folder_is_a_floor_that_imports_no_subpackage() -> None:
    reaching_up = {
        name: sorted(d for d in deps if subpackage(d) != TOP)
        for name, deps in GRAPH.items()
        if subpackage(name) == TOP and name != FACE
    }
    assert "fedsim.errors" in reaching_up and "fedsim.wire" in reaching_up  # the walk sees the top level
    reaching_up = {name: deps for name, deps in reaching_up.items() if deps}
    assert not reaching_up, f"top-level modules importing a subpackage (move them to one): {reaching_up}"


def test_no_import_cycle_among_fedsims_packages() -> None:
    # a cycle of folders: a file of server/ importing engines/ while a file of engines/ imports server/; the
    # top-level folder is one of them (fedsim/__init__.py aside, above: the face, not the floor)
    crossings: dict[tuple[str, str], list[str]] = {}
    for name, deps in GRAPH.items():
        if name == FACE:
            continue
        for dep in deps:
            here, there = subpackage(name), subpackage(dep)
            if here != there:
                crossings.setdefault((here, there), []).append(f"{name} -> {dep}")
    graph: dict[str, set[str]] = {subpackage(name): set() for name in GRAPH}
    for here, there in crossings:
        graph[here].add(there)
    assert {TOP, "fedsim.server", "fedsim.client", "fedsim.deploy", "fedsim.engines", "fedsim.strategies"} <= set(graph)
    assert {TOP, "fedsim.experiment"} <= graph["fedsim.client"]  # the walk sees the crossings
    cycles = strongly_connected(graph)
    causes = [edge for cycle in cycles for (a, b), edges in crossings.items() if {a, b} <= set(cycle) for edge in edges]
    assert not cycles, f"package import cycles {cycles}, through: {causes}"


def test_deployment_stands_on_the_core_and_nothing_below_it_reaches_up() -> None:
    # fedsim/deploy/ holds what Flower's SuperLink path needs (its ServerApp and ClientApp, packing, the
    # waits, the fork server's warm-up); server/ and client/ keep no import of it, and only the command
    # line's deploy and compose commands import it (inside those commands: fedsim run never loads it)
    for name, deps in GRAPH.items():
        if subpackage(name) in ("fedsim.server", "fedsim.client"):
            assert not {d for d in deps if subpackage(d) == "fedsim.deploy"}, name
    importers = {name for name, deps in GRAPH.items() if any(subpackage(d) == "fedsim.deploy" for d in deps)}
    assert {name for name in importers if subpackage(name) != "fedsim.deploy"} == {"fedsim.app.cli"}


def closure(roots: list[str]) -> set[str]:
    """Every fedsim module ``roots`` import, directly or not, at the top level or inside functions."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += GRAPH[name]
    return seen


def test_what_fedsim_run_may_load_holds_nothing_of_deploy() -> None:
    # fedsim run calls fedsim.app.api; every engine's Ray workers import the core ClientApp: whatever any code
    # path of theirs imports, a function's own imports included, is none of fedsim/deploy/
    reach = closure(["fedsim.app.api", "fedsim.client.app", "fedsim.engines.ray_pool", "fedsim.engines.flower_sim"])
    assert {"fedsim.engines.runner", "fedsim.engines.local", "fedsim.server.loop", "fedsim.client.runtime"} <= reach
    assert not {name for name in reach if subpackage(name) == "fedsim.deploy"}


LOADED_BY_RUN = """
import json, sys
from fedsim.app.cli import main
code = main(sys.argv[1:])
import fedsim.engines.flower_sim, fedsim.engines.ray_pool  # the other engines' modules, as the driver loads them
print(json.dumps([code, sorted(m for m in sys.modules if m.startswith("fedsim"))]))
"""


@pytest.mark.slow
def test_a_fedsim_run_loads_nothing_of_deploy(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(small_config(tmp_path, train={"rounds": 1}, eval={"every": 1})))
    out = subprocess.run(
        [sys.executable, "-c", LOADED_BY_RUN, "run", str(path)], capture_output=True, text=True, timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    code, loaded = json.loads(out.stdout.splitlines()[-1])
    assert code == 0 and "fedsim.engines.local" in loaded and "fedsim.server.loop" in loaded
    assert not [name for name in loaded if name.startswith("fedsim.deploy")]


def reaches(start: str, graph: dict[str, set[str]]) -> set[str]:
    """Every node ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for w in graph.get(todo.pop(), set()) - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_the_run_record_package_is_in_no_cycle_of_packages() -> None:
    # a package is a subpackage of fedsim (fedsim.record, fedsim.server) or a top-level module of its own
    def package(name: str) -> str:
        return name if MODULES[name].name == "__init__.py" or name.count(".") < 2 else name.rpartition(".")[0]

    graph: dict[str, set[str]] = {}
    for name, deps in GRAPH.items():
        graph.setdefault(package(name), set()).update(package(d) for d in deps if package(d) != package(name))
    back = sorted(p for p in reaches("fedsim.record", graph) if "fedsim.record" in reaches(p, graph))
    assert not back, f"fedsim.record imports these, which import it back: {back}"


def test_the_graph_sees_real_imports() -> None:
    # the walk must find what is there, or the cycle test proves nothing
    assert "fedsim.experiment.resolve" in GRAPH["fedsim.client.runtime"]
    assert "fedsim.server.replies" in GRAPH["fedsim.server.loop"]
    assert "fedsim.norms.base" in GRAPH["fedsim.norms.basic"]
    assert "fedsim.deploy.launcher" in GRAPH["fedsim.app.cli"]  # imported inside a function


def test_client_and_server_packages_do_not_import_each_other() -> None:
    for name, deps in GRAPH.items():
        if name.startswith("fedsim.client"):
            assert not {d for d in deps if d.startswith("fedsim.server")}, name
        if name.startswith("fedsim.server"):
            assert not {d for d in deps if d.startswith("fedsim.client")}, name


def flower_private_names() -> set[str]:
    """Every underscore name Flower's own source defines (methods, attributes), dunders aside."""
    names: set[str] = set()
    for path in Path(flwr.__file__).parent.rglob("*.py"):
        text = path.read_text(errors="ignore")
        names |= set(re.findall(r"def (_[A-Za-z]\w*)", text)) | set(re.findall(r"self\.(_[A-Za-z]\w*)", text))
    return {n for n in names if not n.startswith("__")}


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, AttributeError, ValueError):  # a name inside a module, not a module
        return False


# The one module allowed to change Flower internals: the fixed waits of a deployment, version-guarded and
# checked by tests/test_flower_waits.py (issue: multi-node simulation at simulation speed)
PATCHES_FLOWER = "fedsim.deploy.flower_waits"


def test_no_flower_private_name_and_no_write_into_a_flower_module() -> None:
    private = flower_private_names()
    assert "_compute_deltat_and_mt" in private  # the scan reads Flower's source
    own: set[str] = set()
    texts = {name: path.read_text() for name, path in MODULES.items()}
    for text in texts.values():  # fedsim's own private names may coincide with Flower's
        own |= set(re.findall(r"def (_[A-Za-z]\w*)", text)) | set(re.findall(r"self\.(_[A-Za-z]\w*)\s*[:=]", text))
    problems = []
    for name, text in texts.items():
        if name == PATCHES_FLOWER:
            continue
        tree = ast.parse(text)
        flower_modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flwr"):
                for a in node.names:
                    if a.name.startswith("_") or any(p.startswith("_") for p in node.module.split(".")):
                        problems.append(f"{name}: imports {node.module}.{a.name}")
                    if is_module(f"{node.module}.{a.name}"):
                        flower_modules.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                flower_modules |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("flwr")}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []  # fmt: skip
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in flower_modules:
                    problems.append(f"{name}: assigns {t.value.id}.{t.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args:
                if isinstance(node.args[0], ast.Name) and node.args[0].id in flower_modules:
                    problems.append(f"{name}: setattr on {node.args[0].id}")
        for attr in re.findall(r"\.(_[A-Za-z]\w*)\b", text):
            if attr in private and attr not in own:
                problems.append(f"{name}: uses Flower's private {attr}")
        if "__dict__[" in text:
            problems.append(f"{name}: writes through __dict__")
    assert not problems, problems
    assert PATCHES_FLOWER in texts and "start_client_internal.time =" in texts[PATCHES_FLOWER]


def test_protocol_document_is_generated_from_the_wire_module_and_the_strategies() -> None:
    # regenerate with: python docs/gen_protocol.py > docs/protocol.md
    spec = importlib.util.spec_from_file_location("gen_protocol", REPO / "docs" / "gen_protocol.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    document = (REPO / "docs" / "protocol.md").read_text()
    assert document == gen.protocol_document()
    assert all(f"### `{name}`" in document for name in ("fedprox", "scaffold", "fedbn"))  # each under its own name
    # every constant of the core's is a row of its table (a separator and a row's label aside)
    keys = {v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str) and k not in ("STATE_SEP",)}
    documented = {k.key for k in wire.PROTOCOL} | {k.record for k in wire.PROTOCOL} | {k.message for k in wire.PROTOCOL}
    assert keys - documented == set()


def test_every_document_the_code_cites_is_in_the_repository() -> None:
    cited: dict[str, set[str]] = {}
    for path in [*MODULES.values(), *REPO.glob("benchmarks/*.py")]:
        # a path to a document (docs/x.md) or a document's name (README.md); not a file fedsim writes (results.md)
        for ref in re.findall(r"(?<![\w/.-])((?:[\w-]+/)+[\w-]+\.md|[A-Z][A-Z_]+\.md)\b", path.read_text()):
            cited.setdefault(ref, set()).add(path.name)
        assert "../shared" not in path.read_text(), f"{path} cites a document outside the repository"
        assert not re.search(r"(?<![\w/])specs/", path.read_text()), f"{path} cites specs/, which is not here"
    assert {"docs/algorithms.md", "docs/normalizers.md", "docs/protocol.md"} <= set(cited)
    missing = {ref: where for ref, where in cited.items() if not (REPO / ref).is_file()}
    assert not missing, missing
