"""Exact-value tests of seed-aimd (its flaws, on purpose), aimd-slowstart and queue."""

from __future__ import annotations

import pytest

from model_concurrency import ControllerCore, Observation
from model_concurrency.policies import AIMDSlowStart, QueuePolicy, SeedAIMD


def full(target: float, *, time: float = 0.0, running: float | None = None) -> Observation:
    """This process uses all of its target on a healthy engine (the growth case)."""
    return Observation(running=target if running is None else running, inflight=int(target), time=time)


# -- seed-aimd ----------------------------------------------------------------------------------------------------
def test_seed_flaw_1_a_decrease_raises_the_target_to_everybodys_running() -> None:
    seed = SeedAIMD(floor=4)
    obs = Observation(running=100, waiting=5, waiting_capacity=5, inflight=4)
    assert seed.next_target(4, obs) == 100.0
    assert seed.next_target(100, obs) == 100.0  # "again and again": saturated, and still 100


def test_seed_decrease_is_at_least_0_8_target_and_at_least_the_floor() -> None:
    seed = SeedAIMD(floor=4)
    assert seed.next_target(100, Observation(running=10, waiting=2, waiting_capacity=2, inflight=12)) == 80.0
    assert seed.next_target(3, Observation(running=1, waiting=1, waiting_capacity=1, inflight=2)) == 4.0


def test_seed_near_full_is_judged_from_server_wide_running() -> None:
    seed = SeedAIMD()
    # This process has nothing in flight; another client's load makes it grow anyway.
    assert seed.next_target(100, Observation(running=80, inflight=0)) == 125.0
    assert seed.next_target(100, Observation(running=79, inflight=100)) == 100.0
    assert seed.next_target(4, Observation(running=4)) == 5.0  # max(1, 1.0)


def test_seed_flaw_3_ramp_4_to_512_takes_22_polls() -> None:
    core = ControllerCore(policy=SeedAIMD(floor=4), floor=4, ceiling=512)
    polls = 0
    while core.target < 512:
        core.update(full(core.target_value, time=12.0 * polls))
        polls += 1
    assert polls == 22


def test_seed_flaw_2_one_failed_poll_resets_to_the_floor() -> None:
    assert SeedAIMD.grace_polls == 0
    core = ControllerCore(policy=SeedAIMD(floor=4), floor=4, ceiling=512, grace_polls=3)
    for i in range(22):
        core.update(full(core.target_value, time=12.0 * i))
    assert core.target == 512
    core.fail(300.0, "connection refused")
    assert core.target == 4


def test_seed_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        SeedAIMD(decrease_factor=1.0)
    with pytest.raises(ValueError):
        SeedAIMD(floor=-1)


# -- aimd-slowstart ------------------------------------------------------------------------------------------------
def test_slowstart_doubles_until_first_saturation_then_is_aimd() -> None:
    policy = AIMDSlowStart()
    target, seen = 4.0, []
    for i in range(4):
        target = policy.next_target(target, full(target, time=12.0 * i))
        seen.append(target)
    assert seen == [8.0, 16.0, 32.0, 64.0]
    # First saturation: AIMD's cut, min(0.8 × 64, 64 × 48 / 64) = 48, and slow start is over.
    target = policy.next_target(64, Observation(running=48, waiting=16, waiting_capacity=16, inflight=64, time=48))
    assert target == 48.0
    assert not policy.in_slow_start
    assert policy.next_target(48, full(48, time=60)) == 60.0  # 48 + 25 %


def test_slowstart_application_limited_hold_and_minimum_step() -> None:
    policy = AIMDSlowStart()
    assert policy.next_target(10, Observation(running=5, inflight=7)) == 10.0  # 7 < 0.8 × 10
    assert policy.next_target(1, Observation(running=1, inflight=1)) == 2.0
    assert AIMDSlowStart(slow_start_factor=1.5).next_target(1, Observation(inflight=1)) == 2.0  # step >= 1


def test_slowstart_restarts_after_a_long_idle_only() -> None:
    policy = AIMDSlowStart(idle_s=120)
    policy.next_target(64, Observation(running=64, waiting=1, waiting_capacity=1, inflight=64, time=0))
    assert not policy.in_slow_start
    for t in (100.0, 160.0, 219.0):  # idle since 100: 119 s < 120
        assert policy.next_target(50, Observation(time=t)) == 50.0
    assert not policy.in_slow_start
    assert policy.next_target(50, full(50, time=230)) == 62.5  # busy again: the idle clock restarts
    for t in (300.0, 360.0, 420.0):  # idle since 300: 120 s at 420
        policy.next_target(50, Observation(time=t))
    assert policy.in_slow_start
    assert policy.next_target(50, full(50, time=432)) == 100.0


def test_slowstart_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        AIMDSlowStart(slow_start_factor=1.0)
    with pytest.raises(ValueError):
        AIMDSlowStart(idle_s=-1)
    with pytest.raises(ValueError):
        AIMDSlowStart(decrease_factor=0)


# -- queue ---------------------------------------------------------------------------------------------------------
def test_queue_grows_when_none_wait_and_near_full() -> None:
    policy = QueuePolicy()
    assert policy.next_target(100, Observation(running=100, inflight=100)) == 125.0
    assert policy.next_target(2, Observation(running=2, inflight=2)) == 3.0
    assert policy.next_target(100, Observation(running=100, inflight=79)) == 100.0  # application-limited


def test_queue_holds_inside_the_band() -> None:
    policy = QueuePolicy(alpha=0, beta=4)
    for queue in (1, 3, 4):
        obs = Observation(running=100, waiting=queue, waiting_capacity=queue, inflight=100)
        assert policy.next_target(100, obs) == 100.0


def test_queue_shrinks_by_its_share_of_the_excess() -> None:
    policy = QueuePolicy()
    # We hold 60 of 120 requests: half the 20 waiting are ours, so we remove 10.
    obs = Observation(running=100, waiting=20, waiting_capacity=20, inflight=60)
    assert policy.next_target(100, obs) == 90.0
    # alpha = 2: the excess is 18, half of it 9.
    assert QueuePolicy(alpha=2, beta=4).next_target(100, obs) == 91.0
    # A tiny share still removes decrease_min.
    obs = Observation(running=1000, waiting=10, waiting_capacity=10, inflight=1)
    assert policy.next_target(100, obs) == 99.0
    # Alone with a huge queue: never below min_factor × target in one poll.
    obs = Observation(running=100, waiting=500, waiting_capacity=500, inflight=600)
    assert policy.next_target(100, obs) == 50.0


def test_queue_with_several_clients_never_raises_on_a_queue() -> None:
    policy = QueuePolicy()
    obs = Observation(running=100, waiting=5, waiting_capacity=5, inflight=4)  # seed-aimd's flaw-1 case
    assert policy.next_target(4, obs) == 3.0


def test_queue_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        QueuePolicy(alpha=5, beta=4)
    with pytest.raises(ValueError):
        QueuePolicy(min_factor=0)
    with pytest.raises(ValueError):
        QueuePolicy(near_full=2)
