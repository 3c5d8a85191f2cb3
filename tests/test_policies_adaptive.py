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
    # Completions per 12 s poll: each doubling buys +100 %, +100 %, then only +9 % (the engine's knee). One
    # round trip of the window a poll (calls = in flight), so each poll doubles once; the last interval's 35
    # completions are a round trip of the 32 held before it, so its rate is a fair test of that window.
    for i, calls in enumerate([0, 8, 16, 32, 35]):
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
    # Back at the capacity the engine ran while saturated (256 ± 0.5), nothing waits yet but every slot is
    # taken: that counts as saturated too (cut to 0.9 × the 255 in flight), so the cycle needs no queue to turn.
    assert p.next_target(255.5, full(255.5, time=24.0)) == pytest.approx(0.9 * 255)


def test_probes_accelerate_only_where_the_engine_runs_more_than_its_known_capacity() -> None:
    p = Adaptive(step_exponent=0.0, accelerate_shared=True)  # the rule as a lone client meets it
    p.next_target(300, saturated(300, running=256, time=0.0))
    # The engine runs 300 > 256 without a queue: capacity grew without a KV-block signal, probe +1, +2, +4.
    t = 257.0
    for i, expected in enumerate([258.0, 260.0, 264.0]):
        t = p.next_target(t, full(t, time=12.0 + 12.0 * i, running=300))
        assert t == expected


def test_on_a_full_shared_engine_a_probe_is_capped_by_its_share_of_the_room() -> None:
    p = Adaptive(step_exponent=0.0, accelerate_shared=True)  # the plain step, to see the cap alone
    # 32 clients on 1024 slots: we saw it saturated with 40 of ours in flight (cut to 0.9 × 40 × 1024 / 1034).
    p.next_target(40, Observation(running=1024, waiting=10, waiting_capacity=10, inflight=40, time=0.0))
    assert p.w_max == pytest.approx(40 * 1024 / 1034)
    # Above the goal (40 / 1000 × 1024 = 40.96), with 1000 of the 1024 slots running: our share of the 24 free is
    # 40 / 1000 × 24 = 0.96, so +1 (the first probe step), and then +1 however long that lasts: the probe step
    # stays at 2 (one probe counted) instead of doubling into other clients' share.
    for i in range(3):
        assert p.next_target(40, full(40, time=12.0 * (i + 1), running=1000)) == 41
    assert p.probes == 1
    # Half the engine free: our share of its capacity (50 / 500 × 1024 = 102.4) is the goal; restore to 0.9 × it.
    assert p.next_target(50, full(50, time=48.0, running=500)) == pytest.approx(0.9 * 102.4)


def test_on_a_big_engine_the_step_shrinks_with_the_square_root_of_its_size_for_every_client_alike() -> None:
    # A fleet that ran 2,048 while saturated. Below the goal the step is (1,024 / 2,000)^0.5 = 0.72, not 1, for a
    # client with 16 in flight and for one with 64 alike (the same step keeps them converging to equal shares).
    # (Sharing a fleet that big, the cut is 0.93 and the step 0.7 of it: the next test; here the plain rule.)
    for inflight in (16, 64):
        p = Adaptive(fleet_decrease_factor=0.9)
        cut = p.next_target(inflight, Observation(running=2048, waiting=8, waiting_capacity=8, inflight=inflight))
        assert cut == pytest.approx(0.9 * inflight * 2048 / 2056)
        assert p.next_target(cut, full(cut, time=12.0, running=2000)) == pytest.approx(cut + (1024 / 2000) ** 0.5)
    # Alone on the big engine, nobody steps with us: the full step.
    alone = Adaptive()
    alone.next_target(2100, saturated(2100, running=2048, time=0.0))
    assert alone.next_target(1900, full(1900, time=12.0)) == pytest.approx(1901)
    # Up to 1,024 running the step is the full one, and the exponent 0 switches the scaling off.
    q = Adaptive()
    q.next_target(300, saturated(300, running=256, time=0.0))
    assert q.next_target(240, full(240, time=12.0)) == pytest.approx(241)
    r = Adaptive(step_exponent=0.0, fleet_decrease_factor=0.9)
    cut = r.next_target(16, Observation(running=2048, waiting=8, waiting_capacity=8, inflight=16))
    assert r.next_target(cut, full(cut, time=12.0, running=2000)) == pytest.approx(cut + 1)


