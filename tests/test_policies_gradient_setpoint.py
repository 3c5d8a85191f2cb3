"""Exact-value tests of the gradient (latency) and setpoint (PI) policies."""

from __future__ import annotations

import math
from typing import Any

import pytest

from model_concurrency import ControllerCore, Observation
from model_concurrency.policies import Gradient, Setpoint


# -- gradient ------------------------------------------------------------------------------------------------------
def calls(
    latency: float | None,
    *,
    t: float = 0.0,
    n: int = 120,
    inflight: int = 100,
    throttled: int = 0,
    errors: int = 0,
    **gauges: Any,
) -> Observation:
    """An ok poll of an endpoint without /metrics: zero gauges unless given; only the client's own figures."""
    return Observation(
        time=t,
        inflight=inflight,
        client_calls=n,
        client_throttled=throttled,
        client_errors=errors,
        client_latency_mean_s=latency,
        **gauges,
    )


def steady(setpoint_latency: float = 2.0, *, tolerance: float = 1.5) -> Gradient:
    """A policy past startup whose setpoint is ``tolerance × setpoint_latency``."""
    policy = Gradient(slow_start_factor=1, tolerance=tolerance)
    assert policy.next_target(100, calls(setpoint_latency, inflight=100)) == 100 * min(2.0, tolerance)
    assert policy.setpoint == tolerance * setpoint_latency and not policy.ramping
    return policy


def test_gradient_steers_to_the_setpoint_latency() -> None:
    policy = steady(2.0)  # setpoint 3 s
    # Past the knee latency grows with concurrency: 6 s at 100 → 3/6 → 50, the knee in one step.
    assert policy.next_target(100, calls(6.0, t=12)) == 50.0
    assert policy.next_target(100, calls(4.0, t=24)) == 75.0
    # Below it, growth is the ratio, capped at max_growth; a cut is capped at min_gradient.
    assert policy.next_target(100, calls(2.4, t=36)) == 125.0
    assert policy.next_target(100, calls(0.5, t=48)) == 200.0
    assert policy.next_target(100, calls(60.0, t=60)) == 50.0


def test_gradient_slow_start_doubles_until_a_doubling_buys_less_than_15_percent() -> None:
    policy = Gradient()
    # Completions per 12 s poll: +100 %, +60 %, then +5 % (the pipe is full): 4, 8, 16, 32, then drain to 32.
    assert policy.next_target(4, calls(1.0, t=0, n=50, inflight=4)) == 8
    assert policy.next_target(8, calls(1.0, t=12, n=50, inflight=8)) == 16
    assert policy.next_target(16, calls(1.1, t=24, n=100, inflight=16)) == 32
    assert policy.next_target(32, calls(1.2, t=36, n=160, inflight=32)) == 64
    assert policy.ramping
    assert policy.next_target(64, calls(1.5, t=48, n=168, inflight=64)) == 32  # back to the level before
    assert not policy.ramping and policy.setpoint == pytest.approx(1.1 * 1.2)


def test_gradient_slow_start_ends_when_a_doubling_only_bought_latency() -> None:
    policy = Gradient()
    policy.next_target(16, calls(1.0, t=0, inflight=16))
    policy.next_target(32, calls(1.0, t=12, n=100, inflight=32))
    # Completions doubled (others' share, when several clients ramp) but latency rose 1.7×: past the knee.
    assert policy.next_target(64, calls(1.7, t=24, n=200, inflight=64)) == 32
    assert policy.setpoint == pytest.approx(1.1)


def test_gradient_waits_a_poll_before_judging_a_doubling_when_calls_are_long() -> None:
    policy = Gradient()
    assert policy.next_target(16, calls(4.0, t=0, n=40, inflight=16)) == 32
    # 4 s calls against 12 s polls (> settle × 12 s): this interval's completions started mostly before the
    # doubling, so it looks like no gain; hold and judge on the next interval, against the level before.
    assert policy.next_target(32, calls(4.5, t=12, n=40, inflight=32)) == 32
    assert policy.ramping
    assert policy.next_target(32, calls(4.5, t=24, n=70, inflight=32)) == 64
    assert policy.ramping


