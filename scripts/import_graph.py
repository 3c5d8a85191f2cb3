"""The package's import graph: circles and arrows that run back up the layers (docs/architecture.md).

Every import counts, at module level, inside a function or under ``TYPE_CHECKING``: a circle hidden behind a
function-level import is still a circle (it only moves the failure from import time to call time). An import of a
package's ``__init__`` counts only as the names it takes from it, since ``from model_concurrency import config``
reads the submodule, not the package.

    python scripts/import_graph.py          # prints circles and back arrows; exit 1 if there are any

tests/test_layering.py runs the same functions, so every change is checked for both.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "model_concurrency"
SRC = Path(__file__).resolve().parent.parent / "src"

# Lowest first: a module may import modules of its own layer or below. Each entry is a module or a package prefix;
# the longest matching prefix places a module. Everything not listed sits on top (the public surface, cli).
LAYERS: list[tuple[str, ...]] = [
    ("_fork", "bundled", "knobs", "extras", "state", "decision", "health", "observation", "signals.saturation"),
    ("signals.vllm", "signals.sglang", "engine.request", "engine.steptime", "engine.presets"),
    ("config", "policies", "page_hold", "signals", "engine"),
    ("controller", "guard", "gate.limiter", "gate.stats", "gate.outage", "gate.hold", "gate.outcome", "lease"),
    ("gate.model_limiter", "telemetry", "export", "lease_runtime"),
    ("runtime",),
    ("gate", "hooks", "integrations", "ray_coordinator"),
    ("ray_job",),
    ("ray",),
    ("lab", "emulator"),
]


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its ``__init__``)."""
    found = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(node: ast.ImportFrom | ast.Import, here: str, is_package: bool, known: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names if alias.name in known)
        return
    if node.level:
        base = here.split(".") if is_package else here.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    for alias in node.names:
        if f"{target}.{alias.name}" in known:
            yield f"{target}.{alias.name}"  # a submodule taken from its package
        elif target in known:
            yield target


def edges() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _imported(node, name, path.name == "__init__.py", known):
                    if target != name and not name.startswith(f"{target}."):  # a package's own parent: its __init__
                        graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_of(module: str) -> int:
    local = module.removeprefix(f"{PACKAGE}.") if module != PACKAGE else ""
    best, best_len = len(LAYERS), -1
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (local == prefix or local.startswith(f"{prefix}.")) and len(prefix) > best_len:
                best, best_len = level, len(prefix)
    return best


def back_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a lower layer to a higher one."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a))


def main() -> int:
    graph = edges()
    found = circles(graph)
    arrows = back_arrows(graph)
    for component in found:
        print("circle:", " ↔ ".join(component))
    for a, b in arrows:
        print(f"back arrow: {a} (layer {layer_of(a)}) → {b} (layer {layer_of(b)})")
    print(f"import_graph: {len(graph)} modules, {len(found)} circles, {len(arrows)} back arrows")
    return 1 if found or arrows else 0


if __name__ == "__main__":
    sys.exit(main())
