"""The Retry-After hold: the rule (exact), header parsing, and every gate front honouring it on a test clock."""

from __future__ import annotations

import asyncio
import contextlib
import functools
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
    HOLD_BACKOFF_MAX_S,
    HOLD_DECAY,
    HOLD_FACTOR_MAX,
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
def test_without_backoff_the_hold_is_the_latest_capped_deadline(notes: list[tuple[float, float]]) -> None:
    hold = AdmissionHold()
    now, expected = 0.0, -math.inf
    for gap, delay in notes:
        now += gap
        hold.note(delay, now)
        expected = max(expected, now + min(delay, MAX_RETRY_AFTER_S))
    assert hold.until == expected
    assert hold.factor == 1.0


@given(st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 500), st.integers(0, 3000)), min_size=1, max_size=20))
def test_with_backoff_never_shorter_than_asked_never_past_the_caps(notes: list[tuple[float, float, int]]) -> None:
    """Whatever the backoff: each deadline covers the delay asked (capped), the backoff adds no more than up to
    HOLD_BACKOFF_MAX_S, and a deadline never shortens."""
    hold = AdmissionHold()
    now, before = 0.0, -math.inf
    for gap, delay, accepted in notes:
        now += gap
        for _ in range(accepted):
            hold.accepted()
        until = hold.note(delay, now, backoff=True)
        asked = now + min(delay, MAX_RETRY_AFTER_S)
        assert until >= asked
        assert until <= max(before, asked, now + HOLD_BACKOFF_MAX_S)
        assert until >= before
        assert 1.0 <= hold.factor <= HOLD_FACTOR_MAX
        before = until


def test_repeated_refusals_double_the_hold_and_accepted_calls_shrink_it() -> None:
    """The backoff, exactly: a refusal after the hold ended doubles the factor for the next hold; refusals during
    a hold (the rest of one burst) do not; each accepted call multiplies it by HOLD_DECAY, down to 1."""
    hold = AdmissionHold()
    note = functools.partial(hold.note, backoff=True)
    assert note(0.1, now=0.0) == 0.1  # the first refusal: the delay as named
    assert hold.factor == 2.0
    assert note(0.1, now=0.05) == pytest.approx(0.25)  # same burst: 0.1 x 2, no doubling
    assert hold.factor == 2.0
    assert note(0.1, now=0.3) == pytest.approx(0.5)  # sent after the hold, refused again: x 2 now, x 4 next
    assert hold.factor == 4.0
    assert note(0.1, now=1.0) == pytest.approx(1.4)
    assert hold.factor == 8.0
    for _ in range(1000):
        hold.accepted()
    assert hold.factor == pytest.approx(8.0 * HOLD_DECAY**1000)
    for _ in range(5000):
        hold.accepted()
    assert hold.factor == 1.0
    for k in range(20):
        note(0.001, now=10.0 + k)
    assert hold.factor == HOLD_FACTOR_MAX
    assert note(1.0, now=100.0) == 100.0 + HOLD_BACKOFF_MAX_S  # 1 s x 1024: the backoff's cap
    assert note(MAX_RETRY_AFTER_S * 2, now=200.0) == 200.0 + MAX_RETRY_AFTER_S  # a delay named: as named, capped


def test_the_runtime_backs_off_only_at_its_floor() -> None:
    """Above the floor a refusal holds for the delay as named (the target's own cuts do the work); at the floor,
    where nothing lowers it, repeated refusals lengthen the hold."""
    runtime, clock = held_runtime(floor=4)
    hold = runtime.limiter.hold
    runtime.core.target_value = 40.0
    assert runtime.core.target > runtime.core.lower
    for _ in range(3):
        clock.now += 10.0
        assert runtime.note_retry_after(1.0) == pytest.approx(clock.now + 1.0, abs=1.0)
    assert hold.factor == 1.0
    runtime.core.target_value = 4.0
    clock.now += 10.0
    first = runtime.note_retry_after(1.0) - clock.now  # factor 1, then 2
    clock.now += 10.0
    second = runtime.note_retry_after(1.0) - clock.now  # factor 2, then 4
    assert hold.factor == 4.0
    assert second == pytest.approx(2.0 * first, abs=0.1)
    assert runtime.state().as_dict()["hold_backoff"] == 4.0  # get_utilization's record, beside the other fallbacks


def test_every_front_counts_an_accepted_call_once() -> None:
    """map_concurrent_sync, map_concurrent and slot() each shrink the backoff once per call that succeeded, and a
    failed call (not a refusal) leaves it alone."""
    runtime, _ = held_runtime(floor=3)
    hold = runtime.limiter.hold
    hold.factor = 2.0
    map_concurrent_sync(range(7), lambda x: x, model="m")
    assert hold.factor == pytest.approx(2.0 * HOLD_DECAY**7)

    async def fn(x: int) -> int:
        return x

    asyncio.run(map_concurrent(range(5), fn, model="m"))
    assert hold.factor == pytest.approx(2.0 * HOLD_DECAY**12)
    with slot("m"):
        pass
    assert hold.factor == pytest.approx(2.0 * HOLD_DECAY**13)

    def boom(_: int) -> int:
        raise RuntimeError("the caller's own bug")

    map_concurrent_sync(range(3), boom, model="m", return_exceptions=True)
    assert hold.factor == pytest.approx(2.0 * HOLD_DECAY**13)


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
    runtime.core.next_poll_at = math.inf  # no poll drains the call counts or moves the target under the test
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
    runtime.core.next_poll_at = math.inf
    runtime.apply_limits()
    refusing = page("slow down", status=429, headers={"retry-after-ms": "1"})
    with fault_server(refusing) as server, httpx.Client(transport=SlotTransport(model="m"), timeout=5) as client:
        assert client.get(server.url).status_code == 429
    assert runtime.current() == 2  # nothing else in flight: 0.9 x 0, held up by the floor
    assert runtime.limiter.hold.holds == 1
    assert runtime.calls.drain().throttled == 1
