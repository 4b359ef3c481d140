"""Fail when modules of a package import each other in a cycle, ``TYPE_CHECKING`` and function-level imports included.

Usage: ``python scripts/check_import_cycles.py PACKAGE [PACKAGE ...]`` (``make lint`` checks
``airflow_batch_provider`` and ``airflow_batch_emulator``). Prints each cycle as the modules in it and
one path around it, and exits 1 when there is any.

import-linter (``[tool.importlinter]`` in pyproject.toml) checks the declared layers; none of its
contract types forbids cycles between any two modules, so this script does, on the graph import-linter
builds (grimp). A module importing its own parent package (``from . import x`` in a package's module) is
not counted: the parent's ``__init__`` runs first anyway, so that is an order, not a cycle.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

import grimp


def import_graph(package: str) -> dict[str, set[str]]:
    """Return module → the modules of ``package`` it imports (anywhere in the module, TYPE_CHECKING included)."""
    graph = grimp.build_graph(
        package, include_external_packages=False, exclude_type_checking_imports=False, cache_dir=None
    )
    return {
        module: {
            imported
            for imported in graph.find_modules_directly_imported_by(module)
            if imported != module and not module.startswith(imported + ".")
        }
        for module in graph.modules
    }


def reachable(start: str, edges: Mapping[str, Iterable[str]]) -> set[str]:
    """Return every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(edges.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(edges.get(module, ()))
    return seen


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Return the groups of modules that reach each other through imports (two or more each), each sorted.

    A few hundred modules: reachability from each is fast enough, and plainer than Tarjan's algorithm.
    """
    reach = {module: reachable(module, edges) for module in edges}
    groups: dict[frozenset[str], None] = {}
    for module, reached in reach.items():
        if module in reached:
            groups[frozenset(other for other in reached if module in reach[other])] = None
    return sorted(sorted(group) for group in groups)


def path_around(group: list[str], edges: Mapping[str, Iterable[str]]) -> list[str]:
    """Return one import path from the group's first module back to itself, staying inside the group."""
    members, start = set(group), group[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for target in sorted(set(edges[node]) & members):
                if target == start:
                    path = [start]
                    while node != start:
                        path.append(node)
                        node = came_from[node]
                    return [start, *reversed(path[1:]), start]
                if target not in came_from:
                    came_from[target] = node
                    next_frontier.append(target)
        frontier = next_frontier
    return group  # unreachable for a strongly connected group


def main(packages: list[str]) -> int:
    if not packages:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    total = 0
    for package in packages:
        edges = import_graph(package)
        groups = cycles(edges)
        for group in groups:
            print(f"import cycle in {package}: {' -> '.join(path_around(group, edges))}")
            if len(group) > 2:
                print(f"  (all modules of this cycle: {', '.join(group)})")
        total += len(groups)
        print(f"{package}: {len(edges)} modules, {len(groups)} import cycle(s)")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
