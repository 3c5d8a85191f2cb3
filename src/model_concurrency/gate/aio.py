"""The asyncio front of the gate: ``map_concurrent`` and ``imap_concurrent``.

(Over 400 lines: the worker tasks with their three ways of taking a slot, imap_concurrent's bounded stream, the
hand-off of sync calls to threads, and the typed overloads of two public functions; the bookkeeping shared with
map_concurrent_sync is in gate/fanout.py.)

A fan-out is a handful of worker tasks, never a task per item: each worker pulls the next item, takes a slot of
the model's limiter, runs ``fn`` inline, releases in ``finally`` and records the outcome. So a generator of a
million items is pulled one item per free worker, and pending work is bounded by the number of workers, which
follows the limit: a worker leaves when there are more workers than the limit, and a re-read that finds the
limit higher starts more. The uncontended path takes the limiter's lock once each way and creates no future.

Worker kinds:

* gated: waits its turn in the model's FIFO (the default: the adaptive or static target);
* pinned: ``capacity=N`` runs N workers that count in the model's in-flight without waiting on its limit;
* borrowed + opportunistic: a fan-out started from inside an item of the same model (the context holds one of
  that limiter's slots) runs one worker on its parent's slot, which always makes progress, and adds workers only
  for slots that are free at once; it never queues behind slots its own parents hold, so it cannot deadlock.

A sync ``fn`` runs on the model's worker-thread pool. Its slot is released by whichever side ends last: the
worker when the thread has returned, else the thread itself (after a timeout or cancellation the engine call is
still running, so its slot stays counted until it really ends).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from enum import Enum
from time import perf_counter
from typing import Any, Literal, TypeVar, Unpack, overload

from model_concurrency.gate.fanout import (
    PENDING,
    AsyncFn,
    FanOptions,
    Fanout,
    Fn,
    Items,
    call_holding,
    is_async_callable,
    raise_first,
)
from model_concurrency.gate.hold import wait_hold_async
from model_concurrency.gate.model_limiter import HOLDING, ModelLimiter
from model_concurrency.gate.outage import ModelUnreachable
from model_concurrency.gate.pool import WorkerPool, pool_for
from model_concurrency.gate.stats import merge_stats
from model_concurrency.gate.target import REFRESH_S, Target, weigh

__all__ = ["WorkerMode", "imap_concurrent", "is_async_callable", "map_concurrent", "raise_first"]

T = TypeVar("T")
R = TypeVar("R")

_END: Any = object()


class WorkerMode(Enum):
    """How a worker takes its slots (see the module docstring)."""

    GATED = "gated"
    PINNED = "pinned"
    BORROWED = "borrowed"
    OPPORTUNISTIC = "opportunistic"


GATED, PINNED = WorkerMode.GATED, WorkerMode.PINNED
BORROWED, OPPORTUNISTIC = WorkerMode.BORROWED, WorkerMode.OPPORTUNISTIC


def _being_cancelled() -> bool:
    """True when the current task has a cancellation request pending (as opposed to a callee raising one)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _post(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


class _ThreadJob:
    """One sync call on a pool thread, posting back to the loop; the slot is released exactly once."""

    __slots__ = ("detached", "done", "fn", "future", "holding", "limiter", "lock", "loop", "units", "value")

    def __init__(
        self,
        fn: Callable[[Any], Any],
        value: Any,
        loop: asyncio.AbstractEventLoop,
        holding: tuple[ModelLimiter, ...],
        limiter: ModelLimiter | None,
        units: int = 0,
    ) -> None:
        self.fn, self.value, self.loop, self.holding, self.limiter = fn, value, loop, holding, limiter
        self.units = units
        self.future: asyncio.Future[Any] = loop.create_future()
        self.lock = threading.Lock()
        self.done = self.detached = False

    def run(self) -> None:
        result, exc = call_holding(self.fn, self.value, self.holding)
        with self.lock:
            self.done = True
            detached = self.detached
        if not detached:
            try:
                self.loop.call_soon_threadsafe(_post, self.future, result, exc)
                return
            except RuntimeError:  # the loop is gone; nobody else will release
                pass
        if self.limiter is not None:
            self.limiter.release(self.units)

    def settle(self) -> None:
        """Called by the awaiting worker when it stops waiting, for any reason."""
        with self.lock:
            release_here = self.done
            self.detached = not self.done
        if release_here and self.limiter is not None:
            self.limiter.release(self.units)


class _Run(Fanout):
    """One call of map_concurrent / imap_concurrent: worker tasks on this loop around the shared bookkeeping."""

    def __init__(
        self,
        items: Iterable[Any] | AsyncIterable[Any],
        fn: Callable[[Any], Any],
        *,
        streaming: bool,
        return_exceptions: bool,
        **options: Unpack[FanOptions[Any]],
    ) -> None:
        super().__init__(fn, return_exceptions=return_exceptions, **options)
        self._it: Iterator[Any] | None = None
        self._ait: AsyncIterator[Any] | None = None
        if isinstance(items, AsyncIterable):
            self._ait = aiter(items)
            self._pull_lock = asyncio.Lock()
        else:
            self._it = iter(items)
        self.target = Target(self.model, self.capacity)
        self.streaming = streaming
        # Streaming: finished (index, result) pairs wait here; workers wait for room when it holds ``bound``.
        self.buffer: deque[Any] = deque()
        self.bound = 64
        self.consumer_wake: asyncio.Future[None] | None = None
        self.room_wake: asyncio.Future[None] | None = None
        self.next_index = 0
        self.exhausted = False
        self.alive = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.finished: asyncio.Future[None] | None = None
        self.nested = self.end_sent = False
        self.pool: WorkerPool | None = None

    # -- workers ---------------------------------------------------------------------------------------------
    def _spawn(self, count: int, mode: WorkerMode) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(count):
            self.alive += 1
            task = loop.create_task(self._worker(mode))
            self.tasks.add(task)
            task.add_done_callback(self._worker_done)

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)

    def _finish(self) -> None:
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(None)
        if self.streaming and not self.end_sent:
            self.end_sent = True
            self._push(_END)

    def _push(self, item: Any) -> None:
        self.buffer.append(item)
        consumer = self.consumer_wake
        if consumer is not None:
            self.consumer_wake = None
            if not consumer.done():
                consumer.set_result(None)

    async def _put(self, item: Any) -> None:
        while len(self.buffer) >= self.bound:
            if self.room_wake is None:
                self.room_wake = asyncio.get_running_loop().create_future()
            await self.room_wake
        self._push(item)

    async def stream(self) -> AsyncIterator[tuple[int, Any]]:
        """The consumer side: pairs in completion order until the end marker."""
        buffer = self.buffer
        while True:
            if not buffer:
                self.consumer_wake = asyncio.get_running_loop().create_future()
                await self.consumer_wake
                continue
            item = buffer.popleft()
            room = self.room_wake
            if room is not None and len(buffer) < self.bound:
                self.room_wake = None
                if not room.done():
                    room.set_result(None)
            if item is _END:
                return
            yield item

    def _refresh(self) -> None:
        limit = self.target.refresh()
        if self.stopped or self.exhausted or self.alive == 0 or self.target.pinned is not None:
            return
        missing = limit - self.alive
        if missing > 0:
            self._spawn(missing, OPPORTUNISTIC if self.nested else GATED)

    async def _pull(self) -> Any:
        try:
            if self._it is not None:
                value = next(self._it)
            else:
                assert self._ait is not None
                async with self._pull_lock:
                    if self.exhausted:
                        return _END
                    value = await anext(self._ait)
        except (StopIteration, StopAsyncIteration):
            self.exhausted = True
            return _END
        except Exception as exc:  # the caller's iterable failed: stop, drain, raise it
            self.fail(exc)
            return _END
        index = self.next_index
        self.next_index = index + 1
        if not self.streaming:
            self.results.append(PENDING)
        return index, value

    async def _worker(self, mode: WorkerMode) -> None:
        target = self.target
        limiter = target.limiter
        HOLDING.set(self.holding)
        releases = mode != BORROWED
        try:
            while not (self.stopped or self.exhausted):
                if target.due():
                    # At most one refresh per item: on a coarse or jumping clock (a virtual one) every read may
                    # find the refresh due again, and a refresh-and-retry loop would never start an item.
                    self._refresh()
                if mode != PINNED and mode != BORROWED and self.alive > target.limit:
                    break  # the limit shrank: surplus workers leave
                units = 0
                if mode == OPPORTUNISTIC:
                    # Nested: under a parent's (weighted) slot, counted by requests only; the weight is still
                    # checked, so a bad one is the same error at every depth.
                    if limiter.held_for() > 0 or not limiter.try_acquire():
                        break
                    item = await self._pull()
                    if item is _END:
                        limiter.release()
                        break
                    if self.weight is not None and await self._weighed(item) is None:
                        limiter.release()
                        continue
                else:
                    item = await self._pull()
                    if item is _END:
                        break
                    if self.weight is not None:
                        weighed = await self._weighed(item)
                        if weighed is None:
                            continue
                        units = weighed if mode != BORROWED else 0
                    try:
                        await self._admit(limiter, units, mode)
                    except ModelUnreachable as exc:  # waited past max_outage_s: the item's own error
                        await self._outcome(item[0], None, exc)
                        continue
                if self.stopped:  # a failure happened while this worker waited: the item is not started
                    if releases:
                        limiter.release(units)
                    break
                await self._run_item(item[0], item[1], limiter if releases else None, units, mode)
        except Exception as exc:  # a bug here, not in fn (fn's errors are caught per item): stop and raise it
            self.fail(exc)
        finally:
            self.alive -= 1
            if self.alive == 0:
                self._finish()

    async def _weighed(self, item: tuple[int, Any]) -> int | None:
        """The item's units, or None when its weight is bad: then the error is its outcome and it never runs."""
        assert self.weight is not None
        try:
            return weigh(self.weight, item[1])
        except Exception as exc:
            await self._outcome(item[0], None, exc)
            return None

    async def _run_item(
        self, index: int, value: Any, limiter: ModelLimiter | None, units: int = 0, mode: WorkerMode = GATED
    ) -> None:
        attempts = self.attempts() if mode != OPPORTUNISTIC else None
        while True:
            result, exc = await self._attempt(value, limiter, units)
            if attempts is None or (delay := attempts.delay(exc)) is None or self.stopped:
                break
            # retries= (gate/retries.py): the slot was given back; wait, then queue for one like a new call.
            await asyncio.sleep(delay)
            if limiter is not None:
                try:
                    await self._admit(limiter, units, mode)
                except ModelUnreachable as error:
                    result, exc = None, error
                    break
                if self.stopped:
                    limiter.release(units)
                    break
            attempts.begin()
        if self.settle(index, result, exc):
            await self._put((index, exc if exc is not None else result))

    async def _admit(self, limiter: ModelLimiter, units: int, mode: WorkerMode) -> None:
        """Wait out a hold and take a slot (GATED) or count one (PINNED); BORROWED runs on its parent's.

        Raises :class:`~.outage.ModelUnreachable` (holding no slot) when the model has been unreachable for longer
        than ``max_outage_s``."""
        if mode == GATED:
            await wait_hold_async(limiter.hold, limiter.clock)
            await limiter.acquire(units)
        elif mode == PINNED:
            limiter.acquire_pinned(units)
        if mode != BORROWED and limiter.held_for() > 0:  # granted during a hold: start only once it has passed
            try:
                await wait_hold_async(limiter.hold, limiter.clock)
            except BaseException:
                limiter.release(units)
                raise

    async def _attempt(self, value: Any, limiter: ModelLimiter | None, units: int) -> tuple[Any, BaseException | None]:
        """One call of ``fn``: its slot is released when it ends, the outcome recorded."""
        exc: BaseException | None = None
        result: Any = None
        clock = limiter.clock if limiter is not None else perf_counter  # the runtime's clock: virtual in the lab
        start = clock()
        if self.is_async:
            try:
                if self.timeout is None:
                    result = await self.fn(value)
                else:
                    async with asyncio.timeout(self.timeout):
                        result = await self.fn(value)
            except Exception as error:
                exc = error
            except asyncio.CancelledError as error:
                if _being_cancelled():
                    raise  # the caller (or the run) is cancelling this worker: not the item's outcome
                exc = error  # fn itself raised CancelledError (e.g. it awaited a task someone cancelled)
            finally:
                if limiter is not None:
                    limiter.release(units)
        else:
            result, exc = await self._in_thread(value, limiter, units)
        self.target.record(clock() - start, exc)
        return result, exc

    async def _outcome(self, index: int, result: Any, exc: BaseException | None) -> None:
        if self.settle(index, result, exc):
            await self._put((index, exc if exc is not None else result))

    async def _in_thread(
        self, value: Any, limiter: ModelLimiter | None, units: int
    ) -> tuple[Any, BaseException | None]:
        assert self.pool is not None
        job = _ThreadJob(self.fn, value, asyncio.get_running_loop(), self.holding, limiter, units)
        self.pool.submit(job.run)
        try:
            if self.timeout is None:
                result = await job.future
                if inspect.isawaitable(result):  # a plain function that returned a coroutine
                    result = await result
            else:
                async with asyncio.timeout(self.timeout):
                    result = await job.future
                    if inspect.isawaitable(result):
                        result = await result
            return result, None
        except Exception as exc:
            return None, exc
        except asyncio.CancelledError as exc:
            if _being_cancelled():
                raise
            return None, exc
        finally:
            job.settle()

    # -- the call --------------------------------------------------------------------------------------------
    async def execute(self) -> None:
        try:
            await self.target.astart()
            try:
                await self._execute()
            finally:
                self.target.stop()
        finally:
            self._finish()  # a stream's consumer always gets its end marker

    async def _execute(self) -> None:
        target = self.target
        limit = target.limit
        self.nested = self.enter() and target.pinned is None
        if not self.is_async:
            self.pool = pool_for(target.key)
        self.bound = max(2 * limit, 64)
        self.finished = asyncio.get_running_loop().create_future()
        if self.nested:
            self._spawn(1, BORROWED)
            self._spawn(limit - 1, OPPORTUNISTIC)
        else:
            self._spawn(limit, GATED if target.pinned is None else PINNED)
        try:
            while not self.finished.done():
                # While workers run, the caller re-reads the target on a timer, so a growth is seen even when
                # every item is slow and no worker starts anything for a while.
                await asyncio.wait((self.finished,), timeout=REFRESH_S)
                if not self.finished.done():
                    self._refresh()
        except BaseException:
            self.stopped = True
            await self._cancel_all()
            raise
        finally:
            merge_stats(target.key, target.tally)
        self.raise_failure("map_concurrent")

    async def _cancel_all(self) -> None:
        for task in self.tasks:
            task.cancel()
        while self.tasks:
            try:
                await asyncio.wait(set(self.tasks))
            except asyncio.CancelledError:  # cancelled again: keep waiting, every slot must come back
                for task in self.tasks:
                    task.cancel()