def test_gradient_queue_estimate_from_the_fastest_call_lowers_the_setpoint() -> None:
    policy = steady(2.0)  # setpoint 3 s; r0 unknown until a fastest latency is seen
    fast = Observation(time=12, inflight=100, client_calls=120, client_latency_mean_s=1.2, client_latency_min_s=0.12)
    assert policy.next_target(100, fast) == 200.0  # r0 = 0.1, no queue; the unloaded latency is now 1.2 s
    # Every call waited: fastest 2.2 s of a 4 s mean → Q = (2.2 − 0.4) / 0.9 = 2 s ≥ 0.5 × the 2 s of service.
    queued = Observation(time=24, inflight=100, client_calls=120, client_latency_mean_s=4.0, client_latency_min_s=2.2)
    assert policy.next_target(100, queued) == pytest.approx(50.0)
    assert policy.setpoint == pytest.approx(2.0)


def test_gradient_queue_estimate_never_lowers_the_setpoint_below_the_unloaded_latency() -> None:
    """Calls of one size, one at a time: min / mean near 1, far above the r0 of varied batches, reads as a queue.
    The setpoint stops at tolerance x the lowest poll mean instead of falling toward 0 (seen live)."""
    policy = steady(2.0, tolerance=1.1)  # setpoint 2.2 s, unloaded latency 2.0 s
    batch = Observation(time=12, inflight=100, client_calls=120, client_latency_mean_s=2.0, client_latency_min_s=1.0)
    policy.next_target(100, batch)  # r0 = 0.5
    for i in range(5):
        alone = Observation(
            time=24 + 12 * i, inflight=1, client_calls=40, client_latency_mean_s=2.0, client_latency_min_s=1.98
        )
        policy.next_target(1, alone)
        assert policy.setpoint == pytest.approx(2.2)


def test_gradient_cuts_on_throttling_or_errors_and_ignores_those_latencies() -> None:
    policy = steady(2.0)
    assert policy.next_target(100, calls(0.01, t=12, throttled=3)) == 80.0
    assert policy.next_target(100, calls(0.01, t=24, throttled=1, inflight=0)) == 80.0  # even when app-limited
    assert policy.next_target(100, calls(0.01, t=36, errors=2)) == 80.0
    assert policy.setpoint == 3.0
    ramping = Gradient()
    assert ramping.next_target(4, calls(1.0, throttled=1)) == 3.2
    assert not ramping.ramping and ramping.setpoint is None
    assert ramping.next_target(4, calls(1.0, t=12)) == pytest.approx(4 * 1.1)  # the next clean poll sets it


def test_gradient_application_limited_does_not_grow_but_cuts() -> None:
    policy = steady(2.0)
    assert policy.next_target(100, calls(1.0, t=12, inflight=49)) == 100.0
    assert policy.next_target(100, calls(6.0, t=24, inflight=49)) == 50.0


def test_gradient_holds_without_enough_calls_and_ignores_engine_gauges() -> None:
    policy = steady(2.0)
    assert policy.next_target(100, calls(None, t=12)) == 100.0
    assert policy.next_target(100, calls(9.0, t=24, n=9)) == 100.0  # fewer than min_calls
    gauges: dict[str, Any] = {"running": 1e6, "waiting": 5e5, "waiting_capacity": 5e5, "kv_cache_usage": 1.0}
    assert steady(2.0).next_target(100, calls(2.4, t=12, **gauges)) == 125.0


def test_gradient_carries_short_polls_into_the_next_instead_of_dropping_them() -> None:
    """At a small target with fast polls no single poll reaches ``min_calls``: they add up (calls, latency, time)."""
    policy = Gradient()
    assert policy.next_target(1, calls(None, t=0, n=0, inflight=1)) == 1  # the first poll: no interval yet
    assert policy.next_target(1, calls(0.3, t=2, n=7, inflight=1)) == 1  # 7 < 10: carried
    assert policy.next_target(1, calls(0.2, t=4, n=7, inflight=1)) == 2  # 14 calls over 4 s: the first doubling
    assert policy.last is not None
    assert policy.last.rate == pytest.approx(14 / 4) and policy.last.latency == pytest.approx(0.25)
    assert policy.carried_calls == 0
    # The next doubling is judged on its own calls only (7 + 7 again, over the next 4 s): twice the rate, go on.
    assert policy.next_target(2, calls(0.25, t=6, n=7, inflight=2)) == 2
    assert policy.next_target(2, calls(0.25, t=8, n=21, inflight=2)) == 4
    assert policy.last is not None and policy.last.rate == pytest.approx(28 / 4)


