"""Exact-value tests of the gradient (latency) and setpoint (PI) policies."""

from __future__ import annotations

import math
from typing import Any

import pytest

from model_concurrency import ControllerCore, Observation
from model_concurrency.policies import Gradient, Setpoint


# -- gradient ------------------------------------------------------------------------------------------------------
def calls(latency: float | None, *, inflight: int = 100, throttled: int = 0, **gauges: Any) -> Observation:
    """An ok poll of an endpoint without /metrics: zero gauges unless given; only the client's own figures."""
    return Observation(
        inflight=inflight,
        client_calls=10,
        client_throttled=throttled,
        client_latency_mean_s=latency,
        **gauges,
    )


def test_gradient_grows_at_steady_latency() -> None:
    policy = Gradient(slow_start_factor=1)
    # First sample: long = short = 1 s, gradient min(1, 1.5) = 1; 0.5 × 100 + 0.5 × (100 + 25) = 112.5.
    assert policy.next_target(100, calls(1.0)) == 112.5
    assert policy.next_target(100, calls(1.0)) == 112.5
    # Small targets grow by the constant queue_size: 0.5 × 8 + 0.5 × (8 + 4) = 10.
    assert policy.next_target(8, calls(1.0)) == 10.0


def test_gradient_shrinks_on_a_latency_step() -> None:
    policy = Gradient(long_window=9, slow_start_factor=1)  # a_long = 0.2, short = the latest poll's mean
    policy.next_target(100, calls(1.0))
    # Step to 3 s: long = 1 + 0.2 × 2 = 1.4, short = 3, gradient = 1.5 × 1.4 / 3 = 0.7;
    # new = 0.5 × 100 + 0.5 × (70 + 25) = 97.5.
    assert policy.next_target(100, calls(3.0)) == pytest.approx(97.5, rel=1e-12)
    # Worse: long = 1.4 + 0.2 × 4.6 = 2.32, gradient = 1.5 × 2.32 / 6 = 0.58; 0.5 × 100 + 0.5 × 83 = 91.5.
    assert policy.next_target(100, calls(6.0)) == pytest.approx(91.5, rel=1e-12)
    assert policy.long_latency == pytest.approx(2.32, rel=1e-12)


def test_gradient_is_clamped_at_min_gradient() -> None:
    policy = Gradient(long_window=9, slow_start_factor=1)
    policy.next_target(100, calls(1.0))
    # long = 2.8, short = 10: 1.5 × 0.28 = 0.42 → 0.5; 0.5 × 100 + 0.5 × (50 + 25) = 87.5.
    assert policy.next_target(100, calls(10.0)) == 87.5


def test_gradient_application_limited_hold_still_learns_latency() -> None:
    policy = Gradient(long_window=9, slow_start_factor=1)
    assert policy.next_target(100, calls(1.0, inflight=49)) == 100.0
    assert policy.long_latency == 1.0
    assert policy.next_target(100, calls(2.0, inflight=49)) == 100.0
    assert policy.long_latency == pytest.approx(1.2)


def test_gradient_shrinks_on_throttling_and_ignores_those_latencies() -> None:
    policy = Gradient(slow_start_factor=1)
    policy.next_target(100, calls(2.0))
    assert policy.next_target(100, calls(0.01, throttled=3)) == 80.0
    assert policy.next_target(100, calls(0.01, throttled=1, inflight=0)) == 80.0  # even when app-limited
    assert policy.long_latency == 2.0 and policy.short_latency == 2.0


def test_gradient_holds_without_latency_and_ignores_engine_gauges() -> None:
    policy = Gradient(slow_start_factor=1)
    assert policy.next_target(100, calls(None)) == 100.0
    assert policy.long_latency is None
    loaded = Gradient(slow_start_factor=1)
    gauges: dict[str, Any] = {"running": 1e6, "waiting": 5e5, "waiting_capacity": 5e5, "kv_cache_usage": 1.0}
    assert (
        loaded.next_target(100, calls(1.0, **gauges))
        == Gradient(slow_start_factor=1).next_target(100, calls(1.0))
        == 112.5
    )


def test_gradient_decays_a_dragged_up_baseline() -> None:
    policy = Gradient(long_window=9, slow_start_factor=1)
    policy.next_target(100, calls(10.0))
    policy.next_target(100, calls(1.0))
    # long = 10 + 0.2 × (1 − 10) = 8.2 > 2 × short (1): decayed to 8.2 × 0.95.
    assert policy.long_latency == pytest.approx(7.79, rel=1e-12)


def ramp_poll(time: float, completed: int, *, inflight: int = 100, latency: float = 1.0) -> Observation:
    return Observation(inflight=inflight, time=time, client_calls=completed, client_latency_mean_s=latency)


def test_gradient_slow_start_doubles_until_a_doubling_buys_less_than_15_percent() -> None:
    policy = Gradient()
    # Completions per 12 s poll: +100 %, +60 %, then +10 % (the pipe is full): 4, 8, 16, 32, then the Gradient2 rule.
    targets = [4.0]
    for i, completed in enumerate([0, 10, 20, 32, 35]):
        t = targets[-1]
        targets.append(policy.next_target(t, ramp_poll(12.0 * i, completed, inflight=int(t))))
    # The fifth poll ends the ramp and applies the rule: 0.5 × 64 + 0.5 × (64 + max(4, 16)) = 72.
    assert targets == [4, 8, 16, 32, 64, 72]
    assert policy.ramping is False and policy.level == 64


def test_gradient_restarts_slow_start_after_a_drop_below_a_quarter_of_its_level() -> None:
    policy = Gradient()
    policy.ramping, policy.level = False, 400.0
    policy.next_target(400, ramp_poll(0.0, 100, inflight=400))  # sets last_time; 400 + 50 → 450
    # The controller's fail-safe put it at the floor (4 < 0.25 × 450): doubling again, first poll without a rate test.
    assert policy.next_target(4, ramp_poll(96.0, 3, inflight=4)) == 8
    assert policy.ramping is True and policy.level == 0.0


def test_gradient_throttling_ends_slow_start() -> None:
    policy = Gradient()
    assert policy.next_target(64, ramp_poll(0.0, 10)) == 128
    assert policy.next_target(128, calls(0.01, throttled=2)) == pytest.approx(102.4)
    assert policy.ramping is False


def test_gradient_rejects_bad_parameters() -> None:
    for bad in (
        {"tolerance": 0.9},
        {"min_gradient": 0},
        {"smoothing": 0},
        {"queue_fraction": 1},
        {"long_window": 0},
        {"slow_start_factor": 0.5},
        {"startup_exit": 0.9},
        {"restart_below": 1.0},
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
