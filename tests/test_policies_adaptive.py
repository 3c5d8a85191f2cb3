"""Exact-value tests of the adaptive policy: slow start and its full-pipe exit, the cut (on a queue, or inferred at
the sampled capacity), the additive climb, the probes, the KV-block rescale, and the goal after a metrics outage."""

from __future__ import annotations

import pytest

from model_concurrency import Observation
from model_concurrency.policies import Adaptive
from model_concurrency.policies.adaptive import RULES
from model_concurrency.policies.registry import load_policy
from model_concurrency.policies.rules import ADAPTIVE_RULES


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


def test_a_saturated_poll_cuts_to_0_9_of_the_served_share_then_climbs_by_one() -> None:
    p = Adaptive()
    assert p.next_target(300, saturated(300, running=256, time=0.0)) == pytest.approx(0.9 * 256)
    assert p.w_max == 256
    assert p.next_target(230.4, full(230.4, time=12.0)) == pytest.approx(231.4)
    # Back at the capacity the engine ran while saturated (256 ± 0.5), nothing waits yet but every slot is
    # taken: that counts as saturated too (cut to 0.9 × the 255 in flight), so the cycle needs no queue to turn.
    assert p.next_target(255.5, full(255.5, time=24.0)) == pytest.approx(0.9 * 255)
    # An inferred cut records no capacity sample of its own: the one it was inferred from stays the only one.
    assert list(p.samples) == [(0.0, 256)] and p.w_max == 255


def test_without_inferred_saturation_running_back_at_the_capacity_is_no_cut() -> None:
    p = Adaptive(without=("inferred-saturation",))
    assert p.next_target(300, saturated(300, running=256, time=0.0)) == pytest.approx(0.9 * 256)
    assert p.next_target(230.4, full(230.4, time=12.0)) == pytest.approx(231.4)
    # Back at the sampled 256 with nothing waiting: no cut without a queue. Above the goal (256 - 1 step) it
    # probes, +1.
    assert p.next_target(255.5, full(255.5, time=24.0)) == pytest.approx(256.5)


def test_inferred_saturation_needs_running_within_half_a_sequence_of_the_capacity() -> None:
    # 255.4 running is more than half a sequence under the sampled 256: no cut, the additive step to the goal.
    p = Adaptive()
    p.next_target(300, saturated(300, running=256, time=0.0))
    assert p.next_target(255.0, full(255.0, time=12.0, running=255.4)) == 256
    # 256.4 is within it: cut to 0.9 × the 256 in flight.
    assert p.next_target(256.0, full(256.0, time=24.0, running=256.4)) == pytest.approx(0.9 * 256)


def test_beside_peers_room_that_appears_restores_to_0_9_of_our_share_of_the_capacity() -> None:
    p = Adaptive()
    # 32 clients on 1024 slots: we saw it saturated with 40 of ours in flight (cut to 0.9 × 40 × 1024 / 1034).
    assert p.next_target(40, Observation(running=1024, waiting=10, waiting_capacity=10, inflight=40)) == (
        pytest.approx(0.9 * 40 * 1024 / 1034)
    )
    assert p.w_max == pytest.approx(40 * 1024 / 1034) and p.capacity(0.0) == 1024
    # Half the engine free: our share of its capacity (50 / 500 × 1024 = 102.4) is the goal, far above the goal at
    # our cut (39.6): room appeared, so slow start (a doubling to 100) up to 0.9 × it, not the additive step.
    assert p.next_target(50, full(50, time=12.0, running=500)) == pytest.approx(0.9 * 102.4)


def test_sharing_the_engine_probes_do_not_accelerate() -> None:
    p = Adaptive()
    p.next_target(300, Observation(running=1000, waiting=200, waiting_capacity=200, inflight=300, time=0.0))
    # Above the goal (250) with the engine running 1100, more than its known capacity: a lone client would
    # probe +1, +2, +4 (a capacity that grew without a KV-block signal); sharing the engine it probes by the
    # step, +1 every poll, since every client sharing it probes too.
    t = 251.0
    for i in range(3):
        t = p.next_target(t, full(t, time=12.0 * (i + 1), running=1100))
        assert t == 251.0 + (i + 1)
    assert p.probes == 3