def test_sharing_a_big_fleet_the_cut_is_0_93_and_the_step_smaller_in_proportion() -> None:
    # 1,000 clients on 16,384 sequences: a saturation is cut by the few whose poll falls in it. The cut is 0.93 of
    # the served share (not 0.9) and the step 0.07 / 0.1 = 0.7 of the fleet's (1,024 / running)^0.5.
    p = Adaptive()
    served = 20 * 16384 / 16400
    cut = p.next_target(20, Observation(running=16384, waiting=16, waiting_capacity=16, inflight=20))
    assert cut == pytest.approx(0.93 * served)
    assert p.w_max == pytest.approx(served)
    cut = 0.93 * served
    assert p.next_target(cut, full(cut, time=12.0, running=16000)) == pytest.approx(cut + 0.7 * (1024 / 16000) ** 0.5)
    # Up to 1,024 running (32 clients on 4 engines of 256), the plain rule: cut 0.9, step 1.
    q = Adaptive()
    plain = q.next_target(40, Observation(running=1024, waiting=16, waiting_capacity=16, inflight=40))
    assert plain == pytest.approx(0.9 * 40 * 1024 / 1040)
    assert q.next_target(plain, full(plain, time=12.0, running=1000)) == pytest.approx(plain + 1)
    # Alone on the big fleet, the plain rule too: nobody else cuts or steps.
    alone = Adaptive()
    assert alone.next_target(16400, saturated(16400, running=16384, time=0.0)) == pytest.approx(0.9 * 16384)
    # fleet_decrease_factor = decrease_factor is the plain rule everywhere.
    r = Adaptive(fleet_decrease_factor=0.9)
    plain = r.next_target(20, Observation(running=16384, waiting=16, waiting_capacity=16, inflight=20))
    assert plain == pytest.approx(0.9 * served)
    assert r.next_target(plain, full(plain, time=12.0, running=16000)) == pytest.approx(plain + (1024 / 16000) ** 0.5)


def test_sharing_the_engine_probes_do_not_accelerate() -> None:
    p = Adaptive()
    p.next_target(300, Observation(running=1000, waiting=200, waiting_capacity=200, inflight=300, time=0.0))
    # Above the goal (250) with the engine running 1100, more than its known capacity: a lone client would
    # probe +1, +2, +4 (a capacity that grew without a KV-block signal); sharing the engine it probes by the
    # step (here 0.7 × (1,024 / 1,100)^0.5, sharing a fleet running over 1,024) every poll, since every client
    # sharing it probes too.
    t = 251.0
    for i in range(3):
        t = p.next_target(t, full(t, time=12.0 * (i + 1), running=1100))
        assert t == pytest.approx(251.0 + (i + 1) * 0.7 * (1024 / 1100) ** 0.5)
    assert p.probes == 3


def test_kv_usage_at_kv_high_or_preemptions_count_as_saturation() -> None:
    p = Adaptive()
    obs = Observation(running=50, inflight=50, kv_cache_usage=0.93, time=0.0)
    assert p.next_target(50, obs) == pytest.approx(45)
    assert p.w_max == 50 and p.capacity(0.0) == 50
    q = Adaptive()
    assert q.next_target(50, Observation(running=50, inflight=50, preemptions=2, time=0.0)) == pytest.approx(45)
    # Both signals can be switched off.
    r = Adaptive(kv_high=1.0, cut_on_preemption=False)
    assert r.next_target(50, Observation(running=50, inflight=50, kv_cache_usage=0.99, preemptions=2)) == 100


def test_growth_is_capped_by_the_kv_headroom() -> None:
    p = Adaptive()
    # Slow start from 32 at 60 % KV usage: doubling would need 120 %; 32 × 0.92 / 0.6 = 49.07 is the most.
    obs = Observation(running=32, inflight=32, kv_cache_usage=0.6, time=0.0)
    assert p.next_target(32, obs) == pytest.approx(32 * 0.92 / 0.6)
    # Never a cut: above the cap already (usage 0.91 < kv_high) it holds.
    assert p.next_target(60, Observation(running=50, inflight=50, kv_cache_usage=0.91, time=12.0)) == 60


def test_slow_start_ends_when_the_engine_did_not_grow_with_us() -> None:
    p = Adaptive()
    # Another 31 clients fill the engine: our doubling 32 -> 64 raised its running by only 11.
    assert p.next_target(32, full(32, time=0.0, running=1005)) == 64
    # Back to the level before the doubling plus what the engine absorbed: max(64 / 2, 64 − 32 + 11) = 43, +1.
    assert p.next_target(64, full(64, time=12.0, running=1016)) == 44
    assert p.w_max == 43
    q = Adaptive(engine_full_exit=False)
    q.next_target(32, full(32, time=0.0, running=1005))
    assert q.next_target(64, full(64, time=12.0, running=1016)) == 128


