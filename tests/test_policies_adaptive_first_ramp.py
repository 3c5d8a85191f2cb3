"""The adaptive policy's first ramp: the capacity estimate from the engine's KV figures, the jump toward
it, the doubling without them, and the property that the first ramp never grows past the KV bound.

Figures are chosen so the rules give whole numbers: 10,000 KV blocks, 4 sequences at 2 % usage are 50 blocks a
sequence; the cache holds 200 such sequences (the whole cache counts as room)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency import Observation
from model_concurrency.observation import observe
from model_concurrency.policies import Adaptive
from model_concurrency.signals.vllm import parse_vllm_metrics
from servers import EngineState, vllm_page

# The jump's own rules, without the per-poll cap of 8x (tested on its own below, with the default).
UNCAPPED = math.inf


def poll(
    inflight: float,
    *,
    running: float | None = None,
    kv: float | None,
    blocks: int | None = 10_000,
    waiting: float = 0.0,
    time: float = 0.0,
) -> Observation:
    return Observation(
        running=inflight if running is None else running,
        waiting=waiting,
        waiting_capacity=waiting,
        inflight=int(inflight),
        kv_cache_usage=kv,
        kv_num_blocks=blocks,
        time=time,
    )


def test_the_estimate_from_a_two_engine_page_with_known_block_counts() -> None:
    # Two engines of 4,096 blocks (8,192 summed), 2 sequences each at 2 % KV usage: 8,192 × 0.02 / 4 = 40.96
    # blocks a sequence, so the cache holds 200 sequences.
    page = vllm_page({"m": [EngineState(running=2, kv=0.02), EngineState(running=2, kv=0.02)]}).decode()
    snapshot = parse_vllm_metrics(page, "m")
    assert snapshot.kv_num_blocks == 8192
    obs = observe(snapshot, None, inflight=4, time=0.0)
    p = Adaptive(jump_max_factor=UNCAPPED)
    estimate = p.kv_estimate(obs)
    assert estimate is not None
    assert estimate.blocks_per_sequence == pytest.approx(40.96)
    assert estimate.sequences == pytest.approx(200)
    assert estimate.bound == pytest.approx(200)  # alone: all of the free room is ours
    # The jump: halfway from 4 to the bound of 200.
    assert p.next_target(4, obs) == pytest.approx(102)


def test_a_lone_client_jumps_halfway_to_the_bound_then_probes_above_it() -> None:
    p = Adaptive(jump_max_factor=UNCAPPED)
    assert p.ramping
    assert p.next_target(4, poll(4, kv=0.02, time=0.0)) == pytest.approx(102)
    assert p.jump_to == pytest.approx(102)
    # 102 sequences at 50 blocks each (51 % usage) ran a poll without a queue: 102 becomes W_max, the ramp is
    # over, and the probes (+1, +2, +4) look for the sequence limit instead of a doubling to 200.
    assert p.next_target(102, poll(102, kv=0.51, time=12.0)) == pytest.approx(103)
    assert p.w_max == pytest.approx(102) and not p.ramping
    assert p.next_target(103, poll(103, kv=0.515, time=24.0)) == pytest.approx(104)
    assert p.next_target(104, poll(104, kv=0.52, time=36.0)) == pytest.approx(106)


def test_a_jump_into_the_sequence_limit_is_cut_to_the_served_share() -> None:
    p = Adaptive(jump_max_factor=UNCAPPED, jump_fraction=1.0)
    assert p.next_target(4, poll(4, kv=0.02, time=0.0)) == pytest.approx(200)
    # The engine runs 128 (its sequence limit, not on the page) and queues 72 of ours. `running` rose by 124 of
    # our 196, so it may still be admitting the burst: one poll's hold, nothing learnt.
    assert p.next_target(200, poll(200, running=128, waiting=72, kv=0.64, time=12.0)) == pytest.approx(200)
    assert p.w_max is None and p.capacity(12.0) is None and p.held
    # Still 128 running: the engine is full, not admitting. Cut to 0.9 × 128.
    assert p.next_target(200, poll(200, running=128, waiting=72, kv=0.64, time=14.0)) == pytest.approx(115.2)
    assert p.w_max == pytest.approx(128) and p.capacity(14.0) == 128
    assert not p.ramping
    # Below the goal: +1 a poll, no second jump.
    assert p.next_target(115.2, poll(115.2, kv=0.576, time=26.0)) == pytest.approx(116.2)


def test_a_burst_the_engine_is_still_admitting_is_not_a_capacity() -> None:
    p = Adaptive(jump_max_factor=UNCAPPED, jump_fraction=1.0)
    assert p.next_target(4, poll(4, kv=0.02, time=0.0)) == pytest.approx(200)
    # A fast poll lands while the engine admits the jump over several steps: 150 running, 50 waiting.
    assert p.next_target(200, poll(200, running=150, waiting=50, kv=0.75, time=2.0)) == pytest.approx(200)
    # The next poll finds all 200 running and nothing waiting: the jump stands and becomes W_max. The cache is
    # full (200 × 50 blocks, a bound of 200), so the probe waits at the bound instead of passing it.
    assert p.next_target(200, poll(200, kv=1.0, time=4.0)) == pytest.approx(200)
    assert p.w_max == pytest.approx(200) and p.capacity(4.0) is None and not p.ramping


def test_a_cut_inferred_from_an_earlier_capacity_does_not_record_it_again() -> None:
    p = Adaptive()
    p.samples.append((0.0, 200.0))
    p.w_max = 180.0
    # `running` is back at the capacity learnt at t=0, with nothing waiting: cut, but learn nothing new.
    assert p.next_target(220, poll(220, running=200, kv=0.3, time=500.0)) == pytest.approx(0.9 * 220)
    assert list(p.samples) == [(0.0, 200.0)]
    # Past ``window_s`` the sample still bounds the goal, but it is no wall to cut at: the same reading grows.
    q = Adaptive()
    q.samples.append((0.0, 200.0))
    q.w_max = 180.0
    assert q.next_target(220, poll(220, running=200, kv=0.3, time=700.0)) == 221


def test_a_jump_the_target_no_longer_stands_at_proves_nothing() -> None:
    p = Adaptive(jump_max_factor=UNCAPPED)
    assert p.next_target(4, poll(4, kv=0.02, time=0.0)) == pytest.approx(102)
    # The ceiling (or the fail-safe) held the target at 64: no W_max; the ramp goes on, a second jump halfway from
    # 64 to the bound of 200 (more than the doubling to 128), judged in turn.
    assert p.next_target(64, poll(64, kv=0.32, time=12.0)) == pytest.approx(132)
    assert p.ramping and p.jump_to == pytest.approx(132)


def test_on_a_shared_engine_it_doubles_and_never_past_its_share_of_the_free_room() -> None:
    p = Adaptive()
    # Three other clients at the floor too (own share 1/4 < jump_share 0.9): doubling, as they do.
    est = p.kv_estimate(poll(4, running=16, kv=0.08))
    assert est is not None and est.sequences == pytest.approx(200)
    assert est.bound == pytest.approx(4 + (200 - 16) / 4)  # 50: a quarter of the 184 free
    assert p.next_target(4, poll(4, running=16, kv=0.08)) == 8
    # 40 of 160 running at 80 %: doubling to 80 would fill four times our share of the 40 left; capped at 50.
    q = Adaptive()
    assert q.next_target(40, poll(40, running=160, kv=0.8)) == pytest.approx(50)


def test_without_cache_config_info_the_first_ramp_doubles() -> None:
    p = Adaptive()
    obs = poll(4, kv=0.02, blocks=None)
    assert p.kv_estimate(obs) is None
    assert p.next_target(4, obs) == 8
    # No KV usage reported, or nothing running yet: no estimate either.
    assert p.kv_estimate(poll(4, kv=None)) is None
    assert p.kv_estimate(poll(4, running=0, kv=0.0)) is None
    assert Adaptive().next_target(4, poll(4, running=0, kv=0.0)) == 8


def test_a_sequence_holds_at_least_one_block() -> None:
    # 10,000 blocks and a usage of 1e-308 (or gauges read at different instants): at most 10,000 sequences fit;
    # the bound stays finite.
    est = Adaptive().kv_estimate(poll(4, kv=1e-308))
    assert est is not None
    assert est.blocks_per_sequence == 1
    assert est.sequences == pytest.approx(10_000)
    assert est.bound == pytest.approx(10_000)


def test_the_jump_can_be_switched_off_or_made_whole() -> None:
    assert Adaptive(jump_max_factor=UNCAPPED, without=("kv-jump",)).next_target(4, poll(4, kv=0.02)) == 8
    assert Adaptive(jump_max_factor=UNCAPPED, jump_fraction=1.0).next_target(4, poll(4, kv=0.02)) == pytest.approx(200)


def test_a_full_pipe_exit_is_not_undone_by_the_kv_cap() -> None:
    p = Adaptive()
    # Another 31 clients fill the engine (share < jump_share: doubling). Our doubling 32 -> 64 raised its running
    # by only 11: the exit answers max(64 / 2, 64 − 32 + 11) + 1 = 44, a cut the KV room must not raise.
    assert p.next_target(32, poll(32, running=1005, kv=0.3, blocks=100_000)) == 64
    assert p.next_target(64, poll(64, running=1016, kv=0.31, blocks=100_000, time=12.0)) == 44
    assert not p.ramping


@pytest.mark.parametrize("bad", [{"jump_share": 1.5}, {"jump_fraction": 0.0}, {"jump_fraction": 1.5}])
def test_rejects_bad_first_ramp_parameters(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Adaptive(**bad)  # type: ignore[arg-type]


_poll = st.builds(
    dict,
    use=st.floats(0.5, 1.2),  # our in-flight over the target: application-limited to growing
    others=st.floats(0, 3),  # the other clients' running, over our in-flight
    waiting=st.floats(0, 0.5),  # waiting over running
    kv=st.one_of(st.none(), st.floats(0, 1)),
    calls=st.integers(0, 10_000),
    preemptions=st.sampled_from([0.0, 0.0, 0.0, 3.0]),
)


@given(
    blocks=st.integers(1, 1_000_000),
    start=st.floats(1, 1000),
    polls=st.lists(_poll, min_size=1, max_size=12),
    jump_fraction=st.floats(0.01, 1.0),
)
def test_the_first_ramp_never_grows_past_the_kv_bound(
    blocks: int, start: float, polls: list[dict[str, float]], jump_fraction: float
) -> None:
    """While ramping, whatever the engine reports, an answer above the current target stays within the KV bound
    (our in-flight plus our share of the room left in the cache) whenever that bound is known."""
    p = Adaptive(jump_fraction=jump_fraction)
    target = start
    for i, f in enumerate(polls):
        inflight = round(target * f["use"])
        running = inflight * (1 + f["others"])
        obs = Observation(
            running=running,
            waiting=f["waiting"] * running,
            inflight=inflight,
            kv_cache_usage=f["kv"],
            kv_num_blocks=blocks,
            preemptions=f["preemptions"],
            client_calls=int(f["calls"]),
            time=12.0 * i,
        )
        ramping, estimate = p.ramping, p.kv_estimate(obs)
        answer = p.next_target(target, obs)
        assert math.isfinite(answer) and answer >= 0
        if ramping and estimate is not None:
            assert answer <= max(target, estimate.bound) * (1 + 1e-12)
        target = max(1.0, answer)


def test_a_jump_is_at_most_eight_times_the_target_and_a_capped_jump_jumps_again() -> None:
    p = Adaptive()  # the default cap, jump_max_factor 8
    # Halfway from 4 to the bound of 200 is 102: capped at 32; the ramp goes on (no jump to judge yet).
    assert p.next_target(4, poll(4, kv=0.02, time=0.0)) == pytest.approx(32)
    assert p.jump_to is None and p.ramping
    # From 32 (the same 50 blocks a sequence): halfway to 200 is 116, within 8 x 32: the jump lands.
    assert p.next_target(32, poll(32, kv=0.16, time=2.0)) == pytest.approx(116)
    assert p.jump_to == pytest.approx(116)
    # It ran without a queue: W_max, and the probes.
    assert p.next_target(116, poll(116, kv=0.58, time=4.0)) == pytest.approx(117)
    assert p.w_max == pytest.approx(116) and not p.ramping


def test_one_block_a_sequence_says_little_and_the_cap_keeps_the_jump_to_eight_times() -> None:
    # An embedding model: 24 sequences in 0.086 % of 27,900 blocks (one block each); the bound is ~25,000.
    p = Adaptive()
    obs = Observation(running=24, waiting=0, kv_cache_usage=0.00086, kv_num_blocks=27900, inflight=24, time=0.0)
    estimate = p.kv_estimate(obs)
    assert estimate is not None and estimate.bound > 25_000
    assert p.next_target(24, obs) == pytest.approx(192)


def test_the_cap_is_checked() -> None:
    with pytest.raises(ValueError, match="jump_max_factor must be >= slow_start_factor"):
        Adaptive(jump_max_factor=1.5)


def test_running_past_every_capacity_sample_forgets_them() -> None:
    p = Adaptive()
    p.samples.append((0.0, 64.0))
    p.w_max = 64.0
    # A raised sequence limit (no KV-block change, so no rescale): the engine now runs 80. The old 64 is no
    # limit any more, so a later poll that passes through 64 running is not "full".
    p.next_target(80, poll(80, kv=0.4, time=12.0))
    assert p.capacity(12.0) is None
    assert p.next_target(90, poll(90, running=64, kv=0.3, time=24.0)) > 90


def test_a_step_held_while_the_engine_admits_it_is_judged_like_a_jump() -> None:
    # 100,000 blocks, 50 a sequence: a bound of 2,000, so both steps are the 8x cap (no jump to judge yet).
    p = Adaptive()
    assert p.next_target(4, poll(4, kv=0.002, blocks=100_000, time=0.0)) == pytest.approx(32)
    first = dataclasses.replace(poll(32, kv=0.016, blocks=100_000, time=2.0), client_calls=10)
    assert p.next_target(32, first) == pytest.approx(256)
    assert p.jump_to is None and p.ramping
    # Capacity-waiting while `running` still climbs (171 of our 224 more): held once, as a jump to judge.
    assert p.next_target(256, poll(256, running=203, waiting=53, kv=0.1, blocks=100_000, time=4.0)) == 256
    assert p.held and p.jump_to == 256
    # The next poll runs it without a queue: W_max and a probe, not another step past the engine's 256, whatever
    # the completion count of a 2 s window says (40, a sixth of a round trip of 256).
    settled = dataclasses.replace(poll(256, running=254, kv=0.127, blocks=100_000, time=6.0), client_calls=40)
    assert p.next_target(256, settled) == pytest.approx(257)
    assert p.w_max == pytest.approx(256) and not p.ramping


def shared(inflight: int, running: float, waiting: float, time: float) -> Observation:
    """A poll of one of many clients on a fleet (no KV figures: the first ramp doubles)."""
    return Observation(
        running=running,
        waiting=waiting,
        waiting_capacity=waiting,
        inflight=inflight,
        inflight_peak=inflight,
        time=time,
    )


def test_a_shared_first_ramp_cut_read_mid_admission_is_forgotten_and_the_ramp_goes_on() -> None:
    # 1,000 clients started together with 4 each: the fleet admits the 4,000 prompts over several steps, and a
    # client polling 0.3 s in sees 1,875 running and 453 waiting. It cuts to 0.9 x its served share 4 x 1,875 /
    # 2,328 (under its floor: the controller hands back 4) and records 1,875 as a capacity.
    p = Adaptive()
    assert p.next_target(4, shared(4, 1875, 453, 0.3)) == pytest.approx(0.9 * 4 * 1875 / 2328)
    assert p.w_max == pytest.approx(4 * 1875 / 2328) and p.capacity(0.3) == 1875 and not p.ramping
    # Its next poll finds the fleet running 7,694 without a queue: the sample was read mid-admission, and so was
    # the share. Both are forgotten and the ramp doubles on, as the other clients' ramps do.
    assert p.next_target(4, shared(4, 7694, 0, 11.7)) == 8
    assert p.w_max is None and p.capacity(11.7) is None and p.ramping
    assert p.next_target(8, shared(8, 14740, 0, 22.9)) == 16


def test_a_shared_first_ramp_cut_is_kept_when_the_engine_runs_less_than_twice_its_sample() -> None:
    # The ramp met the fleet's limit at 16,000 running; the next poll finds 16,100 (a fleet's running wanders a
    # little): a sample, not an admission burst. W_max (31.4) stays and the step climbs toward it, no second ramp.
    p = Adaptive()
    p.next_target(32, shared(32, 16000, 300, 0.0))
    w_max = p.w_max
    assert w_max == pytest.approx(32 * 16000 / 16300)
    assert p.next_target(29, shared(29, 16100, 0, 12.0)) == 30
    assert p.w_max == w_max and p.capacity(12.0) is None and not p.ramping
    # A cut that was not the first ramp's end is kept even past twice its sample (a capacity that grew).
    q = Adaptive()
    q.next_target(32, shared(32, 1000, 300, 0.0))
    q.next_target(32, shared(32, 1000, 300, 12.0))
    q.next_target(29, shared(29, 2500, 0, 24.0))
    assert q.w_max == pytest.approx(32 * 1000 / 1300) and not q.ramping
    # Alone on the engine (a share of 1) a first ramp's cut is not forgotten either: the jump's path holds a
    # step the engine is still admitting (``_admitting``), and the sample alone is dropped.
    r = Adaptive()
    r.next_target(300, shared(300, 256, 44, 0.0))
    assert r.next_target(257, shared(257, 600, 0, 12.0)) == 258
    assert r.w_max == pytest.approx(256) and r.capacity(12.0) is None
