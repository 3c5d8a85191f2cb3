"""The lab's figures: what a reader must be able to see (the target above the lines that track it, a legend entry
for every line, a grid legend that covers no cell), checked on the matplotlib artists rather than on pixels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from model_concurrency.lab.compare import run_study, write_grid
from model_concurrency.lab.plot import draw_run, legend_entries, plot_run
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.policies.registry import load_policy


def lines_by_label(ax: Any) -> dict[str, Any]:
    return {line.get_label(): line for line in ax.get_lines()}


@pytest.mark.parametrize("scenario", ["ramp", "multi-client"])
def test_target_is_drawn_above_in_flight_and_running(scenario: str) -> None:
    trace = simulate(load_scenario(scenario).scaled(0.03), policy_factory=lambda: load_policy("aimd"))
    fig, axes = plt.subplots(2, 1)
    draw_run(axes, trace, title=scenario)
    lines = lines_by_label(axes[0])
    targets = [line for label, line in lines.items() if label.startswith("target")]
    trackers = [line for label, line in lines.items() if label.startswith(("in-flight", "running"))]
    assert targets and len(trackers) == 2
    assert min(t.get_zorder() for t in targets) > max(t.get_zorder() for t in trackers)
    assert min(t.get_linewidth() for t in targets) > max(t.get_linewidth() for t in trackers)
    plt.close(fig)


def test_kv_usage_has_a_legend_entry() -> None:
    trace = simulate(load_scenario("ramp").scaled(0.03), policy_factory=lambda: load_policy("aimd"))
    fig, axes = plt.subplots(2, 1)
    draw_run(axes, trace)
    legend = axes[1].get_legend()
    assert legend is not None
    assert "KV usage (right axis)" in [text.get_text() for text in legend.get_texts()]
    plt.close(fig)


def saved_figures(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What each saved figure's legends and axes look like as laid out in the file."""
    seen: list[dict[str, Any]] = []
    original = plt.Figure.savefig

    def keep(fig: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(fig, *args, **kwargs)
        renderer = fig.canvas.get_renderer()
        seen.append(
            {
                "cell_legends": [ax.get_legend() for ax in fig.axes],
                "legends": [
                    ([t.get_text() for t in legend.get_texts()], legend.get_window_extent(renderer))
                    for legend in fig.legends
                ],
                "cells": [(ax.get_title(), ax.get_window_extent(renderer)) for ax in fig.axes],
            }
        )
        return result

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    return seen


def one_legend_clear_of_every_axis(figure: dict[str, Any]) -> list[str]:
    assert figure["cell_legends"] == [None] * len(figure["cells"])
    ((labels, box),) = figure["legends"]
    assert len(labels) == len(set(labels))
    for title, cell in figure["cells"]:
        assert not box.overlaps(cell), title
    return list(labels)


def test_grid_has_one_legend_outside_every_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenarios = [load_scenario(name).scaled(0.03) for name in ("gpu-added", "multi-client")]
    study = run_study(scenarios, ["aimd", "static"], jobs=1)
    seen = saved_figures(monkeypatch)
    path = write_grid(study, tmp_path / "grid.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    (figure,) = seen
    labels = one_legend_clear_of_every_axis(figure)
    assert {"target", "in-flight", "running (engine)", "capacity change", "KV usage (right axis)"} <= set(labels)
    assert not any(label.startswith("target c") for label in labels)


def test_single_run_plot_has_its_legend_above_the_axes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = simulate(load_scenario("gpu-added").scaled(0.05), policy_factory=lambda: load_policy("aimd"))
    seen = saved_figures(monkeypatch)
    plot_run(trace, tmp_path / "run.png", title="gpu-added")
    (figure,) = seen
    labels = one_legend_clear_of_every_axis(figure)
    assert {"target", "in-flight", "running (engine)", "capacity change", "KV usage (right axis)"} <= set(labels)


def test_legend_entries_collapse_per_client_labels() -> None:
    fig, ax = plt.subplots()
    ax.plot([0, 1], label="target c0")
    ax.plot([0, 1], label="target c1")
    ax.plot([0, 1], label="in-flight (all)")
    ax.plot([0, 1], label="target")
    _, labels = legend_entries(fig)
    assert labels == ["target", "in-flight"]
    plt.close(fig)
