"""Weighted admission through every front: map_concurrent, map_concurrent_sync and slot(tokens=).

A model's runtime is given a policy that answers a two-dimensional Target (requests and tokens) on a client-only
source (every poll succeeds with an empty snapshot), so the budget reaches the limiter the way production's does:
poll -> ControllerCore -> runtime -> limiter. Calls record what is in flight when they start; the tests assert the
admission rule exactly: tokens in flight never exceed the budget while two or more calls run, a call larger than
the budget runs alone, and without a weight the budget is not enforced at all.
"""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_concurrency import map_concurrent, map_concurrent_sync, slot
from model_concurrency.observation import Observation
from model_concurrency.policies.base import PolicyBase, Target
from model_concurrency.runtime import ModelRuntime, install_runtime
from model_concurrency.signals.source import ClientOnlySource

MODEL = "weighted"


class TwoBudgets(PolicyBase):
    """Answers a fixed request count and token budget on every poll."""

    def __init__(self, requests: float, tokens: float | None) -> None:
        self.requests, self.tokens = requests, tokens

    def next_target(self, target: float, obs: Observation) -> Target:
        return Target(self.requests, self.tokens)


def install(requests: int, tokens: float | None) -> ModelRuntime:
    runtime = ModelRuntime(None, name=MODEL, source=ClientOnlySource(), policy=TwoBudgets(requests, tokens))
    runtime.core.set_bounds(1, 512)
    install_runtime(runtime)
    runtime.target()  # the first poll, inline: the limits are in force before any call
    return runtime


