"""The thread front of the gate: ``map_concurrent_sync``.

The calling thread is the driver: it pulls one item, waits in the model's FIFO for a slot (or, with
``capacity=N``, for one of the call's own N permits, the model slot being counted without waiting), and hands
the item to the model's worker pool. The job releases its slot as soon as ``fn`` returns, then settles the
item's result. So pending work is the running calls plus the one item the driver holds.

Nested calls: if the driver thread is itself running an item of the same model (a pool job calling
``map_concurrent_sync`` again), it must not queue for a slot, since the slots it would wait for may all be held
by parents waiting on it. It takes a slot only if one is free at once and otherwise runs the item inline, on
its parent's slot. It always makes progress, and the model never runs more than its limit.

A sync ``fn`` cannot be interrupted: with ``timeout`` its item becomes a ``TimeoutError`` when the deadline
passes (the driver wakes for deadlines while it waits), but its thread and slot stay busy until ``fn`` returns,
because the engine is still working on that request.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import threading
from collections.abc import AsyncIterable, Callable, Iterable
from functools import partial
from time import monotonic, perf_counter, sleep
from typing import Any, Literal, TypeVar, Unpack, overload

from model_concurrency.gate.aio import gather_in_order
from model_concurrency.gate.fanout import PENDING, AsyncFn, FanOptions, Fanout, Fn, Items, call_holding
from model_concurrency.gate.hold import wait_hold
from model_concurrency.gate.model_limiter import ModelLimiter
from model_concurrency.gate.outage import ModelUnreachable
from model_concurrency.gate.pool import pool_for
from model_concurrency.gate.stats import merge_stats
from model_concurrency.gate.target import REFRESH_S, Target, weigh

__all__ = ["map_concurrent_sync"]

T = TypeVar("T")
R = TypeVar("R")


class _Permits:
    """A call's ``capacity=N`` permits: taken by its one driver thread, given back by pool threads.

    Why not ``threading.Semaphore``: its acquire and release are Python code around a Condition (a new lock per
    wait, a waiter list per notify), a few microseconds per item on the gate's hottest path. Here a release hands
    the permit straight to the driver if it is waiting (one C lock released), else bumps a counter.
    """

    __slots__ = ("_lock", "_waiting", "_wake", "free")

    def __init__(self, n: int) -> None:
        self.free = n
        self._lock = threading.Lock()
        self._wake = threading.Lock()
        self._wake.acquire()
        self._waiting = False

    def try_acquire(self) -> bool:
        with self._lock:
            if self.free > 0:
                self.free -= 1
                return True
            return False

    def acquire(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a permit (False: none came; call again to keep waiting)."""
        with self._lock:
            if self.free > 0:
                self.free -= 1
                return True
            self._waiting = True
        if self._wake.acquire(timeout=timeout):
            return True  # handed over by release()
        with self._lock:
            if self._waiting:  # nobody handed one over: withdraw
                self._waiting = False
                return False
        self._wake.acquire()  # a release handed one over between the timeout and the lock: take it
        return True

    def release(self) -> None:
        with self._lock:
            if not self._waiting:
                self.free += 1
                return
            self._waiting = False
        self._wake.release()


def _no_tick() -> None:
    return None


