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

The same hold carries the outage rule (gate/outage.py): while the model is unreachable its deadline is the next
probe, and a call that succeeds lifts it (:meth:`.outage.Outage.succeed`); a Retry-After deadline is never
shortened by that. :func:`hold_from_headers` reads every delay a rejection can name: ``retry-after-ms``,
``Retry-After`` (seconds or an HTTP date), and the hosted APIs' bucket resets (OpenAI's
``x-ratelimit-reset-{requests,tokens}`` durations such as ``6m0s``, Anthropic's
``anthropic-ratelimit-*-reset`` RFC 3339 times).
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from model_concurrency.gate.outage import Outage

__all__ = [
    "MAX_RETRY_AFTER_S",
    "AdmissionHold",
    "hold_from_headers",
    "parse_duration",
    "parse_reset_time",
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
    """The time before which no new call may start; extended by each ``note``, never shortened.

    ``outage`` is the outage rule's own state (gate/outage.py): its deadline (the next probe) counts here too, but
    is kept apart, so that lifting it when a call succeeds never shortens a Retry-After."""

    __slots__ = ("_lock", "holds", "outage", "until")

    def __init__(self) -> None:
        self.until = -math.inf
        self.holds = 0  # how many Retry-After notes extended the hold (for stats and tests)
        self.outage = Outage()
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
        return max(0.0, max(self.until, self.outage.until) - now)


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


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)")


def parse_duration(text: str) -> float | None:
    """Seconds in a Go-style duration as OpenAI's ``x-ratelimit-reset-*`` send them (``12ms``, ``1.5s``,
    ``6m0s``, ``1h2m3s``); a bare number is seconds. None when it cannot be read."""
    raw = text.strip().lower()
    try:
        value = float(raw)
    except ValueError:
        pos, value = 0, 0.0
        for match in _DURATION.finditer(raw):
            if match.start() != pos:
                return None
            pos = match.end()
            scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2)]
            value += float(match.group(1)) * scale
        if pos == 0 or pos != len(raw):
            return None
    return value if math.isfinite(value) and value >= 0 else None


def parse_reset_time(text: str, now: datetime) -> float | None:
    """Seconds from ``now`` until an RFC 3339 time (Anthropic's ``anthropic-ratelimit-*-reset``); 0 if past."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


_OPENAI_BUCKETS = ("requests", "tokens")
_ANTHROPIC_BUCKETS = ("requests", "tokens", "input-tokens", "output-tokens")


def hold_from_headers(headers: Mapping[str, str], now: Callable[[], datetime] | None = None) -> float | None:
    """The delay a rejection names: :func:`retry_after_from_headers` first; else the hosted APIs' bucket resets.

    A bucket with ``remaining`` 0 names when it refills; the longest of those is the delay (every empty bucket
    must refill). With no empty bucket reported, the earliest reset. None when nothing names a time.
    """
    explicit = retry_after_from_headers(headers, now)
    if explicit is not None:
        return explicit
    lowered = {k.lower(): v for k, v in headers.items()}
    wall = now() if now is not None else datetime.now(UTC)
    resets: list[tuple[bool, float]] = []  # (bucket empty, seconds until it refills)
    for bucket in _OPENAI_BUCKETS:
        reset = lowered.get(f"x-ratelimit-reset-{bucket}")
        seconds = parse_duration(reset) if reset is not None else None
        if seconds is not None:
            resets.append((lowered.get(f"x-ratelimit-remaining-{bucket}", "").strip() == "0", seconds))
    for bucket in _ANTHROPIC_BUCKETS:
        reset = lowered.get(f"anthropic-ratelimit-{bucket}-reset")
        seconds = parse_reset_time(reset, wall) if reset is not None else None
        if seconds is not None:
            resets.append((lowered.get(f"anthropic-ratelimit-{bucket}-remaining", "").strip() == "0", seconds))
    empty = [seconds for is_empty, seconds in resets if is_empty]
    if empty:
        return max(empty)
    return min((seconds for _, seconds in resets), default=None)


def retry_after_from_exception(exc: BaseException) -> float | None:
    """The Retry-After an exception's HTTP response carried (httpx/openai errors keep the response)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None or not hasattr(headers, "items"):
        return None
    return retry_after_from_headers(headers)


def wait_hold(hold: AdmissionHold, clock: Callable[[], float], tick: Callable[[], None] | None = None) -> None:
    """Block this thread until the hold has passed, calling ``tick`` between steps (a fan-out follows its target).

    Raises :class:`~.outage.ModelUnreachable` while the model has been unreachable for longer than
    ``max_outage_s`` (gate/outage.py); once the next probe is due the call goes ahead (it may be that probe)."""
    while (left := hold.remaining(now := clock())) > 0:
        hold.outage.check(now)
        time.sleep(min(left, _STEP_S))
        if tick is not None:
            tick()


async def wait_hold_async(hold: AdmissionHold, clock: Callable[[], float]) -> None:
    """Await the end of the hold without blocking the event loop (and raise as :func:`wait_hold` does)."""
    while (left := hold.remaining(now := clock())) > 0:
        hold.outage.check(now)
        await asyncio.sleep(min(left, _STEP_S))
