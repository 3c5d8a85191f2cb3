"""The limiter core: pure bookkeeping for a resizable concurrency limit, shared by every front-end.

No locks, no futures, no clock: a front-end (asyncio, threads, SimPy) holds a lock around these calls and turns
the waiters they hand back into wake-ups. Because the invariant lives here once, the stateful hypothesis test of
this class covers all three worlds.

Rules, after trio's CapacityLimiter (see docs/architecture.md):

* a call starts only while ``inflight < limit``; holders are never revoked, so after a shrink nobody new starts
  until ``inflight`` falls below the new limit, and after a growth waiters start at once;
* admission is FIFO with hand-off: a freed slot goes to the oldest waiter *before* it wakes, so nobody can jump
  the queue between the release and the wake-up;
* ``admit`` computes ``min(waiting, limit - inflight)`` from the slots actually held, so shrink-then-grow with
  holders still in cannot over-admit (the anyio bug: 4 holders, 4 → 1 → 3 admitted 6 against a limit of 3);
* a waiter cancelled after it was granted must hand its slot back with :meth:`release`;
* a *pinned* slot (:meth:`acquire_pinned`, for a fan-out that passed ``capacity=``) is counted but not gated: it
  may push ``inflight`` above the limit, which holds every gated caller back until the count drains.

Units (the engine's second limit, its token budget): each acquire may carry ``units`` (a request's tokens) against an
optional ``budget``. A call starts while both the count and ``units held + its units <= budget`` fit; the same
FIFO, hand-off and shrink rules hold for the budget. A call larger than what is left waits at the head of the
queue (nobody overtakes it) until nothing is in flight, then runs alone, so even one larger than the whole budget
never starves. Zero units (every unweighted call) never touch the budget, and ``budget=None`` is not enforced:
without weights the core is exactly the count limiter above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["CoreReadings", "LimiterCore", "Usage", "UsageMeter"]

W = TypeVar("W")


class LimiterCore(Generic[W]):
    """FIFO waiters, an in-flight count and the units they hold, against limits that may change at any time."""

    __slots__ = ("_budget", "_limit", "_waiters", "inflight", "units")

    def __init__(self, limit: int, budget: int | None = None) -> None:
        self._limit = self._checked(limit)
        self._budget = self._checked_budget(budget)
        self.inflight = 0
        self.units = 0
        # An insertion-ordered dict is a FIFO with O(1) removal of a cancelled waiter; the value is its units.
        self._waiters: dict[W, int] = {}

    @staticmethod
    def _checked(limit: int) -> int:
        return LimiterCore._whole(limit, 1, "limit")

    @staticmethod
    def _checked_budget(budget: int | None) -> int | None:
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"budget must be an int >= 1 or None (not enforced), got {budget!r}")
        return budget

    @staticmethod
    def _checked_units(units: int) -> int:
        return LimiterCore._whole(units, 0, "units")

    @staticmethod
    def _whole(value: int, least: int, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{what} must be an int >= {least}, got {value!r}")
        return value

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def budget(self) -> int | None:
        """The units (tokens) that may be held at once; None: not enforced."""
        return self._budget

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def fits(self, units: int) -> bool:
        """Whether a call of ``units`` may start now (ignoring the queue).

        Zero units never touch the budget, so unweighted calls see exactly the count limit; a call larger than
        what is left starts only when nothing is in flight, so one larger than the whole budget runs alone."""
        if self.inflight >= self._limit:
            return False
        budget = self._budget
        return budget is None or units == 0 or self.inflight == 0 or self.units + units <= budget

    def try_acquire(self, units: int = 0) -> bool:
        """Take a slot now if one is free and nobody is queued ahead."""
        if units.__class__ is not int or units < 0:  # the check's fast path: a plain int >= 0 passes it
            self._checked_units(units)
        if self._waiters:
            return False
        # fits(units), written out (a simulated fleet acquires millions of times)
        inflight = self.inflight
        if inflight >= self._limit:
            return False
        budget = self._budget
        if budget is None or units == 0 or inflight == 0 or self.units + units <= budget:
            self.inflight = inflight + 1
            self.units += units
            return True
        return False

    def acquire_or_enqueue(self, waiter: W, units: int = 0) -> bool:
        """True: the caller holds a slot. False: ``waiter`` is queued and will be handed back by a later call."""
        if self.try_acquire(units):
            return True
        if waiter in self._waiters:
            raise ValueError("waiter is already queued")
        self._waiters[waiter] = units
        return False

    def acquire_pinned(self, units: int = 0) -> None:
        """Count a call that a caller's explicit ``capacity=`` admits: never waits, never checks the limits."""
        if units.__class__ is not int or units < 0:  # the check's fast path: a plain int >= 0 passes it
            self._checked_units(units)
        self.units += units
        self.inflight += 1

    def admit(self) -> list[W]:
        """Grant the queue's head while it fits; a front-end calls this after a successful :meth:`cancel`."""
        granted: list[W] = []
        waiters = self._waiters
        limit, budget = self._limit, self._budget
        while waiters:
            waiter, units = next(iter(waiters.items()))
            inflight = self.inflight
            # fits(units), written out
            if inflight >= limit or not (budget is None or units == 0 or inflight == 0 or self.units + units <= budget):
                break  # strict FIFO: a large head waits for room rather than being overtaken (no starvation)
            del waiters[waiter]
            self.inflight = inflight + 1
            self.units += units
            granted.append(waiter)
        return granted

    def release(self, units: int = 0) -> list[W]:
        """Give a slot (and the units it held) back; returns the waiters that now hold slots and must be woken."""
        if self.inflight <= 0:
            raise RuntimeError("release without a matching acquire")
        if units.__class__ is not int or units < 0:  # the check's fast path: a plain int >= 0 passes it
            self._checked_units(units)
        if units > self.units:
            raise RuntimeError(f"release of {units} units, but only {self.units} are held")
        self.inflight -= 1
        self.units -= units
        return self.admit() if self._waiters else []

    def resize(self, limit: int) -> list[W]:
        """Change the limit in place; returns the waiters admitted by a growth (none on a shrink)."""
        self._limit = self._checked(limit)
        return self.admit()

    def set_budget(self, budget: int | None) -> list[W]:
        """Change the units budget (None: not enforced); returns the waiters a growth admits. Holders stay."""
        self._budget = self._checked_budget(budget)
        return self.admit()

    def cancel(self, waiter: W) -> bool:
        """Withdraw a queued waiter. False means it was already granted: the caller must ``release`` its slot.

        After a True, call :meth:`admit`: a withdrawn head that was too large may have held smaller ones back."""
        if waiter in self._waiters:
            del self._waiters[waiter]
            return True
        return False

    def __repr__(self) -> str:
        return (
            f"LimiterCore(limit={self._limit}, budget={self._budget}, inflight={self.inflight}, units={self.units}, "
            f"waiting={len(self._waiters)})"
        )


