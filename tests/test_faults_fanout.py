"""Fan-out faults through every front of the gate: calls that raise, hang past their timeout, get cancelled, or
answer 429/503 from a real loopback server; the caller cancelled mid-run; an item iterator that raises halfway.

In every case: each item is accounted for (its result, or its own exception with ``return_exceptions=True``),
every call that started also finished, the model's in-flight count returns to 0 with nobody left waiting, and
no worker thread is left behind (idle threads exit after ``MODEL_CONCURRENCY_THREAD_IDLE_S``, 0.05 s here).

Fronts: ``map_concurrent`` with an async fn and with a sync fn (worker threads), ``imap_concurrent`` with both,
``map_concurrent_sync`` with a sync fn (its own driver) and with an async fn (bridged through ``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from fault_servers import FaultHandler, bounded, fault_server, wait_until
from model_concurrency import gate_stats, imap_concurrent, map_concurrent, map_concurrent_sync, register_model
from model_concurrency.gate import limiter_for

LIMIT = 4
AFn = Callable[[int], Awaitable[Any]]
SFn = Callable[[int], Any]


@dataclass
class Calls:
    """What fn saw: calls started and finished (thread-safe), so "every started call finished" is checkable."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    started: int = 0
    finished: int = 0
    peak: int = 0

    def enter(self) -> None:
        with self.lock:
            self.started += 1
            self.peak = max(self.peak, self.started - self.finished)

    def leave(self) -> None:
        with self.lock:
            self.finished += 1

    @property
    def running(self) -> int:
        with self.lock:
            return self.started - self.finished


@pytest.fixture(autouse=True)
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("MODEL_CONCURRENCY_THREAD_IDLE_S", "0.05")
    register_model("m", base_url=None, max_parallel_calls=LIMIT)
    baseline = threading.active_count()  # earlier tests' idle threads may still be exiting: <= below
    yield
    limiter = limiter_for("m", LIMIT)
    assert wait_until(lambda: limiter.inflight() == 0), limiter
    assert limiter.waiting == 0, limiter
    assert wait_until(lambda: threading.active_count() <= baseline), [t.name for t in threading.enumerate()]


FRONTS = ["map-async", "map-threads", "imap-async", "imap-threads", "sync-threads", "sync-async"]


def run_front(front: str, items: Iterable[int], afn: AFn, sfn: SFn, **kwargs: Any) -> list[Any]:
    """Run one front to completion (on a thread, joined with a hang guard); results in input order."""

    async def collect(fn: Callable[[int], Any]) -> list[Any]:
        pairs = [pair async for pair in imap_concurrent(items, fn, model="m", **kwargs)]
        indices = sorted(i for i, _ in pairs)
        assert indices == list(range(len(pairs))), "an index is missing or repeated"
        return [value for _, value in sorted(pairs, key=lambda p: p[0])]

    def call() -> list[Any]:
        if front == "map-async":
            return asyncio.run(map_concurrent(items, afn, model="m", **kwargs))
        if front == "map-threads":
            return asyncio.run(map_concurrent(items, sfn, model="m", **kwargs))
        if front == "imap-async":
            return asyncio.run(collect(afn))
        if front == "imap-threads":
            return asyncio.run(collect(sfn))
        if front == "sync-threads":
            return map_concurrent_sync(items, sfn, model="m", **kwargs)
        assert front == "sync-async"
        return map_concurrent_sync(items, afn, model="m", **kwargs)

    return bounded(call, limit_s=30)


def raises(front: str, items: Iterable[int], afn: AFn, sfn: SFn, **kwargs: Any) -> BaseException:
    """Run one front expecting it to raise; return what it raised."""
    box: list[BaseException] = []

    def call() -> None:
        try:
            run_front(front, items, afn, sfn, **kwargs)
        except AssertionError as exc:  # bounded() wraps what the front raised
            if exc.__cause__ is None:
                raise
            box.append(exc.__cause__)

    bounded(call, limit_s=30)
    assert box, "the front did not raise"
    return box[0]


# -- calls that raise ------------------------------------------------------------------------------------------------
def failing(calls: Calls) -> tuple[AFn, SFn]:
    def check(x: int) -> int:
        if x % 7 == 3:
            raise ValueError(f"item {x} failed")
        return 2 * x

    async def afn(x: int) -> int:
        calls.enter()
        try:
            await asyncio.sleep(0)
            return check(x)
        finally:
            calls.leave()

    def sfn(x: int) -> int:
        calls.enter()
        try:
            return check(x)
        finally:
            calls.leave()

    return afn, sfn


@pytest.mark.parametrize("front", FRONTS)
def test_calls_that_raise_each_item_gets_its_own_exception(front: str) -> None:
    calls = Calls()
    afn, sfn = failing(calls)
    out = run_front(front, range(200), afn, sfn, return_exceptions=True)
    assert len(out) == 200
    for x, value in enumerate(out):
        if x % 7 == 3:
            assert isinstance(value, ValueError) and str(value) == f"item {x} failed"
        else:
            assert value == 2 * x
    assert calls.started == calls.finished == 200 and calls.peak <= LIMIT
    stats = gate_stats("m")
    assert stats.calls == 200 and stats.errors_by_type == {"ValueError": sum(1 for x in range(200) if x % 7 == 3)}


