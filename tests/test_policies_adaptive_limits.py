"""Exact-value tests of the adaptive policy's stated-limits rule on growth: with the engines' sequence slots stated
(``Observation.limits.max_num_seqs``, summed over engines), our in-flight grows to at most ours plus our share of
the free slots, ``inflight + share x (limit - running - waiting)``, two batches of the limit on a one-step engine;
the first ramp's KV jump goes no further. Beside peers after the first ramp the additive step alone goes past it,
so that shares even out. (Which queues it cuts on: test_policies_adaptive_waits.py.)"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency import Observation
from model_concurrency.observation import EngineLimits
from model_concurrency.policies import Adaptive
from model_concurrency.policies._common import own_share


def poll(
    inflight: int,
    *,
    running: float | None = None,
    limit: int | None,
    waiting: float = 0.0,
    kv: float | None = None,
    blocks: int | None = None,
    calls: int = 0,
    time: float = 0.0,
) -> Observation:
    """Our window full; ``waiting`` requests wait for something other than capacity (``waiting_capacity`` 0)."""
    return Observation(
        running=float(inflight) if running is None else running,
        waiting=waiting,
        inflight=inflight,
        kv_cache_usage=kv,
        kv_num_blocks=blocks,
        client_calls=calls,
        time=time,
        limits=None if limit is None else EngineLimits(max_num_seqs=limit),
    )


def test_growth_is_capped_at_our_share_of_the_free_stated_slots() -> None:
    # Beside peers on the first ramp (10 of 40 running, no KV figures): a doubling to 20, capped at our quarter of
    # the 24 free slots of 64, 10 + 6 = 16.
    assert Adaptive().next_target(10, poll(10, running=40, limit=64)) == 16
    # Requests waiting for something else hold slots too: 10 + 10 / 44 x (64 - 40 - 4).
    assert Adaptive().next_target(10, poll(10, running=40, waiting=4, limit=64)) == pytest.approx(10 + 200 / 44)
    # Nobody stated the limit, or the rule is off: the doubling.
    assert Adaptive().next_target(10, poll(10, running=40, limit=None)) == 20
    assert Adaptive(without=("stated-limits",)).next_target(10, poll(10, running=40, limit=64)) == 20
    # No free slot: the target holds (never a cut for it).
    assert Adaptive().next_target(10, poll(10, running=64, limit=64)) == 10


def test_beside_peers_after_the_first_ramp_the_additive_step_goes_past_our_share() -> None:
    # Our first cut beside peers (10 of 74 in the engine, all 64 stated slots running, 10 waiting for capacity) ends
    # the first ramp: 0.9 x 10 x 64 / 74 = 7.78, remembered as W 8.65.
    p = Adaptive()
    full = Observation(running=64, waiting=10, waiting_capacity=10, inflight=10, limits=EngineLimits(max_num_seqs=64))
    assert p.next_target(10, full) == pytest.approx(0.9 * 640 / 74)
    assert not p.ramping and not p.alone
    # Then 8 of 63 running: our share of the slots is 8 + 8 / 63 x 1 = 8.13, and the step still goes to 9; a client
    # that took more than its share on the first ramp is held by its own share bound meanwhile, so shares even out.
    assert p.next_target(8, poll(8, running=63, limit=64, time=12.0)) == 9
    # One step only, never the slow-start band's jump (to 0.9 x W = 7.78) past the bound.
    assert p.next_target(4, poll(4, running=63, limit=64, time=24.0)) == 5
    # With the stated-limits rule off the band jumps; nobody's share bound holds anything.
    q = Adaptive(without=("stated-limits",))
    q.next_target(10, full)
    assert q.next_target(4, poll(4, running=63, limit=64, time=12.0)) == pytest.approx(0.9 * 640 / 74)


def test_alone_at_the_stated_limit_no_probe_goes_past_it() -> None:
    p = Adaptive()
    # A queue with all 64 stated slots running: cut to 0.9 x 64, W_max 64, a capacity sample of 64.
    queue = Observation(running=64, waiting=8, waiting_capacity=8, inflight=72, limits=EngineLimits(max_num_seqs=64))
    assert p.next_target(72, queue) == pytest.approx(57.6)
    assert p.w_max == 64 and p.capacity(0.0) == 64
    # The additive step up to the limit; back at the sampled 64 running, the inferred saturation cuts again.
    assert p.next_target(63, poll(63, limit=64, time=12.0)) == 64
    assert p.next_target(64, poll(64, limit=64, time=24.0)) == pytest.approx(57.6)
    # Without it, a probe (+1) finds no free slot: hold at 64, poll after poll.
    q = Adaptive(without=("inferred-saturation",))
    q.next_target(72, queue)
    assert q.next_target(63, poll(63, limit=64, time=12.0)) == 64
    assert q.next_target(64, poll(64, limit=64, time=24.0)) == 64
    assert q.next_target(64, poll(64, limit=64, time=36.0)) == 64
    # The same polls without a stated limit probe past it.
    r = Adaptive(without=("inferred-saturation",))
    r.next_target(72, replace(queue, limits=None))
    assert r.next_target(64, poll(64, limit=None, time=12.0)) == 65


# 10,000 KV blocks, 4 sequences at 2 % usage: 50 blocks a sequence, 200 sequences in the cache, a KV bound of 200.
KV = {"kv": 0.02, "blocks": 10_000}


def test_the_first_ramps_jump_never_passes_our_share_of_the_stated_limit() -> None:
    uncapped = {"jump_max_factor": math.inf}
    # Alone: halfway from 4 to min(200, 4 + (64 - 4)) = 64 is 34 (102 without the limit); the whole way, 64 (200).
    assert Adaptive(**uncapped).next_target(4, poll(4, limit=64, **KV)) == pytest.approx(34)
    assert Adaptive(**uncapped).next_target(4, poll(4, limit=None, **KV)) == pytest.approx(102)
    whole = Adaptive(**uncapped, jump_fraction=1.0)
    assert whole.next_target(4, poll(4, limit=64, **KV)) == pytest.approx(64)
    assert whole.jump_to == pytest.approx(64)
    assert Adaptive(**uncapped, jump_fraction=1.0).next_target(4, poll(4, limit=None, **KV)) == pytest.approx(200)
    # Beside peers (4 of 16 running at 8 %: a KV bound of 50), a doubling to 8, capped at 4 + (20 - 16) / 4 = 5.
    shared = poll(4, running=16, limit=20, kv=0.08, blocks=10_000)
    assert Adaptive().next_target(4, shared) == 5


def pooling(inflight: int, *, limit: int, generated: float) -> Observation:
    """Alone on the engine with 200 of our calls back in the interval (8x a poll on the first ramp); ``generated``
    0 is a one-step (pooling) engine, more a decoder."""
    return replace(poll(inflight, limit=limit, calls=200), generation_tokens=generated, completed=200.0)


def test_on_a_one_step_engine_the_bound_is_two_batches_of_the_limit() -> None:
    # 40 running of 64 stated slots: a one-step engine grows to 40 + (2 x 64 - 40) = 128 (8x would be 320).
    assert Adaptive().next_target(40, pooling(40, limit=64, generated=0.0)) == 128
    # A decoder, or a one-step engine with the one-step rules off: one batch, 40 + (64 - 40) = 64.
    assert Adaptive().next_target(40, pooling(40, limit=64, generated=500.0)) == 64
    assert Adaptive(without=("one-step",)).next_target(40, pooling(40, limit=64, generated=0.0)) == 64


_poll = st.fixed_dictionaries(
    {
        "use": st.floats(0.5, 1.2),  # our in-flight over the target: application-limited to growing
        "running": st.floats(0, 1),  # the engine's running, over the limit
        "waiting": st.floats(0, 1),  # waiting, over the limit
        "capacity": st.booleans(),  # whether the waiting wait for capacity
        "kv": st.one_of(st.none(), st.floats(0, 1)),
        "calls": st.integers(0, 1000),
        "queue_s": st.one_of(st.none(), st.floats(0, 2)),
    }
)


@given(limit=st.integers(1, 4096), start=st.floats(1, 1000), polls=st.lists(_poll, min_size=1, max_size=12))
def test_a_decoder_never_grows_past_its_share_of_the_free_stated_slots(
    limit: int, start: float, polls: list[dict[str, float]]
) -> None:
    """Whatever the engine reports (no KV block count: no rescale), an answer above the target stays within
    ``inflight + share x (limit - running - waiting)``, or one additive step above the target beside peers after
    the first ramp."""
    p = Adaptive()
    target = start
    for i, f in enumerate(polls):
        inflight = max(0, round(target * f["use"]))
        running, waiting = round(f["running"] * limit), round(f["waiting"] * limit)
        obs = Observation(
            running=running,
            waiting=waiting,
            waiting_capacity=waiting if f["capacity"] else 0.0,
            inflight=inflight,
            kv_cache_usage=f["kv"],
            client_calls=int(f["calls"]),
            client_latency_mean_s=1.0,
            queue_time_mean_s=f["queue_s"],
            time=12.0 * i,
            limits=EngineLimits(max_num_seqs=limit),
        )
        bound = inflight + own_share(obs) * max(0.0, limit - running - waiting)
        answer = p.next_target(target, obs)
        assert math.isfinite(answer) and answer >= 0
        past = target + p.increase_step if not (p.ramping or p.alone) else target
        assert answer <= max(past, bound) * (1 + 1e-12)
        target = max(1.0, answer)
