"""Exact-value tests of which queues the adaptive policy cuts on with ``felt_queue`` (the ``adaptive-felt`` preset): a
queue is a wall when the interval's requests waited for it, when it is over a tenth of ``running``, or when
``running`` stands where the engine stood at its most (ever, or since the previous queue); a request or two
waiting a step for prefill tokens while the engine runs more with every poll is not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from model_concurrency import Observation
from model_concurrency.policies import Adaptive, load_policy

LATENCY = 2.0  # our mean round trip: a wait worth a cut is over (1 - 0.9) x 2 s = 0.2 s


def poll(
    target: float, *, running: float, waiting: float, time: float, queue_s: float | None, started: float = 50.0
) -> Observation:
    """Our whole target in flight; ``queue_s`` is the mean queue time of the interval's ``started`` requests."""
    engine = Observation(running=running, waiting=waiting, waiting_capacity=waiting, time=time)
    ours = {"inflight": int(target), "client_calls": int(started), "client_latency_mean_s": LATENCY}
    return replace(engine, started=started, queue_time_mean_s=queue_s, **ours)


def after_first_cut(felt_queue: bool = True) -> Adaptive:
    """A policy past its first ramp: cut at 100 running (target 100 -> 82, W_max 91, the engine's most 100)."""
    p = Adaptive(felt_queue=felt_queue)
    assert p.next_target(100, poll(100, running=100, waiting=10, time=0.0, queue_s=1.0)) == pytest.approx(
        0.9 * 100 * 100 / 110
    )
    return p


def test_a_step_long_wait_while_the_engine_runs_more_is_no_wall() -> None:
    p = after_first_cut()
    t = 82.0
    # The engine runs more than it ever did (105 > 100), one request waits, and those that started waited 20 ms
    # on average: the climb goes on, +1 a poll.
    for i, running in enumerate([105.0, 110.0, 114.0]):
        nxt = p.next_target(t, poll(t, running=running, waiting=1, time=12.0 * (i + 1), queue_s=0.02))
        assert nxt == t + 1
        t = nxt


def test_a_wait_the_interval_felt_is_cut() -> None:
    p = after_first_cut()
    # Same poll, but the interval's requests waited 0.5 s on average (over 0.2 s): the served share, x 0.9.
    obs = poll(82, running=105, waiting=1, time=12.0, queue_s=0.5)
    assert p.next_target(82, obs) == pytest.approx(0.9 * 82 * 105 / 106)


def test_a_queue_over_a_tenth_of_running_is_cut_before_the_interval_feels_it() -> None:
    p = after_first_cut()
    # 12 waiting of 105 running: a wall whose waiters have not started yet (their wait is not in the mean).
    obs = poll(82, running=105, waiting=12, time=12.0, queue_s=0.02)
    assert p.next_target(82, obs) == pytest.approx(0.9 * 82 * 105 / 117)


def test_a_queue_where_the_engine_already_stood_at_its_most_is_a_wall() -> None:
    p = after_first_cut()
    assert p.next_target(82, poll(82, running=105, waiting=1, time=12.0, queue_s=0.02)) == 83
    # Back at 105, the most it ever ran, with one waiting: pinned at a sequence limit.
    obs = poll(83, running=105, waiting=1, time=24.0, queue_s=0.02)
    assert p.next_target(83, obs) == pytest.approx(0.9 * 83 * 105 / 106)


def test_a_full_engine_reads_up_to_one_steps_completions_under_its_most() -> None:
    # Past the first cut's queue (at 100) the engine ran 105 with nothing waiting: its most, and more than at the
    # last queue. At 103 with one waiting, the page was read between steps after two of the 105 finished: one
    # completion per 50 generated tokens puts 103 / 50 = 2.06 slots in a step, so the engine is pinned at 105.
    p = after_first_cut()
    assert p.next_target(82, poll(82, running=105, waiting=0, time=12.0, queue_s=0.02)) == 83
    obs = poll(83, running=103, waiting=1, time=24.0, queue_s=0.02)
    stepped = replace(obs, completed=20.0, generation_tokens=1000.0)
    assert p.next_target(83, stepped) == pytest.approx(0.9 * 83 * 103 / 104)
    # Without the counters a step's completions are unknown: 2 under the most is room, and the climb goes on.
    q = after_first_cut()
    assert q.next_target(82, poll(82, running=105, waiting=0, time=12.0, queue_s=0.02)) == 83
    assert q.next_target(83, obs) == 84


def test_a_queue_where_the_engine_ran_no_more_since_the_last_queue_is_a_wall() -> None:
    # The first cut's queue stood at 100 running, the most the engine ran. Since then it never ran more: a queue at
    # 95 (within a tenth of 100) is the same wall read between steps (a fleet's engines each free a slot or two).
    p = after_first_cut()
    obs = poll(82, running=95, waiting=1, time=12.0, queue_s=0.02)
    assert p.next_target(82, obs) == pytest.approx(0.9 * 82 * 95 / 96)
    # At 85, under 0.9 of it, the engine has room the queue is not waiting for (a prefill-token wait): climb on.
    q = after_first_cut()
    assert q.next_target(82, poll(82, running=85, waiting=1, time=12.0, queue_s=0.02)) == 83


def test_the_rule_is_the_adaptive_felt_preset_not_the_default() -> None:
    assert load_policy("adaptive-felt").felt_queue is True
    assert load_policy("adaptive").felt_queue is False


@pytest.mark.parametrize(
    ("queue_s", "started", "felt_queue"),
    [
        (None, 50.0, True),  # no queue-time histogram on the page
        (0.02, 0.0, True),  # nothing started in the interval: no wait to read
        (0.02, 50.0, False),  # the default (``adaptive``): any capacity-waiting request is a saturation
    ],
)
def test_without_the_intervals_waits_every_queue_is_cut(
    queue_s: float | None, started: float, felt_queue: bool
) -> None:
    p = after_first_cut(felt_queue)
    obs = poll(82, running=105, waiting=1, time=12.0, queue_s=queue_s, started=started)
    assert p.next_target(82, obs) == pytest.approx(0.9 * 82 * 105 / 106)
