"""The Retry-After hold: the rule (exact), header parsing, and every gate front honouring it on a test clock."""

from __future__ import annotations

import asyncio
import contextlib
import math
from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fault_servers import fault_server, page
from model_concurrency import map_concurrent, map_concurrent_sync, slot
from model_concurrency.config import register_model
from model_concurrency.gate.hold import (
    MAX_RETRY_AFTER_S,
    AdmissionHold,
    retry_after_from_exception,
    retry_after_from_headers,
)
from model_concurrency.runtime import ModelRuntime, install_runtime, runtime_for
from model_concurrency.signals.source import ClientOnlySource


class TickingClock:
    """Advances ``step`` seconds at every read: a wait on it ends after a known number of reads, with no sleeps
    that matter, and the time a call started is exact."""

    def __init__(self, step: float = 1.0) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def held_runtime(name: str = "m", floor: int = 4) -> tuple[ModelRuntime, TickingClock]:
    register_model(name, base_url=None, max_parallel_calls=floor)
    clock = TickingClock()
    runtime = install_runtime(ModelRuntime(runtime_for(name).spec, name=name, clock=clock))
    return runtime, clock


def test_hold_extends_never_shortens_and_caps() -> None:
    hold = AdmissionHold()
    assert hold.remaining(0.0) == 0.0
    assert hold.note(10, now=100.0) == 110.0
    assert hold.note(2, now=101.0) == 110.0  # shorter: the later deadline stays
    assert hold.remaining(105.0) == 5.0
    assert hold.note(1e9, now=200.0) == 200.0 + MAX_RETRY_AFTER_S
    assert hold.holds == 2


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, "5", True])
def test_note_rejects_nonsense(bad: object) -> None:
    hold = AdmissionHold()
    with pytest.raises(ValueError, match="retry-after"):
        hold.note(bad, now=0.0)  # type: ignore[arg-type]
    assert hold.remaining(0.0) == 0.0  # nothing changed


@given(st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 500)), min_size=1, max_size=20))
def test_hold_is_the_latest_capped_deadline(notes: list[tuple[float, float]]) -> None:
    hold = AdmissionHold()
    now, expected = 0.0, -math.inf
    for gap, delay in notes:
        now += gap
        hold.note(delay, now)
        expected = max(expected, now + min(delay, MAX_RETRY_AFTER_S))
    assert hold.until == expected


def test_headers() -> None:
    assert retry_after_from_headers({"Retry-After": "7"}) == 7.0
    assert retry_after_from_headers({"retry-after": "0.5"}) == 0.5
    assert retry_after_from_headers({"Retry-After": "7", "retry-after-ms": "1500"}) == 1.5
    assert retry_after_from_headers({"Retry-After": "soon"}) is None
    assert retry_after_from_headers({"Retry-After": "-3"}) is None
    assert retry_after_from_headers({"Retry-After": "nan"}) is None
    assert retry_after_from_headers({}) is None
    fixed = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    date = "Thu, 01 Jan 2026 12:00:30 GMT"
    assert retry_after_from_headers({"Retry-After": date}, now=lambda: fixed) == 30.0
    assert retry_after_from_headers({"Retry-After": "Thu, 01 Jan 2026 11:00:00 GMT"}, now=lambda: fixed) == 0.0


def test_runtime_note_validates() -> None:
    runtime, _ = held_runtime()
    with pytest.raises(ValueError):
        runtime.note_retry_after(-1)
    assert runtime.held_for() == 0.0
    runtime.note_retry_after(30)
    assert 0 < runtime.held_for() <= 30


def test_sync_slot_starts_after_the_hold() -> None:
    runtime, clock = held_runtime()
    until = runtime.note_retry_after(5)
    with slot("m"):
        started = clock.now
    assert started >= until
    with slot("m"):  # the hold has passed: no wait (one clock read to check, one to note the acquire)
        pass
    assert runtime.calls.drain().calls == 2


def test_async_slot_starts_after_the_hold() -> None:
    runtime, clock = held_runtime()
    until = runtime.note_retry_after(5)

    async def main() -> float:
        async with slot("m"):
            return clock.now

    assert asyncio.run(main()) >= until


def test_fan_outs_start_no_item_during_the_hold() -> None:
    runtime, clock = held_runtime(floor=3)
    until = runtime.note_retry_after(6)
    starts = map_concurrent_sync(range(8), lambda _: clock.now, model="m")
    assert min(starts) >= until
    until = runtime.note_retry_after(6)

    async def fn(_: int) -> float:
        return clock.now

    starts = asyncio.run(map_concurrent(range(8), fn, model="m"))
    assert min(starts) >= until
    until = runtime.note_retry_after(6)
    pinned = map_concurrent_sync(range(4), lambda _: clock.now, model="m", capacity=2)
    assert min(pinned) >= until


def test_a_429_raised_in_a_fan_out_holds_the_model() -> None:
    """An httpx error from a real loopback server that answers 429 + Retry-After reaches the runtime."""
    register_model("m", base_url=None, max_parallel_calls=2)
    with fault_server(page("slow down", status=429, headers={"Retry-After": "40"})) as server:

        def call(_: int) -> int:
            response = httpx.get(server.url, timeout=5)
            response.raise_for_status()
            return response.status_code

        results = map_concurrent_sync(range(1), call, model="m", return_exceptions=True)
    assert isinstance(results[0], httpx.HTTPStatusError)
    assert retry_after_from_exception(results[0]) == 40.0
    runtime = runtime_for("m")
    assert 39 < runtime.held_for() <= 40
    assert runtime.limiter.hold.holds == 1


def test_a_throttled_slot_cuts_the_runtime_target_at_once() -> None:
    """A 429 a transport reports (``set_status``) cuts the target between polls: 0.9 x the calls still in flight."""
    register_model("m", base_url=None, max_parallel_calls=2)
    spec = runtime_for("m").spec
    runtime = install_runtime(ModelRuntime(spec, name="m", source=ClientOnlySource(), clock=TickingClock()))
    runtime.core.target_value = 64.0
    runtime.apply_limits()

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(21):
                await stack.enter_async_context(slot("m"))
            refused = slot("m")
            async with refused:
                refused.set_status(429, retry_after_s=0.0)
            assert runtime.current() == 18  # 21 still in flight after the refused one left: 0.9 x 21, rounded down
            assert runtime.limiter.limit == 18

    asyncio.run(main())
    assert runtime.calls.drain().throttled == 1


def test_a_429_through_the_httpx_transport_cuts_the_target() -> None:
    """The wrapped-client path (``SlotTransport``, which ``integrations.openai.wrap`` uses) against a real loopback
    server answering 429: the same cut as the lab's clients, and the hold."""
    from model_concurrency.integrations.httpx import SlotTransport

    register_model("m", base_url=None, max_parallel_calls=2)
    spec = runtime_for("m").spec
    runtime = install_runtime(ModelRuntime(spec, name="m", source=ClientOnlySource()))
    runtime.core.target_value = 64.0
    runtime.apply_limits()
    refusing = page("slow down", status=429, headers={"retry-after-ms": "1"})
    with fault_server(refusing) as server, httpx.Client(transport=SlotTransport(model="m"), timeout=5) as client:
        assert client.get(server.url).status_code == 429
    assert runtime.current() == 2  # nothing else in flight: 0.9 x 0, held up by the floor
    assert runtime.limiter.hold.holds == 1
    assert runtime.calls.drain().throttled == 1
