"""The fidelity table of docs/engine-model.md stays true: scripts/validate_engine.py runs and its claims hold.

Validation rows (published figures the model was not fitted on) must stay within their tolerance, calibration
rows within 2 % of the figure their constant was solved from; context rows only have to compute. A change to the
step-time model or a preset that breaks fidelity fails here rather than in a later study.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_validate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("validate_engine", ROOT / "scripts" / "validate_engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["validate_engine"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows() -> list:  # type: ignore[type-arg]
    return load_validate().compute(fast=True)  # type: ignore[no-any-return]


def test_every_row_computes_a_positive_finite_model_value(rows) -> None:  # type: ignore[no-untyped-def]
    assert len(rows) >= 8
    for row in rows:
        assert math.isfinite(row.model) and row.model > 0, row.figure.what
        assert row.figure.source and row.figure.hardware and row.figure.vllm and row.figure.workload
        assert row.figure.role in ("validation", "calibration", "context")


def test_validation_rows_stay_within_their_tolerance(rows) -> None:  # type: ignore[no-untyped-def]
    validation = [r for r in rows if r.figure.role == "validation"]
    assert len(validation) >= 3
    for row in validation:
        assert abs(row.error) <= row.figure.tolerance, f"{row.figure.what}: {row.error:+.1%}"


def test_calibration_rows_reproduce_the_figures_they_were_fitted_on(rows) -> None:  # type: ignore[no-untyped-def]
    for row in (r for r in rows if r.figure.role == "calibration"):
        assert abs(row.error) <= 0.02, f"{row.figure.what}: {row.error:+.1%}"


def test_the_table_names_every_figure_and_its_source(rows) -> None:  # type: ignore[no-untyped-def]
    module = load_validate()
    table = module.render(rows)
    for row in rows:
        assert row.figure.what in table and row.figure.source in table
    assert table.count("\n") == len(rows) + 1
