#!/usr/bin/env python3
"""The import graph of vq-admin's own packages, and its cycles.

    python3 scripts/import_graph.py            # the cycles; exit 1 when there is one
    python3 scripts/import_graph.py --dot      # the whole graph in Graphviz dot
    python3 scripts/import_graph.py --edges    # every edge with its kind and line
    python3 scripts/import_graph.py --importers vq_admin.lanes.runtime:RuntimeUpdate
    python3 scripts/import_graph.py PATH...    # other package directories

It reads the source with :mod:`ast` and imports nothing of what it reads.
Every ``import`` and ``from ... import`` is an edge from the importing
module to the imported one, of one of three kinds:

* ``module``: runs when the module is imported (module level, class bodies,
  module-level ``try``/``if``);
* ``function``: inside a function body, so it runs when the function is
  called; still a dependency, and it counts towards a cycle;
* ``type-checking``: under ``if TYPE_CHECKING:`` (or ``if False:``); never
  runs, but a reader (and the type checker) meets the dependency: it counts
  towards a cycle too;
* ``main-block``: under ``if __name__ == "__main__":`` at module level; runs
  only when the file is run as the program, as the module ``__main__``, never
  when others import it: listed apart, not counted.

A cycle is a strongly connected component of more than one module over the
``module``, ``function`` and ``type-checking`` edges.  ``from PKG import NAME`` is an edge to
``PKG.NAME`` when that is a module of the graph, else to ``PKG``.  Imports
of modules outside the scanned packages (the standard library, third-party
packages) are not edges.

By default it reads ``vq_admin`` and the ``hookspecs`` directory (the
``vq_admin_hookspecs`` package) next to this script's parent directory.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATHS = (ROOT / "vq_admin", ROOT / "hookspecs")
SKIP_DIRS = frozenset({"__pycache__", "build", "dist", ".venv", ".git"})
COUNTED = ("module", "function", "type-checking")  # a TYPE_CHECKING import is a dependency too


@dataclass(frozen=True)
class Edge:
    """One import statement's dependency: *source* imports *target* (names: what it takes from it)."""

    source: str
    target: str
    kind: str  # "module", "function", "type-checking" or "main-block"
    line: int
    names: tuple[str, ...] = ()


@dataclass
class Graph:
    modules: dict[str, Path] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)

    def counted(self) -> list[Edge]:
        return [e for e in self.edges if e.kind in COUNTED and e.source != e.target]

    def cycles(self) -> list[list[str]]:
        """The strongly connected components of more than one module (sorted), over counted edges."""
        successors: dict[str, set[str]] = {m: set() for m in self.modules}
        for edge in self.counted():
            successors[edge.source].add(edge.target)
        return [sorted(c) for c in _components(successors) if len(c) > 1]

    def importers(self, module: str, name: str | None = None) -> list[Edge]:
        """Edges into *module* (that take *name* from it, when given)."""
        return [e for e in self.edges if e.target == module and (name is None or name in e.names)]


