"""Exact-value tests of which queues the adaptive policy cuts on. Without a stated sequence limit every
capacity-waiting request is a saturation, whatever the interval's waits, but a prefill wait: a queue of at most 1 %
of ``running`` while the engine runs fewer sequences than the most it ran with a queue and its KV cache has room.
With one (``Observation.limits``), a queue
while ``running`` is below the limit waits for prefill tokens or KV blocks, not for a slot: it is cut only when the
interval's requests waited a cut's worth (their mean queue time over ``1 - decrease_factor`` of our mean round
trip), or at the limit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from model_concurrency import Observation
from model_concurrency.observation import EngineLimits
from model_concurrency.policies import Adaptive

LATENCY = 2.0  # our mean round trip: a wait worth a cut is over (1 - 0.9) x 2 s = 0.2 s


def poll(
    target: float,
    *,
    running: float,
    waiting: float,
    time: float,
    queue_s: float | None,
    started: float = 50.0,
    limit: int | None = None,
) -> Observation:
    """Our whole target in flight; ``queue_s`` is the mean queue time of the interval's ``started`` requests;
    ``limit`` the engines' stated sequence slots (``max_num_seqs``), None when nobody stated them."""
    limits = None if limit is None else EngineLimits(max_num_seqs=limit)
    engine = Observation(running=running, waiting=waiting, waiting_capacity=waiting, time=time, limits=limits)
    ours = {"inflight": int(target), "client_calls": int(started), "client_latency_mean_s": LATENCY}
    return replace(engine, started=started, queue_time_mean_s=queue_s, **ours)


def after_first_cut(policy: Adaptive | None = None, limit: int | None = None) -> Adaptive:
    """A policy past its first ramp: cut at 100 running, a wait of 1 s (target 100 -> 81.8, W_max 90.9)."""
    p = Adaptive() if policy is None else policy
    first = poll(100, running=100, waiting=10, time=0.0, queue_s=1.0, limit=limit)
    assert p.next_target(100, first) == pytest.approx(0.9 * 100 * 100 / 110)
    return p


@pytest.mark.parametrize(
    ("queue_s", "started"),
    [
        (None, 50.0),  # no queue-time histogram on the page
        (0.02, 0.0),  # nothing started in the interval: no wait to read
        (0.02, 50.0),  # a wait far under a cut's worth
    ],
)
def test_without_a_stated_limit_every_queue_is_cut_whatever_its_waits(queue_s: float | None, started: float) -> None:
    p = after_first_cut()
    obs = poll(82, running=105, waiting=1, time=12.0, queue_s=queue_s, started=started)
    assert p.next_target(82, obs) == pytest.approx(0.9 * 82 * 105 / 106)


@pytest.mark.parametrize(
    ("running", "waiting", "kv", "cut"),
    [
        (300.0, 3.0, 0.5, False),  # under the sampled 400, a queue of 1 % of running, room in the cache: a prefill wait
        (300.0, 3.0, None, False),  # no KV figure: the same
        (300.0, 4.0, 0.5, True),  # a queue over 1 % of running
        (400.0, 1.0, 0.5, True),  # at the most the engine ran with a queue: the wall's queue
        (300.0, 3.0, 0.95, True),  # the cache is full: a wall of blocks
    ],
)
def test_without_a_stated_limit_a_prefill_wait_below_the_sampled_capacity_is_not_cut(
    running: float, waiting: float, kv: float | None, cut: bool
) -> None:
    def judged(policy: Adaptive, queue: float = waiting) -> float:
        first = poll(400, running=400, waiting=10, time=0.0, queue_s=1.0)  # the capacity sample: 400
        assert policy.next_target(400, first) == pytest.approx(0.9 * 400 * 400 / 410)
        obs = replace(poll(200, running=running, waiting=queue, time=12.0, queue_s=0.02), kv_cache_usage=kv)
        return float(policy.next_target(200, obs))

    if cut:
        assert judged(Adaptive()) == pytest.approx(0.9 * 200 * running / (running + waiting))
    else:  # read as no queue at all: the slow-start band's step back to 0.9 × W (W = 400 × 400 / 410)
        assert judged(Adaptive()) == judged(Adaptive(), queue=0.0) == pytest.approx(0.9 * 400 * 400 / 410)
    # Switched off, every one of them is cut.
    off = Adaptive(without=("prefill-waits",))
    assert judged(off) == pytest.approx(0.9 * 200 * running / (running + waiting))


