"""Judging a run: goodput and queueing together, against the oracle.

Over-driving an engine gains no throughput, only queueing, preemptions and memory pressure, so no single number
decides; the summary puts goodput next to queue time, saturation and stability. Definitions (docs/results.md):

* ``goodput``: items completed per simulated second over the whole run, all clients;
* ``goodput_ratio``: ``goodput / oracle_goodput``;
* ``time_to_90pct_s``: from the last capacity change (or t=0) until the 10 s throughput first reaches 90 % of the
  oracle's settled throughput in that last phase (None if never). The window is shorter than a poll (12 s) on
  purpose: a trailing window of ``w`` seconds alone takes ``0.9 × w`` to report a step, so with the former 30 s
  window every policy, even one that reacted instantly, scored at least 27 s and "a third of seed-aimd's 68 s"
  was out of reach of any policy;
* ``oracle_time_to_90pct_s``: the oracle's own figure on the same definition: what measurement and the engine's
  own ramp cost a client that knew the change in advance (the floor of ``time_to_90pct_s``);
* ``saturated_fraction``: share of trace samples with capacity-waiting requests;
* ``queue_time_p50_s`` / ``queue_time_p99_s``: engine queue time of the clients' requests;
* ``latency_p99_s``: their end-to-end latency;
* ``oscillation``: coefficient of variation of the summed target over the second half of the last phase;
* ``jain_fairness``: Jain's index of the clients' goodputs, ``(Σx)² / (n Σx²)``; 1.0 with one client;
* ``client_goodput_p5`` / ``_p50`` / ``_p95``: percentiles of the per-client goodputs (items/s over the run): with
  hundreds of clients, the spread Jain's single number hides (who starves, who hogs).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from model_concurrency.lab.trace import Array, Trace

__all__ = ["SUMMARY_KEYS", "jain_index", "summarize"]

SUMMARY_KEYS = (
    "goodput",
    "oracle_goodput",
    "goodput_ratio",
    "time_to_90pct_s",
    "oracle_time_to_90pct_s",
    "saturated_fraction",
    "queue_time_p50_s",
    "queue_time_p99_s",
    "oracle_queue_time_p99_s",
    "latency_p99_s",
    "oscillation",
    "jain_fairness",
    "client_goodput_p5",
    "client_goodput_p50",
    "client_goodput_p95",
)


def jain_index(values: list[float] | Array) -> float:
    x = np.asarray(values, dtype=float)
    if len(x) == 0 or not np.any(x):
        return 1.0
    return float(x.sum() ** 2 / (len(x) * np.square(x).sum()))


def _percentile(values: Array, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


TIME_TO_WINDOW_S = 10.0


def time_to_fraction(
    trace: Trace, reference_rate: float, fraction: float = 0.9, window_s: float = TIME_TO_WINDOW_S
) -> float | None:
    """Seconds from the last capacity change until throughput first reaches ``fraction × reference_rate``."""
    start = trace.capacity_changes[-1] if trace.capacity_changes else 0.0
    if reference_rate <= 0:
        return None
    rate = trace.throughput(window_s)
    hit = np.nonzero((trace.time >= start) & (rate >= fraction * reference_rate))[0]
    return float(trace.time[hit[0]] - start) if len(hit) else None


def oscillation(trace: Trace) -> float:
    start = trace.capacity_changes[-1] if trace.capacity_changes else 0.0
    steady_from = start + (trace.duration_s - start) / 2
    mask = trace.time >= steady_from
    if not np.any(mask):
        return 0.0
    target = np.sum([c.target for c in trace.clients], axis=0)[mask]
    mean = float(target.mean())
    return float(target.std() / mean) if mean > 0 else 0.0


def summarize(trace: Trace, oracle: Trace | None = None, oracle_final_rate: float | None = None) -> dict[str, Any]:
    """The summary keys for one run; oracle figures come from the oracle's own run of the same scenario."""
    duration = trace.duration_s
    goodput = trace.total_completions / duration
    oracle_goodput = oracle.total_completions / oracle.duration_s if oracle is not None else None
    if oracle_final_rate is None and oracle is not None:
        start = oracle.capacity_changes[-1] if oracle.capacity_changes else 0.0
        # The oracle's settled rate in the last phase: skip its own first 30 s there.
        mask = oracle.time >= min(start + 30.0, oracle.duration_s * 0.99)
        rate = oracle.throughput(30.0)[mask]
        oracle_final_rate = float(np.median(rate)) if len(rate) else None
    per_client = [c.completions[-1] / duration if len(c.completions) else 0.0 for c in trace.clients]
    ratio = goodput / oracle_goodput if oracle_goodput else None
    summary: dict[str, Any] = {
        "goodput": goodput,
        "oracle_goodput": oracle_goodput,
        "goodput_ratio": ratio,
        "time_to_90pct_s": time_to_fraction(trace, oracle_final_rate) if oracle_final_rate else None,
        "oracle_time_to_90pct_s": (
            time_to_fraction(oracle, oracle_final_rate) if oracle is not None and oracle_final_rate else None
        ),
        "saturated_fraction": float(np.mean(trace.waiting_capacity > 0)) if len(trace.time) else 0.0,
        "queue_time_p50_s": _percentile(trace.queue_times, 50),
        "queue_time_p99_s": _percentile(trace.queue_times, 99),
        "oracle_queue_time_p99_s": _percentile(oracle.queue_times, 99) if oracle is not None else None,
        "latency_p99_s": _percentile(trace.latencies, 99),
        "oscillation": oscillation(trace),
        "jain_fairness": jain_index(per_client),
        "client_goodput_p5": _percentile(np.asarray(per_client), 5),
        "client_goodput_p50": _percentile(np.asarray(per_client), 50),
        "client_goodput_p95": _percentile(np.asarray(per_client), 95),
    }
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
