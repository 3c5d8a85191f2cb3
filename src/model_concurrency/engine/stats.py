"""Counters and histograms one engine keeps, under the meaning vLLM gives them.

Only plain numbers live here; :mod:`.metrics` turns them into Prometheus families and :meth:`Engine.snapshot`
into an :class:`~model_concurrency.observation.EngineSnapshot`. Bucket bounds are vLLM V1's
(``vllm/v1/metrics/loggers.py``): the queue, e2e and phase histograms share one set (docs/reference vllm.md).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence

import numpy as np

from model_concurrency.engine.request import ABORT, LENGTH, STOP, Request

__all__ = [
    "FINISHED_REASONS",
    "FOLD_EVERY",
    "ITL_BUCKETS",
    "NUMPY_FROM",
    "REQUEST_LATENCY_BUCKETS",
    "TTFT_BUCKETS",
    "ClassLatency",
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
# The engine folds deferred observations once this many finished requests are pending (bounded memory). The fold
# points fix how each histogram's float ``sum`` is accumulated, so changing this changes results in the last bits.
FOLD_EVERY = 8192
# Batches shorter than this are folded without numpy (Histogram.observe_many): numpy's sum of fewer than 8 values
# is a plain left-to-right sum, so both paths give the same bits.
NUMPY_FROM = 8


class Histogram:
    """A Prometheus-style histogram: per-bucket counts (last one is +Inf), a sum and a count."""

    __slots__ = ("_bounds_array", "bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._bounds_array = np.asarray(bounds, dtype=float)
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def observe_many(self, values: Sequence[float]) -> None:
        """Bucket a batch at once (numpy): how the engine folds per-request observations it deferred.

        A batch shorter than :data:`NUMPY_FROM` is bucketed in plain Python instead: every poll of a fleet reads
        (and so folds) every engine, usually a request or two each, and a numpy call costs ~10 µs against ~1 µs.
        The result is bit-identical: below 8 values numpy's pairwise sum is a plain left-to-right sum from 0.0,
        which the loop repeats (``tests/test_engine_stats_fold.py`` holds numpy to that)."""
        n = len(values)
        if not n:
            return
        if n < NUMPY_FROM:
            counts, bounds = self.counts, self.bounds
            acc = 0.0
            for value in values:
                counts[bisect_left(bounds, value)] += 1
                acc += value
            self.sum += acc
            self.count += n
            return
        array = np.asarray(values, dtype=float)
        index = np.searchsorted(self._bounds_array, array, side="left")
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


class ClassLatency:
    """Per-request latencies of one request class (``Request.request_class``), in finishing order.

    ``arrival``: when the request reached the server; ``ttft``: its time to first token; ``itl``: its mean
    inter-token latency (decode time over tokens after the first; NaN for a one-token answer). Aborted requests
    are left out. The lab reads these to judge a neighbour's latency apart from the batch beside it."""

    __slots__ = ("arrival", "itl", "ttft")

    def __init__(self) -> None:
        self.arrival: list[float] = []
        self.ttft: list[float] = []
        self.itl: list[float] = []

    def add(self, r: Request) -> None:
        first, arrival, finish = r.first_token_time, r.arrival_time, r.finish_time
        if first is None or arrival is None or finish is None or r.finished_reason == ABORT:
            return
        self.arrival.append(arrival)
        self.ttft.append(first - arrival)
        self.itl.append((finish - first) / (r.generated - 1) if r.generated > 1 else float("nan"))


