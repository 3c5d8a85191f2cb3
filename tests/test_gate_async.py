"""map_concurrent / imap_concurrent: order, errors, timeouts, cancellation, laziness, and following the target."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from conftest import POLL_WAIT_MAX_S
from model_concurrency import (
    EngineSnapshot,
    ModelRuntime,
    Observation,
    gate_stats,
    imap_concurrent,
    map_concurrent,
    map_concurrent_sync,
    register_model,
    reset_runtimes,
)
from model_concurrency.gate import limiter_for, registered_limiters
from model_concurrency.runtime import install_runtime


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


class Gauge:
    """Concurrency of the calls themselves, as fn sees it."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.started = 0
        self.finished = 0

    def enter(self) -> None:
        self.now += 1
        self.started += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self.now -= 1
        self.finished += 1


class ScriptedPolicy:
    """A policy the test steers: the next poll answers ``value``."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.seen: list[Observation] = []

    def next_target(self, target: float, obs: Observation) -> float:
        self.seen.append(obs)
        return self.value


class FakeSource:
    description = "fake"

    def read(self) -> EngineSnapshot:
        return EngineSnapshot()

    async def aread(self) -> EngineSnapshot:
        return EngineSnapshot()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def live_model(name: str, floor: int, policy: ScriptedPolicy, clock: Clock) -> ModelRuntime:
    """A registered model whose controller is real but polls a fake source on a fake clock."""
    spec = register_model(name, base_url="http://engine.invalid:8000", max_parallel_calls=floor)
    controller = ModelRuntime(spec, source=FakeSource(), policy=policy, clock=clock)
    return install_runtime(controller)


# -- basics -----------------------------------------------------------------------------------------------------
def test_results_in_input_order_for_async_and_sync_fn() -> None:
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    async def main() -> None:
        assert await map_concurrent(range(300), double, capacity=7) == [2 * x for x in range(300)]
        assert await map_concurrent(range(50), lambda x: x + 1, capacity=5) == list(range(1, 51))
        assert await map_concurrent([], double) == []

    run(main())


def test_async_iterable_input() -> None:
    async def source() -> AsyncIterator[int]:
        for x in range(40):
            await asyncio.sleep(0)
            yield x

    async def square(x: int) -> int:
        await asyncio.sleep(0)
        return x * x

    assert run(map_concurrent(source(), square, capacity=6)) == [x * x for x in range(40)]


def test_static_model_limit_is_the_concurrency() -> None:
    register_model("static", base_url=None, max_parallel_calls=3)
    gauge = Gauge()

    async def call(x: int) -> int:
        gauge.enter()
        for _ in range(3):
            await asyncio.sleep(0)
        gauge.leave()
        return x

    assert run(map_concurrent(range(100), call, model="static")) == list(range(100))
    assert gauge.peak == 3
    assert registered_limiters()["static"].inflight() == 0


def test_bad_arguments_raise_value_error_with_a_hint() -> None:
    async def noop(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="capacity must be an int >= 1"):
        run(map_concurrent([1], noop, capacity=0))
    with pytest.raises(ValueError, match="timeout must be a positive"):
        run(map_concurrent([1], noop, timeout=0))


# -- errors -----------------------------------------------------------------------------------------------------
def test_first_error_stops_new_starts_waits_for_running_and_lists_the_others() -> None:
    gauge = Gauge()
    failed = False
    starts_after_failure = 0

    async def call(x: int) -> int:
        nonlocal failed, starts_after_failure
        if failed:
            starts_after_failure += 1
        gauge.enter()
        try:
            await asyncio.sleep(0)
            if x >= 10:
                failed = True
                raise ValueError(f"bad {x}")
            await asyncio.sleep(0)
            return x
        finally:
            gauge.leave()

    with pytest.raises(ValueError, match="bad 10") as info:
        run(map_concurrent(range(1000), call, capacity=4))
    assert starts_after_failure == 0
    assert gauge.now == 0  # every started call finished before the raise
    assert gauge.started < 1000
    notes = "\n".join(info.value.__notes__)
    assert "item 10 failed first" in notes
    assert "item 11: ValueError: bad 11" in notes  # started alongside item 10, failed while draining
    assert limiter_for("default", 1).inflight() == 0


def test_return_exceptions_puts_each_error_in_its_place() -> None:
    async def call(x: int) -> int:
        await asyncio.sleep(0)
        if x % 3 == 0:
            raise KeyError(x)
        return x

    out = run(map_concurrent(range(30), call, capacity=5, return_exceptions=True))
    for x, value in enumerate(out):
        if x % 3 == 0:
            assert isinstance(value, KeyError) and value.args == (x,)
        else:
            assert value == x


def test_timeout_bounds_each_item() -> None:
    never = None

    async def call(x: int) -> int:
        nonlocal never
        if x == 3:
            never = asyncio.Event()
            await never.wait()
        return x

    out = run(map_concurrent(range(8), call, capacity=4, timeout=0.05, return_exceptions=True))
    assert isinstance(out[3], TimeoutError)
    assert [v for i, v in enumerate(out) if i != 3] == [0, 1, 2, 4, 5, 6, 7]
    stats = gate_stats("default")
    assert stats.calls == 8 and stats.timeouts == 1


def test_sync_fn_timeout_keeps_its_slot_until_the_thread_returns() -> None:
    release = threading.Event()

    def slow(x: int) -> int:
        if x == 0:
            release.wait(10)
        return x

    async def main() -> list[Any]:
        # 1 s: the other items return at once, but each crosses to a worker thread and back, which on a loaded
        # machine can take longer than a tighter bound (0.05 s timed item 1 out once).
        return await map_concurrent(range(4), slow, capacity=2, timeout=1.0, return_exceptions=True)

    out = run(main())
    assert isinstance(out[0], TimeoutError) and out[1:] == [1, 2, 3]
    limiter = registered_limiters()["default"]
    assert limiter.inflight() == 1  # the engine call behind item 0 is still running
    release.set()
    deadline = time.monotonic() + 10
    while limiter.inflight() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert limiter.inflight() == 0


# -- cancellation -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn_kind", ["async", "sync"])
def test_cancelling_the_caller_cancels_every_call_and_releases_every_slot(fn_kind: str) -> None:
    register_model("m", base_url=None, max_parallel_calls=5)
    gauge = Gauge()
    unblock = threading.Event()

    async def hang(x: int) -> int:
        gauge.enter()
        try:
            await asyncio.Event().wait()
        finally:
            gauge.leave()
        return x

    def block(x: int) -> int:
        unblock.wait(10)
        return x

    fn: Callable[[int], Any] = hang if fn_kind == "async" else block

    async def main() -> None:
        limiter = limiter_for("m", 5)
        first = asyncio.create_task(map_concurrent(range(1000), fn, model="m"))
        second = asyncio.create_task(map_concurrent(range(10), fn, model="m"))  # queued behind the first
        while limiter.inflight() < 5 or limiter.waiting == 0:
            await asyncio.sleep(0.001)
        first.cancel()
        second.cancel()
        for task in (first, second):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert limiter.waiting == 0
        if fn_kind == "async":
            assert gauge.now == 0 and limiter.inflight() == 0
        else:
            unblock.set()  # threads cannot be interrupted: their slots come back when they return
            while limiter.inflight():
                await asyncio.sleep(0.001)

    run(asyncio.wait_for(main(), 20))


def test_imap_break_cancels_the_rest() -> None:
    async def call(x: int) -> int:
        await asyncio.sleep(0)
        return x

    async def main() -> list[tuple[int, int]]:
        got = []
        stream = imap_concurrent(range(10_000), call, capacity=8)
        async for pair in stream:
            got.append(pair)
            if len(got) == 20:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        return got

    got = run(main())
    assert len(got) == 20 and all(i == v for i, v in got)
    assert registered_limiters()["default"].inflight() == 0


def test_imap_yields_index_result_pairs_as_they_complete() -> None:
    async def call(x: int) -> int:
        for _ in range(x % 5):
            await asyncio.sleep(0)
        return -x

    async def main() -> list[tuple[int, int]]:
        return [pair async for pair in imap_concurrent(range(100), call, capacity=10)]

    pairs = run(main())
    assert sorted(pairs) == [(i, -i) for i in range(100)]
    assert [i for i, _ in pairs] != list(range(100))  # completion order, not input order


def test_imap_raises_the_first_error_after_yielding_the_rest() -> None:
    async def call(x: int) -> int:
        await asyncio.sleep(0)
        if x == 5:
            raise RuntimeError("five")
        return x

    async def main() -> list[int]:
        seen = []
        with pytest.raises(RuntimeError, match="five"):
            async for i, _ in imap_concurrent(range(50), call, capacity=3):
                seen.append(i)
        return seen

    seen = run(main())
    assert 5 not in seen and len(seen) < 50


# -- laziness ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_million_item_generator_is_pulled_lazily() -> None:
    limit = 64
    pulled = finished = worst = 0
    tasks_seen = 0

    def items() -> Iterator[int]:
        nonlocal pulled
        for x in range(1_000_000):
            pulled += 1
            yield x

    async def call(x: int) -> None:
        nonlocal finished, worst, tasks_seen
        worst = max(worst, pulled - finished)
        if x % 1000 == 0:
            tasks_seen = max(tasks_seen, len(asyncio.all_tasks()))
            await asyncio.sleep(0)
        finished += 1

    async def main() -> None:
        async for _ in imap_concurrent(items(), call, capacity=limit):
            pass

    run(main())
    assert pulled == finished == 1_000_000
    assert worst <= limit + 1
    assert tasks_seen <= limit + 3  # workers + the driver + main: never a task per item


# -- following the controller ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_shrink_64_to_8_mid_fan_out_is_obeyed_once_drained() -> None:
    clock, policy = Clock(), ScriptedPolicy(64)
    controller = live_model("llm", floor=8, policy=policy, clock=clock)
    limiter = limiter_for("llm", 8)
    gauge = Gauge()
    peak_before = 0
    drained = False
    peak_after_drain = 0

    async def call(x: int) -> int:
        nonlocal peak_before, drained, peak_after_drain
        gauge.enter()
        assert controller.inflight() == limiter.inflight()  # the gate's count is what the policy sees
        assert gauge.now <= limiter.inflight()
        if drained:
            peak_after_drain = max(peak_after_drain, gauge.now)
        elif policy.value == 64:
            peak_before = max(peak_before, gauge.now)
        while policy.value == 64 and controller.peek() != 64:  # the first poll may run on the poller's thread
            await asyncio.sleep(0.005)
        if x == 1000:
            policy.value = 8
            clock.now += POLL_WAIT_MAX_S  # the next poll is due: the runtime's poller runs it, and the target drops
        while policy.value == 8 and controller.peek() != 8:  # every call waits for that poll (no wall-time race)
            await asyncio.sleep(0.005)
        for _ in range(1 + x % 4):
            await asyncio.sleep(0)
        gauge.leave()
        if policy.value == 8 and limiter.limit == 8 and gauge.now < 8:
            drained = True
        return x

    assert run(map_concurrent(range(2000), call, model="llm")) == list(range(2000))
    assert peak_before == 64
    assert drained
    assert 1 <= peak_after_drain <= 8
    assert controller.peek() == 8
    assert limiter.inflight() == 0


@pytest.mark.slow
def test_growth_mid_run_raises_concurrency_in_the_same_call() -> None:
    clock, policy = Clock(), ScriptedPolicy(8)
    controller = live_model("llm", floor=4, policy=policy, clock=clock)
    gauge = Gauge()
    peak_before = peak_after = 0

    async def call(x: int) -> int:
        nonlocal peak_before, peak_after
        gauge.enter()
        if policy.value == 8:
            peak_before = max(peak_before, gauge.now)
        else:
            peak_after = max(peak_after, gauge.now)
        while policy.value == 8 and controller.peek() != 8:  # the first poll may run on the poller's thread
            await asyncio.sleep(0.005)
        if x == 300:
            policy.value = 48
            clock.now += POLL_WAIT_MAX_S
        while policy.value == 48 and controller.peek() != 48:  # every call waits for the scheduled poll
            await asyncio.sleep(0.005)
        for _ in range(1 + x % 3):
            await asyncio.sleep(0)
        gauge.leave()
        return x

    assert run(map_concurrent(range(2000), call, model="llm")) == list(range(2000))
    assert peak_before == 8
    assert peak_after == 48


def test_outcomes_are_recorded_for_the_policy_and_the_gate() -> None:
    clock, policy = Clock(), ScriptedPolicy(4)
    controller = live_model("llm", floor=4, policy=policy, clock=clock)

    class Throttled(Exception):
        status_code = 429

    async def call(x: int) -> int:
        await asyncio.sleep(0)
        if x % 10 == 0:
            raise Throttled()
        return x

    run(map_concurrent(range(50), call, model="llm", return_exceptions=True))
    # A scheduled poll may have drained some outcomes into an Observation already: count both.
    calls = controller.calls.drain()
    seen = policy.seen
    totals = (
        calls.calls + sum(obs.client_calls for obs in seen),
        calls.errors + sum(obs.client_errors for obs in seen),
        calls.throttled + sum(obs.client_throttled for obs in seen),
    )
    assert totals == (50, 5, 5)
    stats = gate_stats("llm")
    assert (stats.calls, stats.errors, stats.statuses, stats.errors_by_type) == (50, 5, {429: 5}, {"Throttled": 5})


# -- sharing, nesting, reset ------------------------------------------------------------------------------------
def test_nested_fan_out_on_the_same_model_does_not_deadlock() -> None:
    register_model("m", base_url=None, max_parallel_calls=2)
    limiter = limiter_for("m", 2)
    peak = 0

    async def leaf(y: int) -> int:
        nonlocal peak
        peak = max(peak, limiter.inflight())
        await asyncio.sleep(0)
        return y

    async def parent(x: int) -> int:
        # Both slots are held by parents: a nested fan-out that queued for a slot would wait forever.
        return sum(await map_concurrent(range(5), leaf, model="m"))

    out = run(asyncio.wait_for(map_concurrent(range(6), parent, model="m"), 20))
    assert out == [10] * 6
    assert peak <= 2
    assert limiter.inflight() == 0


def test_threads_and_event_loop_share_one_limiter() -> None:
    register_model("m", base_url=None, max_parallel_calls=4)
    limiter = limiter_for("m", 4)
    peak = 0
    lock = threading.Lock()

    def note() -> None:
        nonlocal peak
        with lock:
            peak = max(peak, limiter.inflight())

    def sync_call(x: int) -> int:
        note()
        time.sleep(0.0005)
        return x

    async def async_call(x: int) -> int:
        note()
        await asyncio.sleep(0.0005)
        return x

    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(map_concurrent_sync(range(200), sync_call, model="m")))
    thread.start()
    assert run(map_concurrent(range(200), async_call, model="m")) == list(range(200))
    thread.join(20)
    assert out == [list(range(200))]
    assert peak <= 4 and limiter.inflight() == 0


def test_reset_mid_run_drops_the_limiter_without_breaking_the_calls() -> None:
    register_model("m", base_url=None, max_parallel_calls=3)

    async def main() -> None:
        go = asyncio.Event()

        async def call(x: int) -> int:
            await go.wait()
            return x

        old = limiter_for("m", 3)
        task = asyncio.create_task(map_concurrent(range(20), call, model="m"))
        while old.inflight() < 3:
            await asyncio.sleep(0.001)
        reset_runtimes()
        assert "m" not in registered_limiters()
        go.set()
        assert await task == list(range(20))
        assert old.inflight() == 0 and old.waiting == 0
        assert await map_concurrent(range(5), call, model="m") == list(range(5))
        assert registered_limiters()["m"] is not old

    run(asyncio.wait_for(main(), 20))


@pytest.mark.slow
def test_the_live_poller_draws_each_wait_from_its_own_stream_within_the_jitter() -> None:
    """Through map_concurrent: the runtime's poller polls when the core's jittered ``next_poll_at`` comes, and
    the waits are the ones its seeded stream gives (12 × (1 ± 0.1 × u) by default), not the fixed 12 s grid."""
    clock, policy = Clock(), ScriptedPolicy(8)
    controller = live_model("llm", floor=4, policy=policy, clock=clock)
    controller.core.jitter_rng = random.Random(11)
    twin = random.Random(11)
    polls = 8

    async def call(x: int) -> int:
        if x == 0:  # one driver moves the clock: to each due time, then waits for that poll to be done
            for k in range(1, polls):
                while len(policy.seen) < k:
                    await asyncio.sleep(0.005)
                clock.now = controller.core.next_poll_at
            while len(policy.seen) < polls:
                await asyncio.sleep(0.005)
        return x

    assert run(map_concurrent(range(20), call, model="llm")) == list(range(20))
    times = [obs.time for obs in policy.seen[:polls]]
    expected = [1000.0]
    for _ in range(polls - 1):
        expected.append(expected[-1] + 12.0 * (1.0 + 0.1 * (2.0 * twin.random() - 1.0)))
    assert times == expected
    waits = [b - a for a, b in itertools.pairwise(times)]
    assert all(10.8 <= w <= 13.2 for w in waits) and len(set(waits)) == len(waits)
