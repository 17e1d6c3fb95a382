"""docs/architecture.md's rules, checked on the code: arrows point down, the layers that
draw results open no input files, and no module-level import circles."""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tracekit"

# Layer -> the tracekit packages it must never import (at any level, lazily included).
FORBIDDEN = {
    "analysis": ("perfetto", "report", "host", "cli", "campaign", "vhost", "dataset"),
    "host": ("ingest", "analysis", "report", "perfetto", "cli"),
    "ingest": ("analysis", "report", "perfetto", "host", "cli", "dataset"),
    "report": ("perfetto", "host", "cli"),
    "perfetto": ("report", "host", "cli"),
}
# Calls that read a bundle's or a trace's files; report/ and perfetto/ get data from the
# ingest layer's objects instead (BundleData, RunData, Trace).
READERS = {
    "read_text", "read_bytes", "open_trace", "read_manifest", "read_probe_file",
    "read_vmm_output", "parse_vmm_output", "read_cyclictest_verbose", "read_tool",
    "read_kallsyms", "address_names",
}  # fmt: skip
# Modules of those layers whose job is a file: the loader, the output, serving it.
READS_ALLOWED = {"report/load.py", "perfetto/writer.py", "perfetto/serve.py"}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    """Every module of the package: its path relative to tracekit/, and its tree."""
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


def _imports(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Every tracekit module an import statement names, with the statement."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node
            for alias in node.names:
                yield f"{node.module}.{alias.name}", node
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_arrows_point_down(layer: str) -> None:
    bad = []
    for rel, tree in _modules():
        if not rel.startswith(f"{layer}/"):
            continue
        for name, node in _imports(tree):
            parts = name.split(".")
            if parts[0] == "tracekit" and len(parts) > 1 and parts[1] in FORBIDDEN[layer]:
                bad.append(f"{rel}:{node.lineno} imports {name}")
    assert sorted(set(bad)) == []


def test_report_and_perfetto_open_no_input_files() -> None:
    bad = []
    for rel, tree in _modules():
        if rel.split("/")[0] not in ("report", "perfetto") or rel in READS_ALLOWED:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            is_tracekit_open = (
                isinstance(func, ast.Attribute)
                and func.attr == "open"
                and (isinstance(func.value, ast.Name) and func.value.id == "tracekit")
            )
            if name in READERS or is_tracekit_open or name == "open":
                bad.append(f"{rel}:{node.lineno} calls {name}")
    assert bad == []


def _module_name(rel: str) -> str:
    """tracekit/ingest/bundle.py -> tracekit.ingest.bundle."""
    stem = rel.removesuffix(".py").removesuffix("/__init__")
    return "tracekit." + stem.replace("/", ".") if stem != "__init__" else "tracekit"


def _top_level_imports(tree: ast.Module, known: set[str]) -> set[str]:
    """The tracekit modules a module imports when it is imported (not lazily, not typing)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for name, _ in _imports(node) if isinstance(node, ast.Import | ast.ImportFrom) else ():
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def test_no_import_circles() -> None:
    trees = {_module_name(rel): tree for rel, tree in _modules()}
    graph = {name: _top_level_imports(tree, set(trees)) - {name} for name, tree in trees.items()}
    # A package's __init__ importing its own submodules is not a circle through them.
    for name, edges in graph.items():
        graph[name] = {e for e in edges if not (name.startswith(f"{e}.") and e != "tracekit")}
    done: set[str] = set()
    circles = []

    def visit(node: str, path: list[str]) -> None:
        """Depth-first; a node met again on the current path closes a circle."""
        if node in path:
            circles.append(" -> ".join([*path[path.index(node) :], node]))
            return
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, [*path, node])
        done.add(node)

    for name in sorted(graph):
        visit(name, [])
    assert circles == []
