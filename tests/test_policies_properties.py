"""Properties of every built-in policy and the example plug-in, under any observations.

Directly: any plausible observation (finite, non-negative) gives a finite, non-negative answer and no exception.
Through the controller core: any sequence of observations, plausible or not, and failed polls, keeps the target
in [floor, ceiling] (the guarantee a plug-in author relies on).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency import ControllerCore, Observation
from model_concurrency.policies import BUILTIN_POLICIES, Policy, load_policy

NAMES = [*sorted(BUILTIN_POLICIES), "hysteresis", "aimd-aggressive", "setpoint-queue-time"]

plausible_float = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
any_float = st.one_of(
    plausible_float, st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-1.0, 1e308, math.nan])
)


@st.composite
def observations(draw: st.DrawFn, value: st.SearchStrategy[float] = plausible_float) -> Observation:
    latency = draw(st.one_of(st.none(), value))
    return Observation(
        ok=draw(st.booleans()) if value is any_float else True,
        running=draw(value),
        waiting=draw(value),
        waiting_capacity=draw(st.one_of(st.just(0.0), value)),
        kv_cache_usage=draw(st.one_of(st.none(), st.floats(min_value=0, max_value=1), value)),
        kv_num_blocks=draw(st.one_of(st.none(), st.integers(min_value=0, max_value=10**7))),
        preemptions=draw(value),
        completed=draw(st.one_of(st.none(), value)),
        queue_time_mean_s=draw(st.one_of(st.none(), value)),
        inflight=draw(st.integers(min_value=0, max_value=10**6)),
        time=draw(st.floats(min_value=0, max_value=1e7)),
        client_calls=draw(st.integers(min_value=0, max_value=10**6)),
        client_throttled=draw(st.integers(min_value=0, max_value=10)),
        client_latency_mean_s=latency,
        client_latency_min_s=latency,
    )


@pytest.mark.parametrize("name", NAMES)
@given(steps=st.lists(st.tuples(st.floats(min_value=1, max_value=1e6), observations()), min_size=1, max_size=30))
def test_any_plausible_observation_gives_a_finite_non_negative_answer(
    name: str, steps: list[tuple[float, Observation]]
) -> None:
    policy = load_policy(name)
    for target, obs in steps:
        answer = policy.next_target(target, obs)
        assert math.isfinite(answer) and answer >= 0, (name, target, obs, answer)


@pytest.mark.parametrize("name", NAMES)
@given(
    floor=st.integers(min_value=1, max_value=64),
    ceiling=st.integers(min_value=1, max_value=1024),
    obs_seq=st.lists(observations(any_float), max_size=40),
)
def test_controller_keeps_every_policy_in_bounds(
    name: str, floor: int, ceiling: int, obs_seq: list[Observation]
) -> None:
    core = ControllerCore(policy=load_policy(name), floor=floor, ceiling=ceiling)
    lower, upper = floor, max(floor, ceiling)
    for obs in obs_seq:
        target = core.update(obs)
        assert lower <= target <= upper
        assert lower <= core.target_value <= upper


@pytest.mark.parametrize("name", NAMES)
def test_every_policy_satisfies_the_protocol_and_is_a_fresh_instance(name: str) -> None:
    first, second = load_policy(name), load_policy(name)
    assert isinstance(first, Policy)
    assert first is not second