@overload
async def map_concurrent(
    items: Items[T], fn: AsyncFn[T, R], *, return_exceptions: Literal[False] = ..., **options: Unpack[FanOptions[T]]
) -> list[R]: ...


@overload
async def map_concurrent(
    items: Items[T], fn: AsyncFn[T, R], *, return_exceptions: Literal[True], **options: Unpack[FanOptions[T]]
) -> list[R | BaseException]: ...


@overload
async def map_concurrent(
    items: Items[T], fn: Fn[T, R], *, return_exceptions: Literal[True], **options: Unpack[FanOptions[T]]
) -> list[R | BaseException]: ...


@overload
async def map_concurrent(
    items: Items[T], fn: Fn[T, R], *, return_exceptions: Literal[False] = ..., **options: Unpack[FanOptions[T]]
) -> list[R]: ...


async def map_concurrent(
    items: Items[T], fn: Fn[T, Any], *, return_exceptions: bool = False, **options: Unpack[FanOptions[T]]
) -> list[Any]:
    """Call ``fn`` on every item with at most the model's target in flight; results in input order.

    ``fn`` may be ``async def`` (run on this loop) or plain (run on the model's worker threads). ``items`` may be
    any iterable or async iterable; it is pulled lazily, one item per free worker. The keyword options
    (:class:`~.fanout.FanOptions`): ``model`` names the registered model whose target this follows
    (None: the ``default`` role). ``capacity`` pins this call's
    limit instead of following the target (its calls still count in the model's in-flight). ``timeout`` bounds
    each item (``TimeoutError`` for that item). By default the first failure stops new starts, waits for the
    running calls and is raised, with the other failures listed in its ``__notes__``; with
    ``return_exceptions=True`` each failed item's exception stands in its place. Cancelling the caller cancels
    every call and releases every slot. ``weight`` maps an item to its tokens (prompt plus ``max_tokens``): the
    item then also waits for room in the model's token budget (docs/gate.md); a weight that raises or is not a
    finite number >= 0 is that item's error, and the item is not run. A ``model`` name the registry does not know
    is an :class:`~model_concurrency.config.UnknownModelError` naming the registered ones, before anything runs;
    ``allow_unregistered=True`` runs it at the floor instead (capacity 1, one warning per name).
    ``retries=N`` (idempotent calls only) sends
    an item again, up to N times, after a rejection or an outage (never after another error), with backoff that
    honours ``Retry-After`` (gate/retries.py); a :class:`~model_concurrency.gate.retries.RetryPolicy` instead of N
    sets the backoff too.
    """
    return await gather_in_order(items, fn, return_exceptions, options)


