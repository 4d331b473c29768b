"""The packages of `stream/` form an acyclic graph in layers (docs/design.md, "Package layers"):
protocol -> wire and entry framing -> metadata -> client -> services -> bookie process ->
simulator -> sandbox -> cli. A package imports only its own layer and those below; the bookie
never imports the client; the client's core reaches neither grpc nor kazoo nor the kazoo-backed
metadata modules, and not the facade or adapters that hold them.

The graph is static: every `import` in a module (at the top, in a function, under
TYPE_CHECKING), read with `ast`, so an import added anywhere is seen without running it."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

import stream

STREAM_DIR = Path(stream.__file__).parent

# Lowest first. A package may import its own layer and those below it.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "foundation",
        frozenset(
            {
                "stream",
                "stream.errors",
                "stream.addresses",
                "stream.logs",
                "stream.lazy_exports",
                "stream.clock",
                "stream.wakeup",
                "stream.settings",
            }
        ),
    ),
    ("protocol", frozenset({"stream.protocol"})),
    ("wire and framing", frozenset({"stream.wire", "stream.framing", "stream.security"})),
    ("metadata", frozenset({"stream.metadata"})),
    ("client", frozenset({"stream.client"})),
    ("services", frozenset({"stream.retention", "stream.autorecovery"})),
    ("bookie process", frozenset({"stream.bookie"})),
    ("simulator", frozenset({"stream.sim"})),
    ("sandbox", frozenset({"stream.sandbox"})),
    ("cli", frozenset({"stream.cli"})),
)

# stream.client: the facade (the synchronous `StreamClient` and what builds it) and the adapters
# that hold grpc and kazoo. Everything else in the package is the asyncio core, which does its
# I/O through `stream.client.ports`; the package itself (`__init__`, run by importing any of
# them) loads the facade only when one of its names is asked for.
CLIENT_FACADE = frozenset({"stream.client.client", "stream.client.cursor"})
CLIENT_ADAPTERS = frozenset({"stream.client.grpc_transport", "stream.client.zk_metadata"})
# What the core must not reach, even through another module of ours.
CORE_FORBIDDEN = ("grpc", "kazoo", "stream.metadata.streams", "stream.metadata.connection")

ImportGraph = dict[str, set[str]]


def module_name(path: Path) -> str:
    """Returns the dotted name of `path`, a file under stream/."""
    parts = list(path.relative_to(STREAM_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def our_sources() -> dict[str, Path]:
    """Returns every module of stream/ by name, generated protobuf modules left out (they
    import only protobuf and grpc)."""
    return {
        module_name(path): path
        for path in sorted(STREAM_DIR.rglob("*.py"))
        if "_pb2" not in path.name
    }


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """Yields the module names one import statement names, `from x import y` giving `x.y`
    too (a submodule or a name, told apart by the caller)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    yield base
    yield from (f"{base}.{alias.name}" for alias in node.names)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Returns the ids of the nodes under `if TYPE_CHECKING:` (never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def import_graph(sources: Mapping[str, Path], *, run_only: bool = False) -> ImportGraph:
    """Returns {module: the names it imports} for `sources`: one of our modules where the name
    is one, else the name itself (a third-party or standard module). `run_only` leaves out the
    imports under TYPE_CHECKING."""
    graph: ImportGraph = {}
    for module, path in sources.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = _type_checking_only(tree) if run_only else set()
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skipped:
                is_package = path.name == "__init__.py"
                for name in _imported(node, module, is_package):
                    if name.startswith("stream.") and name not in sources:
                        continue  # `from stream.x import SomeClass`: x is named on its own
                    names.add(name)
        names.discard(module)
        graph[module] = names
    return graph


def package_of(module: str) -> str:
    """Returns the package a module of ours belongs to in the layers: `stream.<first part>`."""
    return ".".join(module.split(".")[:2])


def layer_of(package: str) -> int:
    for rank, (_, packages) in enumerate(LAYERS):
        if package in packages:
            return rank
    raise AssertionError(f"{package} is in no layer: add it to LAYERS")


def package_edges(graph: ImportGraph) -> dict[tuple[str, str], str]:
    """Returns {(package, package it imports): one module import that makes the edge}."""
    edges: dict[tuple[str, str], str] = {}
    for module, names in sorted(graph.items()):
        for name in sorted(names):
            if name in graph and package_of(name) != package_of(module):
                edges.setdefault((package_of(module), package_of(name)), f"{module} -> {name}")
    return edges


def find_cycle(edges: Iterable[tuple[str, str]]) -> list[str] | None:
    """Returns a cycle of the directed graph `edges` as [a, b, ..., a], or None."""
    successors: dict[str, list[str]] = {}
    for a, b in edges:
        successors.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(successors.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(successors):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def parents(module: str) -> Iterator[str]:
    """Yields the packages importing `module` runs first: stream, stream.client, ..."""
    parts = module.split(".")
    for end in range(1, len(parts)):
        yield ".".join(parts[:end])


def reach(graph: ImportGraph, start: str) -> dict[str, str]:
    """Returns every name importing `start` imports, directly or not (the packages around each
    module of ours included), each with the module that imports it."""
    seen: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for name in [*graph.get(module, ()), *parents(module)]:
            if name not in seen and name != start:
                seen[name] = module
                if name in graph:
                    queue.append(name)
    return seen


def forbidden(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


GRAPH = import_graph(our_sources())
RUN_GRAPH = import_graph(our_sources(), run_only=True)
EDGES = package_edges(GRAPH)
CLIENT_CORE = sorted(
    module
    for module in GRAPH
    if package_of(module) == "stream.client" and module not in CLIENT_FACADE | CLIENT_ADAPTERS
)


def test_the_graph_is_read() -> None:
    assert len(GRAPH) > 120
    assert "stream.client.ports" in CLIENT_CORE and "stream.client.writer" in CLIENT_CORE
    assert set(GRAPH) >= CLIENT_FACADE | CLIENT_ADAPTERS, "a facade or adapter module was renamed"


def test_every_package_has_a_layer() -> None:
    for module in GRAPH:
        layer_of(package_of(module))


def test_no_package_cycle() -> None:
    cycle = find_cycle(EDGES)
    assert cycle is None, "package cycle: " + "; ".join(
        EDGES[(a, b)] for a, b in zip(cycle, cycle[1:], strict=False)
    )


def test_no_package_imports_a_higher_layer() -> None:
    upward = [
        f"{via} ({LAYERS[layer_of(a)][0]} imports {LAYERS[layer_of(b)][0]})"
        for (a, b), via in sorted(EDGES.items())
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "imports of a higher layer: " + "; ".join(upward)


def test_the_bookie_never_imports_the_client() -> None:
    found = {
        f"{module} -> {name}"
        for module, names in sorted(GRAPH.items())
        if package_of(module) == "stream.bookie"
        for name in sorted(names)
        if forbidden(name, ["stream.client"])
    }
    assert not found, "the bookie imports the client: " + "; ".join(sorted(found))


def test_retention_never_imports_the_sandbox() -> None:
    found = [
        f"{module} -> {name}"
        for module, names in sorted(GRAPH.items())
        if package_of(module) == "stream.retention"
        for name in sorted(names)
        if forbidden(name, ["stream.sandbox"])
    ]
    assert not found, "retention imports the sandbox: " + "; ".join(found)


@pytest.mark.parametrize("module", CLIENT_CORE)
def test_the_client_core_reaches_no_grpc_kazoo_facade_or_adapter(module: str) -> None:
    reached = reach(RUN_GRAPH, module)
    banned = (*CORE_FORBIDDEN, *CLIENT_ADAPTERS)
    found = sorted(
        f"{via} -> {name}"
        for name, via in reached.items()
        if forbidden(name, banned) or name in CLIENT_FACADE
    )
    assert not found, f"{module} reaches: " + "; ".join(found)


def test_importing_the_client_core_loads_neither_grpc_nor_kazoo() -> None:
    code = (
        "import sys, stream.client.writer, stream.client.reader, stream.client.recovery; "
        "print(sorted(m for m in ('grpc', 'kazoo') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