class _SyncRun(Fanout):
    """One call of map_concurrent_sync: the calling thread drives, pool threads call, around the shared
    bookkeeping; ``results`` and the failures are written under :attr:`cond`."""

    def __init__(
        self, fn: Callable[[Any], Any], *, return_exceptions: bool, **options: Unpack[FanOptions[Any]]
    ) -> None:
        super().__init__(fn, return_exceptions=return_exceptions, **options)
        self.cond = threading.Condition(threading.Lock())
        self.outstanding = 0
        self.deadlines: list[tuple[float, int]] = []
        self.permits = _Permits(self.capacity) if self.capacity is not None else None

    # -- slots -------------------------------------------------------------------------------------------------
    def _release(self, limiter: ModelLimiter, pinned: bool, units: int = 0) -> None:
        limiter.release(units)
        if pinned:
            assert self.permits is not None
            self.permits.release()

    def _wait_slot(self, units: int, tick: bool = True) -> bool:
        """Block for a slot, re-reading the target and expiring deadlines meanwhile (``tick``: the driver; a
        retrying pool thread only waits). False if stopped. Raises ``ModelUnreachable`` holding no slot."""
        limiter = self.target.limiter
        ticker = self._tick if tick else _no_tick
        if self.permits is not None:
            while not self.permits.acquire(self._wait_s()):
                ticker()
            if self.stopped:
                self.permits.release()
                return False
            limiter.acquire_pinned(units)
            return self._after_hold(limiter, units, ticker)
        wait_hold(limiter.hold, limiter.clock, ticker)
        waiter = limiter.acquire_or_enqueue_thread(units)
        try:
            while waiter is not None and not waiter.wait(self._wait_s()):
                ticker()
        except BaseException:
            if not limiter.withdraw(waiter):  # type: ignore[arg-type]
                limiter.release(units)
            raise
        if self.stopped:
            limiter.release(units)
            return False
        return self._after_hold(limiter, units, ticker)

    def _after_hold(self, limiter: ModelLimiter, units: int, tick: Callable[[], None] | None = None) -> bool:
        """A slot granted during a Retry-After hold starts its call only when the hold ends (gate/hold.py)."""
        if limiter.held_for() > 0:
            try:
                wait_hold(limiter.hold, limiter.clock, tick or self._tick)
            except BaseException:
                self._release(limiter, self.permits is not None, units)
                raise
            if self.stopped:
                self._release(limiter, self.permits is not None, units)
                return False
        return True

    def _try_slot(self, units: int) -> bool:
        limiter = self.target.limiter
        if limiter.held_for() > 0:
            return False
        if self.permits is not None:
            if not self.permits.try_acquire():
                return False
            limiter.acquire_pinned(units)
            return True
        return limiter.try_acquire(units)

    def _wait_s(self) -> float:
        wait = REFRESH_S
        if self.deadlines:
            wait = min(wait, self.deadlines[0][0] - monotonic())
        return max(wait, 0.0)

    def _tick(self) -> None:
        """While waiting: follow the target and turn overdue items into TimeoutErrors."""
        self.target.refresh()
        now = monotonic()
        while self.deadlines and self.deadlines[0][0] <= now:
            _, index = heapq.heappop(self.deadlines)
            self._settle(index, None, self._late(index), None)

    # -- items -------------------------------------------------------------------------------------------------
    def _job(self, index: int, value: Any, limiter: ModelLimiter | None, units: int = 0) -> None:
        """Run one item (on a pool thread, or inline when nested): call, release, settle; with ``retries=``, the
        failed attempts are recorded here and the item sent again after a backoff and a new slot."""
        attempts = self.attempts()
        while True:
            result, exc, latency = self._attempt(index, value, limiter, units)
            if attempts is None or (delay := attempts.delay(exc)) is None or self.stopped:
                break
            if self.results[index] is not PENDING:  # timed out meanwhile: its outcome is settled
                break
            with self.cond:  # the tally is the run's, written under its lock (as _settle does)
                self.target.record(latency, exc)
            sleep(delay)
            if limiter is not None:
                try:
                    if not self._wait_slot(units, tick=False):
                        break
                except ModelUnreachable as error:
                    result, exc = None, error
                    break
            attempts.begin()
        self._settle(index, result, exc, latency)

    def _attempt(
        self, index: int, value: Any, limiter: ModelLimiter | None, units: int
    ) -> tuple[Any, BaseException | None, float]:
        clock = limiter.clock if limiter is not None else perf_counter  # the runtime's clock: virtual in the lab
        start = clock()
        result, exc = call_holding(self.fn, value, self.holding)
        if limiter is not None:
            self._release(limiter, self.permits is not None, units)
        latency = clock() - start
        if exc is None and self.timeout is not None and latency > self.timeout and limiter is None:
            exc = self._late(index)  # inline (nested) items cannot be timed out while they run: judged at the end
        return result, exc, latency

    def _late(self, index: int) -> TimeoutError:
        return TimeoutError(f"item {index} did not finish within {self.timeout}s")

    def _settle(
        self, index: int, result: Any, exc: BaseException | None, latency: float | None, ran: bool = True
    ) -> None:
        with self.cond:
            if self.results[index] is not PENDING:
                return  # already timed out; the late result is dropped, its slot was released above
            if ran:  # an item refused for its weight never reached the model
                self.target.record(latency if latency is not None else self.timeout or 0.0, exc)
            self.settle(index, result, exc)
            self.outstanding -= 1
            if self.outstanding == 0:
                self.cond.notify_all()

    # -- the call ----------------------------------------------------------------------------------------------
    def execute(self, items: Iterable[Any]) -> list[Any]:
        target = self.target = Target(self.model, self.capacity)
        target.start()
        try:
            return self._execute(items)
        finally:
            target.stop()

    def _execute(self, items: Iterable[Any]) -> list[Any]:
        target = self.target
        limiter = target.limiter
        nested = self.enter()
        pool = pool_for(target.key)
        iterator = iter(items)
        try:
            while True:
                try:
                    value = next(iterator)
                except StopIteration:
                    break
                except Exception as exc:  # the caller's iterable failed: stop, let running calls finish, raise
                    self.fail(exc)
                    break
                if self.stopped:
                    break
                if target.due():
                    target.refresh()
                index = len(self.results)
                with self.cond:
                    self.results.append(PENDING)
                    self.outstanding += 1
                units = 0
                if self.weight is not None:
                    try:
                        units = weigh(self.weight, value)
                    except Exception as exc:  # the item's own error: it stands in its place, unrun
                        self._settle(index, None, exc, None, ran=False)
                        continue
                if nested and not self._try_slot(units):
                    self._job(index, value, None)  # on the parent's slot, on this thread
                    continue
                if not nested:
                    try:
                        granted = self._wait_slot(units)
                    except ModelUnreachable as exc:  # waited past max_outage_s: the item's own error, unrun
                        self._settle(index, None, exc, None, ran=False)
                        continue
                    if not granted:
                        with self.cond:
                            self.results.pop()
                            self.outstanding -= 1
                        break
                if self.timeout is not None:
                    heapq.heappush(self.deadlines, (monotonic() + self.timeout, index))
                try:
                    pool.submit(partial(self._job, index, value, limiter, units))
                except BaseException:
                    self._release(limiter, self.permits is not None, units)
                    raise
            self._wait_all()
        except BaseException:
            self.stopped = True  # no new starts; running calls finish on their threads and release there
            raise
        finally:
            merge_stats(target.key, target.tally)
        return self.results_in_order("map_concurrent_sync")

    def _wait_all(self) -> None:
        while True:
            with self.cond:
                if self.outstanding == 0:
                    return
                self.cond.wait(self._wait_s())
                if self.outstanding == 0:
                    return
            self._tick()


