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

The same hold carries the outage rule (:class:`Outage`, described in gate/outage.py): while the model is
unreachable its deadline is the next probe, and a call that succeeds lifts it; a Retry-After deadline is never
shortened by that. The delays a rejection can name are read by gate/outcome.py (:func:`hold_from_headers`:
``retry-after-ms``, ``Retry-After`` as seconds or an HTTP date, the hosted APIs' bucket resets), re-exported here.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable

from model_concurrency.gate.outcome import (
    hold_from_headers,
    parse_duration,
    parse_reset_time,
    retry_after_from_headers,
)
from model_concurrency.knobs import MAX_OUTAGE_S

__all__ = [
    "FIRST_PROBE_S",
    "HOLD_BACKOFF_MAX_S",
    "HOLD_DECAY",
    "HOLD_FACTOR_MAX",
    "MAX_OUTAGE_S",
    "MAX_PROBE_S",
    "MAX_RETRY_AFTER_S",
    "AdmissionHold",
    "ModelUnreachable",
    "Outage",
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
# The backoff on refusals that repeat at the floor (AdmissionHold.note): each accepted call shrinks the factor by
# this, so refusals settle near ln(1 / 0.999) / ln 2 = 0.14 % of accepted calls; a faster decay leaves many more
# calls refused after the first minute on the generator's draws that repeat refusals (``model-concurrency fuzz``).
HOLD_DECAY = 0.999
# The most the factor grows, 2^10: for floors many times what the limit admits (15 clients of floor 12 beside a
# limit of 15 calls a second).
HOLD_FACTOR_MAX = 1024.0
# The backoff never holds longer than this; a delay the server names is honoured as named. Hosted APIs' buckets
# hold a minute's worth, so half a minute wastes none of it and the burst that follows finds it full. With holds
# of up to MAX_RETRY_AFTER_S, 4 clients of floor 16 behind 2 calls a second reached 0.73 of the limit.
HOLD_BACKOFF_MAX_S = 30.0
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


FIRST_PROBE_S = 0.25
MAX_PROBE_S = 2.0


class ModelUnreachable(RuntimeError):
    """An item waited for a model that has been unreachable for longer than ``max_outage_s``."""


class Outage:
    """One model's outage state: since when, the next probe, the backoff. Thread-safe; no clock of its own."""

    __slots__ = ("_lock", "backoff_s", "max_s", "noted_at", "opened", "probes_failed", "reason", "since", "until")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        self.until = -math.inf
        self.noted_at = -math.inf
        self.backoff_s = FIRST_PROBE_S
        self.max_s = MAX_OUTAGE_S[1]
        self.reason = ""
        self.opened = 0  # outages so far (tests, stats)
        self.probes_failed = 0

    @property
    def active(self) -> bool:
        return self.since is not None

    def fail(self, sent_at: float, now: float, reason: str, max_s: float) -> bool:
        """A call failed as an outage. True when this opened the outage (the caller pins its limiter to 1).

        ``max_s`` <= 0: the rule is off and nothing happens."""
        if not max_s > 0:
            return False
        with self._lock:
            if self.since is None:
                self.since, self.reason, self.max_s = now, reason, max_s
                self.backoff_s = FIRST_PROBE_S
                self.noted_at = now
                self.until = now + self.backoff_s
                self.opened += 1
                return True
            if sent_at >= self.noted_at:  # a probe, sent after the last deadline was set, failed: back off
                self.backoff_s = min(2 * self.backoff_s, MAX_PROBE_S)
                self.until = now + self.backoff_s
                self.noted_at = now
                self.reason = reason
                self.probes_failed += 1
            return False

    def succeed(self, sent_at: float) -> bool:
        """A call sent at ``sent_at`` succeeded. True when this ended an outage (the caller restores its limiter).

        A call sent before the outage opened says the model *was* reachable then, not that it is now: no change."""
        if self.since is None:
            return False
        with self._lock:
            if self.since is None or sent_at < self.since:
                return False
            self.since = None
            self.until = -math.inf
            self.noted_at = -math.inf
            return True

    def check(self, now: float) -> None:
        """Raise :class:`ModelUnreachable` when the outage has lasted longer than its ``max_outage_s``."""
        since = self.since
        if since is not None and now - since > self.max_s:
            raise ModelUnreachable(
                f"the model has been unreachable for {now - since:.1f} s (more than max_outage_s = {self.max_s:g} s,"
                f" MODEL_CONCURRENCY_MAX_OUTAGE_S): {self.reason}"
            )


class AdmissionHold:
    """The time before which no new call may start; extended by each ``note``, never shortened.

    **The backoff** (``note(..., backoff=True)``: the runtime asks for it only while its target stands at the
    floor). An exact Retry-After is the time until the bucket's next token. Every call waiting out the hold, and
    every client told the same instant, start together when it ends; one is admitted, the rest are refused and held
    again. Above the floor the target falls to what the limit admits (the throttle cut, the guard's throttle cap)
    and that stops it; at the floor nothing does. On the generator's draws where a rate limit binds, 74-99 % of
    calls were refused after the first minute, through floors above what the limit admits or several clients
    sharing it (tests/test_lab_ratelimit.py runs such a case). So at the floor each refusal holds for its delay times
    ``factor``; a refusal that comes after the hold in force ended (the calls sent after it were refused again)
    doubles ``factor``, up to :data:`HOLD_FACTOR_MAX`, and each accepted call shrinks it by :data:`HOLD_DECAY`.
    A longer hold lets the bucket fill for the burst that follows it. Not above the floor: there a long hold reads
    to the guard as a low allowed rate, the cap falls with it, and the bundled ``rate-limited`` (one client) fell
    to 0.63 of the limit on one of its three seeds.

    ``outage`` is the outage rule's own state (gate/outage.py): its deadline (the next probe) counts here too, but
    is kept apart, so that lifting it when a call succeeds never shortens a Retry-After."""

    __slots__ = ("_lock", "factor", "holds", "outage", "until")

    def __init__(self) -> None:
        self.until = -math.inf
        self.holds = 0  # how many Retry-After notes extended the hold (for stats and tests)
        self.factor = 1.0  # the backoff at the floor (written under the lock)
        self.outage = Outage()
        self._lock = threading.Lock()

    def note(self, seconds: float, now: float, *, backoff: bool = False) -> float:
        """Hold admissions until ``now + seconds`` (validated, capped at :data:`MAX_RETRY_AFTER_S`); with
        ``backoff``, ``seconds × factor`` up to :data:`HOLD_BACKOFF_MAX_S`, and the factor doubles if the hold in
        force had ended. Returns the deadline in force."""
        delay = check_retry_after(seconds)
        with self._lock:
            if backoff:
                delay = max(delay, min(delay * self.factor, HOLD_BACKOFF_MAX_S))
                if now >= self.until:
                    self.factor = min(HOLD_FACTOR_MAX, self.factor * 2.0)
            if now + delay > self.until:
                self.until = now + delay
                self.holds += 1
            return self.until

    def accepted(self) -> None:
        """A call was accepted: the backoff shrinks by :data:`HOLD_DECAY` (nothing to do, and no lock, at 1)."""
        if self.factor > 1.0:
            with self._lock:
                self.factor = max(1.0, self.factor * HOLD_DECAY)

    def remaining(self, now: float) -> float:
        """Seconds until admissions may start again (0 when none is held)."""
        return max(0.0, max(self.until, self.outage.until) - now)


def retry_after_from_exception(exc: BaseException) -> float | None:
    """The Retry-After an exception's HTTP response carried (httpx/openai errors keep the response)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None or not hasattr(headers, "items"):
        return None
    return retry_after_from_headers(headers)


def wait_hold(hold: AdmissionHold, clock: Callable[[], float], tick: Callable[[], None] | None = None) -> None:
    """Block this thread until the hold has passed, calling ``tick`` between steps (a fan-out follows its target).

    Raises :class:`ModelUnreachable` while the model has been unreachable for longer than
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
