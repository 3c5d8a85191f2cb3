"""The previous reading's totals, kept by the source: what turns counters into an interval.

Counters and histograms are running totals on the engine; a policy wants what happened since the previous poll.
A source owns one :class:`IntervalMeter` and passes every successful reading through it, so the returned snapshot
carries its :class:`~model_concurrency.observation.Interval` (built by
:func:`~model_concurrency.observation.interval_between`, the one place deltas are taken). A failed read leaves the
meter alone: the next interval then spans from the last good reading. One meter per reader: two clients polling
the same engine each keep their own, since each asks about its own interval.
"""

from __future__ import annotations

import dataclasses
import threading

from model_concurrency.observation import EngineSnapshot, interval_between

__all__ = ["IntervalMeter"]


class IntervalMeter:
    """Keeps the previous snapshot; :meth:`advance` returns the new one with the interval since it."""

    __slots__ = ("_lock", "_previous")

    def __init__(self) -> None:
        self._previous: EngineSnapshot | None = None
        self._lock = threading.Lock()  # a sync read and an async read of one source may overlap

    def advance(self, snapshot: EngineSnapshot) -> EngineSnapshot:
        """``snapshot`` with ``interval`` set (None on the first reading); it becomes the previous reading."""
        with self._lock:
            previous, self._previous = self._previous, snapshot
        return dataclasses.replace(snapshot, interval=interval_between(previous, snapshot))

    def forget(self) -> None:
        """Drop the previous reading (the next interval is unknown until a second reading)."""
        with self._lock:
            self._previous = None
