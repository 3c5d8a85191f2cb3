"""The adaptive policy's first ramp paced by turnover: a lone client's growth per round trip of its own
calls, a queue the engine is still admitting held rather than cut, and the engine-full test not fooled by other
clients leaving. Exact values from hand-built observations."""

from __future__ import annotations

import pytest

from model_concurrency import Observation
from model_concurrency.policies import Adaptive
from test_policies_adaptive_first_ramp import shared  # a poll of one of several clients (no KV figures)


def alone(
    inflight: int,
    *,
    calls: int,
    time: float,
    latency: float | None = 1.0,
    queued: float | None = None,
    running: float | None = None,
) -> Observation:
    """A poll of a client with the engine to itself (no KV figures: the doubling path, not the KV jump)."""
    return Observation(
        running=float(inflight) if running is None else running,
        inflight=inflight,
        inflight_peak=inflight,
        inflight_mean=float(inflight),
        client_calls=calls,
        client_latency_mean_s=latency,
        queue_time_mean_s=queued,
        time=time,
    )


def test_a_lone_ramp_grows_once_per_round_trip_of_its_window_up_to_8x_a_poll() -> None:
    # A 4-wide window that turned over 1.5 times (6 calls): 2^1.5; 3 times (12 calls): 8x; 10 times: still 8x
    # (jump_max_factor, the most one blind step may take).
    assert Adaptive().next_target(4, alone(4, calls=6, time=0.0)) == pytest.approx(4 * 2**1.5)
    assert Adaptive().next_target(4, alone(4, calls=12, time=0.0)) == pytest.approx(32)
    assert Adaptive().next_target(4, alone(4, calls=40, time=0.0)) == pytest.approx(32)
    # Less than one round trip: one doubling, as TCP's slow start on a poll (never less).
    assert Adaptive().next_target(4, alone(4, calls=2, time=0.0)) == 8
    # Without the turnover ramp: one doubling a poll whatever the turnover.
    assert Adaptive(without=("turnover-ramp",)).next_target(4, alone(4, calls=40, time=0.0)) == 8


def test_an_interval_that_queued_us_or_a_shared_engine_doubles_once() -> None:
    # The mean queue time over 10 % of our round trip (0.2 s of 1 s): the engine did not take the window freely.
    assert Adaptive().next_target(4, alone(4, calls=40, time=0.0, queued=0.2)) == 8
    assert Adaptive().next_target(4, alone(4, calls=40, time=0.0, queued=0.05)) == pytest.approx(32)
    # Three other clients' 12 running beside our 4 (share 1/4 < jump_share): one doubling, as they do.
    assert Adaptive().next_target(4, alone(4, calls=40, time=0.0, running=16)) == 8


def test_a_queue_the_engine_is_still_taking_in_is_held_not_cut() -> None:
    p = Adaptive()
    assert p.next_target(16, shared(16, running=21, waiting=0, time=0.0)) == 32
    # `running` rose by 126 since our last poll and 28 wait: a peer's burst being admitted. Hold at 32, no
    # capacity sample; the first ramp ends there (W_max 32), as a cut would have ended it.
    assert p.next_target(32, shared(32, running=147, waiting=28, time=12.0)) == 32
    assert not p.ramping and p.w_max == 32 and p.capacity(12.0) is None
    # `running` flat at 147 with 28 still waiting: a wall. Cut to 0.9 x the served share 32 x 147 / 175.
    assert p.next_target(32, shared(32, running=147, waiting=28, time=24.0)) == pytest.approx(0.9 * 32 * 147 / 175)
    assert p.w_max == pytest.approx(32 * 147 / 175)
    # Held, then no queue on the next poll: the additive climb (W_max 32), not another doubling.
    r = Adaptive()
    r.next_target(16, shared(16, running=21, waiting=0, time=0.0))
    r.next_target(32, shared(32, running=147, waiting=28, time=12.0))
    assert r.next_target(32, shared(32, running=150, waiting=0, time=24.0)) == 33
    # Settled (not ramping), a queue is cut even while running rises: its peers cut on the same queue.
    settled = Adaptive()
    settled.next_target(40, shared(40, running=100, waiting=10, time=0.0))  # a cut ends the ramp: W_max 40 x 100 / 110
    assert not settled.ramping
    settled.next_target(37, shared(37, running=100, waiting=0, time=12.0))
    assert settled.next_target(38, shared(38, running=150, waiting=10, time=24.0)) == pytest.approx(
        0.9 * 38 * 150 / 160
    )
    # Without the admission hold: the first queue is cut at once.
    q = Adaptive(without=("admission-hold",))
    q.next_target(16, shared(16, running=21, waiting=0, time=0.0))
    assert q.next_target(32, shared(32, running=147, waiting=28, time=12.0)) == pytest.approx(0.9 * 32 * 147 / 175)


def test_others_leaving_is_not_a_full_engine() -> None:
    # Our doubling 2 -> 4 while a tenant left: running fell from 41 to 12 (by more than the 2 we added). The
    # engine-full test (running rose by less than half our growth) says nothing then: the ramp goes on.
    p = Adaptive()
    assert p.next_target(2, shared(2, running=41, waiting=0, time=0.0)) == 4
    assert p.next_target(4, shared(4, running=12, waiting=0, time=36.0)) == 8
    assert p.ramping
    # A running that stayed flat is a full engine, as before: back to 2 + what it absorbed (0), +1.
    q = Adaptive()
    q.next_target(2, shared(2, running=41, waiting=0, time=0.0))
    assert q.next_target(4, shared(4, running=41, waiting=0, time=36.0)) == 3
    assert q.w_max == 2


def test_the_rate_test_judges_a_window_only_over_a_round_trip_of_it() -> None:
    # 8, 16, then 32 in flight, one round trip a poll (8 and 16 completions: one doubling each). Then 15
    # completions: a rate that fell, but 15 are less than one round trip of the 16 held before this poll, so
    # they say nothing about it: the ramp goes on (one doubling: 15 < 32).
    p = Adaptive()
    assert p.next_target(8, alone(8, calls=8, time=0.0)) == 16
    assert p.next_target(16, alone(16, calls=16, time=12.0)) == 32
    assert p.next_target(32, alone(32, calls=15, time=24.0)) == 64
    assert p.ramping
    # 17 completions are a round trip of those 16, and +6 % over the 16 before: the pipe is full, W_max = 32.
    q = Adaptive()
    assert q.next_target(8, alone(8, calls=8, time=0.0)) == 16
    assert q.next_target(16, alone(16, calls=16, time=12.0)) == 32
    assert q.next_target(32, alone(32, calls=17, time=24.0)) == 33
    assert q.w_max == 32
