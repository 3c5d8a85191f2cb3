"""Plots of a run: target versus saturation over time, capacity changes marked.

matplotlib is imported inside the functions with the Agg backend, so the lab works headless and importing the
lab does not pull in a GUI toolkit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model_concurrency.lab.trace import Trace

__all__ = ["draw_run", "plot_run"]


def _mark_changes(ax: Any, trace: Trace) -> None:
    for i, t in enumerate(trace.capacity_changes):
        ax.axvline(t, color="0.4", linestyle="--", linewidth=1, label="capacity change" if i == 0 else None)


def draw_run(axes: Any, trace: Trace, oracle: Trace | None = None, title: str = "", *, legend: bool = True) -> None:
    """Draw one run on two stacked axes: concurrency (top) and throughput with KV usage (bottom).

    ``legend=False`` leaves the legends out, for grids where one cell's legend explains them all.
    """
    import numpy as np

    top, bottom = axes
    t = trace.time
    for i, client in enumerate(trace.clients):
        label = "target" if len(trace.clients) == 1 else f"target c{i}"
        top.step(t, client.target, where="post", linewidth=1.5, label=label)
    if len(trace.clients) > 1:
        top.plot(t, np.sum([c.inflight for c in trace.clients], axis=0), linewidth=0.8, label="in-flight (all)")
    else:
        top.plot(t, trace.clients[0].inflight, linewidth=0.8, label="in-flight")
    top.plot(t, trace.running, linewidth=0.8, label="running (engine)")
    top.fill_between(t, 0, trace.waiting_capacity, color="tab:red", alpha=0.3, step="post", label="capacity-waiting")
    if oracle is not None:
        top.step(
            oracle.time,
            np.sum([c.target for c in oracle.clients], axis=0),
            where="post",
            color="k",
            linestyle=":",
            linewidth=1,
            label="oracle (knee)",
        )
    _mark_changes(top, trace)
    top.set_ylabel("requests")
    top.set_title(title)
    if legend:
        top.legend(loc="upper left", fontsize=7, ncol=3)
    bottom.plot(t, trace.throughput(30.0), label="goodput (30 s)", color="tab:green")
    if oracle is not None:
        bottom.plot(oracle.time, oracle.throughput(30.0), label="oracle goodput", color="k", linestyle=":")
    _mark_changes(bottom, trace)
    bottom.set_ylabel("items/s")
    bottom.set_xlabel("simulated time (s)")
    kv = bottom.twinx()
    kv.plot(t, trace.kv_usage, color="tab:purple", linewidth=0.6, alpha=0.6, label="KV usage")
    kv.set_ylim(0, 1.05)
    kv.set_ylabel("KV usage")
    if legend:
        bottom.legend(loc="upper left", fontsize=7)


def plot_run(trace: Trace, path: str | Path, *, oracle: Trace | None = None, title: str = "") -> Path:
    """Write a two-panel PNG of one run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    draw_run(axes, trace, oracle, title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
