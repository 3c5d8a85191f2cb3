"""The adaptive policy's first-ramp jump bisecting in log space (``jump_geometric``, the ``adaptive-bisect`` preset):
the jump lands at the geometric mean of the target and the KV bound, a jump that ran clean is followed by another
while one could overshoot by more than ``jump_overshoot``, and then the probes take over. Exact values from
hand-built observations.

Figures: 10,000 KV blocks and a usage of 0.00359375 per 4 sequences, so a sequence holds 8.984375 blocks and the
cache holds 1,024 sequences at ``kv_high`` 0.92: a lone client's bound is 1,024 whatever it runs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency import Observation
from model_concurrency.policies import Adaptive, load_policy
from model_concurrency.policies.adaptive import KvEstimate

BLOCKS = 10_000
USAGE_PER_SEQUENCE = 0.00359375 / 4  # 8.984375 blocks of 10,000: 1,024 sequences at kv_high 0.92


def alone(inflight: int, *, time: float, running: float | None = None, waiting: float = 0.0) -> Observation:
    """A poll of a client alone on the engine, KV usage in proportion to what runs."""
    run = float(inflight) if running is None else running
    return Observation(
        running=run,
        waiting=waiting,
        waiting_capacity=waiting,
        inflight=inflight,
        kv_cache_usage=USAGE_PER_SEQUENCE * run,
        kv_num_blocks=BLOCKS,
        time=time,
    )


def bisecting(**overrides: float) -> Adaptive:
    """The rule on its own: no 8x cap on one jump (its own rule, tested in test_policies_adaptive_first_ramp)."""
    return Adaptive(jump_geometric=True, jump_max_factor=math.inf, **overrides)  # type: ignore[arg-type]


def test_the_jump_lands_at_the_geometric_mean_of_the_target_and_the_bound() -> None:
    p = bisecting()
    estimate = p.kv_estimate(alone(4, time=0.0))
    assert estimate is not None and estimate.bound == pytest.approx(1024)
    # sqrt(4 x 1,024) = 64: a limit anywhere in [4, 1,024] is overshot by at most 16x, where the half-way point
    # (514, the rule without jump_geometric) may overshoot a limit of 4 by 128x.
    assert p.next_target(4, alone(4, time=0.0)) == pytest.approx(64)
    assert p.jump_to == pytest.approx(64)
    assert Adaptive(jump_max_factor=math.inf).next_target(4, alone(4, time=0.0)) == pytest.approx(514)


def test_a_jump_that_ran_clean_is_followed_by_another_until_one_could_overshoot_by_10_percent() -> None:
    p = bisecting()
    assert p.next_target(4, alone(4, time=0.0)) == pytest.approx(64)
    # 64 ran a poll without a queue: the limit lies in [64, 1,024]; the next jump halves that in log space.
    assert p.next_target(64, alone(64, time=2.0)) == pytest.approx(256)
    assert p.ramping and p.w_max is None
    assert p.next_target(256, alone(256, time=4.0)) == pytest.approx(512)
    # The limit is 600 (not on the page): 512 runs clean, the next jump (724) queues 124 and is cut to 0.9 x the
    # 600 served (the saturated rule; running rose 88 of our 212, so not a burst being admitted).
    assert p.next_target(512, alone(512, time=6.0)) == pytest.approx(512 * math.sqrt(2))
    assert p.next_target(724, alone(724, running=600, waiting=124, time=8.0)) == pytest.approx(540)
    assert p.w_max == pytest.approx(600) and not p.ramping


def test_the_bisection_stops_where_the_next_jump_could_overshoot_by_at_most_jump_overshoot() -> None:
    p = bisecting()
    # A bound of 121 over a target of 100: sqrt(1.21) = 1.1 <= jump_overshoot, so 110 is the last jump; it ran
    # clean, so it is W_max and the probes (+1) take over, as after the single half-way jump.
    usage = 0.92 * 100 / 121 / 100  # per sequence: the cache holds 121 sequences at kv_high
    obs = Observation(running=100, inflight=100, kv_cache_usage=usage * 100, kv_num_blocks=BLOCKS, time=0.0)
    assert p.next_target(100, obs) == pytest.approx(110)
    at_jump = Observation(running=110, inflight=110, kv_cache_usage=usage * 110, kv_num_blocks=BLOCKS, time=2.0)
    assert p.next_target(110, at_jump) == pytest.approx(111)
    assert p.w_max == pytest.approx(110) and not p.ramping
    # A looser stop (1.5): from 64 of a 1,024 bound the next jump could overshoot by 4x, still bisecting; from
    # 512, by sqrt(2) < 1.5: the probes.
    q = bisecting(jump_overshoot=1.5)
    assert q.next_target(64, alone(64, time=0.0)) == pytest.approx(256)
    assert q.next_target(256, alone(256, time=2.0)) == pytest.approx(512)
    assert q.next_target(512, alone(512, time=4.0)) == pytest.approx(513)
    assert q.w_max == pytest.approx(512)


def test_the_default_adaptive_keeps_the_half_way_jump_and_the_preset_turns_bisection_on() -> None:
    assert not Adaptive().jump_geometric
    preset = load_policy("adaptive-bisect")
    assert isinstance(preset, Adaptive) and preset.jump_geometric and preset.jump_overshoot == 1.1
    # With the default 8x cap, from 16: sqrt(16 x 1,024) = 128 = 8 x 16, landed.
    assert preset.next_target(16, alone(16, time=0.0)) == pytest.approx(128)
    assert preset.jump_to == pytest.approx(128)


def test_jump_overshoot_is_checked() -> None:
    with pytest.raises(ValueError, match="jump_overshoot"):
        Adaptive(jump_overshoot=1.0)


@given(
    target=st.floats(min_value=1.0, max_value=1e5),
    ratio=st.floats(min_value=1.0, max_value=1e4),
    fraction=st.floats(min_value=0.05, max_value=1.0),
)
def test_a_geometric_jump_never_lands_past_the_half_way_one_nor_the_bound(
    target: float, ratio: float, fraction: float
) -> None:
    bound = target * ratio
    estimate = KvEstimate(blocks_per_sequence=1.0, sequences=bound, bound=bound)
    geometric = Adaptive(jump_geometric=True, jump_fraction=fraction)._jump(target, estimate)
    arithmetic = Adaptive(jump_fraction=fraction)._jump(target, estimate)
    assert target * (1 - 1e-9) <= geometric <= arithmetic * (1 + 1e-9)
    assert geometric <= bound * (1 + 1e-9)
