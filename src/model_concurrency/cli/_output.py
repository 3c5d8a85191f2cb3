"""Terminal output shared by subcommands: a progress bar and a summary table, with graceful fallbacks.

tqdm and rich are the ``cli`` extra; without them (or when stdout is not a terminal) the command still works and
prints plain text.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["fmt", "print_table", "progress_bar"]


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


@contextmanager
def progress_bar(total: float, desc: str, *, enabled: bool = True) -> Iterator[Callable[[float], None]]:
    """Yields ``update(position)``; a tqdm bar on a terminal, nothing otherwise."""
    bar: Any = None
    if enabled and sys.stderr.isatty():
        try:
            from tqdm import tqdm

            bar = tqdm(total=round(total), desc=desc, unit="sim-s", leave=False, file=sys.stderr)
        except ImportError:
            bar = None
    last = [0.0]

    def update(position: float) -> None:
        if bar is not None and position - last[0] >= 1:
            bar.update(round(position - last[0]))
            last[0] = position

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


def _print_rich(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], title: str) -> bool:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return False
    table = Table(title=title or None)
    for column in columns:
        table.add_column(column, justify="left" if column in ("scenario", "policy", "key", "model") else "right")
    for row in rows:
        table.add_row(*(fmt(row.get(c)) for c in columns))
    Console(width=max(100, 14 * len(columns))).print(table)
    return True


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], title: str = "") -> None:
    """Print rows as a table: rich when installed, aligned plain text otherwise."""
    if _print_rich(rows, columns, title):
        return
    if title:
        print(title)
    widths = [max(len(c), *(len(fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(fmt(row.get(c)).ljust(w) for c, w in zip(columns, widths, strict=True)))
