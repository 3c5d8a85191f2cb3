"""Every notebook in notebooks/ executes in FAST mode and draws its figures, so none can rot.

Each notebook is a jupytext percent-format ``.py`` file; it is converted, run by nbclient on the venv's
``python3`` kernel with ``MODEL_CONCURRENCY_FAST=1`` and a temporary ``MODEL_CONCURRENCY_FIGURES`` folder, and
must leave the PNGs it promises there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
EXPECTED = {
    "aimd_ramp": ["aimd_ramp_targets", "aimd_ramp_tradeoffs"],
    "default_ramp": ["default_ramp_rules", "default_ramp_runs", "default_ramp_kv_jump"],
    "policy_comparison": ["comparison_scatter", "comparison_bars", "comparison_grid"],
    "fairness": ["fairness_phase_plot", "fairness_four_clients", "fairness_32_clients"],
    "step_response": ["step_response"],
}


def test_every_notebook_is_listed() -> None:
    assert {p.stem for p in NOTEBOOKS.glob("*.py")} == set(EXPECTED)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs_and_draws(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_FAST", "1")
    monkeypatch.setenv("MODEL_CONCURRENCY_FIGURES", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = jupytext.read(NOTEBOOKS / f"{name}.py")
    tags = [cell.metadata.get("tags", []) for cell in notebook.cells]
    assert any("parameters" in t for t in tags), "the FAST parameter cell must be tagged 'parameters'"
    client = nbclient.NotebookClient(
        notebook, kernel_name="python3", timeout=240, resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # the kernel inherits this process environment, with the two variables above
    errors = [o for cell in notebook.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    for figure in EXPECTED[name]:
        png = tmp_path / f"{figure}.png"
        assert png.exists() and png.stat().st_size > 1000, f"{name} did not draw {figure}.png"
