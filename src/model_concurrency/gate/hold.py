"""The ``Retry-After`` rule: after a 429/503 that names a delay, no new call to that model starts before it ends.

Why a hold and not only a smaller target: a hosted endpoint that answered 429 will refuse whatever arrives before
its bucket refills, however few calls are in flight, so every call started early is a wasted, throttled call.
:class:`AdmissionHold` is the rule itself, pure and on a clock it is given: the live gate reads it on the
monotonic clock of the model's runtime, and the lab's simulated clients read it on SimPy time, so the lab
measures the rule production runs.

The gate's fronts (``map_concurrent``, ``map_concurrent_sync``, ``slot``) wait for the hold before they queue for a
slot and again once granted (a slot released during the hold may be handed straight to a waiter), so no call
starts while a hold is in force. Pinned fan-outs (``capacity=N``) wait too. The waits poll the clock in short
steps, so a hold that is extended meanwhile is honoured and a test's clock that jumps is followed.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

__all__ = [
    "MAX_RETRY_AFTER_S",
    "AdmissionHold",
    "retry_after_from_exception",
    "retry_after_from_headers",
    "wait_hold",
    "wait_hold_async",
]

# A longer Retry-After is capped here: a hold of minutes would look like a hang, and the next 429 extends it.
MAX_RETRY_AFTER_S = 120.0
# How long one wait step sleeps at most before reading the hold (and the caller's tick) again.
_STEP_S = 0.05


def check_retry_after(seconds: float) -> float:
    """A valid delay in seconds, capped at :data:`MAX_RETRY_AFTER_S`; ``ValueError`` for NaN, inf or negatives."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"retry-after must be a number of seconds, got {seconds!r}")
    value = float(seconds)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"retry-after must be a finite number of seconds >= 0, got {seconds!r}")
    return min(value, MAX_RETRY_AFTER_S)


class AdmissionHold:
    """The time before which no new call may start; extended by each ``note``, never shortened."""

    __slots__ = ("_lock", "holds", "until")

    def __init__(self) -> None:
        self.until = -math.inf
        self.holds = 0  # how many Retry-After notes extended the hold (for stats and tests)
        self._lock = threading.Lock()

    def note(self, seconds: float, now: float) -> float:
        """Hold admissions until ``now + seconds`` (validated and capped). Returns the deadline in force."""
        delay = check_retry_after(seconds)
        with self._lock:
            if now + delay > self.until:
                self.until = now + delay
                self.holds += 1
            return self.until

    def remaining(self, now: float) -> float:
        """Seconds until admissions may start again (0 when none is held)."""
        return max(0.0, self.until - now)


def retry_after_from_headers(headers: Mapping[str, str], now: Callable[[], datetime] | None = None) -> float | None:
    """The delay a response asks for: ``retry-after-ms``, else ``Retry-After`` (seconds or an HTTP date).

    None when there is none or it cannot be read (a malformed header is ignored, never raised: the response is
    still a 429 and counted as throttled).
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        value = (when - (now() if now is not None else datetime.now(UTC))).total_seconds()
        return max(0.0, value)
    return value if math.isfinite(value) and value >= 0 else None


def retry_after_from_exception(exc: BaseException) -> float | None:
    """The Retry-After an exception's HTTP response carried (httpx/openai errors keep the response)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None or not hasattr(headers, "items"):
        return None
    return retry_after_from_headers(headers)


def wait_hold(hold: AdmissionHold, clock: Callable[[], float], tick: Callable[[], None] | None = None) -> None:
    """Block this thread until the hold has passed, calling ``tick`` between steps (a fan-out follows its target)."""
    while (left := hold.remaining(clock())) > 0:
        time.sleep(min(left, _STEP_S))
        if tick is not None:
            tick()


async def wait_hold_async(hold: AdmissionHold, clock: Callable[[], float]) -> None:
    """Await the end of the hold without blocking the event loop."""
    while (left := hold.remaining(clock())) > 0:
        await asyncio.sleep(min(left, _STEP_S))