@pytest.mark.parametrize("front", FRONTS)
def test_calls_that_raise_without_return_exceptions_raise_the_first_after_the_running_ones(front: str) -> None:
    calls = Calls()
    afn, sfn = failing(calls)
    exc = raises(front, range(10_000), afn, sfn)
    assert isinstance(exc, ValueError) and str(exc).startswith("item ")
    assert any("failed first" in note for note in getattr(exc, "__notes__", []))
    assert calls.started == calls.finished < 10_000  # stopped early, nothing still running


# -- calls that hang past their timeout --------------------------------------------------------------------------
@pytest.mark.parametrize("front", FRONTS)
def test_calls_that_hang_past_their_timeout(front: str) -> None:
    calls = Calls()
    release = threading.Event()

    async def afn(x: int) -> int:
        calls.enter()
        try:
            if x % 5 == 0:
                await asyncio.Event().wait()  # hangs until the gate's timeout cancels it
            return x
        finally:
            calls.leave()

    def sfn(x: int) -> int:
        calls.enter()
        try:
            if x % 5 == 0:
                release.wait(10)  # a sync call cannot be interrupted: it ends when the test releases it
            return x
        finally:
            calls.leave()

    # Sync hangs hold their slots until they return: keep fewer of them than the limit, so the run can finish.
    items = range(20) if front.endswith("async") else [1, 2, 0, 3, 4, 6, 7, 5, 8, 9, 11, 12, 13, 14]
    # A call that crosses to a thread and back must not time out by a loaded machine's hand-offs alone: 1 s there,
    # 0.2 s where the whole run is one event loop.
    timeout = 0.2 if front in ("map-async", "imap-async") else 1.0
    out = run_front(front, items, afn, sfn, timeout=timeout, return_exceptions=True)
    for x, value in zip(items, out, strict=True):
        if x % 5 == 0:
            assert isinstance(value, TimeoutError), (x, value)
        else:
            assert value == x
    release.set()
    assert wait_until(lambda: calls.running == 0)
    assert gate_stats("m").timeouts == sum(1 for x in items if x % 5 == 0)


# -- calls that get cancelled (not the caller) -------------------------------------------------------------------
def cancelling(calls: Calls) -> tuple[AFn, SFn]:
    """Every fifth item's call raises CancelledError of its own accord; the caller is never cancelled."""

    async def afn(x: int) -> int:
        calls.enter()
        try:
            if x % 5 == 2:
                inner = asyncio.ensure_future(asyncio.sleep(10))  # e.g. a client's request task, cancelled
                await asyncio.sleep(0)
                inner.cancel()
                await inner
            return x
        finally:
            calls.leave()

    def sfn(x: int) -> int:
        calls.enter()
        try:
            if x % 5 == 2:
                raise asyncio.CancelledError()  # e.g. a sync SDK bridging an event loop whose task was cancelled
            return x
        finally:
            calls.leave()

    return afn, sfn


@pytest.mark.parametrize("capacity", [None, 2], ids=["target", "pinned"])
@pytest.mark.parametrize("front", FRONTS)
def test_calls_that_get_cancelled_are_their_items_exceptions(front: str, capacity: int | None) -> None:
    """The worker that ran such a call lives on: with LIMIT workers and more cancelled items than that, a worker
    lost per cancelled call would leave items unrun (or the run hung)."""
    calls = Calls()
    afn, sfn = cancelling(calls)
    out = run_front(front, range(20), afn, sfn, return_exceptions=True, capacity=capacity)
    assert len(out) == 20
    for x, value in enumerate(out):
        if x % 5 == 2:
            assert isinstance(value, asyncio.CancelledError), (x, value)
        else:
            assert value == x, (x, value)
    assert calls.started == calls.finished == 20
    assert gate_stats("m").errors_by_type == {"CancelledError": 4}


@pytest.mark.parametrize("front", FRONTS)
def test_calls_that_get_cancelled_without_return_exceptions_raise_the_first_after_the_running_ones(
    front: str,
) -> None:
    """Without ``return_exceptions`` a cancelled call is a failure like any other: no new item starts, the
    running ones finish, and its CancelledError is raised with the first-failure note."""
    calls = Calls()
    afn, sfn = cancelling(calls)
    exc = raises(front, range(10_000), afn, sfn)
    assert isinstance(exc, asyncio.CancelledError), exc
    assert any("failed first" in note for note in getattr(exc, "__notes__", [])), exc
    assert calls.started == calls.finished < 10_000  # stopped early, nothing still running


# -- calls that answer 429 / 503 from a real server --------------------------------------------------------------
def status_server(h: FaultHandler) -> None:
    x = int(h.path.rsplit("/", 1)[-1])
    status = 429 if x % 10 == 1 else 503 if x % 10 == 2 else 200
    body = str(x).encode()
    h.send_response(status)
    if status == 429:
        h.send_header("Retry-After", "1")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


