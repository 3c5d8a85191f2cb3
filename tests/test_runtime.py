"""The model runtime: its usage meter, its registry, the declared policy traits and the knobs it validates."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import FakeClock
from model_concurrency import get_utilization, knobs, map_concurrent_sync, register_model, slot
from model_concurrency.config import setting
from model_concurrency.controller import CallRecorder, ControllerCore
from model_concurrency.gate.model_limiter import ModelLimiter
from model_concurrency.observation import EngineSnapshot
from model_concurrency.policies import AIMD, Gradient, load_policy
from model_concurrency.policies.base import declared_grace_polls, uses_engine_signals
from model_concurrency.runtime import poll_step, runtime_for
from model_concurrency.signals.source import ClientOnlySource
from servers import Behaviour, EngineState, metrics_server, vllm_page

# -- the usage meter under every interleaving --------------------------------------------------------------------
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.just(0.0)),
        st.tuples(st.just("release"), st.just(0.0)),
        st.tuples(st.just("resize"), st.integers(1, 6).map(float)),
        st.tuples(st.just("wait"), st.floats(0.0, 5.0)),
        st.tuples(st.just("poll"), st.just(0.0)),
    ),
    max_size=80,
)


@given(OPS)
def test_usage_meter_sees_the_whole_interval(ops: list[tuple[str, float]]) -> None:
    """Peak = the most held at any moment since the previous poll; mean = the time-average over it."""
    clock = FakeClock(0.0)
    limiter = ModelLimiter("m", 3, clock)
    held = 0
    level_since_poll = [0]  # every count the interval saw, starting with the one at its start
    area, start = 0.0, 0.0
    for op, arg in ops:
        before = limiter.inflight()
        if op == "acquire":
            if limiter.try_acquire():
                held += 1
        elif op == "release" and held:
            limiter.release()
            held -= 1
        elif op == "resize":
            limiter.resize(int(arg))
        elif op == "wait":
            at = clock.now
            clock.advance(arg)
            area += before * (clock.now - at)  # the clock's own step: a float sum rounds, and the meter reads it
        elif op == "poll":
            usage = limiter.take_usage()
            assert usage.inflight == limiter.inflight() == held
            assert usage.peak == max(level_since_poll)
            span = clock.now - start
            if span > 0:
                assert usage.mean == pytest.approx(area / span)
            else:
                assert usage.mean is None
            level_since_poll, area, start = [held], 0.0, clock.now
        level_since_poll.append(limiter.inflight())
    assert limiter.inflight() == held


def test_a_full_window_counts_as_used_whenever_the_poll_happens() -> None:
    """4 calls held most of the interval, one released just before the poll: the policy sees a full window."""
    clock = FakeClock(0.0)
    limiter = ModelLimiter("m", 4, clock)
    for _ in range(4):
        assert limiter.try_acquire()
    clock.advance(0.9)
    limiter.release()
    clock.advance(0.1)
    usage = limiter.take_usage()
    assert (usage.inflight, usage.peak) == (3, 4)
    assert usage.mean == pytest.approx(3.9)
    core = ControllerCore(policy=AIMD(), floor=4, ceiling=64)
    assert poll_step(core, CallRecorder().drain(), usage, 1.0, EngineSnapshot(running=3)) == 5
    assert core.last_observation is not None and core.last_observation.inflight_peak == 4


# -- registry ------------------------------------------------------------------------------------------------------
def test_one_runtime_per_model_rebuilt_on_re_registration() -> None:
    register_model("m", base_url=None, max_parallel_calls=3)
    first = runtime_for("m")
    assert runtime_for("m") is first and first.limiter.limit == 3
    register_model("m", base_url=None, max_parallel_calls=5)
    second = runtime_for("m")
    assert second is not first and second.current() == 5


# -- declared policy traits ----------------------------------------------------------------------------------------
def test_gradient_needs_no_engine_signals_and_a_hosted_model_is_not_scraped() -> None:
    assert uses_engine_signals(Gradient()) is False and uses_engine_signals(AIMD()) is True
    register_model("hosted", base_url="https://api.example.invalid/v1", policy="gradient")
    assert isinstance(runtime_for("hosted").source, ClientOnlySource)


def test_plugins_without_the_declarations_get_the_documented_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).parent.parent)
    plugin = load_policy("policies/example_plugin.py:Hysteresis")
    assert declared_grace_polls(plugin) is None and uses_engine_signals(plugin) is True
    assert declared_grace_polls(load_policy("seed-aimd")) == 0


# -- knobs and registration ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "raw", "default"),
    [
        ("MODEL_MAX_CONCURRENCY", "0", 512),
        ("MODEL_MAX_CONCURRENCY", "-3", 512),
        ("MODEL_CONCURRENCY_TIMEOUT_S", "0", 2.0),
        ("MODEL_CONCURRENCY_TIMEOUT_S", "-1.5", 2.0),
        ("MODEL_CONCURRENCY_POLL_S", "-1", 12.0),
        ("MODEL_CONCURRENCY_GRACE_POLLS", "-2", 3),
        ("MODEL_CONCURRENCY_THREAD_IDLE_S", "-0.5", 10.0),
        ("MODEL_CONCURRENCY_RAMP_POLL_DIVISOR", "0.5", 6.0),
        ("MODEL_CONCURRENCY_POLL_JITTER", "1", 0.1),
        ("MODEL_CONCURRENCY_POLL_JITTER", "-0.1", 0.1),
    ],
)
def test_invalid_knob_values_are_warned_about_and_ignored(
    name: str, raw: str, default: float, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(name, raw)
    monkeypatch.setattr(knobs, "_warned", set())
    with caplog.at_level(logging.WARNING, "model_concurrency"):
        assert setting(name, default) == default
        assert setting(name, default) == default
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith(f"ignoring {name}={raw!r}: must be")


@pytest.mark.parametrize(
    ("name", "default"), [("MODEL_CONCURRENCY_POLL_S", 12.0), ("MODEL_CONCURRENCY_GRACE_POLLS", 3)]
)
def test_zero_poll_interval_and_zero_grace_stay_valid(
    name: str, default: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, "0")
    assert setting(name, default) == 0


def test_zero_max_parallel_calls_is_rejected_at_registration() -> None:
    with pytest.raises(ValueError, match="max_parallel_calls must be an int >= 1, got 0"):
        register_model("m", base_url=None, max_parallel_calls=0)


def test_an_unknown_model_name_allowed_at_the_floor_warns_once_per_name(caplog: pytest.LogCaptureFixture) -> None:
    register_model("known", base_url=None)
    with caplog.at_level(logging.WARNING, "model_concurrency"):
        for _ in range(3):
            assert map_concurrent_sync([1, 2], lambda x: x, model="typo", allow_unregistered=True) == [1, 2]
        map_concurrent_sync([1], lambda x: x, model="other-typo", allow_unregistered=True)
    lines = [r.getMessage() for r in caplog.records if "is not registered" in r.getMessage()]
    assert lines == [
        "model 'typo' is not registered (known: known); using capacity 1",
        "model 'other-typo' is not registered (known: known); using capacity 1",
    ]


def test_last_poll_is_wall_clock_time() -> None:
    page = vllm_page({"served": [EngineState(running=1)]})
    with metrics_server(Behaviour(body=page)) as server:
        register_model("m", base_url=f"{server.url}/v1", served_model_name="served", max_parallel_calls=2)
        before = time.time()
        runtime_for("m").target()
        after = time.time()
    last_poll = get_utilization("m")["last_poll"]
    assert before - 1 <= last_poll <= after + 1  # epoch seconds, not the monotonic clock's uptime


# -- slot ----------------------------------------------------------------------------------------------------------
def test_slot_counts_waits_and_records_outcomes() -> None:
    import asyncio
    import threading

    register_model("m", base_url=None, max_parallel_calls=2)
    runtime = runtime_for("m")

    class Throttled(Exception):
        status_code = 429

    seen: list[int] = []

    def third_call() -> None:
        with slot("m"):
            seen.append(runtime.inflight())

    with slot("m"), slot("m"):
        assert runtime.inflight() == 2
        third = threading.Thread(target=third_call)  # waits: the limit is reached
        third.start()
        deadline = time.monotonic() + 10
        while runtime.limiter.waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert runtime.limiter.waiting == 1 and seen == []
    third.join(10)  # granted once the two were released
    assert not third.is_alive() and seen == [1]

    async def main() -> None:
        with pytest.raises(Throttled):
            async with slot("m"):
                assert runtime.inflight() == 1
                raise Throttled()

    asyncio.run(main())
    calls = runtime.calls.drain()
    assert (calls.calls, calls.errors, calls.throttled) == (4, 1, 1)
    assert runtime.inflight() == 0 and runtime.limiter.waiting == 0
