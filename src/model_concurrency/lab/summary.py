"""Judging a run: goodput and queueing together, against the oracle.

Over-driving an engine gains no throughput, only queueing, preemptions and memory pressure, so no single number
decides; the summary puts goodput next to queue time, saturation and stability. Definitions (docs/results.md):

* ``goodput``: items completed per simulated second over the whole run, all clients;
* ``goodput_ratio``: ``goodput / oracle_goodput``;
* ``time_to_90pct_s``: from the last capacity change (or t=0) until the 10 s throughput first reaches 90 % of the
  oracle's settled throughput in that last phase (None if never). The window is shorter than a poll (12 s) on
  purpose: a trailing window of ``w`` seconds alone takes ``0.9 × w`` to report a step, so a 30 s window would
  score every policy, even one that reacted instantly, at 27 s or more;
* ``oracle_time_to_90pct_s``: the oracle's own figure on the same definition: what measurement and the engine's
  own ramp cost a client that knew the change in advance (the floor of ``time_to_90pct_s``);
* ``saturated_fraction``: share of trace samples with capacity-waiting requests;
* ``saturated_gateway_fraction``: share of trace samples where the Gateway API Inference Extension would call
  the pool saturated: the mean over engines of ``max(waiting / 5, kv / 0.8)`` reaches 1.0, an engine without
  fresh metrics (down, or the scenario's metrics outage) counting 1.0 (signals/saturation.py); None when the
  trace did not sample it;
* ``queue_time_p50_s`` / ``queue_time_p99_s``: engine queue time of the clients' requests;
* ``latency_p99_s``: their end-to-end latency;
* ``oscillation``: coefficient of variation of the summed target over the second half of the last phase;
* ``jain_fairness``: Jain's index of the clients' goodputs, ``(Σx)² / (n Σx²)``; 1.0 with one client;
* ``throttled_fraction``: calls refused with 429 over all calls sent (completed, failed, refused), whole run;
  ``throttled_fraction_after_60s`` the same from t = 60 s (a rate limit's bucket starts full, so the first
  minute is a burst no client can avoid learning from);
* ``limit_ratio``: with a ``[rate_limit]``, the goodput from t = 60 s over what the limit lets through
  (``min(rpm / 60, tpm / 60 / tokens per item)`` items per second); None without a limit;
* ``preemptions``: engine preemptions fleet-wide after the first minute (:data:`PREEMPTIONS_AFTER_S`): the first
  ramp may overshoot once, by design; after it a client that knows the KV cache should never make the engine
  evict and recompute a request.
* ``client_goodput_p5`` / ``_p50`` / ``_p95``: percentiles of the per-client goodputs (items/s over the run): with
  hundreds of clients, the spread Jain's single number hides (who starves, who hogs);
* ``first_ramp_overshoot``: the highest summed target of the first ramp (from t = 0 until the summed target first
  falls, within the first phase) over the oracle's highest summed target in that phase, its knee: above 1 the
  ramp drove the engines past what they can take, the overshoot a stated limit exists to prevent. None without an
  oracle.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from model_concurrency.lab.trace import Array, Trace
from model_concurrency.signals.saturation import STALE

__all__ = ["SUMMARY_KEYS", "jain_index", "summarize"]

SUMMARY_KEYS = (
    "goodput",
    "oracle_goodput",
    "goodput_ratio",
    "time_to_90pct_s",
    "oracle_time_to_90pct_s",
    "saturated_fraction",
    "saturated_gateway_fraction",
    "queue_time_p50_s",
    "queue_time_p99_s",
    "oracle_queue_time_p99_s",
    "latency_p99_s",
    "oscillation",
    "jain_fairness",
    "throttled_fraction",
    "throttled_fraction_after_60s",
    "limit_ratio",
    "preemptions",
    "client_goodput_p5",
    "client_goodput_p50",
    "client_goodput_p95",
    "first_ramp_overshoot",
)

AFTER_S = 60.0
PREEMPTIONS_AFTER_S = AFTER_S


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


def preemptions_after(trace: Trace, after_s: float) -> int:
    """Preemptions from ``after_s`` to the end of the run (the trace's cumulative count, sampled)."""
    if not len(trace.time) or not len(trace.preemptions):
        return 0
    start = int(np.searchsorted(trace.time, min(after_s, float(trace.time[-1])), side="left"))
    return round(float(trace.preemptions[-1] - trace.preemptions[start]))


def gateway_saturated_fraction(trace: Trace) -> float | None:
    """Share of samples whose gateway pool score is saturated (≥ 1.0); None when the trace lacks the series."""
    scores = trace.gateway_saturation
    if not len(trace.time) or len(scores) != len(trace.time):
        return None
    return float(np.mean(scores >= STALE))


def oscillation(trace: Trace) -> float:
    start = trace.capacity_changes[-1] if trace.capacity_changes else 0.0
    steady_from = start + (trace.duration_s - start) / 2
    mask = trace.time >= steady_from
    if not np.any(mask):
        return 0.0
    target = np.sum([c.target for c in trace.clients], axis=0)[mask]
    mean = float(target.mean())
    return float(target.std() / mean) if mean > 0 else 0.0


def first_ramp_overshoot(trace: Trace, oracle: Trace | None) -> float | None:
    """See the module docstring. Trace samples every ``trace_dt_s``: a peak between two samples is not seen."""
    if oracle is None or not trace.clients or not oracle.clients or not len(trace.time):
        return None
    end = trace.capacity_changes[0] if trace.capacity_changes else trace.duration_s
    total = np.sum([c.target for c in trace.clients], axis=0)[trace.time < end]
    knee = np.sum([c.target for c in oracle.clients], axis=0)[oracle.time < end]
    if not len(total) or not len(knee) or knee.max() <= 0:
        return None
    falls = np.flatnonzero(np.diff(total) < 0)
    ramp = total[: falls[0] + 1] if len(falls) else total
    return float(ramp.max() / knee.max())


def _throttling(trace: Trace) -> dict[str, float | None]:
    """Throttled shares and the goodput against the rate limit (see the module docstring)."""
    if not len(trace.time) or not trace.clients:
        return {"throttled_fraction": 0.0, "throttled_fraction_after_60s": 0.0, "limit_ratio": None}

    def total(name: str) -> Array:
        series = [getattr(c, name) for c in trace.clients]
        if any(len(x) != len(trace.time) for x in series):
            return np.zeros_like(trace.time)
        summed: Array = np.sum(series, axis=0)
        return summed

    throttled, done, failed = total("throttled"), total("completions"), total("errors")
    sent = throttled + done + failed
    cut = int(np.searchsorted(trace.time, AFTER_S))
    cut = min(cut, len(trace.time) - 1)
    sent_after = sent[-1] - sent[cut]
    ratio = None
    span = trace.time[-1] - trace.time[cut]
    if trace.limit_rps and span > 0:
        ratio = float((done[-1] - done[cut]) / span / trace.limit_rps)
    return {
        "throttled_fraction": float(throttled[-1] / sent[-1]) if sent[-1] else 0.0,
        "throttled_fraction_after_60s": float((throttled[-1] - throttled[cut]) / sent_after) if sent_after else 0.0,
        "limit_ratio": ratio,
    }


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
        "saturated_gateway_fraction": gateway_saturated_fraction(trace),
        "queue_time_p50_s": _percentile(trace.queue_times, 50),
        "queue_time_p99_s": _percentile(trace.queue_times, 99),
        "oracle_queue_time_p99_s": _percentile(oracle.queue_times, 99) if oracle is not None else None,
        "latency_p99_s": _percentile(trace.latencies, 99),
        "oscillation": oscillation(trace),
        "jain_fairness": jain_index(per_client),
        **_throttling(trace),
        "preemptions": preemptions_after(trace, PREEMPTIONS_AFTER_S),
        "client_goodput_p5": _percentile(np.asarray(per_client), 5),
        "client_goodput_p50": _percentile(np.asarray(per_client), 50),
        "client_goodput_p95": _percentile(np.asarray(per_client), 95),
        "first_ramp_overshoot": first_ramp_overshoot(trace, oracle),
    }
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
