"""The package's imports point one way (docs/architecture.md): no circles, no arrow back up the layers.

Counted by scripts/import_graph.py over every import, module-level, function-level and typing-only alike, so a
circle cannot hide behind an import moved into a function. A new module lands in a layer by its name's prefix
(``LAYERS`` there); one that fits none sits on top, where it may import anything and nothing may import it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "import_graph.py"


def _import_graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_circles() -> None:
    graph = _import_graph()
    assert graph.circles(graph.edges()) == []


def test_no_import_runs_back_up_the_layers() -> None:
    graph = _import_graph()
    assert graph.back_arrows(graph.edges()) == []


def test_the_checker_sees_a_circle_and_a_back_arrow() -> None:
    """The checker itself: a made-up graph with one circle and one upward arrow is reported as such."""
    graph = _import_graph()
    made_up = {
        "model_concurrency.observation": {"model_concurrency.runtime"},  # layer 0 importing the runtime: up
        "model_concurrency.runtime": {"model_concurrency.observation"},
        "model_concurrency.lab.a": {"model_concurrency.lab.b"},
        "model_concurrency.lab.b": set(),
    }
    assert graph.circles(made_up) == [["model_concurrency.observation", "model_concurrency.runtime"]]
    assert graph.back_arrows(made_up) == [("model_concurrency.observation", "model_concurrency.runtime")]


def test_a_module_over_400_lines_says_why_at_its_top() -> None:
    """A long module is a choice to be read: its docstring says why, in a paragraph right after its first line."""
    src = SCRIPT.parent.parent / "src" / "model_concurrency"
    unexplained = []
    for path in sorted(src.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= 400:
            continue
        paragraphs = text.split('"""', 2)[1].split("\n\n") if text.startswith('"""') else []
        if len(paragraphs) < 2 or not (paragraphs[1].startswith("(") and "400 lines" in paragraphs[1]):
            unexplained.append(str(path.relative_to(src)))
    assert unexplained == []
