"""Terminal output shared by subcommands: a progress bar and a summary table, with graceful fallbacks.

tqdm and rich are the ``cli`` extra; without them (or when stdout is not a terminal) the command still works and
prints plain text.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

__all__ = ["fmt", "print_table", "progress_bar", "run_counter"]


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


class _Lines:
    """Progress as plain lines on stderr, one per tenth of the work, for logs and CI where a bar would be noise."""

    def __init__(self, total: float, desc: str, unit: str) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.reported = 0  # tenths already printed

    def __call__(self, position: float, label: str = "") -> None:
        tenths = int(10 * position / self.total) if self.total > 0 else 10
        if tenths <= self.reported:
            return
        self.reported = min(tenths, 10)
        done = f"{position:,.0f}/{self.total:,.0f} {self.unit}"
        print(
            f"{self.desc}: {done} ({10 * self.reported} %){f' {label}' if label else ''}", file=sys.stderr, flush=True
        )


@contextmanager
def progress_bar(
    total: float, desc: str, *, enabled: bool = True, unit: str = "sim-s"
) -> Iterator[Callable[..., None]]:
    """Yields ``update(position, label="")``: a tqdm bar on a terminal, a line per 10 % on stderr otherwise."""
    bar: Any = None
    lines: _Lines | None = None
    if enabled and sys.stderr.isatty():
        try:
            from tqdm import tqdm

            bar = tqdm(total=round(total), desc=desc, unit=unit, leave=False, file=sys.stderr)
        except ImportError:
            bar = None
    if enabled and bar is None:
        lines = _Lines(total, desc, unit)
    last = [0.0]

    def update(position: float, label: str = "") -> None:
        if lines is not None:
            lines(position, label)
        if bar is not None and position - last[0] >= 1:
            if label:
                bar.set_postfix_str(label, refresh=False)
            bar.update(round(position - last[0]))
            last[0] = position

    try:
        yield update
        if lines is not None:
            lines(total)  # the closing 100 % line, which the last update may have stopped short of
    finally:
        if bar is not None:
            bar.close()


@contextmanager
def run_counter(total: int, desc: str, *, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """Yields ``finished(label)``, called once per finished run of a study: :func:`progress_bar` counted in runs."""
    with progress_bar(total, desc, enabled=enabled, unit="runs") as update:
        done = [0]

        def finished(label: str) -> None:
            done[0] += 1
            update(done[0], label)

        yield finished


def _print_rich(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], title: str) -> bool:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return False
    table = Table(title=title or None)
    for column in columns:
        justify: Literal["left", "right"] = "left" if column in ("scenario", "policy", "key", "model") else "right"
        table.add_column(column, justify=justify, no_wrap=True)
    cells = [[fmt(row.get(c)) for c in columns] for row in rows]
    for line in cells:
        table.add_row(*line)
    # Wide enough for every header and cell in full: rich would otherwise cut them to fit (goodput_rat…).
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)] if cells else []
    needed = sum(widths) + 3 * len(columns) + 1
    Console(width=max(80, needed)).print(table)
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
