"""What one poll of one model saw: the only thing a policy is allowed to read.

An :class:`Observation` is built by the controller from an :class:`EngineSnapshot` (what a signal source read:
a live ``/metrics`` page, a Prometheus query, or the simulated engine) plus this process's own view (calls in
flight, latencies and outcomes of its own calls since the previous poll) and the controller's clock. Counters
arrive from the source as running totals and leave here as an :class:`Interval`: what happened since the previous
poll (requests started and how long they waited, from the queue-time histogram's bucket deltas; preemptions;
completions), so a policy never has to remember totals or care about counter resets. The source keeps the previous
totals (:class:`~model_concurrency.signals.interval.IntervalMeter`); a counter that went backwards is an engine
restart, and the interval is then unknown, never negative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CallStats",
    "EngineLimits",
    "EngineSnapshot",
    "Interval",
    "Observation",
    "counter_delta",
    "interval_between",
    "observe",
]

# ``(upper bound in seconds, cumulative count)`` pairs of a histogram, ending with ``(inf, count)``.
Buckets = tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """What the engine's counters say happened between two successful polls (deltas, never negative).

    ``known`` False: some counter went backwards (an engine restarted in between), so nothing is known about the
    interval; every delta is then None. ``started`` is the requests that left the queue (the queue-time
    histogram's count delta) and ``queue_waits`` how long they waited, as cumulative bucket deltas.
    """

    known: bool = True
    preemptions: float | None = None
    completed: float | None = None
    generation_tokens: float | None = None
    started: float | None = None
    queue_time_sum_s: float | None = None
    queue_waits: Buckets | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLimits:
    """What is known of the engines' own limits, in the units a policy compares with the snapshot's gauges.

    ``running`` is summed over the engines a snapshot reads, so the limits it is compared with are too:

    * ``max_num_seqs``: the sequence slots of all those engines together (vLLM's ``--max-num-seqs``, SGLang's
      ``max_running_requests``, times the engines); ``running`` cannot exceed it;
    * ``max_num_batched_tokens``: the token budget of **one engine's one step** (vLLM's
      ``--max-num-batched-tokens``), not a total: it bounds how much prefill a step carries, whatever the
      engine count, so adding engines does not change what one step can take;
    * ``kv_cache_tokens``: the KV-cache tokens of all those engines together;
    * ``kv_cache_max_concurrency``: requests of ``max_model_len`` tokens whose KV fits at once, all engines
      together (vLLM from 0.24).

    None: nobody said. ``source`` names, per known field, where it came from: ``"stated"`` (the operator's spec),
    ``"sglang /v1/loads"``, ``"sglang /metrics"`` or ``"vllm cache_config_info"``. Treat it as read-only.
    """

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    source: dict[str, str] = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict[str, Any]:
        """The known limits and their sources, JSON-ready (``get_utilization(model)["limits"]``)."""
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_max_concurrency": self.kv_cache_max_concurrency,
            "source": dict(self.source),
        }


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
    # ``vllm:request_queue_time_seconds_bucket`` summed over engines by ``le``: cumulative (bound, count) pairs.
    queue_time_buckets: Buckets | None = None
    # Set by a source that keeps the previous totals (IntervalMeter): the interval since its previous reading.
    interval: Interval | None = None
    # ``vllm:e2e_request_latency_seconds_sum``: the seconds finished requests spent in the server. Its growth over
    # an interval divided by the interval is the mean number of requests in the server then (Little's law). Read
    # from pages for the hook-alone path only (runtime.engine_view); the simulated engine's own snapshot leaves it
    # out of its hot path, so it takes no part in comparing two snapshots.
    e2e_latency_sum_total: float | None = field(default=None, compare=False)
    # The Gateway API Inference Extension's pool score (signals/saturation.py), read beside ours for operators;
    # no policy reads it, and it takes no part in equality (the simulated engine, whose snapshots are compared with
    # parsed pages, does not compute it). None when the source cannot tell engines apart (a PromQL sum).
    gateway_saturation: float | None = field(default=None, compare=False)
    # The engines' limits the page (or a request beside it, SGLang's /v1/loads) states. Out of equality: the
    # simulated engine's snapshot, compared with its parsed page, does not restate what its page's labels carry.
    limits: EngineLimits | None = field(default=None, compare=False)


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
    # Failed calls that say the server is overloaded or broken without being a refusal: 408, a 5xx other than 503,
    # or no status at all (a dropped connection). Not a 400: a request the model can never take says nothing of
    # load (the peers that react to "errors" react to these: AIBrix's 408/5xx, batch-gateway's 5xx).
    server_errors: int = 0

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

    ``started`` and ``queue_waits`` are the interval's requests that left the engine's queue and how long they
    waited (cumulative bucket deltas; :meth:`waited_over` reads them). ``interval_known`` False: an engine restarted
    since the previous poll, so every counter-derived field is None (``preemptions`` 0).
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
    started: float | None = None
    queue_waits: Buckets | None = None
    interval_known: bool = True
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
    client_server_errors: int = 0
    limits: EngineLimits | None = None

    def __post_init__(self) -> None:
        if self.inflight_peak < self.inflight:
            object.__setattr__(self, "inflight_peak", self.inflight)

    def waited_over(self, seconds: float) -> float | None:
        """The fraction of the interval's started requests that waited longer than ``seconds`` in the queue.

        Read at the largest bucket bound not above ``seconds`` (the smallest bound if none is), so between bounds
        it counts a little more than the exact fraction. None when nothing started or the histogram is absent.
        """
        waits = self.queue_waits
        if not waits or not waits[-1][1]:
            return None
        below = [count for bound, count in waits if bound <= seconds] or [waits[0][1]]
        return max(0.0, waits[-1][1] - below[-1]) / waits[-1][1]


class _Backwards(Exception):
    """A counter went down between two readings: the engine restarted."""


def counter_delta(now: float | None, before: float | None) -> float | None:
    """How much a counter grew between two readings; None when either is missing or it went backwards (a restart:
    the restarted engine's total is not what happened since the earlier reading)."""
    if now is None or before is None or now < before:
        return None
    return now - before


def _delta(now: float | None, before: float | None) -> float | None:
    if now is not None and before is not None and now < before:
        raise _Backwards
    return counter_delta(now, before)


def _bucket_deltas(now: Buckets | None, before: Buckets | None) -> Buckets | None:
    if now is None or before is None or [b for b, _ in now] != [b for b, _ in before]:
        return None  # absent, or the bounds changed (a different release): no comparable interval
    return tuple((bound, _delta(count, old) or 0.0) for (bound, count), (_, old) in zip(now, before, strict=True))


def interval_between(previous: EngineSnapshot | None, snapshot: EngineSnapshot) -> Interval | None:
    """The interval from ``previous`` to ``snapshot`` (None before the first pair of readings).

    A counter that went backwards (an engine restart) makes the interval unknown (``known=False``), never
    negative and never counted from zero: the restarted engine's total is not what happened since the last poll.
    """
    if previous is None:
        return None
    try:
        q_sum = _delta(snapshot.queue_time_sum_total, previous.queue_time_sum_total)
        return Interval(
            preemptions=_delta(snapshot.preemptions_total, previous.preemptions_total),
            completed=_delta(snapshot.success_total, previous.success_total),
            generation_tokens=_delta(snapshot.generation_tokens_total, previous.generation_tokens_total),
            started=_delta(snapshot.queue_time_count_total, previous.queue_time_count_total),
            queue_time_sum_s=q_sum if q_sum is None or math.isfinite(q_sum) else None,
            queue_waits=_bucket_deltas(snapshot.queue_time_buckets, previous.queue_time_buckets),
        )
    except _Backwards:
        return Interval(known=False)


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
    limits: EngineLimits | None = None,
) -> Observation:
    """Combine a source's reading with this process's own view into an Observation.

    The interval is the one the source measured (``snapshot.interval``), else the one from ``previous`` (for a
    source that keeps no totals). ``snapshot=None`` is a failed poll: the Observation carries only the client's own
    figures and ``ok=False``. ``limits``: the merged limits (the runtime's); without them, the snapshot's own.
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
        "client_server_errors": calls.server_errors,
        "limits": limits if limits is not None or snapshot is None else snapshot.limits,
    }
    if snapshot is None:
        return Observation(ok=False, inflight=inflight, time=time, **client)  # type: ignore[arg-type]
    waiting_capacity = snapshot.waiting if snapshot.waiting_capacity is None else snapshot.waiting_capacity
    interval = snapshot.interval if snapshot.interval is not None else interval_between(previous, snapshot)
    interval = interval or Interval()
    q_sum, started = interval.queue_time_sum_s, interval.started
    return Observation(
        ok=True,
        running=snapshot.running,
        waiting=snapshot.waiting,
        waiting_capacity=waiting_capacity,
        kv_cache_usage=snapshot.kv_cache_usage,
        kv_num_blocks=snapshot.kv_num_blocks,
        kv_tokens=snapshot.kv_tokens,
        preemptions=interval.preemptions or 0.0,
        completed=interval.completed,
        generation_tokens=interval.generation_tokens,
        queue_time_mean_s=q_sum / started if q_sum is not None and started else None,
        started=started,
        queue_waits=interval.queue_waits,
        interval_known=interval.known,
        inflight=inflight,
        time=time,
        **client,  # type: ignore[arg-type]
    )
