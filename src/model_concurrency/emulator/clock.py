"""Drive a SimPy environment on the wall clock, from inside an event loop.

The engine model is single-threaded SimPy code, so the only safe place to advance it is the thread that also
submits requests and reads ``/metrics``: the event loop of the engine process (served form) or of the ASGI server
(in-process form). A :class:`SimDriver` maps wall time to simulated time (``sim = start + elapsed × time_scale``),
and one loop timer sleeps until the next simulated event is due, then runs the environment up to "now" and calls
``on_advance`` (the core reports streamed tokens from there). Callers :meth:`SimDriver.sync` before they touch
the model (so a request arrives at the current simulated time and a scrape sees current gauges) and
:meth:`SimDriver.poke` after they submit (a new request may need the engine sooner than the timer planned).

Completions fire inside ``env.run`` as plain callbacks on this same thread. No thread ever races on the
environment. In the in-process form a busy HTTP loop delays the timer, so simulated time then catches up in a
jump; the served form avoids that by giving the driver a loop of its own (:mod:`.processes`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

__all__ = ["SimDriver"]

log = logging.getLogger("model_concurrency.emulator")

# An event this close ahead of the mapped time (simulated seconds) is due now.
_DUE_EPS_S = 1e-9


class SimDriver:
    """Advance ``env`` to ``wall elapsed × time_scale`` continuously; wake early when poked.

    Scheduling is a single loop timer (``call_at``) re-armed for the next simulated event, so an idle emulator
    costs one wake-up per ``max_sleep_s`` and a busy one one per engine step, never a spinning task.
    """

    def __init__(
        self,
        env: Any,
        time_scale: float = 1.0,
        *,
        max_sleep_s: float = 0.05,
        on_advance: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not time_scale > 0 or not math.isfinite(time_scale):
            raise ValueError(f"time_scale must be a positive number, got {time_scale!r}")
        self.env = env
        self.time_scale = float(time_scale)
        self.max_sleep_s = max_sleep_s
        # The wall clock, or a virtual one (an event loop whose clock jumps: lab/conformance.py).
        self._clock = clock
        self._wall0 = clock()
        self._sim0 = float(env.now)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._on_advance = on_advance

    def sim_now(self) -> float:
        """The simulated time the wall clock says it is (the environment catches up on :meth:`sync`)."""
        return self._sim0 + (self._clock() - self._wall0) * self.time_scale

    def sync(self) -> None:
        """Run every simulated event due by now. Call before reading or changing the model."""
        env = self.env
        target = self.sim_now()
        if 0 < env.peek() - target <= _DUE_EPS_S:
            # Due but for float noise between the two clocks: on a clock that jumps (lab/virtual_loop.py) the timer
            # armed for it fires at this very instant again and again, and time never moves on.
            target = env.peek()
        if target > env.now:
            env.run(until=target)
        # ``run(until=...)`` leaves its spent stop event queued at ``now``; events due exactly now are due anyway.
        while env.peek() <= env.now:
            env.step()
        if self._on_advance is not None:
            self._on_advance()

    def start(self) -> None:
        """Start driving on the running loop (idempotent)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._arm()

    def poke(self) -> None:
        """A request was submitted or capacity changed: the next event may now be due sooner."""
        if self._loop is not None:
            self._arm()

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._loop = None

    def _arm(self) -> None:
        loop = self._loop
        assert loop is not None
        nxt = self.env.peek()
        delay = self.max_sleep_s
        if nxt != math.inf:
            delay = min(delay, max(0.0, (nxt - self.sim_now()) / self.time_scale))
        when = loop.time() + delay
        timer = self._timer
        if timer is not None:
            if not timer.cancelled() and timer.when() <= when:
                return
            timer.cancel()
        self._timer = loop.call_at(when, self._tick)

    def _tick(self) -> None:
        self._timer = None
        try:
            self.sync()
        except Exception:  # a model bug must not freeze every pending request silently
            log.exception("simulated engine raised; continuing")
        if self._loop is not None:
            self._arm()
