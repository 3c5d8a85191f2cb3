"""The figures docs/results.md quotes in prose are the ones in the table it publishes (docs/figures/compare.csv).

Prose drifts from its own table when a comparison is re-run and only the table is pasted. Each figure the prose
takes from the comparison carries a marker right after it, invisible when rendered:

    at 0.956<!-- fig replica-lost adaptive goodput -->, with a p99 queue 1.75×<!-- fig replica-lost adaptive p99x -->

The test reads every marker, computes the figure from the CSV and checks the quoted number agrees to the digits
quoted (0.956 is checked to ±0.0005, 12 to ±0.5). A marker naming a scenario, policy or figure that does not exist
fails too, so a renamed scenario cannot leave a stale quote behind.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
RESULTS = DOCS / "results.md"
TABLE = DOCS / "figures" / "compare.csv"

Row = dict[str, str]


def _ratio(numerator: str, denominator: str) -> Callable[[Row], float]:
    return lambda row: float(row[numerator]) / float(row[denominator])


def _column(name: str, scale: float = 1.0) -> Callable[[Row], float]:
    return lambda row: float(row[name]) * scale


# The figures prose may quote, by the short name its markers use.
FIGURES: dict[str, Callable[[Row], float]] = {
    "goodput": _column("goodput_ratio"),
    "t90": _column("time_to_90pct_s"),
    "oracle_t90": _column("oracle_time_to_90pct_s"),
    "p99": _column("queue_time_p99_s"),
    "p99x": _ratio("queue_time_p99_s", "oracle_queue_time_p99_s"),
    "jain": _column("jain_fairness"),
    "saturated_pct": _column("saturated_fraction", 100.0),
    "preemptions": _column("preemptions"),
}

# A number (with thousands commas), an optional unit or sign the prose puts after it, then the marker.
MARKER = re.compile(r"(?P<number>\d[\d,]*(?:\.\d+)?)\s*(?:×|%|s)?\s*<!--\s*fig\s+(?P<key>[^>]*?)\s*-->")
ANY_MARKER = re.compile(r"<!--\s*fig\b")


def _table() -> dict[tuple[str, str], Row]:
    with TABLE.open(newline="") as handle:
        return {(row["scenario"], row["policy"]): row for row in csv.DictReader(handle)}


def _quotes() -> list[tuple[str, str]]:
    text = RESULTS.read_text(encoding="utf-8")
    return [(m.group("number"), " ".join(m.group("key").split())) for m in MARKER.finditer(text)]


def test_results_prose_quotes_figures_with_markers() -> None:
    """The marker syntax is in use (a doc rewritten without markers would make the check below vacuous)."""
    assert len(_quotes()) >= 20
    markers = len(ANY_MARKER.findall(RESULTS.read_text(encoding="utf-8")))
    assert markers == len(_quotes()), "a marker with no number right before it, or one that does not parse"


@pytest.mark.parametrize(("quoted", "key"), _quotes())
def test_a_quoted_figure_matches_the_table(quoted: str, key: str) -> None:
    scenario, policy, figure = key.split()
    row = _table().get((scenario, policy))
    assert row is not None, f"no row {scenario} × {policy} in {TABLE.name}"
    assert figure in FIGURES, f"unknown figure {figure!r}; known: {sorted(FIGURES)}"
    actual = FIGURES[figure](row)
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    value = float(quoted.replace(",", ""))
    tolerance = 0.5 * 10**-digits + 1e-9
    assert math.isfinite(actual) and abs(value - actual) <= tolerance, (
        f"results.md quotes {quoted} for {key}; the table gives {actual:.{digits + 2}f}"
    )
