"""A job's runtime reads its lease book: in flight is what the workers hold, its calls are what they reported.

The Ray coordinator (ray_coordinator.py) and the lab's simulated job (lab/job.py) run the same ``ModelRuntime`` over
a :class:`~model_concurrency.lease.LeaseBook`; these two adapters are what makes the book look like the runtime's
limiter and call recorder, so both poll the same way and the lab measures the rule that ships.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from model_concurrency.controller import CallRecorder
from model_concurrency.gate.hold import AdmissionHold
from model_concurrency.gate.limiter import Usage, UsageMeter
from model_concurrency.lease import LeaseBook
from model_concurrency.observation import CallStats

__all__ = ["BookCalls", "BookLimits"]


class BookCalls(CallRecorder):
    """A job's call recorder: the workers' reports, summed by the book since the last poll."""

    def __init__(self, book: LeaseBook, lock: threading.RLock) -> None:
        super().__init__()
        self._book, self._book_lock = book, lock

    def drain(self) -> CallStats:
        with self._book_lock:
            return self._book.drain_stats()


class BookLimits:
    """A job runtime's limits: in flight is what the workers hold (the sum of outstanding grants), noted
    in a usage meter after every book call so the poll reads the interval's peak and mean. Nothing is admitted
    here; the limit and budget the runtime sets are the job's, which the book splits."""

    def __init__(self, book: LeaseBook, lock: threading.RLock, clock: Callable[[], float]) -> None:
        self.hold = AdmissionHold()
        self._book, self._lock, self._clock = book, lock, clock
        self._meter = UsageMeter(clock())
        self._limit = 1
        self.budget: int | None = None

    @property
    def limit(self) -> int:
        return self._limit

    def inflight(self) -> int:
        with self._lock:
            return self._book.inflight()

    def units(self) -> int:
        with self._lock:
            return self._book.ledger(tokens=True).outstanding

    def note(self) -> None:
        with self._lock:
            self._meter.note(self._book.inflight(), self._clock(), self._book.ledger(tokens=True).outstanding)

    def take_usage(self) -> Usage:
        with self._lock:
            self.note()
            return self._meter.take(self._clock())

    def resize(self, limit: int) -> None:
        self._limit = limit

    def set_budget(self, budget: int | None) -> None:
        self.budget = budget
