"""vLLM's ``--scheduling-policy priority`` in the engine model, and the TTFT / inter-token latency it keeps per
request class (the neighbour's figures in the lab)."""

from __future__ import annotations

import pytest
import simpy

from engine_helpers import check_invariants, tiny_preset
from model_concurrency.engine import Engine, Request, Server


def make_engine(**changes: object) -> tuple[simpy.Environment, Engine]:
    env = simpy.Environment()
    return env, Engine(env, tiny_preset(scheduling_policy="priority", **changes))


def test_waiting_requests_are_admitted_by_priority_then_arrival() -> None:
    # One sequence at a time: the admission order is the queue order, lower priority value first, FIFO in a tie.
    env, engine = make_engine(max_num_seqs=1)
    a, b, c, d = Request(8, 2, priority=5), Request(8, 2, priority=10), Request(8, 2, priority=0), Request(8, 2)
    d.priority = 5
    for r in (a, b, c, d):
        engine.submit(r)
    env.run()
    order = sorted((a, b, c, d), key=lambda r: r.first_scheduled_time)  # type: ignore[arg-type,return-value]
    assert order == [c, a, d, b]


def test_fcfs_ignores_the_priority_field() -> None:
    env = simpy.Environment()
    engine = Engine(env, tiny_preset(max_num_seqs=1))
    a, b = Request(8, 2, priority=9), Request(8, 2, priority=0)
    engine.submit(a)
    engine.submit(b)
    env.run()
    assert a.first_scheduled_time < b.first_scheduled_time  # type: ignore[operator]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_kv_exhaustion_preempts_the_lowest_priority_running_request(policy: str) -> None:
    # 6 usable blocks. A (16 tokens, priority 10) runs first; B and C (20 tokens each) join at the next step and
    # fill the cache. When A's 33rd token needs a 3rd block, none is free: FCFS evicts the last admitted (C),
    # priority evicts the largest (priority, arrival), A itself, which goes back to the queue.
    env = simpy.Environment()
    engine = Engine(env, tiny_preset(num_gpu_blocks=7, max_num_seqs=3, scheduling_policy=policy))
    a, b, c = Request(16, 40, priority=10), Request(20, 40), Request(20, 40)
    engine.submit(a)
    env.run(until=0.005)
    engine.submit(b)
    engine.submit(c)
    env.run(until=0.015)
    assert list(engine.running) == [a, b, c] and engine.free_blocks == 0
    while not (a.num_preemptions or c.num_preemptions):
        env.step()
        check_invariants(engine)
    victim = a if policy == "priority" else c
    assert victim.num_preemptions == 1 and victim in engine.waiting
    assert b.num_preemptions == 0
    env.run()
    assert all(r.finished_reason == "stop" and r.generated == r.output_tokens for r in (a, b, c))
    assert victim.finish_time == max(r.finish_time for r in (a, b, c))  # type: ignore[type-var]


def test_a_victim_in_the_middle_lets_the_walk_go_on() -> None:
    # The first victim (priority 10) sits between two requests in the running list: the walk goes on past it and
    # the books stay right at every step.
    env, engine = make_engine(num_gpu_blocks=6, max_num_seqs=3)
    a, b, c = Request(16, 40), Request(20, 40, priority=10), Request(16, 40)
    for r in (a, b, c):
        engine.submit(r)
    while not engine.stats.num_preemptions:
        env.step()
    assert (a.num_preemptions, b.num_preemptions, c.num_preemptions) == (0, 1, 0)
    while env.peek() < float("inf"):
        env.step()
        check_invariants(engine)
    assert all(r.finished_reason == "stop" and r.generated == r.output_tokens for r in (a, b, c))


def test_unknown_scheduling_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="scheduling_policy"):
        tiny_preset(scheduling_policy="lifo")


def test_ttft_and_itl_are_kept_per_request_class() -> None:
    env = simpy.Environment()
    server = Server(env, tiny_preset(max_num_seqs=8))
    chat = [Request(8, 5, request_class="chat") for _ in range(3)]
    batch = [Request(40, 3) for _ in range(3)]
    for r in (*batch, *chat):
        server.submit(r)
    env.run()
    stats = server.engines[0].stats
    assert set(stats.classes) == {"chat"}
    kept = stats.classes["chat"]
    assert kept.ttft == [r.first_token_time - r.arrival_time for r in chat]  # type: ignore[operator]
    assert kept.itl == [(r.finish_time - r.first_token_time) / 4 for r in chat]  # type: ignore[operator]
    assert kept.arrival == [0.0, 0.0, 0.0]
