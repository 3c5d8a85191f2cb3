"""Exact-value tests of the adaptive policy: slow start and its full-pipe exit, the cut, the additive climb, the
probes, the KV-block rescale, and the goal after a metrics outage."""

from __future__ import annotations

import pytest

from model_concurrency import Observation
from model_concurrency.policies import Adaptive


def full(
    target: float, *, time: float, calls: int = 0, blocks: int | None = None, running: float | None = None
) -> Observation:
    """This process uses all of its target on a healthy engine (the growth case)."""
    return Observation(
        running=target if running is None else running,
        inflight=int(target),
        time=time,
        client_calls=calls,
        kv_num_blocks=blocks,
    )


def saturated(target: float, *, running: float, time: float, blocks: int | None = None) -> Observation:
    waiting = target - running
    return Observation(
        running=running,
        waiting=waiting,
        waiting_capacity=waiting,
        inflight=int(target),
        time=time,
        kv_num_blocks=blocks,
    )


def test_slow_start_doubles_until_a_doubling_buys_less_than_15_percent() -> None:
    p = Adaptive()
    targets = [4.0]
    # Completions per 12 s poll: each doubling buys +90 %, +80 %, then only +10 % (the engine's knee).
    for i, calls in enumerate([0, 10, 19, 34, 37]):
        targets.append(p.next_target(targets[-1], full(targets[-1], time=12.0 * i, calls=calls)))
    assert targets == [4, 8, 16, 32, 64, 65]
    assert p.w_max == 64  # the full pipe becomes the goal
    # Above the goal: probes of +1, +2, +4 (the step doubles while nothing queues).
    t = 65.0
    for i, expected in enumerate([66.0, 68.0, 72.0]):
        t = p.next_target(t, full(t, time=60.0 + 12.0 * i, calls=40))
        assert t == expected


def test_a_saturated_poll_cuts_to_0_9_of_the_served_share_then_climbs_by_one() -> None:
    p = Adaptive()
    assert p.next_target(300, saturated(300, running=256, time=0.0)) == pytest.approx(0.9 * 256)
    assert p.w_max == 256
    assert p.next_target(230.4, full(230.4, time=12.0)) == pytest.approx(231.4)
    # At the goal it probes by one, then two.
    assert p.next_target(255.5, full(255.5, time=24.0)) == pytest.approx(256.5)
    assert p.next_target(256.5, full(256.5, time=36.0)) == pytest.approx(258.5)


def test_a_cut_never_raises_the_target_whatever_others_run() -> None:
    p = Adaptive()
    obs = Observation(running=100, waiting=5, waiting_capacity=5, inflight=4, time=0.0)
    assert p.next_target(4, obs) == pytest.approx(0.9 * 4 * 100 / 105)
    assert p.next_target(4, Observation(running=100, waiting=5, waiting_capacity=5, inflight=0, time=12.0)) == 4


def test_more_kv_blocks_scale_the_target_and_the_goal_at_once() -> None:
    p = Adaptive()
    p.next_target(140, saturated(140, running=128, time=0.0, blocks=1000))
    assert p.next_target(115.2, full(115.2, time=12.0, blocks=1000)) == pytest.approx(116.2)
    # Three engines join: 4x the blocks. One poll later the target is 4x, and so is the goal.
    assert p.next_target(116.2, full(116.2, time=24.0, blocks=4000)) == pytest.approx(464.8)
    assert p.w_max == pytest.approx(512)
    # Engines lost: the target follows down even before any queue is seen.
    assert p.next_target(464.8, full(464.8, time=36.0, blocks=2000)) == pytest.approx(232.4)


def test_after_an_outage_dropped_it_to_the_floor_it_doubles_back_to_0_9_of_the_goal() -> None:
    p = Adaptive()
    p.next_target(300, saturated(300, running=256, time=0.0))
    targets = [4.0]
    for i in range(8):
        targets.append(p.next_target(targets[-1], full(targets[-1], time=1000.0 + 12.0 * i)))
    assert targets == pytest.approx([4, 8, 16, 32, 64, 128, 230.4, 231.4, 232.4])


def test_application_limited_holds_and_long_idle_forgets() -> None:
    p = Adaptive(idle_s=120.0)
    p.next_target(300, saturated(300, running=256, time=0.0))
    assert p.next_target(200, Observation(running=10, inflight=10, time=12.0)) == 200
    p.next_target(200, Observation(inflight=0, time=24.0))
    p.next_target(200, Observation(inflight=0, time=150.0))
    assert p.w_max is None
    assert p.next_target(200, full(200, time=162.0)) == 400  # slow start again


@pytest.mark.parametrize(
    "bad",
    [
        {"slow_start_factor": 1.0},
        {"decrease_factor": 1.0},
        {"increase_step": 0.0},
        {"probe_growth": 0.5},
        {"startup_exit": 0.9},
        {"near_full": 1.5},
        {"window_polls": 0},
        {"rescale_threshold": 0.0},
    ],
)
def test_rejects_bad_parameters(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Adaptive(**bad)  # type: ignore[arg-type]
