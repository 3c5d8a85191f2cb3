"""The lab's figures: what a reader must be able to see (the target as a band with the lines that track it visible
on top, a legend entry for every line, legends that cover no panel, the capacity change named, the oracle
explained), checked on the matplotlib artists rather than on pixels."""

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
def test_in_flight_and_running_stay_visible_on_the_target(scenario: str) -> None:
    trace = simulate(load_scenario(scenario).scaled(0.03), policy_factory=lambda: load_policy("aimd"))
    fig, axes = plt.subplots(2, 1)
    draw_run(axes, trace, title=scenario)
    lines = lines_by_label(axes[0])
    targets = [line for label, line in lines.items() if label.startswith("target")]
    trackers = [line for label, line in lines.items() if label.startswith(("in-flight", "running"))]
    assert targets and len(trackers) == 2
    # The target is the wide band; the thin lines that sit on it in a healthy run are drawn on top of it.
    assert max(t.get_zorder() for t in targets) < min(t.get_zorder() for t in trackers)
    assert min(t.get_linewidth() for t in targets) > max(t.get_linewidth() for t in trackers)
    colours = [line.get_color() for line in (*targets, *trackers)]
    assert len(set(colours)) == len(colours)
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


def test_single_run_plot_explains_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``make sim``'s figure: a legend per panel, clear of every axis; the change named; the oracle in a caption."""
    from model_concurrency.lab.experiment import run_scenario
    from model_concurrency.lab.plot import ORACLE_CAPTION, change_labels

    scenario = load_scenario("gpu-added").scaled(0.05)
    assert change_labels(scenario) == [(30.0, "+3 engines")]
    result = run_scenario(scenario, lambda: load_policy("aimd"), policy_name="aimd", parallel=False)
    checked: list[bool] = []
    original = plt.Figure.savefig

    def check(fig: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(fig, *args, **kwargs)  # laid out as in the file
        renderer = fig.canvas.get_renderer()
        top, bottom = fig.axes[:2]
        boxes = [ax.get_window_extent(renderer) for ax in fig.axes]
        for panel, must in ((top, {"target", "in-flight", "running (engine)", "oracle target (knee)"}),
                            (bottom, {"goodput (30 s)", "oracle goodput", "KV usage (right axis)"})):  # fmt: skip
            legend = panel.get_legend()
            assert legend is not None
            assert must <= {text.get_text() for text in legend.get_texts()}
            assert not any(legend.get_window_extent(renderer).overlaps(box) for box in boxes)
        assert fig.legends == []
        assert "+3 engines" in [text.get_text().strip() for text in top.texts]
        assert ORACLE_CAPTION in [text.get_text() for text in fig.texts]
        checked.append(True)
        return result

    monkeypatch.setattr(plt.Figure, "savefig", check)
    changes = change_labels(scenario)
    plot_run(result.trace, tmp_path / "run.png", oracle=result.oracle, title="gpu-added", changes=changes)
    assert checked == [True]


def test_legend_entries_collapse_per_client_labels() -> None:
    fig, ax = plt.subplots()
    ax.plot([0, 1], label="target c0")
    ax.plot([0, 1], label="target c1")
    ax.plot([0, 1], label="in-flight (all)")
    ax.plot([0, 1], label="target")
    _, labels = legend_entries(fig)
    assert labels == ["target", "in-flight"]
    plt.close(fig)
