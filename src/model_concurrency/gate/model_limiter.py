"""One limiter per model, shared by every event loop and thread of the process.

A :class:`ModelLimiter` is a :class:`~model_concurrency.gate.limiter.LimiterCore` behind a ``threading.Lock``.
The core decides who holds a slot; this module only turns its decisions into wake-ups:

* an async waiter is an ``asyncio.Future`` on the waiter's own loop, resolved with ``call_soon_threadsafe`` when
  the granting thread is not that loop's thread (waiters of several loops can share one limiter);
* a thread waiter is a pre-acquired ``threading.Lock`` that the granter releases.

The core is the only authority on whether a waiter was granted: a waiter that gives up (cancelled, timed out,
interrupted) asks the core to withdraw it, and if the core says it was already granted, the waiter releases the
slot, which passes it on to the next in line. Wake-ups happen outside the lock.

Every change of the in-flight count is noted in a :class:`~model_concurrency.gate.limiter.UsageMeter` under the
same lock, with the clock of the runtime that owns the limiter, so a poll reads the interval's peak and mean.
The registry of limiters is the runtime registry (:mod:`model_concurrency.runtime`): one limiter per model.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from model_concurrency.gate.hold import AdmissionHold
from model_concurrency.gate.limiter import CoreReadings, LimiterCore, Usage, UsageMeter
from model_concurrency.gate.outcome import CutOncePerFlight

__all__ = ["HOLDING", "ModelLimiter", "ThreadWaiter"]

# The limiters whose slot the current context is running an item under. A fan-out started from inside one of
# its own model's items sees its limiter here and runs "nested" (see docs/gate.md): it never queues for a slot
# its parent may be holding.
HOLDING: contextvars.ContextVar[tuple[ModelLimiter, ...]] = contextvars.ContextVar(
    "model_concurrency_holding", default=()
)

_running_loop = asyncio.events._get_running_loop


class _Waiter(Protocol):
    def wake(self, limiter: ModelLimiter) -> None: ...


def _grant(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _AsyncWaiter:
    __slots__ = ("future", "loop", "units")

    def __init__(self, loop: asyncio.AbstractEventLoop, units: int) -> None:
        self.loop = loop
        self.units = units
        self.future: asyncio.Future[None] = loop.create_future()

    def wake(self, limiter: ModelLimiter) -> None:
        if _running_loop() is self.loop:
            _grant(self.future)
            return
        try:
            self.loop.call_soon_threadsafe(_grant, self.future)
        except RuntimeError:  # the waiter's loop is closed: nobody will take the slot, so pass it on
            limiter.release(self.units)


class ThreadWaiter:
    """A queued thread: :meth:`wait` until granted, or :meth:`ModelLimiter.withdraw` to give up."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def wake(self, limiter: ModelLimiter) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """True once granted; False if ``timeout`` passed first (the waiter is still queued)."""
        return self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))


class ModelLimiter(CoreReadings[_Waiter]):
    """A model's resizable limit and in-flight count, safe across threads and event loops (its readings:
    :class:`~model_concurrency.gate.limiter.CoreReadings`)."""

    __slots__ = ("_clock", "_core", "_lock", "_meter", "flights", "hold", "name")

    def __init__(self, name: str, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._core: LimiterCore[_Waiter] = LimiterCore(limit)
        self._clock = clock
        self._meter = UsageMeter(clock())
        # The Retry-After hold (gate/hold.py): the fronts wait for it around taking a slot; the core never sees it.
        self.hold = AdmissionHold()
        # The once-per-flight rule of the cuts a refusal makes (gate/outcome.py, applied by gate/rejections.py).
        self.flights = CutOncePerFlight()

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def held_for(self) -> float:
        """Seconds until a Retry-After hold ends (0: calls may start)."""
        return self.hold.remaining(self._clock())

    def _noted(self) -> None:
        """Record the count after a change (caller holds the lock)."""
        self._meter.note(self._core.inflight, self._clock(), self._core.units)

    def take_usage(self) -> Usage:
        """The interval since the previous call (the poll step's view of this process's use)."""
        with self._lock:
            return self._meter.take(self._clock())

    def _wake(self, granted: list[_Waiter]) -> None:
        for waiter in granted:
            waiter.wake(self)

    def resize(self, limit: int) -> None:
        """Set the limit; while the model is in an outage (gate/outage.py) it stays 1: one probe at a time."""
        if self.hold.outage.active:
            limit = 1
        if limit == self._core.limit:  # the common case at every re-read: no lock
            return
        self._change(self._core.resize, limit)

    def set_budget(self, budget: int | None) -> None:
        """Change the token budget (None: not enforced); a growth admits waiters at once, a shrink revokes nobody."""
        if budget == self._core.budget:
            return
        self._change(self._core.set_budget, budget)

    def _change(self, change: Callable[[Any], list[_Waiter]], value: Any) -> None:
        """Change the core under the lock, then wake the waiters the change admits (outside it)."""
        with self._lock:
            granted = change(value)
            if granted:
                self._noted()
        if granted:
            self._wake(granted)

    def try_acquire(self, units: int = 0) -> bool:
        with self._lock:
            if self._core.try_acquire(units):
                self._noted()
                return True
            return False

    def acquire_pinned(self, units: int = 0) -> None:
        with self._lock:
            self._core.acquire_pinned(units)
            self._noted()

    def release(self, units: int = 0) -> None:
        """Give back a slot and the ``units`` it was acquired with."""
        with self._lock:
            granted = self._core.release(units)
            self._noted()
        if granted:
            self._wake(granted)

    async def acquire(self, units: int = 0) -> None:
        """Wait for a slot and ``units`` tokens (FIFO). Cancelled while waiting: withdrawn, or the grant passed on."""
        with self._lock:
            if self._core.try_acquire(units):
                self._noted()
                return
            waiter = _AsyncWaiter(asyncio.get_running_loop(), units)
            if self._core.acquire_or_enqueue(waiter, units):
                self._noted()
                return
        try:
            await waiter.future
        except BaseException:
            if not self._withdraw(waiter):
                self.release(units)
            raise

    def acquire_or_enqueue_thread(self, units: int = 0) -> ThreadWaiter | None:
        """None: the caller holds a slot. Otherwise a queued waiter to :meth:`ThreadWaiter.wait` on."""
        with self._lock:
            if self._core.try_acquire(units):
                self._noted()
                return None
            waiter = ThreadWaiter()
            if self._core.acquire_or_enqueue(waiter, units):
                self._noted()
                return None
            return waiter

    def _withdraw(self, waiter: _Waiter) -> bool:
        with self._lock:
            withdrawn = self._core.cancel(waiter)
            # A withdrawn head too large for the budget may have held smaller waiters back: let them in.
            granted = self._core.admit() if withdrawn else []
            if granted:
                self._noted()
        if granted:
            self._wake(granted)
        return withdrawn

    def withdraw(self, waiter: ThreadWaiter) -> bool:
        """Give up waiting. True: withdrawn. False: it was granted meanwhile and the caller now holds the slot."""
        return self._withdraw(waiter)

    def __repr__(self) -> str:
        core = self._core
        return (
            f"ModelLimiter({self.name!r}, limit={core.limit}, budget={core.budget}, inflight={core.inflight}, "
            f"units={core.units}, waiting={core.waiting})"
        )
