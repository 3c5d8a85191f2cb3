"""Plots of a run: target versus saturation over time, capacity changes marked.

With more than :data:`BAND_CLIENTS` clients the targets are drawn as a distribution (the sum, and the per-client
p5-p95 band with its median), never one line per client.

matplotlib is imported inside the functions with the Agg backend, so the lab works headless and importing the
lab does not pull in a GUI toolkit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model_concurrency.lab.trace import Trace

__all__ = ["BAND_CLIENTS", "draw_run", "figure_legend", "legend_entries", "plot_neighbour", "plot_run"]


def _mark_changes(ax: Any, trace: Trace) -> None:
    for i, t in enumerate(trace.capacity_changes):
        ax.axvline(t, color="0.4", linestyle="--", linewidth=1, label="capacity change" if i == 0 else None)


def draw_run(axes: Any, trace: Trace, oracle: Trace | None = None, title: str = "", *, legend: bool = True) -> None:
    """Draw one run on two stacked axes: concurrency (top) and throughput with KV usage (bottom).

    The target is drawn last and thickest: in a healthy run in-flight and running sit right on it, and drawn
    after it they would hide the one line the policy controls. ``legend=False`` leaves the legends out, for grids
    that draw one legend for every cell (:func:`legend_entries`).
    """
    import numpy as np

    top, bottom = axes
    t = trace.time
    if len(trace.clients) > 1:
        top.plot(t, np.sum([c.inflight for c in trace.clients], axis=0), color="tab:orange", linewidth=0.8,
                 alpha=0.8, zorder=2, label="in-flight (all)")  # fmt: skip
    else:
        top.plot(
            t, trace.clients[0].inflight, color="tab:orange", linewidth=0.8, alpha=0.8, zorder=2, label="in-flight"
        )
    top.plot(t, trace.running, color="tab:green", linewidth=0.8, alpha=0.8, zorder=2, label="running (engine)")
    top.fill_between(t, 0, trace.waiting_capacity, color="tab:red", alpha=0.3, step="post", zorder=1,
                     label="capacity-waiting")  # fmt: skip
    if oracle is not None:
        top.step(
            oracle.time,
            np.sum([c.target for c in oracle.clients], axis=0),
            where="post",
            color="k",
            linestyle=":",
            linewidth=1,
            zorder=3,
            label="oracle (knee)",
        )
    per_client_axis = None
    if len(trace.clients) > BAND_CLIENTS:
        per_client_axis = _draw_target_distribution(top, trace)
    else:
        many = len(trace.clients) > _LABELLED_CLIENTS
        for i, client in enumerate(trace.clients):
            if len(trace.clients) == 1:
                style: dict[str, Any] = {"color": "tab:blue", "label": "target"}
            else:
                label = ("target (per client)" if i == 0 else None) if many else f"target c{i}"
                style = {"color": f"C{i % 10}" if not many else "tab:blue", "alpha": 1.0 if not many else 0.5,
                         "label": label}  # fmt: skip
            top.step(t, client.target, where="post", linewidth=1.8, zorder=4, **style)
    _mark_changes(top, trace)
    top.set_ylabel("requests")
    top.set_title(title)
    bottom.plot(t, trace.throughput(30.0), label="goodput (30 s)", color="tab:green", zorder=3)
    if oracle is not None:
        bottom.plot(oracle.time, oracle.throughput(30.0), label="oracle goodput", color="k", linestyle=":", zorder=3)
    _mark_changes(bottom, trace)
    bottom.set_ylabel("items/s")
    bottom.set_xlabel("simulated time (s)")
    kv = bottom.twinx()
    kv.plot(t, trace.kv_usage, color="tab:purple", linewidth=0.6, alpha=0.6, label="KV usage (right axis)")
    kv.set_ylim(0, 1.05)
    kv.set_ylabel("KV usage")
    # The goodput axis in front of its twin, so the KV line stays behind the curves it explains.
    bottom.set_zorder(kv.get_zorder() + 1)
    bottom.patch.set_visible(False)
    if legend:
        if per_client_axis is not None:
            handles, labels = _entries([top, per_client_axis])
            top.legend(handles, labels, loc="upper left", fontsize=7, ncol=3)
        else:
            top.legend(loc="upper left", fontsize=7, ncol=3)
        handles, labels = _entries([bottom, kv])
        bottom.legend(handles, labels, loc="upper left", fontsize=7)


def _draw_target_distribution(top: Any, trace: Trace) -> Any:
    """Many clients: their summed target against the fleet (left axis), and how it is shared (right axis).

    One line per client is unreadable past a few dozen, and per-client targets (tens) drawn on the fleet's scale
    (thousands) would sit flat on the axis, so the per-client p5-p95 band and median get their own axis.
    """
    import numpy as np

    t = trace.time
    targets = np.vstack([c.target for c in trace.clients])
    top.step(t, targets.sum(axis=0), where="post", color="tab:blue", linewidth=1.8, zorder=4,
             label="target (sum of clients)")  # fmt: skip
    p5, p50, p95 = np.percentile(targets, [5, 50, 95], axis=0)
    per = top.twinx()
    per.fill_between(t, p5, p95, step="post", color="tab:cyan", alpha=0.3, linewidth=0,
                     label="per-client target p5-p95 (right axis)")  # fmt: skip
    per.step(t, p50, where="post", color="tab:cyan", linewidth=1.0, label="per-client target p50 (right axis)")
    per.set_ylim(0, max(1.0, float(p95.max())) * 1.1)
    per.set_ylabel("per-client target")
    # The fleet-scale curves in front of the band, as the KV twin sits behind goodput below.
    top.set_zorder(per.get_zorder() + 1)
    top.patch.set_visible(False)
    return per


_GENERIC_OF = {"in-flight (all)": "in-flight", "target (per client)": "target", "target (sum of clients)": "target"}
_GENERIC = frozenset({"in-flight", "target"})

# Above this many clients, one "target (per client)" entry stands for all their target lines.
_LABELLED_CLIENTS = 4
# Above this many, no line per client at all: the summed target and a percentile band of the per-client ones.
BAND_CLIENTS = 16


def _entries(axes: Any) -> tuple[list[Any], list[str]]:
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    return handles, labels


def legend_entries(figure: Any) -> tuple[list[Any], list[str]]:
    """One entry per distinct label over every axis of ``figure`` (KV twins included), for a figure legend.

    Cells with one client and cells with several label the same lines differently (``target`` or ``target c0``,
    ``in-flight`` or ``in-flight (all)``); each collapses to one entry, the single-client line's if there is one.
    """
    handles, labels = _entries(figure.axes)
    kept: list[tuple[Any, str]] = []
    for handle, label in sorted(zip(handles, labels, strict=True), key=lambda e: e[1] not in _GENERIC):
        label = _GENERIC_OF.get(label, "target" if label.startswith("target c") else label)
        if label not in (k for _, k in kept):
            kept.append((handle, label))
    return [h for h, _ in kept], [k for _, k in kept]


def figure_legend(figure: Any, handles: list[Any], labels: list[str], *, ncol: int) -> None:
    """One legend above every axis of ``figure``, then the layout below it: a legend inside an axis covers some
    curve in some run (the top left is where a ramp starts, the top right where a grown target ends)."""
    figure.legend(handles, labels, loc="upper center", ncol=ncol, fontsize=8, frameon=False)
    rows = -(-len(labels) // max(1, ncol))
    header_in = 0.2 + 0.2 * rows  # legend rows x line height, in inches
    figure.tight_layout(rect=(0, 0, 1, 1 - header_in / figure.get_figheight()))


def plot_run(trace: Trace, path: str | Path, *, oracle: Trace | None = None, title: str = "") -> Path:
    """Write a two-panel PNG of one run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    draw_run(axes, trace, oracle, title, legend=False)
    handles, labels = _entries(fig.axes)
    figure_legend(fig, handles, labels, ncol=5)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_neighbour(
    runs: list[tuple[str, Any]], spec: Any, path: str | Path, *, end_s: float, title: str = "", window_s: float = 5.0
) -> Path:
    """The interactive tenant's TTFT over time beside its target, one line per run (lab/neighbour.py).

    ``runs`` are (label, latency) pairs of one scenario with an ``[interactive]`` tenant (``trace.neighbour``, or
    :func:`~model_concurrency.lab.neighbour.tenant_alone`'s); ``spec`` is that tenant
    (:class:`~model_concurrency.lab.scenario.Interactive`). Each line is the p99 of the TTFTs of requests that
    arrived in a trailing ``window_s`` (log scale); bursts are shaded and the target is the dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(10, 4.5))
    end = end_s
    start = spec.first_burst_s
    while start < end:
        ax.axvspan(start, min(start + spec.burst_s, end), color="0.9", zorder=0)
        start += spec.burst_s + spec.idle_s
    for label, latency in runs:
        if latency is None or not len(latency.arrival):
            continue
        grid = np.arange(window_s, end + window_s, window_s)
        idx = np.searchsorted(latency.arrival, grid)
        lo = np.concatenate([[0], idx[:-1]])
        p99 = [float(np.percentile(latency.ttft[a:b], 99)) if b > a else np.nan for a, b in zip(lo, idx, strict=True)]
        ax.plot(grid, p99, label=label, linewidth=1.2, drawstyle="steps-pre")
    ax.axhline(spec.ttft_target_s, color="black", linestyle="--", linewidth=1, label="TTFT target")
    ax.set_yscale("log")
    ax.set_xlabel("simulated time (s); shaded: the tenant bursts")
    ax.set_ylabel(f"neighbour TTFT p99 per {window_s:g} s (s)")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
