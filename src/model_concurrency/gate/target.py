"""What limit a fan-out obeys right now, re-read cheaply while it runs.

A :class:`Target` belongs to one fan-out call. It holds the model's
:class:`~model_concurrency.runtime.ModelRuntime` for the call's life: the runtime's limiter is the one every
slot is taken from, and its recorder gets every outcome. The first read may run a due poll (awaited on an event
loop, inline in a plain thread); after that the runtime's background poller keeps the target current while the
fan-out is registered as a user, and the fan-out only re-reads it (every :data:`REFRESH_EVERY` starts or
:data:`REFRESH_S` seconds) to follow growth with more workers. No poll ever rides on a completion.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable
from typing import Any

from model_concurrency.config import get_model
from model_concurrency.controller import THROTTLED
from model_concurrency.gate.model_limiter import ModelLimiter
from model_concurrency.gate.rejections import note_failure, note_success, outcome_of
from model_concurrency.gate.stats import GateStats, status_of
from model_concurrency.hooks import check_registered, warn_unknown
from model_concurrency.runtime import ModelRuntime, atarget_or_floor, runtime_for, target_or_floor

__all__ = [
    "REFRESH_EVERY",
    "REFRESH_S",
    "THROTTLED",
    "Target",
    "check_args",
    "check_registered",
    "check_weight",
    "checked_tokens",
    "note_throttle",
    "weigh",
]

log = logging.getLogger("model_concurrency")

REFRESH_EVERY = 16
REFRESH_S = 0.1


def check_args(capacity: int | None, timeout: float | None) -> None:
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
        raise ValueError(f"capacity must be an int >= 1 (or None to follow the model's target), got {capacity!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds per item (or None), got {timeout!r}")


def check_weight(weight: Callable[[Any], float] | None) -> None:
    if weight is not None and not callable(weight):
        raise TypeError(f"weight must be a callable mapping an item to its tokens (or None), got {weight!r}")


def weigh(weight: Callable[[Any], float], value: Any) -> int:
    """An item's units: ``weight(value)`` rounded up to whole tokens; a bad weight is a clear error for that item.

    The error stands in the item's place (it is never run), so nothing is lost and no slot is taken."""
    return checked_tokens(weight(value), f" for item {value!r}")


def checked_tokens(units: object, where: str = "") -> int:
    """Whole tokens from a finite number >= 0 (rounded up); anything else is a ValueError."""
    if isinstance(units, bool) or not isinstance(units, numbers.Real) or not math.isfinite(units) or units < 0:
        raise ValueError(f"a weight must be a finite number of tokens >= 0, got {units!r}{where}")
    return math.ceil(float(units))


class Target:
    """One fan-out's view of its model: runtime, limiter, current limit, and the outcome tally."""

    __slots__ = ("countdown", "limit", "model", "next_at", "pinned", "recorder", "runtime", "tally")

    def __init__(self, model: str | None, capacity: int | None) -> None:
        self.model = model
        if get_model(model) is None:
            warn_unknown(model)
        self.runtime: ModelRuntime = runtime_for(model)
        # Outcomes feed the next poll; a model that is never polled (no source) does not need them.
        self.recorder = self.runtime.calls if self.runtime.source is not None else None
        self.pinned = capacity
        self.limit = capacity or self.runtime.current()
        self.tally = GateStats()
        self.countdown = REFRESH_EVERY
        self.next_at = 0.0

    @property
    def key(self) -> str:
        return self.runtime.name

    @property
    def limiter(self) -> ModelLimiter:
        return self.runtime.limiter

    def due(self) -> bool:
        """Count one start; True when the target should be re-read."""
        self.countdown -= 1
        return self.countdown <= 0 or self.runtime.clock() >= self.next_at

    def start(self) -> int:
        """The fan-out begins: register as a user (scheduled polls from now on) and take a first reading."""
        self.runtime.enter()
        return self._apply(self.runtime.target)

    async def astart(self) -> int:
        """:meth:`start` on an event loop: a due first poll is awaited, never run on the loop's thread."""
        self.runtime.enter()
        target = await atarget_or_floor(self.model, self.runtime.floor, self.runtime.atarget)
        return self._apply(lambda: target)

    def stop(self) -> None:
        self.runtime.leave()

    def refresh(self) -> int:
        """Re-read the limit the poller keeps current (no I/O)."""
        return self._apply(self.runtime.current)

    def _apply(self, read: Callable[[], int]) -> int:
        """Read the target (``read`` may run a due poll), have the runtime apply it, and size the workers.

        The runtime is the limiter's one writer (under its lock); a fan-out only reads."""
        target_or_floor(self.model, self.runtime.floor, read)
        target = target_or_floor(self.model, self.runtime.floor, self.runtime.apply_limits)
        self.limit = self.pinned or target
        self.countdown = REFRESH_EVERY
        self.next_at = self.runtime.clock() + REFRESH_S
        return self.limit

    def record(self, latency_s: float, exc: BaseException | None) -> None:
        """Tally one finished call here and in the runtime's recorder for the next poll."""
        tally = self.tally
        tally.calls += 1
        tally.latency_sum_s += latency_s
        if latency_s > tally.latency_max_s:
            tally.latency_max_s = latency_s
        if exc is None:
            if self.recorder is not None:
                self.recorder.record(latency_s, ok=True)
            hold = self.runtime.limiter.hold
            hold.accepted()
            if hold.outage.active:
                note_success(self.runtime, self.runtime.clock() - latency_s)
            return
        status = status_of(exc)
        tally.add_error(exc, status)
        outcome = outcome_of(exc, None, None)
        if self.recorder is not None:
            self.recorder.record(latency_s, ok=False, status=status, throttled=outcome.throttled)
        note_failure(self.runtime, outcome, self.runtime.clock() - latency_s, answered=status is not None)


def note_throttle(runtime: ModelRuntime, status: int | None, exc: BaseException) -> None:
    """Hand a failed call to the model's runtime (the classification table, gate/rejections.py), as sent now.

    Kept for callers of the earlier name; :func:`~.rejections.note_failure` is the rule."""
    outcome = outcome_of(exc, None, None)
    note_failure(runtime, outcome, runtime.clock(), answered=status is not None)