class InFlight:
    """What runs at once: every (own tokens, calls, weighted calls, tokens) seen when a call starts."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = self.weighted = self.tokens = 0
        self.starts: list[tuple[int, int, int, int]] = []

    def enter(self, tokens: int) -> None:
        with self.lock:
            self.count += 1
            self.weighted += tokens > 0
            self.tokens += tokens
            self.starts.append((tokens, self.count, self.weighted, self.tokens))

    def leave(self, tokens: int) -> None:
        with self.lock:
            self.count -= 1
            self.weighted -= tokens > 0
            self.tokens -= tokens

    def check(self, requests: int, budget: int) -> None:
        """The rule: within the count; weighted calls together within the budget, or one of them alone.

        Zero-token calls never touch the budget, so they may join a call larger than the budget."""
        for own, count, weighted, tokens in self.starts:
            assert count <= requests
            if weighted > 1:
                assert tokens <= budget, (own, count, weighted, tokens, budget)


def assert_nothing_held(runtime: ModelRuntime) -> None:
    limiter = runtime.limiter
    assert limiter.inflight() == 0 and limiter.units() == 0 and limiter.waiting == 0


WEIGHTS = st.lists(st.integers(0, 40), min_size=1, max_size=30)


@settings(max_examples=25)
@given(weights=WEIGHTS, requests=st.integers(1, 6), budget=st.integers(1, 50))
def test_async_fan_out_keeps_tokens_in_flight_within_the_budget(weights: list[int], requests: int, budget: int) -> None:
    runtime = install(requests, budget)
    seen = InFlight()

    async def call(i: int) -> int:
        seen.enter(weights[i])
        for _ in range(3):
            await asyncio.sleep(0)
        seen.leave(weights[i])
        return i * 2

    out = asyncio.run(map_concurrent(range(len(weights)), call, model=MODEL, weight=lambda i: weights[i]))
    assert out == [i * 2 for i in range(len(weights))]
    assert runtime.limiter.budget == budget
    seen.check(requests, budget)
    assert_nothing_held(runtime)


@settings(max_examples=15)
@given(weights=WEIGHTS, requests=st.integers(1, 6), budget=st.integers(1, 50))
def test_sync_fan_out_keeps_tokens_in_flight_within_the_budget(weights: list[int], requests: int, budget: int) -> None:
    runtime = install(requests, budget)
    seen = InFlight()
    gate = threading.Event()

    def call(i: int) -> int:
        seen.enter(weights[i])
        gate.wait(0.001)  # let the others pile up behind the limits (no timing is asserted)
        seen.leave(weights[i])
        return i + 1

    out = map_concurrent_sync(range(len(weights)), call, model=MODEL, weight=lambda i: weights[i])
    assert out == [i + 1 for i in range(len(weights))]
    seen.check(requests, budget)
    assert_nothing_held(runtime)


def test_a_call_larger_than_the_budget_waits_for_the_others_and_runs_alone() -> None:
    runtime = install(8, 10)
    weights = [4, 4, 25, 1, 1]
    seen = InFlight()

    async def call(i: int) -> int:
        seen.enter(weights[i])
        for _ in range(5):
            await asyncio.sleep(0)
        seen.leave(weights[i])
        return i

    asyncio.run(map_concurrent(range(5), call, model=MODEL, weight=lambda i: weights[i]))
    assert [(own, count) for own, count, _, _ in seen.starts] == [(4, 1), (4, 2), (25, 1), (1, 1), (1, 2)]
    assert_nothing_held(runtime)


def test_without_a_weight_the_budget_is_not_enforced() -> None:
    runtime = install(5, 1)
    seen = InFlight()

    async def call(i: int) -> int:
        seen.enter(0)
        for _ in range(3):
            await asyncio.sleep(0)
        seen.leave(0)
        return i

    asyncio.run(map_concurrent(range(20), call, model=MODEL))
    assert max(count for _, count, _, _ in seen.starts) == 5
    assert runtime.limiter.budget == 1
    assert_nothing_held(runtime)


BAD = [-1, math.nan, math.inf, "12", None, True]


@pytest.mark.parametrize("front", ["async", "sync", "sync-async-fn"])
def test_bad_weights_are_each_items_error_and_nothing_is_lost(front: str) -> None:
    runtime = install(3, 100)
    values: list[Any] = [5, *BAD, 7, "raise"]

    def weight(i: int) -> Any:
        if values[i] == "raise":
            raise KeyError("no size for this item")
        return values[i]

    def plain(i: int) -> int:
        return i * 10

    async def coro(i: int) -> int:
        return i * 10

    items = range(len(values))
    if front == "async":
        out = asyncio.run(map_concurrent(items, coro, model=MODEL, weight=weight, return_exceptions=True))
    elif front == "sync":
        out = map_concurrent_sync(items, plain, model=MODEL, weight=weight, return_exceptions=True)
    else:
        out = map_concurrent_sync(items, coro, model=MODEL, weight=weight, return_exceptions=True)
    assert out[0] == 0 and out[len(BAD) + 1] == (len(BAD) + 1) * 10
    for i in range(1, len(BAD) + 1):
        assert isinstance(out[i], ValueError) and "finite number of tokens >= 0" in str(out[i])
    assert isinstance(out[-1], KeyError)
    assert_nothing_held(runtime)


def test_bad_weight_without_return_exceptions_raises_it() -> None:
    runtime = install(3, 100)
    with pytest.raises(ValueError, match="finite number of tokens"):
        map_concurrent_sync(range(10), lambda i: i, model=MODEL, weight=lambda i: -1 if i == 4 else 1)
    with pytest.raises(ValueError, match="finite number of tokens"):
        asyncio.run(map_concurrent(range(10), _echo, model=MODEL, weight=lambda i: math.nan if i == 4 else 1))
    with pytest.raises(TypeError, match="weight must be a callable"):
        map_concurrent_sync(range(3), lambda i: i, model=MODEL, weight=3)  # type: ignore[arg-type]
    assert_nothing_held(runtime)


async def _echo(i: int) -> int:
    return i


def test_slot_tokens_wait_for_the_budget_async() -> None:
    runtime = install(10, 100)

    async def main() -> list[str]:
        order: list[str] = []
        first = slot(MODEL, tokens=70)
        await first.__aenter__()

        async def second() -> None:
            async with slot(MODEL, tokens=50):
                order.append("second in")

        task = asyncio.create_task(second())
        async with slot(MODEL):  # unweighted: the budget does not hold it back
            order.append("unweighted in")
        for _ in range(5):
            await asyncio.sleep(0)
        assert runtime.limiter.units() == 70 and runtime.limiter.waiting == 1
        order.append("first out")
        await first.__aexit__(None, None, None)
        await task
        return order

    assert asyncio.run(main()) == ["unweighted in", "first out", "second in"]
    assert_nothing_held(runtime)


def test_slot_tokens_sync_and_bad_tokens() -> None:
    runtime = install(10, 100)
    with slot(MODEL, tokens=60.2):
        assert runtime.limiter.units() == 61
    for bad in (-1, math.inf, math.nan, "3"):
        with pytest.raises(ValueError, match="finite number of tokens"):
            slot(MODEL, tokens=bad)  # type: ignore[arg-type]
    assert_nothing_held(runtime)


def test_cancelled_weighted_waiter_lets_smaller_ones_behind_it_in() -> None:
    runtime = install(10, 100)

    async def main() -> None:
        holder = slot(MODEL, tokens=60)
        await holder.__aenter__()

        async def take(tokens: int, log: list[int]) -> None:
            async with slot(MODEL, tokens=tokens):
                log.append(tokens)
                await asyncio.sleep(0)

        log: list[int] = []
        big = asyncio.create_task(take(90, log))
        await asyncio.sleep(0)
        small = asyncio.create_task(take(30, log))
        await asyncio.sleep(0)
        assert runtime.limiter.waiting == 2  # the small one waits behind the big head (FIFO)
        big.cancel()
        await small  # withdrawing the head admits the small one at once
        assert log == [30]
        await holder.__aexit__(None, None, None)
        await asyncio.gather(big, return_exceptions=True)

    asyncio.run(main())
    assert_nothing_held(runtime)


@pytest.mark.parametrize("tokens", [None, math.nan, math.inf])
def test_a_count_only_or_nonfinite_token_answer_leaves_the_budget_unenforced(tokens: float | None) -> None:
    runtime = install(4, tokens)
    assert map_concurrent_sync(range(5), lambda i: i, model=MODEL, weight=lambda i: 10**6) == list(range(5))
    assert runtime.limiter.budget is None
    assert_nothing_held(runtime)
