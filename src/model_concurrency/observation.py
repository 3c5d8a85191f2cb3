"""What one poll of one model saw: the only thing a policy is allowed to read.

An :class:`Observation` is built by the controller from an :class:`EngineSnapshot` (what a signal source read:
a live ``/metrics`` page, a Prometheus query, or the simulated engine) plus this process's own view (calls in
flight, latencies and outcomes of its own calls since the previous poll) and the controller's clock. Counters
arrive from the source as running totals and leave here as deltas since the previous poll, so a policy never
has to remember totals or care about counter resets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["CallStats", "EngineSnapshot", "Observation", "counter_delta", "observe"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSnapshot:
    """One reading of a model's engine-side signals, summed over engines (and replicas, for fleet sources).

    Gauges are instantaneous; fields ending in ``_total`` are cumulative counters as the engine exports them.
    ``None`` means the source did not report the signal at all, which is different from reporting zero.
    """

    running: float = 0.0
    waiting: float = 0.0
    waiting_capacity: float | None = None
    kv_cache_usage: float | None = None
    kv_num_blocks: int | None = None
    # Block count × block size, summed over engines: the tokens the KV caches hold (``vllm:cache_config_info``).
    kv_tokens: int | None = None
    preemptions_total: float | None = None
    success_total: float | None = None
    # ``vllm:generation_tokens_total``: a pooling (embedding) engine completes requests without generating any.
    generation_tokens_total: float | None = None
    queue_time_sum_total: float | None = None
    queue_time_count_total: float | None = None
    # ``vllm:e2e_request_latency_seconds_sum``: the seconds finished requests spent in the server. Its growth over
    # an interval divided by the interval is the mean number of requests in the server then (Little's law). Read
    # from pages for the hook-alone path only (runtime.engine_view); the simulated engine's own snapshot leaves it
    # out of its hot path, so it takes no part in comparing two snapshots.
    e2e_latency_sum_total: float | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallStats:
    """This process's own calls to the model that finished since the previous poll (recorded by the gate)."""

    calls: int = 0
    errors: int = 0
    throttled: int = 0
    latency_sum_s: float = 0.0
    latency_min_s: float | None = None
    # Latency of the calls that succeeded only: a 429 comes back in a round trip and would make the mean look
    # like room exactly when the server is pushing back (the guard's throttle cap needs the served calls' latency).
    ok_latency_sum_s: float = 0.0

    @property
    def latency_mean_s(self) -> float | None:
        return self.latency_sum_s / self.calls if self.calls else None

    @property
    def ok_latency_mean_s(self) -> float | None:
        ok = self.calls - self.errors
        return self.ok_latency_sum_s / ok if ok > 0 and self.ok_latency_sum_s > 0 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """One poll of one model, as a policy sees it.

    ``waiting_capacity`` is the by-reason "capacity" gauge when the engine exports it, else ``waiting``.
    Counter-derived fields (``preemptions``, ``completed``, ``generation_tokens``, ``queue_time_mean_s``) are
    deltas since the previous successful poll. ``generation_tokens`` 0 while ``completed`` > 0 is how a pooling
    (embedding) engine looks: each request finishes in the step that reads its prompt (see
    ``policies._common.one_step_engine``). ``client_*`` fields describe this process's own calls and are what a
    policy for an endpoint without ``/metrics`` (a hosted API) works from.

    ``inflight`` is this process's calls in flight at the poll (what share estimates compare with the engine's
    gauges, which are instantaneous too). ``inflight_peak`` and ``inflight_mean`` describe the whole interval
    since the previous poll: a window that was full at any moment of it was used, whichever moment the poll
    happened to be taken, so the application-limited rule reads the peak. The peak is never below ``inflight``;
    ``inflight_mean`` is None when nobody measured the interval (an Observation built by hand).
    ``inflight_tokens`` is the tokens (weights) our calls in flight hold at the poll; None when not measured, 0 when
    no call passed a weight. ``kv_tokens`` is the engines' KV capacity in tokens (block count × block size).
    """

    ok: bool = True
    running: float = 0.0
    waiting: float = 0.0
    waiting_capacity: float = 0.0
    kv_cache_usage: float | None = None
    kv_num_blocks: int | None = None
    kv_tokens: int | None = None
    preemptions: float = 0.0
    completed: float | None = None
    generation_tokens: float | None = None
    queue_time_mean_s: float | None = None
    inflight: int = 0
    inflight_peak: int = 0
    inflight_mean: float | None = None
    inflight_tokens: int | None = None
    time: float = 0.0
    client_calls: int = 0
    client_errors: int = 0
    client_throttled: int = 0
    client_latency_mean_s: float | None = None
    client_latency_min_s: float | None = None
    client_ok_latency_mean_s: float | None = None

    def __post_init__(self) -> None:
        if self.inflight_peak < self.inflight:
            object.__setattr__(self, "inflight_peak", self.inflight)


def counter_delta(now: float | None, before: float | None) -> float | None:
    if now is None or before is None:
        return None
    # A counter that went down was reset (engine restart): count from zero rather than report a negative delta.
    return now - before if now >= before else now


def observe(
    snapshot: EngineSnapshot | None,
    previous: EngineSnapshot | None,
    *,
    inflight: int,
    time: float,
    calls: CallStats | None = None,
    inflight_peak: int = 0,
    inflight_mean: float | None = None,
    inflight_tokens: int | None = None,
) -> Observation:
    """Combine a source's reading with this process's own view into an Observation.

    ``snapshot=None`` is a failed poll: the Observation carries only the client's own figures and ``ok=False``.
    """
    calls = calls or CallStats()
    client = {
        "inflight_peak": inflight_peak,
        "inflight_mean": inflight_mean,
        "inflight_tokens": inflight_tokens,
        "client_calls": calls.calls,
        "client_errors": calls.errors,
        "client_throttled": calls.throttled,
        "client_latency_mean_s": calls.latency_mean_s,
        "client_latency_min_s": calls.latency_min_s,
        "client_ok_latency_mean_s": calls.ok_latency_mean_s,
    }
    if snapshot is None:
        return Observation(ok=False, inflight=inflight, time=time, **client)  # type: ignore[arg-type]
    waiting_capacity = snapshot.waiting if snapshot.waiting_capacity is None else snapshot.waiting_capacity
    preemptions = completed = generated = queue_mean = None
    if previous is not None:
        preemptions = counter_delta(snapshot.preemptions_total, previous.preemptions_total)
        completed = counter_delta(snapshot.success_total, previous.success_total)
        generated = counter_delta(snapshot.generation_tokens_total, previous.generation_tokens_total)
        q_sum = counter_delta(snapshot.queue_time_sum_total, previous.queue_time_sum_total)
        q_count = counter_delta(snapshot.queue_time_count_total, previous.queue_time_count_total)
        if q_sum is not None and q_count and math.isfinite(q_sum):
            queue_mean = q_sum / q_count
    return Observation(
        ok=True,
        running=snapshot.running,
        waiting=snapshot.waiting,
        waiting_capacity=waiting_capacity,
        kv_cache_usage=snapshot.kv_cache_usage,
        kv_num_blocks=snapshot.kv_num_blocks,
        kv_tokens=snapshot.kv_tokens,
        preemptions=preemptions or 0.0,
        completed=completed,
        generation_tokens=generated,
        queue_time_mean_s=queue_mean,
        inflight=inflight,
        time=time,
        **client,  # type: ignore[arg-type]
    )