class EngineStats:
    """Cumulative counters of one engine since it (re)started.

    Per-request bookkeeping is deferred: the engine's hot path only appends a request to ``pending_first`` when it
    gets its first token and to ``pending_finished`` when it finishes (one list append each), and :meth:`fold`
    turns those lists into the TTFT, e2e, queue, prefill and decode histograms, ``prompt_tokens`` and the
    ``finished`` counts in a few list comprehensions and numpy passes. ``finished`` and ``prompt_tokens`` are
    properties that fold first, and ``Engine.stats``, snapshots and scrapes fold too, so a reader always sees every
    request up to now, exactly as if each had been counted when it happened. Folds happen at every read and every
    :data:`FOLD_EVERY` finished requests, so each histogram's float ``sum`` is accumulated in fixed batches.
    """

    __slots__ = (
        "_finished",
        "_prompt_tokens",
        "classes",
        "decode_time",
        "e2e",
        "generation_tokens",
        "itl",
        "num_preemptions",
        "pending_finished",
        "pending_first",
        "prefill_time",
        "queue_time",
        "ttft",
    )

    def __init__(self) -> None:
        self.num_preemptions = 0
        self._prompt_tokens = 0
        self.generation_tokens = 0
        self._finished: dict[str, int] = dict.fromkeys(FINISHED_REASONS, 0)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prefill_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.pending_finished: list[Request] = []
        self.pending_first: list[Request] = []
        # TTFT and inter-token latency per request class, for requests that carry one (Request.request_class).
        self.classes: dict[str, ClassLatency] = {}

    @property
    def finished(self) -> dict[str, int]:
        """``vllm:request_success_total`` by ``finished_reason`` (stop, length, abort, then any other reason)."""
        self.fold()
        return self._finished

    @property
    def prompt_tokens(self) -> int:
        """``vllm:prompt_tokens_total``: prompt tokens of requests that got their first token."""
        self.fold()
        return self._prompt_tokens

    def fold(self) -> None:
        """Bucket the deferred per-request observations (requests must not be resubmitted after finishing).

        Values are computed exactly as the per-request code would (``first_token_time − arrival_time`` is the
        ``now − arrival_time`` of the step that produced the first token), in the same order, so counts and float
        sums are bit-identical. List comprehensions, not ``map(attrgetter)`` or arrays of tuples: on Python 3.11
        they are the fastest way to pull a slot out of thousands of objects (~25 ns each).
        """
        first = self.pending_first
        if first:
            self.pending_first = []
            if len(first) < NUMPY_FROM:  # Histogram.observe_many's plain path, value by value (same bits)
                ttft = self.ttft
                counts, bounds = ttft.counts, ttft.bounds
                acc = 0.0
                prompt_tokens = 0
                for r in first:
                    value = r.first_token_time - r.arrival_time  # type: ignore[operator]
                    counts[bisect_left(bounds, value)] += 1
                    acc += value
                    prompt_tokens += r.prompt_tokens
                ttft.sum += acc
                ttft.count += len(first)
                self._prompt_tokens += prompt_tokens
            else:
                self.ttft.observe_many([r.first_token_time - r.arrival_time for r in first])  # type: ignore[operator]
                self._prompt_tokens += sum([r.prompt_tokens for r in first])
        done = self.pending_finished
        if not done:
            return
        self.pending_finished = []
        for r in done:
            if r.request_class is not None:
                self._classed(r)
        if len(done) < NUMPY_FROM:
            self._fold_few(done)
            return
        finished = self._finished
        # Counter keeps first-seen order, so new reasons enter ``finished`` in the order they would one by one.
        for reason, n in Counter([r.finished_reason for r in done]).items():
            finished[reason] = finished.get(reason, 0) + n  # type: ignore[index,arg-type]
        self.e2e.observe_many([r.finish_time - r.arrival_time for r in done])  # type: ignore[operator]
        self.queue_time.observe_many(
            [r.first_scheduled_time - r.queued_time for r in done if r.first_scheduled_time is not None]  # type: ignore[operator]
        )
        served = [r for r in done if r.first_token_time is not None and r.finished_reason != ABORT]
        self.prefill_time.observe_many([r.first_token_time - r.first_scheduled_time for r in served])  # type: ignore[operator]
        self.decode_time.observe_many([r.finish_time - r.first_token_time for r in served])  # type: ignore[operator]

    def _classed(self, r: Request) -> None:
        latency = self.classes.get(r.request_class)  # type: ignore[arg-type]
        if latency is None:
            latency = self.classes[r.request_class] = ClassLatency()  # type: ignore[index]
        latency.add(r)

    def _fold_few(self, done: list[Request]) -> None:
        """:meth:`fold` of fewer than :data:`NUMPY_FROM` finished requests in one pass, without lists or Counter.

        A fleet's polls fold every engine they read, a request or two each. Every histogram then takes the plain
        path of :meth:`Histogram.observe_many` (its batch is no longer than ``done``), which this repeats value by
        value in the same order: counts, ``sum += (0.0 + v1 + v2 ...)`` and reasons in first-seen order alike."""
        finished = self._finished
        e2e, queue, prefill, decode = self.e2e, self.queue_time, self.prefill_time, self.decode_time
        bounds = e2e.bounds  # the four share REQUEST_LATENCY_BUCKETS
        e2e_counts, queue_counts, prefill_counts, decode_counts = (
            e2e.counts,
            queue.counts,
            prefill.counts,
            decode.counts,
        )
        e2e_acc = queue_acc = prefill_acc = decode_acc = 0.0
        queued = served = 0
        for r in done:
            reason = r.finished_reason
            finished[reason] = finished.get(reason, 0) + 1  # type: ignore[index,arg-type]
            finish = r.finish_time
            value = finish - r.arrival_time  # type: ignore[operator]
            e2e_counts[bisect_left(bounds, value)] += 1
            e2e_acc += value
            scheduled = r.first_scheduled_time
            if scheduled is not None:
                value = scheduled - r.queued_time  # type: ignore[operator]
                queue_counts[bisect_left(bounds, value)] += 1
                queue_acc += value
                queued += 1
            first = r.first_token_time
            if first is not None and reason != ABORT:
                value = first - scheduled  # type: ignore[operator]
                prefill_counts[bisect_left(bounds, value)] += 1
                prefill_acc += value
                value = finish - first  # type: ignore[operator]
                decode_counts[bisect_left(bounds, value)] += 1
                decode_acc += value
                served += 1
        e2e.sum += e2e_acc
        e2e.count += len(done)
        if queued:
            queue.sum += queue_acc
            queue.count += queued
        if served:
            prefill.sum += prefill_acc
            prefill.count += served
            decode.sum += decode_acc
            decode.count += served

    @property
    def success_total(self) -> int:
        """``vllm:request_success_total`` summed over ``finished_reason`` (aborts included, as vLLM counts them)."""
        return sum(self.finished.values())
