"""Exact-value tests of the production AIMD: observation in, exact target out."""

from __future__ import annotations

import pytest

from model_concurrency import AIMD, ControllerCore, Observation


def near_full(target: float) -> Observation:
    # Using all of the target, engine healthy: the growth case.
    return Observation(running=10, waiting=0, waiting_capacity=0, inflight=int(target) + 1)


def test_ramp_from_4_reaches_512_in_22_polls() -> None:
    core = ControllerCore(policy=AIMD(), floor=4, ceiling=512)
    targets = []
    for _ in range(22):
        core.update(near_full(core.target_value))
        targets.append(core.target)
    assert targets[0] == 5
    assert targets[-2] < 512
    assert targets[-1] == 512
    assert targets == sorted(targets)


def test_increase_is_max_of_one_and_a_quarter() -> None:
    aimd = AIMD()
    assert aimd.next_target(4, Observation(inflight=4)) == 5.0  # max(1, 1.0)
    assert aimd.next_target(2, Observation(inflight=2)) == 3.0  # max(1, 0.5)
    assert aimd.next_target(100, Observation(inflight=80)) == 125.0  # exactly at 0.8 × target
    assert aimd.next_target(100, Observation(inflight=79)) == 100.0  # just below: application-limited hold


def test_saturation_with_server_wide_running_far_above_inflight_never_raises() -> None:
    # Flaw 1 of the original: floor 4, running 100, waiting 5 went *up* to 100. Ours goes down.
    aimd = AIMD()
    obs = Observation(running=100, waiting=5, waiting_capacity=5, inflight=4)
    new = aimd.next_target(4, obs)
    assert new <= 0.8 * 4
    assert new == pytest.approx(3.2)  # our share (4 × 100/105 = 3.8) is above the cut, so the cut binds


def test_saturation_cuts_to_sustainable_share() -> None:
    aimd = AIMD()
    # We hold 50 of 100 in flight: 80 running, 20 waiting → our running share is 50 × 0.8 = 40 < 0.8 × 100.
    obs = Observation(running=80, waiting=20, waiting_capacity=20, inflight=50)
    assert aimd.next_target(100, obs) == 40.0
    # Fully using the target with little queueing: the multiplicative cut binds.
    obs = Observation(running=99, waiting=1, waiting_capacity=1, inflight=100)
    assert aimd.next_target(100, obs) == 80.0


def test_saturation_with_nothing_in_flight_is_a_plain_cut() -> None:
    assert AIMD().next_target(50, Observation(running=300, waiting=40, waiting_capacity=40, inflight=0)) == 40.0


def test_idle_holds() -> None:
    aimd = AIMD()
    assert aimd.next_target(64, Observation(running=0, waiting=0, inflight=0)) == 64
    assert aimd.next_target(64, Observation(running=200, waiting=0, inflight=10)) == 64


def test_deferred_waiting_is_not_saturation() -> None:
    # Requests waiting for LoRA or KV transfer do not mean the engine is at capacity.
    obs = Observation(running=10, waiting=7, waiting_capacity=0, inflight=10)
    assert AIMD().next_target(10, obs) == 12.5


def test_parameters_are_validated() -> None:
    with pytest.raises(ValueError):
        AIMD(decrease_factor=1.0)
    with pytest.raises(ValueError):
        AIMD(increase_fraction=-0.1)
    with pytest.raises(ValueError):
        AIMD(near_full=1.5)


def test_custom_factors() -> None:
    aimd = AIMD(increase_fraction=0.5, increase_min=2, decrease_factor=0.5, near_full=0.5)
    assert aimd.next_target(10, Observation(inflight=5)) == 15.0
    assert aimd.next_target(2, Observation(inflight=1)) == 4.0
    assert aimd.next_target(10, Observation(running=10, waiting=1, waiting_capacity=1, inflight=10)) == 5.0
