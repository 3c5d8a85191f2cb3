"""Per-model record of the gate's calls: counts, latency, error classes and HTTP statuses.

The controller's :class:`~model_concurrency.controller.CallRecorder` gets every call as it finishes (policies
read it at the next poll and it is drained there). This module keeps a cumulative view per model that is never
drained, for dashboards and tests. A fan-out tallies into its own :class:`GateStats` without locks (one loop, or
under its own lock in threads) and merges into the model's record when it ends.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from model_concurrency._fork import reset_in_forked_child

__all__ = ["GateStats", "gate_stats", "merge_stats", "reset_stats", "status_of"]


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (httpx/openai ``.response.status_code``, ``.status_code``, ``.status``)."""
    for holder in (getattr(exc, "response", None), exc):
        for attr in ("status_code", "status"):
            value = getattr(holder, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


@dataclass(slots=True)
class GateStats:
    """Cumulative outcome of a model's calls through the gate."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    latency_sum_s: float = 0.0
    latency_max_s: float = 0.0
    errors_by_type: dict[str, int] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)

    def add_error(self, exc: BaseException, status: int | None) -> None:
        self.errors += 1
        if isinstance(exc, TimeoutError):
            self.timeouts += 1
        name = type(exc).__name__
        self.errors_by_type[name] = self.errors_by_type.get(name, 0) + 1
        if status is not None:
            self.statuses[status] = self.statuses.get(status, 0) + 1

    def merge(self, other: GateStats) -> None:
        self.calls += other.calls
        self.errors += other.errors
        self.timeouts += other.timeouts
        self.latency_sum_s += other.latency_sum_s
        self.latency_max_s = max(self.latency_max_s, other.latency_max_s)
        for name, count in other.errors_by_type.items():
            self.errors_by_type[name] = self.errors_by_type.get(name, 0) + count
        for status, count in other.statuses.items():
            self.statuses[status] = self.statuses.get(status, 0) + count

    @property
    def latency_mean_s(self) -> float | None:
        return self.latency_sum_s / self.calls if self.calls else None


_books: dict[str, GateStats] = {}
_lock = threading.Lock()


# A parent thread may have held the lock at fork time; the child's copy would stay locked forever. The books are
# not cleared.
reset_in_forked_child(globals(), "_lock", threading.Lock)


def merge_stats(key: str, tally: GateStats) -> None:
    if not tally.calls:
        return
    with _lock:
        _books.setdefault(key, GateStats()).merge(tally)


def gate_stats(model: str) -> GateStats:
    """A copy of what the gate recorded for ``model`` (its registered name) since start or the last reset."""
    with _lock:
        book = _books.get(model) or GateStats()
        return replace(book, errors_by_type=dict(book.errors_by_type), statuses=dict(book.statuses))


def reset_stats() -> None:
    with _lock:
        _books.clear()
