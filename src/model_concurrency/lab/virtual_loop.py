"""An asyncio event loop on virtual time: its clock jumps to the next timer whenever nothing is ready to run.

Why: the production stack (``map_concurrent``, the model runtime and its poller, httpx, the emulator's ASGI
app over the engine model) can then run an hour of simulated traffic in seconds, and no figure depends on how fast
this machine is or on what else it runs. Nothing in the stack is changed for it: everything that tells time asks
the loop (``loop.time``), and the runtime and the emulator's :class:`~model_concurrency.emulator.SimDriver` are
given ``loop.time`` as their clock.

The runtime's scheduled poller runs on the loop too (``ModelRuntime(poll_loop=loop)``): a poll thread's waits
are real, so where its poll landed among the loop's callbacks varied with the machine's speed. What may still
happen outside the loop is a poll's I/O (a real loopback ``/metrics`` page) or a poll thread where one is used.
The clock must not run on while such a poll is under way, nor past one that is due, or the poll would land late
in virtual time only because the socket or the thread was slower than the loop. So the loop takes a *barrier*
(``barrier() -> float | None``, e.g. :meth:`ModelRuntime.scheduled_poll_at
<model_concurrency.runtime.ModelRuntime.scheduled_poll_at>`): the clock never jumps past it, and once it is
reached the loop waits in real time (serving any I/O, such as the ``/metrics`` request) until the barrier moves
on. Only jumps are virtual; real I/O (a socket, a thread's ``call_soon_threadsafe``) still wakes the loop at once.
"""

from __future__ import annotations

import asyncio
import math
import selectors
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

__all__ = ["VirtualTimeLoop", "run_virtual"]

T = TypeVar("T")

Barrier = Callable[[], "float | None"]

# Real seconds the loop waits at a barrier before looking again (a thread's wake-up interrupts it sooner).
_HELD_WAIT_S = 0.002
# A barrier that does not move for this long (real seconds) is a bug in the harness, not a slow thread.
_HELD_LIMIT_S = 30.0


class _JumpingSelector(selectors.BaseSelector):
    """The default selector for real I/O, plus the jump: an idle ``select(timeout)`` moves the clock instead."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.loop: VirtualTimeLoop | None = None
        self._held_since: float | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        loop = self.loop
        assert loop is not None
        now = loop.time()
        goal = now + timeout if timeout is not None else math.inf
        barrier = loop.barrier()
        if barrier is not None and barrier <= now:
            # Held: a thread has work due at this instant. Wait for it in real time, without moving the clock.
            held_since = self._held_since = self._held_since or time.monotonic()
            if time.monotonic() - held_since > _HELD_LIMIT_S:
                raise RuntimeError(f"virtual clock held at {now:.3f} for {_HELD_LIMIT_S:.0f} s by its barrier")
            return self._real.select(_HELD_WAIT_S)
        self._held_since = None
        if barrier is not None:
            goal = min(goal, barrier)
        if goal == math.inf:
            return self._real.select(timeout)  # nothing scheduled and nothing to wait for: only real I/O can come
        loop.advance_to(goal)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual; see the module docstring."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._barriers: list[Barrier] = []
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._now

    def advance_to(self, when: float) -> None:
        if when > self._now:
            self._now = when

    def add_barrier(self, barrier: Barrier) -> None:
        """The clock never jumps past ``barrier()`` (None: no bound now); at it, the loop waits in real time."""
        self._barriers.append(barrier)

    def barrier(self) -> float | None:
        bounds = [b for b in (f() for f in self._barriers) if b is not None]
        return min(bounds) if bounds else None


def run_virtual(main: Callable[[VirtualTimeLoop], Coroutine[Any, Any, T]], *, start: float = 0.0) -> T:
    """``main(loop)`` to completion on a fresh virtual-time loop, which is then closed.

    Tasks still pending at the end (handlers of calls cancelled when the run stopped wait on their jobs) are
    cancelled and let unwind first, so nothing outlives the loop and no "task was destroyed" warning is left.
    """
    loop = VirtualTimeLoop(start)
    try:
        return loop.run_until_complete(main(loop))
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(_unwind(pending))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _unwind(tasks: set[asyncio.Task[Any]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)  # inside the loop: an empty gather binds to no other
