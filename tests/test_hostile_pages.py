"""Hostile pages where the target must hold: neither grow into them nor collapse (page_hold.py).

Real loopback servers serve the pages. The clock is fake where the entry point allows it (a ``ModelRuntime``
polled by ``target()``, as ``resolve_capacity`` does), and virtual through ``map_concurrent`` (its loop's clock
waits at each poll of the runtime's thread: tests/virtual_stack.py), so no claim depends on this machine's speed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import FakeClock
from model_concurrency import get_utilization, map_concurrent, register_model
from model_concurrency.lab.virtual_loop import VirtualTimeLoop
from model_concurrency.observation import Observation
from model_concurrency.page_hold import LIVELOCK, RETRACTION_LIVELOCK, WEDGED, PageHold
from model_concurrency.runtime import ModelRuntime, reset_runtimes
from model_concurrency.signals.scrape import ScrapeLimits
from model_concurrency.telemetry import snapshot
from servers import Behaviour, EngineState, MetricsServer, SglangScheduler, metrics_server, sglang_page, vllm_page
from virtual_stack import install_on_loop, run_virtual

SERVED = "meta-llama/Llama-3.1-8B-Instruct"
POLL_S = 120.0  # one poll every two minutes: an hour is 30 polls (each a real scrape)
HOUR_POLLS = int(3600 / POLL_S)


@dataclass
class Engine:
    """A page whose engine runs what the client sends and finishes a whole batch per poll, unless told otherwise."""

    running: Callable[[], float]
    wedged: float = 0  # capacity-waiting requests that never get in
    success: float = 0.0
    preemptions: float = 0.0
    livelock: bool = False
    sglang: bool = False
    admitted: float = 0.0  # the queue-time histogram's count: every request admitted, none of them kept waiting

    def render(self) -> bytes:
        if self.livelock:
            return vllm_page({SERVED: [EngineState(running=0, waiting_capacity=6, kv=0.0, success=self.success)]})
        running = self.running()
        self.success += running  # the batch turns over every poll
        self.admitted += running
        if self.sglang:
            scheduler = SglangScheduler(running=running, queue=self.wedged, retracted=self.preemptions)
            return sglang_page({SERVED: [scheduler]}, finished=self.success)
        state = EngineState(
            running=running, waiting_capacity=self.wedged, kv=0.05, success=self.success, queue_count=self.admitted
        )
        return vllm_page({SERVED: [state]})


@pytest.fixture(autouse=True)
def knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", str(POLL_S))
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "65536")


def runtime_on(server: MetricsServer, clock: FakeClock) -> ModelRuntime:
    spec = register_model("m", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=4)
    runtime = ModelRuntime(spec, clock=clock)
    runtime.source.limits = ScrapeLimits(timeout_s=0.5, deadline_s=1.0)  # type: ignore[union-attr]
    return runtime


def poll(runtime: ModelRuntime, clock: FakeClock, n: int) -> list[int]:
    targets = []
    for _ in range(n):
        clock.advance(POLL_S * 1.1)  # past the jitter: the next poll is always due
        targets.append(runtime.target())
    return targets


def ramped(runtime: ModelRuntime, clock: FakeClock) -> int:
    """Poll a healthy engine until the target leaves the floor well behind; the level reached."""
    targets = poll(runtime, clock, 12)
    assert targets[-1] >= 32, targets
    return targets[-1]


def test_wedged_request_holds_what_the_engine_serves(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    """``waiting_by_reason{capacity}`` stuck at 1 while the engine serves the rest: at most one cut, undone."""
    with metrics_server() as server:
        runtime = runtime_on(server, clock)
        engine = Engine(running=lambda: runtime.peek())
        server.behaviour = Behaviour(render=engine.render)
        before = ramped(runtime, clock)
        engine.wedged = 1
        with caplog.at_level(logging.INFO, logger="model_concurrency"):
            targets = poll(runtime, clock, HOUR_POLLS)
        assert min(targets) >= int(0.8 * before) - 1  # the policy's one cut while the reading was unproven
        assert max(targets) <= before and targets[-1] == before  # back where it was, and held: no growth
        assert runtime.core.page_hold.reason == WEDGED and snapshot(runtime)["saturated"] is False
        assert sum("not a capacity signal" in r.message for r in caplog.records) == 1  # one line, not one a poll
        # The request gets in at last: the reading moves, the policy decides again (and grows: the engine has room).
        engine.wedged = 0
        after = poll(runtime, clock, 5)
        assert runtime.core.page_hold.reason is None and after[-1] > before


def test_livelock_page_holds_for_an_hour(clock: FakeClock) -> None:
    """``running 0``, KV 0, capacity-waiting 6 and no completion, for an hour: not a single cut."""
    with metrics_server() as server:
        runtime = runtime_on(server, clock)
        engine = Engine(running=lambda: runtime.peek())
        server.behaviour = Behaviour(render=engine.render)
        before = ramped(runtime, clock)
        engine.livelock = True
        targets = poll(runtime, clock, HOUR_POLLS)
        assert set(targets) == {before}
        assert runtime.core.page_hold.reason == LIVELOCK
        assert runtime.core.consecutive_failures == 0  # a good page, held: not an outage


def test_retraction_livelock_holds(clock: FakeClock) -> None:
    """SGLang retractions climbing at zero completions: two cuts at most, then back and held."""
    with metrics_server() as server:
        runtime = runtime_on(server, clock)
        engine = Engine(running=lambda: runtime.peek(), sglang=True)
        server.behaviour = Behaviour(render=engine.render)
        before = ramped(runtime, clock)
        frozen = engine.success

        def livelocked() -> bytes:
            engine.preemptions += 5
            scheduler = SglangScheduler(running=runtime.peek(), token_usage=0.9, retracted=engine.preemptions)
            return sglang_page({SERVED: [scheduler]}, finished=frozen)

        server.behaviour = Behaviour(render=livelocked)
        targets = poll(runtime, clock, HOUR_POLLS)
        assert min(targets) >= int(0.8**2 * before) - 1
        assert max(targets) <= before and targets[-1] == before
        assert runtime.core.page_hold.reason == RETRACTION_LIVELOCK


def test_a_real_queue_still_cuts(clock: FakeClock) -> None:
    """A closed loop one batch over a full engine (queue = target - capacity) is a signal: never held above it."""
    capacity = 24
    with metrics_server() as server:
        runtime = runtime_on(server, clock)
        counts = [0.0, 0.0]  # finished (= admitted) and their total queue time

        def full() -> bytes:
            sent = runtime.peek()
            running, queued = min(sent, capacity), max(0, sent - capacity)
            counts[0] += running
            counts[1] += queued * POLL_S * 1.1  # Little: the queue held `queued` requests over the poll
            state = EngineState(
                running=running, waiting_capacity=queued, kv=0.05, success=counts[0], queue_count=counts[0],
                queue_sum=counts[1],
            )  # fmt: skip
            return vllm_page({SERVED: [state]})

        server.behaviour = Behaviour(render=full)
        targets = poll(runtime, clock, 40)
        assert runtime.core.page_hold.holds == 0
        assert sum(t > capacity for t in targets[-20:]) <= 10  # saturated at most every other poll, as AIMD does
        assert max(targets[-20:]) <= 2 * capacity


def test_map_concurrent_holds_through_a_wedged_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's own in-flight count (not the engine's gauge) shows room appeared, and the wedge is held.

    The wedge is proven from calls that completed between two polls; on virtual time (each call 10 ms, a poll every
    50 ms) an interval holds the same calls on any machine. Without the page hold the target falls to the floor."""
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0.05")
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_JITTER", "0")
    reset_runtimes()  # start from the floor with a fresh runtime
    with metrics_server() as server:
        register_model("m", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=4)
        levels: list[int] = []

        async def main(loop: VirtualTimeLoop) -> Engine:
            runtime = install_on_loop(loop, "m")
            engine = Engine(running=lambda: runtime.inflight())
            server.behaviour = Behaviour(render=engine.render)

            async def items() -> AsyncIterator[int]:
                i, seen = 0, 0
                while runtime.core.polls < 36:
                    if runtime.inflight() >= 32 and not engine.wedged:  # the gate took the room: wedge it
                        engine.wedged, seen = 1, runtime.core.polls
                        levels.append(runtime.current())
                    if engine.wedged and runtime.core.polls > seen:
                        levels.append(runtime.current())
                    yield i
                    i += 1

            await map_concurrent(items(), call_10ms, model="m")
            return engine

        engine = run_virtual(main)
        assert get_utilization("m")["saturated"] is False
    assert engine.wedged and len(levels) > 8, levels
    start = levels[0]
    assert min(levels) >= int(0.8 * start) - 1 and levels[-1] >= start, levels


