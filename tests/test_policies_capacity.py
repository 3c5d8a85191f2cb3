"""Exact-value tests of the capacity policy: startup, the windowed-max estimate, probes, a GPU added and removed."""

from __future__ import annotations

import pytest

from model_concurrency import Observation
from model_concurrency.policies import Capacity


class Engine:
    """One client alone on an engine that runs at most ``capacity`` requests; the rest wait for capacity."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.time = 0.0

    def poll(self, inflight: float) -> Observation:
        running = min(inflight, self.capacity)
        waiting = inflight - running
        obs = Observation(
            running=running, waiting=waiting, waiting_capacity=waiting, inflight=int(inflight), time=self.time
        )
        self.time += 12.0
        return obs


def drive(policy: Capacity, engine: Engine, target: float, polls: int) -> list[float]:
    seen = []
    for _ in range(polls):
        target = policy.next_target(target, engine.poll(target))
        seen.append(target)
    return seen


def test_startup_doubles_then_settles_on_the_measured_capacity() -> None:
    policy, engine = Capacity(), Engine(64)
    # 8 → 16 → 32 → 64 → 128 (no estimate yet), then saturated: running 64, cut to 128 × 64 / 128 = 64.
    assert drive(policy, engine, 8, 5) == [16.0, 32.0, 64.0, 128.0, 64.0]
    assert policy.mode == "cruise"
    assert policy.estimate(Observation(time=engine.time)) == 64
    # At the estimate: hold twice, probe ×1.25 on the third, the probe saturates and is cut back.
    assert drive(policy, engine, 64, 4) == [64.0, 64.0, 80.0, 64.0]


def test_gpu_added_reaches_new_capacity_one_poll_after_saturation_is_seen() -> None:
    policy, engine = Capacity(), Engine(64)
    target = drive(policy, engine, 8, 5)[-1]
    assert target == 64.0
    engine.capacity = 128  # a GPU is added
    # Hold, hold, probe 80 (absorbed: no queue), so double to 160; saturated at running 128 → exactly 128.
    assert drive(policy, engine, target, 5) == [64.0, 64.0, 80.0, 160.0, 128.0]
    assert policy.estimate(Observation(time=engine.time)) == 128
    # And it stays there (probes excepted), where AIMD would have climbed 25 % a poll from its last cut.
    assert drive(policy, engine, 128, 3) == [128.0, 128.0, 160.0]


def test_gpu_removed_drops_the_stale_estimate() -> None:
    policy, engine = Capacity(), Engine(128)
    target = drive(policy, engine, 16, 5)[-1]
    assert target == 128.0
    engine.capacity = 64  # a GPU is removed
    # Saturated at 64: cut to 64. The window still says 128, so one jump back (RETURN); it saturates, the
    # stale sample is dropped, and the target settles at 64.
    assert drive(policy, engine, target, 4) == [64.0, 128.0, 64.0, 64.0]
    assert policy.estimate(Observation(time=engine.time)) == 64


def test_saturated_cut_never_raises_with_other_clients_on_the_engine() -> None:
    policy = Capacity()
    obs = Observation(running=100, waiting=5, waiting_capacity=5, inflight=4)  # seed-aimd's flaw-1 case
    assert policy.next_target(4, obs) == pytest.approx(4 * 100 / 105)
    # None of the queue is ours: hold.
    assert policy.next_target(10, Observation(running=100, waiting=5, waiting_capacity=5, inflight=0)) == 10.0


def test_targets_own_share_of_the_estimate() -> None:
    policy = Capacity()
    policy.next_target(50, Observation(running=120, waiting=10, waiting_capacity=10, inflight=50, time=0))
    # Unsaturated, we hold 25 of the 100 running: share 0.25 of capacity 120 = 30.
    assert policy.next_target(25, Observation(running=100, inflight=25, time=12)) == 30.0
    assert policy.mode == "return"


def test_kv_block_estimate_before_any_saturation() -> None:
    policy = Capacity(tokens_per_request=500)
    obs = Observation(running=8, inflight=8, kv_num_blocks=1000, time=0)
    assert policy.next_target(8, obs) == 32.0  # 1000 blocks × 16 tokens / 500 tokens per request
    assert Capacity().next_target(8, obs) == 16.0  # without the hint: startup doubling


def test_window_forgets_old_samples() -> None:
    policy = Capacity(window_s=100, window_polls=2)
    policy.next_target(10, Observation(running=50, waiting=1, waiting_capacity=1, inflight=10, time=0))
    assert policy.estimate(Observation(time=100)) == 50
    assert policy.estimate(Observation(time=101)) is None
    for t, running in ((200, 10), (212, 20), (224, 30)):
        policy.next_target(10, Observation(running=running, waiting=1, waiting_capacity=1, inflight=10, time=t))
    assert policy.estimate(Observation(time=224)) == 30  # only the last 2 saturated polls: 20, 30


def test_application_limited_hold() -> None:
    policy = Capacity()
    assert policy.next_target(100, Observation(running=10, inflight=79)) == 100.0
    assert policy.mode == "startup"


def test_capacity_rejects_bad_parameters() -> None:
    for bad in (
        {"startup_gain": 1},
        {"probe_gain": 0.9},
        {"probe_interval": 0},
        {"window_polls": 1.5},
        {"drain_factor": 0},
        {"tokens_per_request": 0},
    ):
        with pytest.raises(ValueError):
            Capacity(**bad)