def test_the_newest_capacity_sample_never_expires() -> None:
    p = Adaptive(window_s=100.0)
    p.next_target(300, saturated(300, running=200, time=0.0))
    p.next_target(300, saturated(300, running=256, time=50.0))
    assert p.capacity(60.0) == 256
    assert p.capacity(1000.0) == 256
    assert list(p.samples) == [(50.0, 256)]  # the older one expired, the newest stays


def test_a_queue_below_the_most_the_engine_has_run_is_not_its_capacity() -> None:
    """A long prompt waiting a step for tokens at 12 running, on an engine that has run 38 at once, is not the
    sequence limit: the cut stands, but 12 running is no inferred saturation afterwards (``fuzz-41-0187``)."""
    p = Adaptive()
    p.next_target(38, full(38, time=0.0))
    assert p.next_target(14, saturated(14, running=12, time=12.0)) == pytest.approx(0.9 * 12)
    assert p.capacity(12.0) is None
    assert p.next_target(12, full(12, time=24.0)) == 13  # the probe goes on: nothing says 12 is a wall
    # At the most the engine has run, a queue is the sequence limit's: a sample, and the inferred rule after it.
    assert p.next_target(40, saturated(40, running=38, time=36.0)) == pytest.approx(0.9 * 38)
    assert p.capacity(36.0) == 38
    assert p.next_target(38, full(38, time=48.0)) == pytest.approx(0.9 * 38)


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


def test_after_an_outage_dropped_it_to_the_floor_it_returns_to_0_9_of_the_goal_at_once() -> None:
    p = Adaptive()
    p.next_target(300, saturated(300, running=256, time=0.0))
    targets = [4.0]
    for i in range(3):
        targets.append(p.next_target(targets[-1], full(targets[-1], time=1000.0 + 12.0 * i)))
    assert targets == pytest.approx([4, 230.4, 231.4, 232.4])
    # restore_fraction=0 keeps the doubling: 4, 8, ..., 128, then 0.9 × 256.
    q = Adaptive(restore_fraction=0.0)
    q.next_target(300, saturated(300, running=256, time=0.0))
    targets = [4.0]
    for i in range(7):
        targets.append(q.next_target(targets[-1], full(targets[-1], time=1000.0 + 12.0 * i)))
    assert targets == pytest.approx([4, 8, 16, 32, 64, 128, 230.4, 231.4])


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
        {"restore_fraction": 1.5},
        {"kv_high": 0.0},
        {"step_exponent": -0.1},
        {"step_exponent": 1.5},
        {"full_step_running": 0.0},
        {"fleet_decrease_factor": 1.0},
        {"fleet_decrease_factor": 0.0},
    ],
)
def test_rejects_bad_parameters(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Adaptive(**bad)  # type: ignore[arg-type]


def _shared_cuts(policy: Adaptive) -> None:
    """Two cuts beside peers: at the most the engine ran (100, the capacity sample) and then below it."""
    poll = Observation(running=100, waiting=10, waiting_capacity=10, inflight=66, time=0.0)
    assert policy.next_target(66, poll) == pytest.approx(0.9 * 60)  # served 66 × 100 / 110
    poll = Observation(running=80, waiting=10, waiting_capacity=10, inflight=54, time=12.0)
    assert policy.next_target(54, poll) == pytest.approx(0.9 * 48)  # served 54 × 80 / 90; goal 0.6 × 100


def test_beside_peers_a_client_climbs_back_from_its_own_cuts_by_the_additive_step() -> None:
    """Our share of the capacity (43 / 75 × 100 = 57.3) puts 43.2 under the slow-start band, but only our own cuts
    put us there: +1, the step every client takes, not a jump to 0.9 of our own share (which keeps any split)."""
    after = Observation(running=75, inflight=43, time=24.0)
    p = Adaptive()
    _shared_cuts(p)
    assert p.next_target(43.2, after) == pytest.approx(44.2)
    old = Adaptive(shared_restore=True)
    _shared_cuts(old)
    assert old.next_target(43.2, after) == pytest.approx(0.9 * 43 / 75 * 100)
    # Put below where our cut left us (the fail-safe's floor): the restore to 0.9 × the goal (W_max 48) as before.
    q = Adaptive()
    _shared_cuts(q)
    assert q.next_target(20, Observation(running=52, inflight=20, time=24.0)) == pytest.approx(0.9 * 48)