def _components(successors: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(successors):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(successors[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(successors[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(component)
    return found


def packages(paths: Iterable[Path]) -> dict[str, Path]:
    """Module name -> file for every package at or directly under each of *paths*."""
    modules: dict[str, Path] = {}
    for path in paths:
        path = path.resolve()
        tops = [path] if (path / "__init__.py").is_file() else sorted(
            p for p in path.iterdir() if p.is_dir() and p.name not in SKIP_DIRS and (p / "__init__.py").is_file())
        for top in tops:
            for file in sorted(top.rglob("*.py")):
                relative = file.relative_to(top.parent)
                if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in relative.parts[:-1]):
                    continue
                parts = list(relative.with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                modules[".".join(parts)] = file
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:``, ``if typing.TYPE_CHECKING:`` or ``if False:`` (never runs)."""
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
            or (isinstance(test, ast.Constant) and test.value is False))


def _is_main_block(test: ast.expr) -> bool:
    """``if __name__ == "__main__":``: runs only when the file is the program (then it is ``__main__``,
    not the module others import)."""
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement with its kind."""
    def walk(nodes: Iterable[ast.AST], kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node, kind
                continue
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.body, "type-checking")
                yield from walk(node.orelse, kind)
                continue
            if isinstance(node, ast.If) and kind == "module" and _is_main_block(node.test):
                yield from walk(node.body, "main-block")
                yield from walk(node.orelse, kind)
                continue
            inner = "function" if kind == "module" and isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else kind
            yield from walk(ast.iter_child_nodes(node), inner)
    yield from walk(tree.body, "module")


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(modules: dict[str, Path], dotted: str) -> str | None:
    """The longest prefix of *dotted* that is a module of the graph."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in modules:
            return name
        parts.pop()
    return None


def scan(paths: Iterable[Path] = DEFAULT_PATHS) -> Graph:
    graph = Graph(packages(paths))
    for module, file in sorted(graph.modules.items()):
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
        is_package = file.name == "__init__.py"
        for node, kind in _imports(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _known(graph.modules, alias.name)
                    if target is not None:
                        graph.edges.append(Edge(module, target, kind, node.lineno))
                continue
            base = _resolve(module, is_package, node)
            plain: list[str] = []
            for alias in node.names:
                submodule = f"{base}.{alias.name}" if base else alias.name
                if submodule in graph.modules:
                    graph.edges.append(Edge(module, submodule, kind, node.lineno))
                else:
                    plain.append(alias.name)
            target = _known(graph.modules, base) if base else None
            if plain and target is not None:
                graph.edges.append(Edge(module, target, kind, node.lineno, tuple(plain)))
    return graph


def dot(graph: Graph) -> str:
    styles = {"module": "solid", "function": "dashed", "type-checking": "dotted", "main-block": "dotted"}
    lines = ["digraph imports {", "  rankdir=LR;", "  node [shape=box, fontsize=10];"]
    in_cycle = {m for c in graph.cycles() for m in c}
    for module in sorted(graph.modules):
        colour = ', color="red"' if module in in_cycle else ""
        lines.append(f'  "{module}"{colour};')
    seen: set[tuple[str, str, str]] = set()
    for edge in graph.edges:
        key = (edge.source, edge.target, edge.kind)
        if edge.source == edge.target or key in seen:
            continue
        seen.add(key)
        lines.append(f'  "{edge.source}" -> "{edge.target}" [style={styles[edge.kind]}];')
    lines.append("}")
    return "\n".join(lines)


def report(graph: Graph) -> list[str]:
    lines: list[str] = []
    cycles = graph.cycles()
    for number, members in enumerate(cycles, 1):
        lines.append(f"cycle {number}: {len(members)} modules: {', '.join(members)}")
        inside = set(members)
        for edge in sorted(graph.counted(), key=lambda e: (e.source, e.target, e.line)):
            if edge.source in inside and edge.target in inside:
                lines.append(f"  {edge.source} -> {edge.target}  ({edge.kind} import, "
                             f"{graph.modules[edge.source].name}:{edge.line})")
    deferred = [e for e in graph.edges if e.kind == "type-checking"]
    main_blocks = [e for e in graph.edges if e.kind == "main-block"]
    counted = graph.counted()
    lines.append(f"{len(graph.modules)} modules, {len(counted)} counted edges "
                 f"({sum(e.kind == 'module' for e in counted)} module-level, "
                 f"{sum(e.kind == 'function' for e in counted)} inside functions, "
                 f"{len(deferred)} under TYPE_CHECKING)"
                 + (f", {len(main_blocks)} in __main__ blocks (not counted)" if main_blocks else ""))
    lines.append(f"{len(cycles)} import cycle(s)" if cycles else "no import cycle")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("paths", nargs="*", type=Path, help="package directories (default: vq_admin, hookspecs)")
    parser.add_argument("--dot", action="store_true", help="print the graph in Graphviz dot")
    parser.add_argument("--edges", action="store_true", help="print every edge: source, target, kind, line")
    parser.add_argument("--importers", metavar="MODULE[:NAME]",
                        help="print the modules that import MODULE (or take NAME from it), with the kind")
    args = parser.parse_args(argv)
    graph = scan(args.paths or DEFAULT_PATHS)
    if args.dot:
        print(dot(graph))
    elif args.edges:
        for e in graph.edges:
            names = f"  ({', '.join(e.names)})" if e.names else ""
            print(f"{e.source} -> {e.target}  {e.kind}  line {e.line}{names}")
    elif args.importers:
        module, _, name = args.importers.partition(":")
        for e in graph.importers(module, name or None):
            print(f"{e.source}  {e.kind}  line {e.line}")
    if not args.dot:
        print("\n".join(report(graph)), file=sys.stdout if not (args.edges or args.importers) else sys.stderr)
    return 1 if graph.cycles() else 0


if __name__ == "__main__":
    sys.exit(main())