def test_gradient_rejects_bad_parameters() -> None:
    for bad in (
        {"tolerance": 0},
        {"min_gradient": 0},
        {"max_growth": 0.5},
        {"app_limited": 1.5},
        {"throttle_factor": 1},
        {"slow_start_factor": 0.5},
        {"startup_exit": 0.9},
        {"startup_latency_exit": 1},
        {"min_calls": 0},
        {"queue_tolerance": 0},
        {"settle": -1},
    ):
        with pytest.raises(ValueError):
            Gradient(**bad)


# -- setpoint ------------------------------------------------------------------------------------------------------
def kv(usage: float | None, *, time: float, inflight: int = 1000, **more: Any) -> Observation:
    return Observation(running=10, kv_cache_usage=usage, inflight=inflight, time=time, **more)


def test_setpoint_pi_steps_exactly() -> None:
    policy = Setpoint(setpoint=0.8, kp=0.5, ki=0.05)
    # Headroom e = (0.8 − 0.4) / 0.8 = 0.5. First poll: integral = log 10, no dt yet: 10 × e^(0.5 × 0.5).
    first = policy.next_target(10, kv(0.4, time=0))
    assert first == pytest.approx(10 * math.exp(0.25), rel=1e-12)
    # 12 s later: integral += 0.05 × 0.5 × 12 = 0.3.
    second = policy.next_target(first, kv(0.4, time=12))
    assert second == pytest.approx(10 * math.exp(0.55), rel=1e-12)
    # At the setpoint the P term vanishes and the integral holds the level reached: no steady-state error.
    assert policy.next_target(second, kv(0.8, time=24)) == pytest.approx(10 * math.exp(0.3), rel=1e-12)
    # Above it: e = −0.25, integral −0.15, P −0.125.
    level = policy.next_target(10 * math.exp(0.3), kv(1.0, time=36))
    assert level == pytest.approx(10 * math.exp(0.3 - 0.15 - 0.125), rel=1e-12)


def test_setpoint_conditional_integration_while_application_limited() -> None:
    policy = Setpoint()
    for i in range(100):  # headroom, but we are not using our target: hold, do not wind up
        assert policy.next_target(10, kv(0.1, time=12.0 * i, inflight=0)) == 10.0
    # Demand arrives: e = 0.875, one poll's integration (0.05 × 0.875 × 12 = 0.525) on top of 10, no burst.
    assert policy.next_target(10, kv(0.1, time=1200)) == pytest.approx(10 * math.exp(0.525), rel=1e-12)


def test_setpoint_tracks_a_target_the_controller_clamped() -> None:
    core = ControllerCore(policy=Setpoint(), floor=1, ceiling=12)
    for i in range(50):
        core.update(kv(0.1, time=12.0 * i))
    assert core.target == 12
    core.set_bounds(1, 512)
    core.update(kv(0.1, time=600))
    # Without tracking the integral would stand for e^(50 × 0.525) calls; with it, one poll's growth from 12.
    assert core.target_value == pytest.approx(12 * math.exp(0.525), rel=1e-12)
    assert core.target == 20


def test_setpoint_clamps_the_integral_and_the_time_step() -> None:
    policy = Setpoint(integral_limit=100, max_dt_s=60)
    first = policy.next_target(90, kv(0.0, time=0))  # e = 1
    assert first == pytest.approx(90 * math.exp(0.5), rel=1e-12)
    # 10 000 s later counts as 60 s (+3.0), and the integral is clamped at log 100.
    assert policy.next_target(first, kv(0.0, time=10_000)) == pytest.approx(100 * math.exp(0.5), rel=1e-12)
    assert policy.integral == pytest.approx(math.log(100), rel=1e-12)


def test_setpoint_on_queue_time_and_missing_signal() -> None:
    policy = Setpoint(signal="queue_time", setpoint=0.5)
    assert policy.next_target(10, kv(None, time=0, queue_time_mean_s=1.0)) == pytest.approx(10 * math.exp(-0.5))
    assert Setpoint().next_target(10, kv(None, time=0)) == 10.0  # no KV gauge: hold


def test_setpoint_rejects_bad_parameters() -> None:
    for bad in ({"setpoint": 0}, {"setpoint": 1.5}, {"signal": "gpu"}, {"kp": -1}, {"integral_limit": 0.5}):
        with pytest.raises(ValueError):
            Setpoint(**bad)
