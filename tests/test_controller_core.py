"""The pure controller core: grace rule, bounds, fail-safe, exact states; properties over any observations."""

from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency import AIMD, ControllerCore, Observation


def grow(target: float, time: float = 0.0) -> Observation:
    return Observation(running=1, inflight=int(target) + 1, time=time)


class Raises:
    def next_target(self, target: float, obs: Observation) -> float:
        raise RuntimeError("plug-in bug")


class Constant:
    def __init__(self, value: float) -> None:
        self.value = value

    def next_target(self, target: float, obs: Observation) -> float:
        return self.value


def test_starts_at_floor() -> None:
    assert ControllerCore(policy=AIMD(), floor=7, ceiling=512).target == 7


def test_floor_above_ceiling_wins() -> None:
    core = ControllerCore(policy=Constant(1000), floor=64, ceiling=16)
    assert core.target == 64
    core.update(grow(64))
    assert core.target == 64


def test_grace_holds_then_drops_to_floor() -> None:
    core = ControllerCore(policy=Constant(300), floor=4, ceiling=512, grace_polls=3)
    core.update(grow(4, time=0))
    assert core.target == 300
    for i in range(3):
        assert core.fail(now=12.0 * (i + 1), reason="refused") == 300
    assert core.consecutive_failures == 3
    assert core.fail(now=48.0, reason="refused") == 4
    assert core.last_ok is False and core.last_error == "refused"
    # Recovery starts over from the floor; the failure count resets.
    core.update(grow(4, time=60))
    assert core.consecutive_failures == 0 and core.target == 300


def test_grace_zero_is_the_original_reset() -> None:
    core = ControllerCore(policy=Constant(512), floor=4, ceiling=512, grace_polls=0)
    core.update(grow(4))
    assert core.target == 512
    assert core.fail(now=1, reason="timeout") == 4


def test_implausible_observation_is_a_failed_poll() -> None:
    core = ControllerCore(policy=Constant(100), floor=2, ceiling=512, grace_polls=0)
    core.update(grow(2))
    assert core.target == 100
    core.update(Observation(running=math.nan, inflight=3))
    assert core.target == 2
    assert core.last_ok is False and "running=nan" in (core.last_error or "")


def test_policy_exception_holds() -> None:
    core = ControllerCore(policy=Raises(), floor=5, ceiling=50)
    assert core.update(grow(5)) == 5
    assert core.last_ok is True and "plug-in bug" in (core.last_error or "")


def test_non_finite_policy_output_holds() -> None:
    core = ControllerCore(policy=Constant(math.nan), floor=5, ceiling=50)
    assert core.update(grow(5)) == 5
    core.policy = Constant(math.inf)
    assert core.update(grow(5)) == 5


def test_target_rounds_down() -> None:
    core = ControllerCore(policy=Constant(9.99), floor=1, ceiling=50)
    assert core.update(grow(1)) == 9


def test_poll_throttle() -> None:
    core = ControllerCore(policy=AIMD(), poll_interval_s=12)
    assert core.poll_due(0.0)
    core.begin_poll(100.0)
    assert not core.poll_due(111.9)
    assert core.poll_due(112.0)


def test_set_bounds_reclamps() -> None:
    core = ControllerCore(policy=Constant(300), floor=4, ceiling=512)
    core.update(grow(4))
    core.set_bounds(4, 100)
    assert core.target == 100
    core.set_bounds(200, 100)
    assert core.target == 200


floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-10, max_value=1e6),
    st.sampled_from([0.0, -1.0, 1e308, -1e308, math.nan, math.inf]),
)
observations = st.builds(
    Observation,
    ok=st.booleans(),
    running=floats,
    waiting=floats,
    waiting_capacity=floats,
    kv_cache_usage=st.none() | floats,
    preemptions=floats,
    inflight=st.integers(min_value=-5, max_value=10_000),
    time=floats,
    client_latency_mean_s=st.none() | floats,
)


@given(
    floor=st.integers(min_value=-3, max_value=600),
    ceiling=st.integers(min_value=-3, max_value=2000),
    grace=st.integers(min_value=0, max_value=5),
    seq=st.lists(observations, max_size=40),
)
def test_target_always_within_bounds(floor: int, ceiling: int, grace: int, seq: list[Observation]) -> None:
    core = ControllerCore(policy=AIMD(), floor=floor, ceiling=ceiling, grace_polls=grace)
    lower = max(1, floor)
    upper = max(lower, ceiling)
    for obs in seq:
        target = core.update(obs)
        assert isinstance(target, int)
        assert lower <= target <= upper
        assert math.isfinite(core.target_value)


@given(seq=st.lists(st.booleans(), min_size=1, max_size=30), grace=st.integers(0, 4))
def test_grace_rule(seq: list[bool], grace: int) -> None:
    """After any sequence, the target is at the floor iff the trailing failures exceed the grace."""
    core = ControllerCore(policy=Constant(100), floor=4, ceiling=512, grace_polls=grace)
    for ok in seq:
        if ok:
            core.update(grow(core.target))
        else:
            core.fail(now=0, reason="x")
    trailing = len(seq) - (max(i for i, ok in enumerate(seq) if ok) + 1 if any(seq) else 0)
    ever_ok = any(seq)
    if not ever_ok or trailing > grace:
        assert core.target == 4
    else:
        assert core.target == 100


class PinsGrace(Constant):
    grace_polls = 0


def test_policy_may_pin_its_own_grace() -> None:
    core = ControllerCore(policy=PinsGrace(50), floor=4, ceiling=512, grace_polls=3)
    core.update(grow(4))
    assert core.target == 50
    assert core.fail(now=1, reason="x") == 4


def test_each_good_poll_logs_its_decision_at_info(caplog: pytest.LogCaptureFixture) -> None:
    core = ControllerCore(policy=Constant(300), floor=4, ceiling=100, name="llama")
    with caplog.at_level(logging.INFO, logger="model_concurrency"):
        decision = core.decide(Observation(running=3, waiting=2, waiting_capacity=1, inflight=4, time=1.5))
    (record,) = [r for r in caplog.records if r.levelno == logging.INFO]
    assert record.getMessage() == (
        "model llama: target 4 -> 100: ceiling [ceiling] (running 3, waiting 2 (capacity 1), kv n/a, "
        "in flight 4 (peak 4), calls 0)"
    )
    assert (decision.previous, decision.target, decision.rule, decision.limited_by) == (4, 100, "ceiling", "ceiling")
    assert core.last_decision == decision and str(decision) == "4 -> 100: ceiling [ceiling]"


def test_no_decision_log_above_info(caplog: pytest.LogCaptureFixture) -> None:
    core = ControllerCore(policy=Constant(300), floor=4, ceiling=100)
    with caplog.at_level(logging.WARNING, logger="model_concurrency"):
        core.update(grow(4))
    assert not caplog.records