@pytest.mark.parametrize("front", FRONTS)
def test_calls_that_answer_429_or_503(front: str) -> None:
    with fault_server(status_server) as server:

        async def afn(x: int) -> int:
            async with httpx.AsyncClient(verify=False, trust_env=False) as client:
                response = await client.get(f"{server.url}/item/{x}")
                response.raise_for_status()
                return int(response.text)

        def sfn(x: int) -> int:
            with httpx.Client(verify=False, trust_env=False) as client:
                response = client.get(f"{server.url}/item/{x}")
                response.raise_for_status()
                return int(response.text)

        out = run_front(front, range(40), afn, sfn, return_exceptions=True)
    for x, value in enumerate(out):
        if x % 10 in (1, 2):
            assert isinstance(value, httpx.HTTPStatusError), (x, value)
            assert value.response.status_code == (429 if x % 10 == 1 else 503)
            assert value.request.url.path == f"/item/{x}"  # its own exception, not a neighbour's
        else:
            assert value == x
    stats = gate_stats("m")
    assert stats.calls == 40 and stats.statuses == {429: 4, 503: 4}


# -- the caller cancelled mid-run --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["map-async", "map-threads", "imap-async", "imap-threads"])
def test_caller_cancelled_mid_run_with_calls_running_queued_and_timing_out(kind: str) -> None:
    """Two fan-outs share the model; the first is cancelled while its calls run, time out, and others queue."""
    calls = Calls()
    release = threading.Event()

    async def afn(x: int) -> int:
        calls.enter()
        try:
            await asyncio.Event().wait()
            return x
        finally:
            calls.leave()

    def sfn(x: int) -> int:
        calls.enter()
        try:
            release.wait(10)
            return x
        finally:
            calls.leave()

    fn: Callable[[int], Any] = afn if kind.endswith("async") else sfn

    async def consume() -> None:
        async for _ in imap_concurrent(range(1000), fn, model="m", timeout=30):
            pass

    async def main() -> None:
        limiter = limiter_for("m", LIMIT)
        first: asyncio.Future[Any] = asyncio.ensure_future(
            map_concurrent(range(1000), fn, model="m", timeout=30) if kind.startswith("map") else consume()
        )
        second = asyncio.ensure_future(map_concurrent(range(3), fn, model="m", return_exceptions=True, timeout=0.3))
        while limiter.inflight() < LIMIT or limiter.waiting == 0:
            await asyncio.sleep(0.005)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        # The second fan-out gets the slots: each of its items times out on its own, none is lost.
        if kind.endswith("threads"):
            release.set()
        out = await second
        assert len(out) == 3 and all(isinstance(v, TimeoutError) or v == i for i, v in enumerate(out))

    bounded(lambda: asyncio.run(main()), limit_s=30)
    release.set()
    assert wait_until(lambda: calls.running == 0)
    # The caller's cancellation is not the model failing: no cancelled call is tallied as an error (the policy and
    # the outage hold read those), unlike a call that raises CancelledError of its own accord.
    assert "CancelledError" not in gate_stats("m").errors_by_type, gate_stats("m")


# -- an item iterator that raises halfway ------------------------------------------------------------------------
def halfway() -> Iterator[int]:
    yield from range(50)
    raise ValueError("the item source broke halfway")


async def ahalfway() -> AsyncIterator[int]:
    for x in range(50):
        await asyncio.sleep(0)
        yield x
    raise ValueError("the item source broke halfway")


@pytest.mark.parametrize("front", FRONTS)
def test_item_iterator_that_raises_halfway(front: str) -> None:
    calls = Calls()

    async def afn(x: int) -> int:
        calls.enter()
        try:
            await asyncio.sleep(0.01)
            return x
        finally:
            calls.leave()

    def sfn(x: int) -> int:
        calls.enter()
        try:
            threading.Event().wait(0.01)
            return x
        finally:
            calls.leave()

    exc = raises(front, halfway(), afn, sfn, return_exceptions=True)
    assert isinstance(exc, ValueError) and str(exc) == "the item source broke halfway"  # the source's own error
    # When the caller sees the error, every call it started has finished: nothing of the fan-out still runs.
    assert calls.started == calls.finished and calls.started <= 50
    assert limiter_for("m", LIMIT).inflight() == 0


@pytest.mark.parametrize("front", ["map-async", "map-threads", "imap-async", "sync-async"])
def test_async_item_iterator_that_raises_halfway(front: str) -> None:
    calls = Calls()

    async def afn(x: int) -> int:
        calls.enter()
        try:
            await asyncio.sleep(0.001)
            return x
        finally:
            calls.leave()

    def sfn(x: int) -> int:
        calls.enter()
        calls.leave()
        return x

    exc = raises(front, ahalfway(), afn, sfn)  # type: ignore[arg-type]
    assert isinstance(exc, ValueError) and str(exc) == "the item source broke halfway"
    assert calls.started == calls.finished and calls.started <= 50