def test_high_kv_usage_or_preemptions_without_a_queue_are_no_saturation() -> None:
    # Nothing waits: KV usage at 93 % (no block count, so no KV bound either) and the first ramp doubles on.
    p = Adaptive()
    assert p.next_target(50, Observation(running=50, inflight=50, kv_cache_usage=0.93, time=0.0)) == 100
    assert p.ramping and p.capacity(0.0) is None
    # Preemptions with nothing waiting: the same.
    q = Adaptive()
    assert q.next_target(50, Observation(running=50, inflight=50, preemptions=2, time=0.0)) == 100
    assert q.ramping
    r = Adaptive()
    assert r.next_target(50, Observation(running=50, inflight=50, kv_cache_usage=0.99, preemptions=2)) == 100
    # Nor is growth capped where KV usage would pass some mark: 32 at 60 % usage doubles to 64.
    s = Adaptive()
    assert s.next_target(32, Observation(running=32, inflight=32, kv_cache_usage=0.6, time=0.0)) == 64


def test_slow_start_ends_when_the_engine_did_not_grow_with_us() -> None:
    p = Adaptive()
    # Another 31 clients fill the engine: our doubling 32 -> 64 raised its running by only 11.
    assert p.next_target(32, full(32, time=0.0, running=1005)) == 64
    # Back to the level before the doubling plus what the engine absorbed: max(64 / 2, 64 − 32 + 11) = 43, +1.
    assert p.next_target(64, full(64, time=12.0, running=1016)) == 44
    assert p.w_max == 43
    q = Adaptive(without=("engine-full-exit",))
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
    sequence limit: the cut stands, but 12 running is no inferred saturation afterwards."""
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


def test_after_an_outage_dropped_it_to_the_floor_it_slow_starts_back_to_0_9_of_the_goal() -> None:
    p = Adaptive()
    p.next_target(300, saturated(300, running=256, time=0.0))
    # Far below the goal (256) it doubles back: 4, 8, ..., 128, then 0.9 × 256 (the cap), then the additive step.
    targets = [4.0]
    for i in range(7):
        targets.append(p.next_target(targets[-1], full(targets[-1], time=1000.0 + 12.0 * i)))
    assert targets == pytest.approx([4, 8, 16, 32, 64, 128, 230.4, 231.4])


def test_application_limited_holds_and_an_idle_spell_forgets_nothing() -> None:
    p = Adaptive()
    p.next_target(300, saturated(300, running=256, time=0.0))
    assert p.next_target(200, Observation(running=10, inflight=10, time=12.0)) == 200
    assert p.next_target(200, Observation(inflight=0, time=24.0)) == 200
    assert p.next_target(200, Observation(inflight=0, time=1000.0)) == 200
    assert p.w_max == 256 and p.capacity(1000.0) == 256
    # Busy again: back to 0.9 × the goal it remembers, not a doubling to 400.
    assert p.next_target(200, full(200, time=1012.0)) == pytest.approx(0.9 * 256)


@pytest.mark.parametrize("target", [2.9, 3.9, 1.6])
def test_a_fractional_target_whose_whole_window_is_in_use_is_not_application_limited(target: float) -> None:
    # The limiter opens the target's whole part: 2.9 admits 2 calls, and 2 in flight is all of it. Read against
    # 0.8 × 2.9 = 2.32 the window would look unused and the target would hold there for good.
    p = Adaptive()
    p.next_target(300, saturated(300, running=256, time=0.0))  # W = 256: the target is far below it
    window = int(target)
    grown = p.next_target(target, Observation(running=200, inflight=window, inflight_peak=window, time=12.0))
    assert grown == pytest.approx(2 * target)  # the slow-start band's doubling
    # One call short of the window is short of it.
    held = Observation(running=200, inflight=window - 1, inflight_peak=window - 1, time=24.0)
    assert p.next_target(target, held) == target


@pytest.mark.parametrize(
    "bad",
    [
        {"slow_start_factor": 1.0},
        {"decrease_factor": 1.0},
        {"increase_step": 0.0},
        {"near_full": 1.5},
        {"window_polls": 0},
        {"rescale_threshold": 0.0},
        {"slow_start_below": 1.5},
        {"startup_exit": 0.9},
        {"window_s": 0.0},
        {"window_polls": 2.5},
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
    # Put below where our cut left us (the fail-safe's floor): slow start, a doubling (20 -> 40) under the cap of
    # 0.9 × the goal (W_max 48: 43.2), not the step.
    q = Adaptive()
    _shared_cuts(q)
    assert q.next_target(20, Observation(running=52, inflight=20, time=24.0)) == 40


# -- without: the rules switched off by name -------------------------------------------------------------------
def test_without_refuses_unknown_rule_names_and_names_them() -> None:
    with pytest.raises(ValueError, match=r"unknown rules \['felt-queue', 'probes'\]"):
        Adaptive(without=("kv-jump", "probes", "felt-queue"))


def test_without_refuses_a_string_for_a_list() -> None:
    with pytest.raises(ValueError, match="without must be a list of rule names"):
        Adaptive(without="probe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without must be a list of rule names"):
        Adaptive(without=("probe", 1))  # type: ignore[arg-type]


def test_without_takes_a_list_as_a_preset_states_it() -> None:
    p = load_policy("adaptive", without=["probe", "inferred-saturation"])
    assert isinstance(p, Adaptive)
    assert p.without == ("probe", "inferred-saturation")
    assert not p.on("probe") and not p.on("inferred-saturation") and p.on("kv-jump")


def test_the_rules_without_names_are_the_rule_tables_switches() -> None:
    assert {r.name for r in ADAPTIVE_RULES if "without" in r.off} == RULES
    assert all(r.off == {"without": [r.name]} for r in ADAPTIVE_RULES if r.name in RULES)


def test_without_probe_a_probe_is_the_step_alone() -> None:
    # Alone above the goal (W_max 256): +1, +2, +4 with the probe; +1 a poll without it. The polls come after the
    # sample's window (600 s), so running back at 256 is no inferred saturation.
    for without, expected in (((), [257.0, 259.0, 263.0]), (("probe",), [257.0, 258.0, 259.0])):
        p = Adaptive(without=without)
        p.next_target(300, saturated(300, running=256, time=0.0))
        t, seen = 256.0, []
        for i in range(3):
            t = p.next_target(t, full(t, time=600.0 + 12.0 * (i + 1)))
            seen.append(t)
        assert seen == expected


def test_without_capacity_samples_the_goal_is_w_max_alone() -> None:
    # Cut beside peers at 1024 running (W_max 39.6). Later, half the engine free: with the sample, our share of its
    # capacity (50 / 500 x 1024 = 102.4) is the goal and 50 slow-starts to 0.9 x it; without, the goal stays W_max and
    # 50 is above it: a probe of +1.
    first = Observation(running=1024, waiting=10, waiting_capacity=10, inflight=40)
    with_samples, without = Adaptive(), Adaptive(without=("capacity-samples",))
    for p in (with_samples, without):
        assert p.next_target(40, first) == pytest.approx(0.9 * 40 * 1024 / 1034)
    assert with_samples.capacity(0.0) == 1024 and without.capacity(0.0) is None
    assert with_samples.next_target(50, full(50, time=12.0, running=500)) == pytest.approx(0.9 * 102.4)
    assert without.next_target(50, full(50, time=12.0, running=500)) == 51


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