async def gather_in_order(
    items: Items[Any], fn: Fn[Any, Any], return_exceptions: bool, options: FanOptions[Any]
) -> list[Any]:
    """:func:`map_concurrent` without its typed overloads (``map_concurrent_sync`` runs async work through it)."""
    run = _Run(items, fn, streaming=False, return_exceptions=return_exceptions, **options)
    await run.execute()
    return run.results_in_order("map_concurrent")


@overload
def imap_concurrent(
    items: Items[T], fn: AsyncFn[T, R], *, return_exceptions: Literal[False] = ..., **options: Unpack[FanOptions[T]]
) -> AsyncIterator[tuple[int, R]]: ...


@overload
def imap_concurrent(
    items: Items[T], fn: AsyncFn[T, R], *, return_exceptions: Literal[True], **options: Unpack[FanOptions[T]]
) -> AsyncIterator[tuple[int, R | BaseException]]: ...


@overload
def imap_concurrent(
    items: Items[T], fn: Fn[T, R], *, return_exceptions: Literal[True], **options: Unpack[FanOptions[T]]
) -> AsyncIterator[tuple[int, R | BaseException]]: ...


@overload
def imap_concurrent(
    items: Items[T], fn: Fn[T, R], *, return_exceptions: Literal[False] = ..., **options: Unpack[FanOptions[T]]
) -> AsyncIterator[tuple[int, R]]: ...


async def imap_concurrent(
    items: Items[T], fn: Fn[T, Any], *, return_exceptions: bool = False, **options: Unpack[FanOptions[T]]
) -> AsyncIterator[tuple[int, Any]]:
    """:func:`map_concurrent` as a stream of ``(input index, result)`` pairs in completion order.

    Finished results wait in a bounded buffer: a consumer that stops reading stops new starts once the buffer is
    full. Leaving the loop early (``break``, an exception) cancels the calls still running and releases their
    slots. Errors follow :func:`map_concurrent`: without ``return_exceptions`` the first failure is raised after
    the running calls have finished (their results are still yielded). The keyword options are
    :func:`map_concurrent`'s; an unregistered ``model`` is an ``UnknownModelError`` unless
    ``allow_unregistered=True``.
    """
    run = _Run(items, fn, streaming=True, return_exceptions=return_exceptions, **options)
    driver = asyncio.ensure_future(run.execute())
    try:
        async for item in run.stream():
            yield item
        await driver
    finally:
        if not driver.done():
            driver.cancel()
            await asyncio.gather(driver, return_exceptions=True)
