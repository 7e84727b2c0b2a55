"""The shape of the product code (``app``, ``db``, ``model``, ``ingestion``): its import graph and
the size of its modules and folders (issue 42).

The graph is read from the source with :mod:`ast`, not by importing anything. Every import
statement counts: at module level and inside functions, methods and classes, also under
``try`` and other ``if`` blocks; only the blocks under ``if TYPE_CHECKING:`` (or
``typing.TYPE_CHECKING``) are left out, since they never run. A PEP 562 package lists its lazy
exports as ``{"module": (names...)}`` for ``lazy_exports``: importing one of those names imports
that module, so each listed module counts as imported by the package. Relative imports are
resolved, and ``from package import name`` is an import of ``package.name`` when that is a
module, else of ``package``. Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and
``a.b``; those implicit imports are not edges (a package's ``__init__`` that names its own
submodules would otherwise make every package a circle).

Checked:

- no import circle among product modules (each circle is reported as a chain ``a -> b -> a``,
  with the line of each import);
- the layer order ``app`` > ``db`` > ``model`` > ``ingestion``: a lower layer never imports a
  higher one;
- no product module over 600 lines, no product folder of more than 15 ``.py`` modules
  (``__init__.py`` included; ``db/migrations`` aside).
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("app", "db", "model", "ingestion")  # highest first
MAX_LINES = 600
MAX_MODULES = 15
FOLDER_LIMIT_ASIDE = ("db/migrations",)


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line`` of ``source``'s file."""

    source: str
    target: str
    line: int


# --- reading the imports ------------------------------------------------------------------------


def module_name(path: Path, root: Path = ROOT) -> str:
    """``db/audit/log.py`` -> ``db.audit.log``; ``db/audit/__init__.py`` -> ``db.audit``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for layer in LAYERS for p in (root / layer).rglob("*.py"))


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (its ``else`` counts)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(reversed(node.orelse))
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _base(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module of ``from <level dots><name> import ...`` in ``module``."""
    if level == 0:
        return name or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        package = package[: len(package) - (level - 1)]
    return ".".join([*package, name] if name else package)


def _lazy_sources(tree: ast.Module) -> list[tuple[str, int]]:
    """The modules a PEP 562 package lists for ``lazy_exports`` (a dict literal, given inline
    or through a module-level name), with their lines."""
    dicts: dict[str, ast.Dict] = {}
    for node in tree.body:
        target: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
            dicts[target.id] = value
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or len(node.args) < 2:
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if called.lstrip("_") != "lazy_exports":
            continue
        sources = node.args[1]
        if isinstance(sources, ast.Name):
            sources = dicts.get(sources.id, sources)
        if isinstance(sources, ast.Dict):
            for key in sources.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    found.append((key.value, key.lineno))
    return found


def imports_of(
    source: str, module: str, *, is_package: bool, known: Mapping[str, object] | set[str]
) -> list[Edge]:
    """The imports ``module`` (whose text is ``source``) makes of the ``known`` modules."""
    tree = ast.parse(source)
    edges: list[Edge] = []

    def add(target: str, line: int) -> None:
        while target and target not in known:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != module:
            edges.append(Edge(module, target, line))

    for node in _statements(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node.level, node.module)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                add(submodule if submodule in known else base, node.lineno)
    for target, line in _lazy_sources(tree):
        add(target, line)
    return edges


def product_graph(root: Path = ROOT) -> tuple[dict[str, Path], list[Edge]]:
    files = {module_name(p, root): p for p in product_files(root)}
    edges: list[Edge] = []
    for name, path in files.items():
        text = path.read_text(encoding="utf-8")
        edges += imports_of(text, name, is_package=path.name == "__init__.py", known=files)
    return files, edges


# --- circles and layers -------------------------------------------------------------------------


