"""Plots of a run: target versus saturation over time, capacity changes marked and named.

The single-run figure (``make sim``'s, the first a newcomer sees) explains itself: the title says what the oracle
is, each capacity change is labelled with what changed ("+3 engines"), the target is drawn translucent so the
in-flight line under it stays visible, every line has its own colour, and each panel carries its own legend,
outside its axes (a legend inside an axis covers some curve in some run).

With more than :data:`BAND_CLIENTS` clients the targets are drawn as a distribution (the sum, and the per-client
p5-p95 band with its median), never one line per client.

matplotlib is imported inside the functions with the Agg backend, so the lab works headless and importing the
lab does not pull in a GUI toolkit.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_concurrency.lab.trace import Trace

if TYPE_CHECKING:
    from model_concurrency.lab.scenario import Event, Scenario

__all__ = [
    "BAND_CLIENTS",
    "ORACLE_CAPTION",
    "change_labels",
    "draw_run",
    "figure_legend",
    "legend_entries",
    "plot_neighbour",
    "plot_run",
]

ORACLE_CAPTION = (
    "oracle: a client told the capacity at every moment, holding the knee of each phase "
    "(the least concurrency reaching 99 % of the peak goodput, found by sweeping fixed concurrencies)"
)
# One colour per meaning, none shared between two lines (the goodput and running were both green).
COLOURS = {
    "target": "tab:blue",
    "in-flight": "tab:orange",
    "running": "tab:brown",
    "waiting": "tab:red",
    "goodput": "tab:green",
    "kv": "tab:purple",
    "oracle": "black",
    "change": "0.45",
}


# Per-client targets (a few clients): none of the colours the other lines use.
_CLIENT_COLOURS = ("tab:blue", "tab:cyan", "tab:olive", "tab:pink")


def event_label(event: Event) -> str:
    """What a capacity event does, in a few words ("+3 engines", "replica 1 down")."""
    engines = f"{event.count} engine{'s' if event.count != 1 else ''}"
    if event.action == "add_engines":
        return f"+{engines}"
    if event.action == "remove_engines":
        return f"−{engines}"
    if event.action in ("replica_down", "replica_up"):
        return f"replica {event.replica} {event.action.removeprefix('replica_')}"
    if event.action == "background" and event.rate_rps is not None:
        return f"background {event.rate_rps:g} req/s"
    if event.action == "background" and event.fraction_of_capacity is not None:
        return f"background {event.fraction_of_capacity:.0%} of capacity"
    return event.action.replace("_", " ")


def change_labels(scenario: Scenario) -> list[tuple[float, str]]:
    """``(time, what changed)`` per capacity change of ``scenario``; events at one time joined."""
    labels: dict[float, list[str]] = {}
    for event in scenario.events:
        if event.changes_capacity and event.at_s < scenario.duration_s:
            labels.setdefault(event.at_s, []).append(event_label(event))
    return [(t, ", ".join(labels[t])) for t in sorted(labels)]


def _mark_changes(ax: Any, trace: Trace, names: Sequence[tuple[float, str]] = ()) -> None:
    named = dict(names)
    for i, t in enumerate(trace.capacity_changes):
        ax.axvline(t, color=COLOURS["change"], linestyle="--", linewidth=1, label="capacity change" if i == 0 else None)
        if t in named:
            ax.annotate(f" {named[t]}", (t, 1.0), xycoords=("data", "axes fraction"), va="top", ha="left",
                        fontsize=9, color="0.2", fontweight="bold")  # fmt: skip


def draw_run(
    axes: Any,
    trace: Trace,
    oracle: Trace | None = None,
    title: str = "",
    *,
    legend: bool = True,
    changes: Sequence[tuple[float, str]] = (),
) -> None:
    """Draw one run on two stacked axes: concurrency (top) and throughput with KV usage (bottom).

    The target is the thickest line, a translucent band: in a healthy run in-flight and running sit right on it,
    so they are drawn thin on top of it, where both stay visible (drawn under it, in-flight vanished).
    ``legend=False`` leaves the legends out, for grids that draw one legend for every cell
    (:func:`legend_entries`); else each panel gets its own, outside it on the right. ``changes`` names the
    capacity changes (:func:`change_labels`).
    """
    import numpy as np

    top, bottom = axes
    t = trace.time
    if len(trace.clients) > 1:
        top.plot(t, np.sum([c.inflight for c in trace.clients], axis=0), color=COLOURS["in-flight"],
                 linewidth=0.9, zorder=6, label="in-flight (all)")  # fmt: skip
    else:
        top.plot(t, trace.clients[0].inflight, color=COLOURS["in-flight"], linewidth=0.9, zorder=6, label="in-flight")
    top.plot(t, trace.running, color=COLOURS["running"], linewidth=0.7, alpha=0.8, zorder=5, label="running (engine)")
    top.fill_between(t, 0, trace.waiting_capacity, facecolor=COLOURS["waiting"], edgecolor="darkred", alpha=0.6,
                     linewidth=0.8, step="post", zorder=1, label="capacity-waiting (engine queue)")  # fmt: skip
    if oracle is not None:
        top.step(
            oracle.time,
            np.sum([c.target for c in oracle.clients], axis=0),
            where="post",
            color=COLOURS["oracle"],
            linestyle=":",
            linewidth=1.2,
            zorder=3,
            label="oracle target (knee)",
        )
    per_client_axis = None
    if len(trace.clients) > BAND_CLIENTS:
        per_client_axis = _draw_target_distribution(top, trace)
    else:
        many = len(trace.clients) > _LABELLED_CLIENTS
        for i, client in enumerate(trace.clients):
            if len(trace.clients) == 1:
                style: dict[str, Any] = {"color": COLOURS["target"], "label": "target", "alpha": 0.45}
            else:
                label = ("target (per client)" if i == 0 else None) if many else f"target c{i}"
                colour = _CLIENT_COLOURS[i % len(_CLIENT_COLOURS)] if not many else COLOURS["target"]
                style = {"color": colour, "alpha": 0.6 if not many else 0.4, "label": label}
            top.step(t, client.target, where="post", linewidth=3.2, zorder=4, **style)
    _mark_changes(top, trace, changes)
    top.set_ylabel("requests")
    top.set_title(title)
    bottom.plot(t, trace.throughput(30.0), label="goodput (30 s)", color=COLOURS["goodput"], zorder=3)
    if oracle is not None:
        bottom.plot(oracle.time, oracle.throughput(30.0), label="oracle goodput", color=COLOURS["oracle"],
                    linestyle="-.", linewidth=1.0, zorder=3)  # fmt: skip
    _mark_changes(bottom, trace)
    bottom.set_ylabel("items/s")
    bottom.set_xlabel("simulated time (s)")
    kv = bottom.twinx()
    kv.plot(t, trace.kv_usage, color=COLOURS["kv"], linewidth=0.6, alpha=0.6, label="KV usage (right axis)")
    kv.set_ylim(0, 1.05)
    kv.set_ylabel("KV usage")
    # The goodput axis in front of its twin, so the KV line stays behind the curves it explains.
    bottom.set_zorder(kv.get_zorder() + 1)
    bottom.patch.set_visible(False)
    if legend:
        # Right of each panel, past the KV axis's label: inside, a legend covers some curve in some run.
        tops = [top, per_client_axis] if per_client_axis is not None else [top]
        for ax, shown in ((top, tops), (bottom, [bottom, kv])):
            handles, labels = _entries(shown)
            ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.09, 1.0), fontsize=8, borderaxespad=0)


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


def plot_run(
    trace: Trace,
    path: str | Path,
    *,
    oracle: Trace | None = None,
    title: str = "",
    changes: Sequence[tuple[float, str]] = (),
) -> Path:
    """Write a two-panel PNG of one run; ``changes`` names its capacity changes (:func:`change_labels`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(13, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    draw_run(axes, trace, oracle, title, changes=changes)
    if oracle is not None:
        fig.text(0.01, 0.01, ORACLE_CAPTION, fontsize=8, color="0.25", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03 if oracle is not None else 0, 1, 1))
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