class CoreReadings(Generic[W]):
    """A front-end's readings of its :class:`LimiterCore` (``_core``), passed through as they are.

    Shared by every front-end (the gate's ``ModelLimiter``, the lab's ``SimLimits``): each value is one attribute
    read, which needs no lock."""

    __slots__ = ()

    _core: LimiterCore[W]

    @property
    def limit(self) -> int:
        return self._core.limit

    @property
    def budget(self) -> int | None:
        """The token budget in force (None: not enforced, the default and the fail-safe)."""
        return self._core.budget

    @property
    def waiting(self) -> int:
        return self._core.waiting

    def units(self) -> int:
        """Tokens held now by weighted calls (unweighted calls hold none)."""
        return self._core.units

    def inflight(self) -> int:
        """Slots held now (what the controller reports to the policy as this process's in-flight)."""
        return self._core.inflight


@dataclass(frozen=True, slots=True)
class Usage:
    """In-flight over one interval between polls: at its end, its peak, and its time-average (None: no time)."""

    inflight: int
    peak: int
    mean: float | None
    units: int = 0  # the units (tokens) held at the interval's end


class UsageMeter:
    """Peak and time-averaged in-flight since the last :meth:`take`, fed every change with the caller's clock.

    A front-end calls :meth:`note` after each acquire, release or grant with the count and its own time
    (``time.monotonic``, a test's clock, ``env.now``), so the poll sees the whole interval, not the instant it
    happened to be taken. A clock that steps back is treated as no time passing.
    """

    __slots__ = ("_area", "_at", "_level", "_peak", "_since", "_units")

    def __init__(self, now: float, inflight: int = 0) -> None:
        self._since = self._at = now
        self._level = self._peak = inflight
        self._area = 0.0
        self._units = 0

    def note(self, inflight: int, now: float, units: int | None = None) -> None:
        if units is not None:
            self._units = units
        if now > self._at:
            self._area += self._level * (now - self._at)
            self._at = now
        self._level = inflight
        if inflight > self._peak:
            self._peak = inflight

    def take(self, now: float) -> Usage:
        """The interval since the previous take, ending at ``now``; the next interval starts here."""
        self.note(self._level, now)
        span = self._at - self._since
        usage = Usage(self._level, self._peak, self._area / span if span > 0 else None, self._units)
        self._since, self._area, self._peak = self._at, 0.0, self._level
        return usage