def test_below_the_stated_limit_a_queue_the_interval_did_not_wait_for_is_not_cut() -> None:
    p = after_first_cut(limit=128)
    t = 82.0
    # 128 slots stated, the engine runs 105-114 of them, one request waits, and those that started waited 20 ms
    # on average: the climb goes on, +1 a poll (under W_max 90.9, and under our share of the free slots).
    for i, running in enumerate([105.0, 110.0, 114.0]):
        nxt = p.next_target(t, poll(t, running=running, waiting=1, time=12.0 * (i + 1), queue_s=0.02, limit=128))
        assert nxt == t + 1
        t = nxt
    assert p.w_max == pytest.approx(100 * 100 / 110)


@pytest.mark.parametrize(("queue_s", "cut"), [(0.19, False), (0.21, True), (0.5, True)])
def test_below_the_stated_limit_a_queue_is_cut_when_the_interval_waited_a_cuts_worth(queue_s: float, cut: bool) -> None:
    p = after_first_cut(limit=128)
    obs = poll(82, running=105, waiting=1, time=12.0, queue_s=queue_s, limit=128)
    assert p.next_target(82, obs) == (pytest.approx(0.9 * 82 * 105 / 106) if cut else 83)


def test_the_same_queue_with_running_at_the_stated_limit_is_cut() -> None:
    # 105 slots stated and 105 running: every slot taken, the one waiting waits for a slot. Cut to 0.9 x the served
    # share, and the engine's most (105) is a capacity sample.
    p = after_first_cut(limit=105)
    obs = poll(82, running=105, waiting=1, time=12.0, queue_s=0.02, limit=105)
    assert p.next_target(82, obs) == pytest.approx(0.9 * 82 * 105 / 106)
    assert p.w_max == pytest.approx(82 * 105 / 106) and p.capacity(12.0) == 105


def test_without_the_stated_limits_rule_the_same_queue_is_cut() -> None:
    p = after_first_cut(Adaptive(without=("stated-limits",)), limit=128)
    obs = poll(82, running=105, waiting=1, time=12.0, queue_s=0.02, limit=128)
    assert p.next_target(82, obs) == pytest.approx(0.9 * 82 * 105 / 106)


@pytest.mark.parametrize("missing", ["queue_time_mean_s", "client_latency_mean_s"])
def test_below_the_stated_limit_a_queue_without_the_figures_to_judge_its_wait_is_not_cut(missing: str) -> None:
    # No queue-time histogram on the page, or none of our calls came back: no wait worth a cut is known.
    p = after_first_cut(limit=128)
    obs = replace(poll(82, running=105, waiting=1, time=12.0, queue_s=0.02, limit=128), **{missing: None})
    assert p.next_target(82, obs) == 83


def test_on_a_one_step_engine_any_visible_queue_below_the_stated_limit_is_cut() -> None:
    # A pooling engine (completions, no generated tokens) of 64 stated slots runs 40 with 4 waiting, a 20 ms wait:
    # more than its pipelined batch, cut to 0.9 x the pipelined share 44 x (40 + 40) / (44 + 40).
    pooling = replace(
        poll(44, running=40, waiting=4, time=0.0, queue_s=0.02, limit=64), generation_tokens=0.0, completed=50.0
    )
    assert Adaptive().next_target(44, pooling) == pytest.approx(0.9 * 44 * 80 / 84)
    # A decoder in the same place is not cut: it ramps, to our share of the free slots, 44 + 1 x (64 - 40 - 4).
    decoder = replace(pooling, generation_tokens=500.0)
    assert Adaptive().next_target(44, decoder) == 64
