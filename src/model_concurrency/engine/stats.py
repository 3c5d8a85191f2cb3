"""Counters and histograms one engine keeps, under the meaning vLLM gives them.

Only plain numbers live here; :mod:`.metrics` turns them into Prometheus families and :meth:`Engine.snapshot`
into an :class:`~model_concurrency.observation.EngineSnapshot`. Bucket bounds are vLLM V1's
(``vllm/v1/metrics/loggers.py``): the queue, e2e and phase histograms share one set (docs/reference vllm.md).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np

from model_concurrency.engine.request import ABORT, LENGTH, STOP, Request

__all__ = [
    "FINISHED_REASONS",
    "ITL_BUCKETS",
    "REQUEST_LATENCY_BUCKETS",
    "TTFT_BUCKETS",
    "EngineStats",
    "Histogram",
]

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISHED_REASONS = (STOP, LENGTH, ABORT)


class Histogram:
    """A Prometheus-style histogram: per-bucket counts (last one is +Inf), a sum and a count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def observe_n(self, value: float, n: int) -> None:
        """``n`` observations of the same value in O(log buckets): a decode step gives every sequence one ITL."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def observe_many(self, values: Sequence[float]) -> None:
        """Bucket a batch at once (numpy): how the engine folds per-request observations it deferred."""
        if not values:
            return
        array = np.asarray(values, dtype=float)
        index = np.searchsorted(np.asarray(self.bounds), array, side="left")
        for i, n in enumerate(np.bincount(index, minlength=len(self.counts)).tolist()):
            self.counts[i] += n
        self.sum += float(array.sum())
        self.count += len(values)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, cumulative count)`` pairs ending with ``(inf, count)``, as Prometheus exposes them."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class EngineStats:
    """Cumulative counters of one engine since it (re)started.

    Per-request histograms are filled lazily: the engine appends finished requests and first-token latencies to
    ``pending_*`` lists (one list append in the hot path instead of four bisections) and :meth:`fold` buckets them
    in one numpy pass whenever the stats are read (``Engine.stats``, a snapshot or a scrape). A reader therefore
    always sees every request that finished up to now, exactly as if each had been observed when it happened.
    """

    __slots__ = (
        "decode_time",
        "e2e",
        "finished",
        "generation_tokens",
        "itl",
        "num_preemptions",
        "pending_finished",
        "pending_ttft",
        "prefill_time",
        "prompt_tokens",
        "queue_time",
        "ttft",
    )

    def __init__(self) -> None:
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = dict.fromkeys(FINISHED_REASONS, 0)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prefill_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.pending_finished: list[Request] = []
        self.pending_ttft: list[float] = []

    def fold(self) -> None:
        """Bucket the deferred per-request observations (requests must not be resubmitted after finishing)."""
        if self.pending_ttft:
            self.ttft.observe_many(self.pending_ttft)
            self.pending_ttft = []
        done = self.pending_finished
        if not done:
            return
        self.pending_finished = []
        self.e2e.observe_many([r.finish_time - r.arrival_time for r in done])  # type: ignore[operator]
        self.queue_time.observe_many(
            [r.first_scheduled_time - r.queued_time for r in done if r.first_scheduled_time is not None]  # type: ignore[operator]
        )
        served = [r for r in done if r.first_token_time is not None and r.finished_reason != ABORT]
        self.prefill_time.observe_many([r.first_token_time - r.first_scheduled_time for r in served])  # type: ignore[operator]
        self.decode_time.observe_many([r.finish_time - r.first_token_time for r in served])  # type: ignore[operator]

    @property
    def success_total(self) -> int:
        """``vllm:request_success_total`` summed over ``finished_reason`` (aborts included, as vLLM counts them)."""
        return sum(self.finished.values())
