"""The adaptive core (policies/core.py): exact values of each rule, the parameter budget, a property of bounds and
N clients converging to equal shares on one engine."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_concurrency.observation import Observation
from model_concurrency.policies.core import PARAMETERS, AdaptiveCore
from model_concurrency.policies.registry import load_policy

PRESETS = Path(__file__).resolve().parents[1] / "policies"
# Queue-time buckets (cumulative) of an interval where 20 requests started and 5 waited over 0.5 s.
WAITS = ((0.3, 12.0), (0.5, 15.0), (0.8, 17.0), (float("inf"), 20.0))
# One of 100 started requests waited over 0.5 s: what a queue standing at a wall leaves in the histogram.
ONE_MARK = ((0.3, 99.0), (0.5, 99.0), (float("inf"), 100.0))


def core(**changes: object) -> AdaptiveCore:
    return AdaptiveCore(token_budget=False, **changes)  # type: ignore[arg-type]


def busy(inflight: int, **fields: object) -> Observation:
    """Our window full (peak = inflight), alone on the engine unless ``running`` says otherwise; ``waiting`` is
    the capacity-waiting count unless given, and a queue leaves one mark in a hundred unless told otherwise."""
    base: dict[str, object] = {"inflight": inflight, "inflight_peak": inflight, "running": float(inflight)}
    base.update(fields)
    base.setdefault("waiting", base.get("waiting_capacity", 0.0))
    if float(base["waiting"]) >= 1:  # type: ignore[arg-type]
        base.setdefault("queue_waits", ONE_MARK)
        base.setdefault("started", 100.0)
    return Observation(**base)  # type: ignore[arg-type]


def test_at_most_twelve_parameters_and_the_preset_states_each_default() -> None:
    assert len(PARAMETERS) <= 12
    tunable = {f.name for f in dataclasses.fields(AdaptiveCore) if f.init} - {"token_budget"}
    assert tunable == set(PARAMETERS)
    preset = tomllib.loads((PRESETS / "adaptive-core.toml").read_text())
    assert {k: preset[k] for k in PARAMETERS} == {k: getattr(AdaptiveCore(), k) for k in PARAMETERS}
    assert type(load_policy("adaptive-core")) is AdaptiveCore
    assert type(load_policy("adaptive")).__name__ == "Adaptive"  # the default, beside it for comparison
    with pytest.raises(ValueError, match="cut_gain"):
        AdaptiveCore(cut_gain=1.0)


def test_the_first_ramp_doubles_and_stops_at_the_kv_knee_plus_the_margin() -> None:
    policy = core()
    assert policy.next_target(4, busy(4)) == 8  # nothing known: TCP's slow start
    # 100 running at KV 0.46: the cache holds 100 x 0.92 / 0.46 = 200; at most 1.1 x 200 = 220, and the ramp ends.
    assert policy.next_target(120, busy(100, kv_cache_usage=0.46, kv_num_blocks=1000)) == pytest.approx(220)
    assert not policy.ramping and policy.good == pytest.approx(220)


def test_the_cut_is_graded_by_how_saturated_the_interval_was() -> None:
    # 10 of 100 waiting at the poll (0.1), 5 of the 20 started waited over 0.5 s (0.25): F = 0.25.
    obs = busy(100, running=90.0, waiting_capacity=10.0, queue_waits=WAITS, started=20.0)
    assert core().saturation(obs) == 0.25
    assert core().next_target(100, obs) == pytest.approx(100 * (1 - 0.5 * 0.25))  # 87.5, under the served 90
    # One long prompt waiting among 69 running: no longer a saturated poll, a cut to the served share (68.01).
    blip = busy(69, running=69.0, waiting_capacity=1.0)
    assert core().next_target(69, blip) == pytest.approx(69 * 69 / 70)
    # Marks with no queue left at the poll are a transient the engine absorbed (our own step's prefill): growth.
    assert core().saturation(busy(100, queue_waits=WAITS, started=20.0)) == 0.0
    # Preemptions over running count too.
    assert core().saturation(busy(100, preemptions=30.0)) == 0.3


def test_under_the_wall_half_the_gap_and_at_it_one_step_per_round_trip() -> None:
    policy = core()
    policy.next_target(100, busy(100, running=200.0, waiting_capacity=2.0, time=0.0))  # a wall at 200 running
    # Room on the engine (150 running): our share of the wall is 100 + (100/150) x (200 - 150) = 133.3; half the gap.
    room = busy(100, running=150.0, inflight_mean=100.0, client_calls=300, time=12.0)
    assert policy.next_target(100, room) == pytest.approx(100 + 0.5 * (100 + 100 / 150 * 50 - 100))
    # At the wall: 300 calls came back from 100 in flight, three round trips: +3.
    at_wall = busy(100, running=200.0, inflight_mean=100.0, client_calls=300, time=24.0)
    assert policy.next_target(100, at_wall) == 103
    # A one-step engine turns over hundreds of times a poll: the step is at most 25 % of the target.
    assert policy.next_target(100, dataclasses.replace(at_wall, client_calls=90_000)) == 125
    # A queue that made nobody wait, while the engine took our step: an admission in progress, not a wall.
    fresh = core()
    fresh.next_target(100, busy(100, running=100.0, time=0.0))
    admitting = busy(160, running=150.0, waiting_capacity=10.0, queue_waits=(*WAITS[:1], (float("inf"), 12.0)))
    assert fresh.next_target(160, admitting) == 160 and fresh.wall(0.0) is None


def test_far_below_a_verified_level_it_restores_half_the_gap() -> None:
    policy = core()
    policy.next_target(100, busy(100, running=100.0, waiting_capacity=1.0))  # served 99, the good level
    assert policy.good == pytest.approx(100 * 100 / 101)
    # The fail-safe's floor: 4 is far under 0.5 x the wall share (100 alone): 4 + 0.5 x (100 - 4) = 52.
    assert policy.next_target(4, busy(4, running=4.0, time=12.0)) == pytest.approx(52)


def test_engines_added_rescale_the_target_at_once() -> None:
    policy = core()
    policy.next_target(50, busy(50, kv_num_blocks=1000, kv_cache_usage=0.1))
    assert policy.next_target(60, busy(50, kv_num_blocks=2000, kv_cache_usage=0.05)) == 120


def test_application_limited_holds_and_a_long_idle_forgets() -> None:
    policy = core()
    assert policy.next_target(100, Observation(inflight=10, inflight_peak=10, running=10.0)) == 100
    policy.next_target(100, busy(100, running=100.0, waiting_capacity=5.0, time=1.0))
    assert not policy.ramping
    policy.next_target(100, Observation(time=2.0))
    policy.next_target(100, Observation(time=200.0))  # 198 s with nothing in flight
    assert policy.ramping


def test_clients_sharing_an_engine_converge_to_equal_shares() -> None:
    """Same rules, same engine: proportional cuts and equal absolute steps (Chiu & Jain)."""
    capacity = 240.0
    clients = [core(), core(), core()]
    targets = [8.0, 60.0, 150.0]
    for poll in range(1000):
        total = float(sum(math.floor(t) for t in targets))  # in flight: each limit rounded down
        running, waiting = min(total, capacity), max(0.0, total - capacity)
        targets = [
            float(
                p.next_target(
                    t,
                    busy(
                        math.floor(t),
                        running=running,
                        waiting_capacity=waiting,
                        inflight_mean=t,
                        client_calls=round(2 * t),
                        time=12.0 * poll,
                    ),
                )
            )
            for p, t in zip(clients, targets, strict=True)
        ]
    jain = sum(targets) ** 2 / (len(targets) * sum(t * t for t in targets))
    assert jain > 0.999  # from 8 / 60 / 150 (Jain 0.63)
    assert 0.9 * capacity <= sum(targets) <= 1.1 * capacity


@settings(max_examples=300, deadline=None)
@given(
    target=st.floats(1, 5000),
    inflight=st.integers(0, 5000),
    running=st.floats(0, 20000),
    waiting=st.floats(0, 5000),
    kv=st.none() | st.floats(0, 1),
    preemptions=st.floats(0, 1000),
    calls=st.integers(0, 100_000),
)
def test_answers_stay_within_bounds(
    target: float, inflight: int, running: float, waiting: float, kv: float | None, preemptions: float, calls: int
) -> None:
    """A fresh core: a finite answer in [0, start_factor x target]; never a raise on a saturated interval."""
    policy = core()
    obs = Observation(
        inflight=inflight, inflight_peak=inflight, running=running, waiting=waiting, waiting_capacity=waiting,
        kv_cache_usage=kv, kv_num_blocks=1000, preemptions=preemptions, client_calls=calls,
    )  # fmt: skip
    answer = float(policy.next_target(target, obs))
    assert math.isfinite(answer) and 0 <= answer <= policy.start_factor * target
    if policy.saturation(obs) > 0:
        assert answer <= target
