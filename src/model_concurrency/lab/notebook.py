"""What the notebooks in ``notebooks/`` share: the FAST switch, where figures go, and saving them small.

The test suite executes every notebook (tests/test_notebooks.py) with ``MODEL_CONCURRENCY_FAST=1`` and a
temporary ``MODEL_CONCURRENCY_FIGURES`` folder, then checks the figures exist: a notebook that no longer runs,
or silently stops drawing, fails the suite instead of rotting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model_concurrency import knobs
from model_concurrency.knobs import setting

__all__ = ["FAST_ENV", "FIGURES_ENV", "fast_mode", "figure_dir", "save_figure"]

FAST_ENV = knobs.FAST[0]
FIGURES_ENV = knobs.FIGURES[0]


def fast_mode(default: bool) -> bool:
    """The notebook's ``FAST`` parameter, forced on by ``MODEL_CONCURRENCY_FAST=1`` (and off by ``=0``)."""
    if not setting(FAST_ENV, ""):
        return default
    return bool(setting(FAST_ENV, default))


def figure_dir(default: str | Path = "out/notebooks") -> Path:
    """Where a notebook writes its PNGs: ``MODEL_CONCURRENCY_FIGURES`` if set, else ``default``."""
    path = Path(setting(FIGURES_ENV, "") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_figure(fig: Any, name: str, *, dpi: int = 80, folder: Path | None = None) -> Path:
    """Save a matplotlib figure as ``<figure_dir>/<name>.png`` (dpi 80 keeps committed figures small)."""
    path = (folder or figure_dir()) / f"{name}.png"
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path