def _components(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(sorted(component))
    return found


def _shortest_cycle(graph: Mapping[str, set[str]], start: str, within: set[str]) -> list[str]:
    """The shortest path from ``start`` back to itself inside ``within``."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph.get(node, ())):
            if child not in within:
                continue
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    return []


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Import circles of ``graph`` (module -> the modules it imports), each as a chain that ends
    where it starts (``["a", "b", "a"]``): for every strongly connected component of more than
    one module, the shortest circle through each of its modules, each circle once (rotated to
    start at its smallest module)."""
    cycles: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for component in _components(graph):
        if len(component) < 2:
            continue
        members = set(component)
        for start in component:
            cycle = _shortest_cycle(graph, start, members)
            ring = cycle[:-1]
            first = ring.index(min(ring))
            ring = ring[first:] + ring[:first]
            if tuple(ring) not in seen:
                seen.add(tuple(ring))
                cycles.append([*ring, ring[0]])
    return sorted(cycles)


def describe(cycle: list[str], edges: Iterable[Edge]) -> str:
    """``a -> b (line 3 of a) -> a (line 9 of b)``."""
    lines = {(e.source, e.target): e.line for e in edges}
    steps = [cycle[0]]
    for source, target in itertools.pairwise(cycle):
        steps.append(f"{target} (line {lines.get((source, target), '?')} of {source})")
    return " -> ".join(steps)


def layer_violations(edges: Iterable[Edge], layers: tuple[str, ...] = LAYERS) -> list[str]:
    """Imports of a higher layer from a lower one (``layers``: highest first)."""
    rank = {layer: len(layers) - i for i, layer in enumerate(layers)}
    found = []
    for edge in edges:
        source, target = edge.source.split(".")[0], edge.target.split(".")[0]
        if source in rank and target in rank and rank[target] > rank[source]:
            found.append(f"{edge.source} imports {edge.target} (line {edge.line})")
    return sorted(found)


def graph_of(edges: Iterable[Edge]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    return graph


# --- the product --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def product() -> tuple[dict[str, Path], list[Edge]]:
    return product_graph()


def test_the_product_has_modules_and_imports(product: tuple[dict[str, Path], list[Edge]]) -> None:
    files, edges = product
    assert {"db.engine", "db.audit", "ingestion.errors", "model", "app"} <= set(files)
    assert any(e.source == "db.review" and e.target == "db.audit" for e in edges)


def test_no_import_circle(product: tuple[dict[str, Path], list[Edge]]) -> None:
    _, edges = product
    cycles = find_cycles(graph_of(edges))
    assert not cycles, "import circles:\n" + "\n".join(describe(c, edges) for c in cycles)


def test_layers_import_downwards_only(product: tuple[dict[str, Path], list[Edge]]) -> None:
    _, edges = product
    wrong = layer_violations(edges)
    assert not wrong, "app > db > model > ingestion, but:\n" + "\n".join(wrong)


def test_no_product_module_over_600_lines(product: tuple[dict[str, Path], list[Edge]]) -> None:
    files, _ = product
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in files.values()}
    over = sorted(f"{p.relative_to(ROOT)}: {n}" for p, n in sizes.items() if n > MAX_LINES)
    assert not over, f"modules over {MAX_LINES} lines:\n" + "\n".join(over)


def test_no_product_folder_over_15_modules(product: tuple[dict[str, Path], list[Edge]]) -> None:
    files, _ = product
    folders: dict[Path, int] = {}
    for path in files.values():
        folder = path.parent.relative_to(ROOT)
        if not any(folder.as_posix().startswith(aside) for aside in FOLDER_LIMIT_ASIDE):
            folders[folder] = folders.get(folder, 0) + 1
    crowded = sorted(f"{f}: {n}" for f, n in folders.items() if n > MAX_MODULES)
    assert not crowded, f"folders of more than {MAX_MODULES} modules:\n" + "\n".join(crowded)


# --- the checks themselves, on made-up graphs ---------------------------------------------------


def test_find_cycles_on_a_synthetic_graph() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": set(),
        "e": {"f"},
        "f": {"e"},
        "g": {"a"},
    }
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({}) == []


def test_find_cycles_names_each_circle_of_a_tangle() -> None:
    graph = {"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}
    assert find_cycles(graph) == [["a", "b", "a"], ["a", "c", "a"]]


def test_describe_names_the_lines() -> None:
    edges = [Edge("x", "y", 3), Edge("y", "x", 9)]
    assert find_cycles(graph_of(edges)) == [["x", "y", "x"]]
    assert describe(["x", "y", "x"], edges) == "x -> y (line 3 of x) -> x (line 9 of y)"


def test_layer_violations_on_synthetic_edges() -> None:
    edges = [
        Edge("app.cli", "db.engine", 1),
        Edge("db.store", "model.measurer", 2),
        Edge("ingestion.load", "model.numeric", 3),
        Edge("model.x", "app.cli", 4),
        Edge("db.store", "db.audit", 5),
    ]
    assert layer_violations(edges) == [
        "ingestion.load imports model.numeric (line 3)",
        "model.x imports app.cli (line 4)",
    ]


def test_imports_of_reads_functions_and_skips_type_checking() -> None:
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "from . import sibling\n"
        "from .sibling import thing\n"
        "from .. import errors\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.heavy import Heavy\n"
        "else:\n"
        "    import pkg.light\n"
        "def late():\n"
        "    from pkg.heavy import load\n"
        "class K:\n"
        "    def m(self):\n"
        "        import pkg.sub.sibling as s\n"
        "_SOURCES = {'pkg.lazy': ('Name',)}\n"
        "__getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, globals())\n"
    )
    known = {
        "pkg",
        "pkg.errors",
        "pkg.heavy",
        "pkg.light",
        "pkg.lazy",
        "pkg.sub",
        "pkg.sub.sibling",
    }
    edges = imports_of(source, "pkg.sub.mod", is_package=False, known=known)
    assert [(e.target, e.line) for e in edges] == [
        ("pkg.sub.sibling", 4),
        ("pkg.sub.sibling", 5),
        ("pkg.errors", 6),
        ("pkg.light", 10),
        ("pkg.heavy", 12),
        ("pkg.sub.sibling", 15),
        ("pkg.lazy", 16),
    ]
    in_package = imports_of("from . import sibling\n", "pkg.sub", is_package=True, known=known)
    assert [e.target for e in in_package] == ["pkg.sub.sibling"]