def _run_coroutine(coro_fn: Callable[[], Any]) -> Any:
    """``asyncio.run`` from sync code, on a helper thread when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn())
    box: list[Any] = []
    context = contextvars.copy_context()

    def target() -> None:
        try:
            box.append((True, context.run(asyncio.run, coro_fn())))
        except BaseException as exc:
            box.append((False, exc))

    thread = threading.Thread(target=target, name="model-concurrency-async-bridge")
    thread.start()
    thread.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


@overload
def map_concurrent_sync(
    items: Items[T], fn: AsyncFn[T, R], *, return_exceptions: Literal[False] = ..., **options: Unpack[FanOptions[T]]
) -> list[R]: ...


@overload
def map_concurrent_sync(
    items: Items[T], fn: AsyncFn[T, R], *, return_exceptions: Literal[True], **options: Unpack[FanOptions[T]]
) -> list[R | BaseException]: ...


@overload
def map_concurrent_sync(
    items: Items[T], fn: Fn[T, R], *, return_exceptions: Literal[True], **options: Unpack[FanOptions[T]]
) -> list[R | BaseException]: ...


@overload
def map_concurrent_sync(
    items: Items[T], fn: Fn[T, R], *, return_exceptions: Literal[False] = ..., **options: Unpack[FanOptions[T]]
) -> list[R]: ...


def map_concurrent_sync(
    items: Items[T], fn: Fn[T, Any], *, return_exceptions: bool = False, **options: Unpack[FanOptions[T]]
) -> list[Any]:
    """The blocking twin of :func:`map_concurrent`: same parameters, same results and error rules.

    A plain ``fn`` runs on the model's worker threads (one pool per model, idle threads exit). An ``async def``
    ``fn`` or async iterable runs :func:`map_concurrent` under ``asyncio.run`` (on a helper thread if this thread
    already runs a loop). ``weight`` maps an item to its tokens, as for :func:`map_concurrent`. Called from
    inside an item of the same model it runs nested: free slots only, else inline on the parent's slot, so it
    never deadlocks. An unregistered ``model`` is an ``UnknownModelError`` unless ``allow_unregistered=True``, as
    for :func:`map_concurrent`. ``retries=N`` as for
    :func:`map_concurrent` (a retrying item keeps its pool thread, not its slot, while it waits).
    """
    run = _SyncRun(fn, return_exceptions=return_exceptions, **options)  # every argument checked, nothing run yet
    if run.is_async or isinstance(items, AsyncIterable):
        return _run_coroutine(lambda: gather_in_order(items, fn, return_exceptions, options))  # type: ignore[no-any-return]
    return run.execute(items)