async def call_10ms(i: int) -> int:
    await asyncio.sleep(0.01)
    return i


def test_map_concurrent_holds_through_a_livelock_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the gate counting its calls, a livelock page would read as "saturated, served nothing": to the floor."""
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0.05")
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_JITTER", "0")
    with metrics_server() as server:
        register_model("m", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=4)
        levels: list[int] = []

        async def main(loop: VirtualTimeLoop) -> tuple[Engine, ModelRuntime]:
            runtime = install_on_loop(loop, "m")
            engine = Engine(running=lambda: runtime.inflight())
            server.behaviour = Behaviour(render=engine.render)

            async def items() -> AsyncIterator[int]:
                i, since = 0, 0
                while not engine.livelock or runtime.core.polls < since + 15:
                    if runtime.inflight() >= 32 and not engine.livelock:
                        engine.livelock, since = True, runtime.core.polls + 1
                    if engine.livelock and runtime.core.polls >= since:
                        levels.append(runtime.current())
                    if runtime.core.polls > 60:
                        break
                    yield i
                    i += 1

            await map_concurrent(items(), call_10ms, model="m")
            return engine, runtime

        engine, runtime = run_virtual(main)
        assert engine.livelock and levels, levels
        assert min(levels) == max(levels) >= 32, levels
        assert runtime.core.page_hold.reason == LIVELOCK


observations = st.builds(
    Observation,
    running=st.floats(0, 100),
    waiting_capacity=st.sampled_from([0.0, 1.0, 2.0, 6.0]),
    preemptions=st.sampled_from([0.0, 3.0]),
    completed=st.one_of(st.none(), st.floats(0, 200)),
    queue_time_mean_s=st.one_of(st.none(), st.floats(0, 5)),
    inflight=st.integers(0, 100),
)


@given(st.lists(st.tuples(st.floats(1, 1000), observations), max_size=30))
def test_a_hold_never_raises_past_a_target_it_was_given(polls: list[tuple[float, Observation]]) -> None:
    hold, seen = PageHold(), 0.0
    for i, (target, obs) in enumerate(polls):
        seen = max(seen, target)
        held = hold.judge(target, replace(obs, time=float(i)))
        if held is not None:
            assert target <= held <= seen
        if obs.waiting_capacity == 0 and obs.preemptions == 0:
            assert held is None


def test_no_queue_time_figures_no_wedge() -> None:
    """The wedge rule needs the queue-time histogram: without it the policy decides (nothing is proven)."""
    hold = PageHold()
    for i in range(10):
        obs = Observation(running=50 - i, waiting_capacity=1, completed=100, inflight=50 - 5 * i, time=float(i))
        assert hold.judge(50.0, obs) is None
