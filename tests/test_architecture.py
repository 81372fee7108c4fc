"""The architecture, checked from the code: no import cycle, the client and server packages apart,
no reliance on Flower's private names or writes into Flower's modules, the protocol document equal
to its source, and every document a docstring cites present in the repository."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import flwr

from fedsim import wire
from tests.conftest import REPO

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


def test_no_import_cycle_among_fedsims_modules() -> None:
    # Tarjan's strongly connected components: any component of two or more modules is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(GRAPH)))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
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

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


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
    assert "fedsim.experiment" in GRAPH["fedsim.client.runtime"]
    assert "fedsim.server.replies" in GRAPH["fedsim.server.loop"]
    assert "fedsim.norms.base" in GRAPH["fedsim.norms.basic"]


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


def test_protocol_document_is_generated_from_the_wire_module() -> None:
    # regenerate with: python -m fedsim.wire > docs/protocol.md
    assert (REPO / "docs" / "protocol.md").read_text() == wire.protocol_markdown()
    keys = {v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str) and k not in ("STATE_SEP",)}
    documented = {k.key for k in wire.PROTOCOL} | {k.record for k in wire.PROTOCOL} | {k.message for k in wire.PROTOCOL}
    assert keys - documented == {wire.SCAFFOLD_C_I, wire.FEDBN_LOCAL}  # a client's own state, never sent


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
