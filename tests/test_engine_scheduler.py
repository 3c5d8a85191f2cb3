"""The engine's scheduler against hand-computed cases, on simulated time only.

Most cases use ``tiny_preset``: every step lasts exactly 10 ms, blocks of 16 tokens, so timelines can be worked
out on paper (comments give them).
"""

from __future__ import annotations

import pytest
import simpy

from engine_helpers import check_invariants, closed_loop, tiny_preset
from model_concurrency.engine import ABORT, Engine, FrontEndCost, Request, RequestState, Server, StepTimeModel


def make_engine(**changes: object) -> tuple[simpy.Environment, Engine]:
    env = simpy.Environment()
    return env, Engine(env, tiny_preset(**changes))


def test_admission_stops_at_max_num_seqs() -> None:
    # t=0: 4 of 6 admitted (max_num_seqs=4); prefill step to 0.01, decodes at 0.02 and 0.03 -> 3 tokens, finish
    # at 0.03; then the last 2 are admitted and finish at 0.06.
    env, engine = make_engine()
    requests = [Request(8, 3) for _ in range(6)]
    for r in requests:
        engine.submit(r)
    env.run(until=0.005)
    assert (engine.gauge_running, engine.gauge_waiting) == (4, 2)
    snap = engine.snapshot()
    assert (snap.running, snap.waiting, snap.waiting_capacity) == (4.0, 2.0, 2.0)
    assert list(engine.waiting) == requests[4:]
    env.run()
    assert [r.finish_time for r in requests] == pytest.approx([0.03] * 4 + [0.06] * 2)
    assert [r.queue_time for r in requests] == pytest.approx([0.0] * 4 + [0.03] * 2)
    assert all(r.finished_reason == "stop" and r.generated == 3 for r in requests)


def test_step_time_formula() -> None:
    # a=5, b=0.1, c=0.001, d=0.0001 ms. Prefill of 10: 5 + 1 + 0.0001*100 = 6.01 ms. Decodes read 11 then 12
    # context tokens: 5.111 and 5.112 ms. Finish at 16.233 ms.
    env, engine = make_engine(step=StepTimeModel(5.0, 0.1, 0.001, 0.0001))
    r = Request(10, 3)
    engine.submit(r)
    env.run()
    assert r.first_token_time == pytest.approx(0.00601)
    assert r.finish_time == pytest.approx(0.016233)


def test_chunked_prefill_under_the_token_budget() -> None:
    # Budget 16: a 40-token prompt is computed 16 + 16 + 8 over three steps; its first token comes at 0.03.
    env, engine = make_engine(max_num_batched_tokens=16)
    r = Request(40, 2)
    engine.submit(r)
    env.run(until=0.015)
    assert engine.progress(r) == (16, 0)
    env.run()
    assert r.first_token_time == pytest.approx(0.03)
    assert r.finish_time == pytest.approx(0.04)


def test_decodes_are_served_before_a_new_prompt_takes_the_budget() -> None:
    # A decodes from 0.01; B (32 tokens) arrives then: budget 16 leaves 15 for B after A's decode token,
    # so B needs 15 + 15 + 2 -> first token at 0.04.
    env, engine = make_engine(max_num_batched_tokens=16)
    a = Request(8, 10)
    engine.submit(a)
    env.run(until=0.01)
    b = Request(32, 2)
    engine.submit(b)
    env.run(until=0.025)  # computed tokens count at the end of the step that computed them
    assert engine.progress(b) == (15, 0)
    env.run()
    assert b.first_token_time == pytest.approx(0.04)
    assert a.finish_time == pytest.approx(0.10)


def test_kv_exhaustion_preempts_the_last_running_request_to_the_head_of_the_queue() -> None:
    # 5 usable blocks. t=0: A (16 tokens, 1 block), B (20, 2), C (20, 2) admitted; D waits (max_num_seqs=3).
    # t=0.01: A's first decode needs a 2nd block, none is free -> the LAST running request, C, is preempted:
    # it frees 2 blocks, loses its computed tokens and goes to the HEAD of the queue, ahead of D. Nobody is
    # admitted in that step although D would fit. At t=0.02 C needs 2 blocks for its 21-token recompute but
    # only 1 is free: head-of-line blocking keeps D (1 block) waiting too.
    env, engine = make_engine(num_gpu_blocks=6, max_num_seqs=3)
    a, b, c, d = Request(16, 50), Request(20, 50), Request(20, 50), Request(8, 2)
    for r in (a, b, c, d):
        engine.submit(r)
    env.run(until=0.005)
    assert list(engine.running) == [a, b, c] and list(engine.waiting) == [d]
    assert engine.free_blocks == 0
    env.run(until=0.015)
    assert list(engine.running) == [a, b]
    assert list(engine.waiting) == [c, d]
    assert (c.num_preemptions, c.computed, c.prefill_target, c.generated) == (1, 0, 21, 1)
    assert engine.stats.num_preemptions == 1
    assert engine.free_blocks == 1
    assert engine.gauge_waiting == 2
    check_invariants(engine)
    env.run(until=0.025)
    assert list(engine.waiting) == [c, d]
    check_invariants(engine)
    env.run()
    for r in (a, b, c, d):
        assert r.finished_reason == "stop" and r.generated == r.output_tokens
    assert engine.stats.generation_tokens == 50 + 50 + 50 + 2


def test_capacity_waiting_is_positive_exactly_when_a_request_waits_for_a_slot() -> None:
    samples: dict[int, list[tuple[int, int]]] = {}
    for clients in (3, 4, 5, 8):
        env, engine = make_engine()
        closed_loop(env, engine, clients, lambda: Request(8, 5), [])

        def monitor(env: simpy.Environment = env, engine: Engine = engine, clients: int = clients):  # type: ignore[no-untyped-def]
            yield env.timeout(0.0051)
            while True:
                samples.setdefault(clients, []).append((engine.gauge_running, engine.gauge_waiting))
                yield env.timeout(0.01)

        env.process(monitor())
        env.run(until=2.0)
    # No more clients than slots: nobody ever waits. More: requests wait, and only while all 4 slots are taken.
    # A request resubmitted at the instant its predecessor finished arrives after that step's scheduling; if a
    # slot frees at the next step boundary it is admitted there without ever having waited for a slot, so with 5
    # clients many steps read 0. With 8, four wait at most steps.
    for clients in (3, 4):
        assert {w for _, w in samples[clients]} == {0}
    for clients in (5, 8):
        assert any(w > 0 for _, w in samples[clients])
        assert all(running == 4 for running, w in samples[clients] if w > 0)
    assert sum(w == 4 for _, w in samples[8]) > len(samples[8]) * 3 // 4


def test_embedding_requests_finish_after_their_prefill() -> None:
    # Prefill-only: three 100-token prompts in one step at a=3, b=0.02 ms -> all finish at 9 ms, no tokens
    # generated, no decode step.
    env, engine = make_engine(
        step=StepTimeModel(3.0, 0.02), chunked_prefill=False, embedding=True, max_num_batched_tokens=512
    )
    rs = [Request(100, embedding=True) for _ in range(3)]
    for r in rs:
        engine.submit(r)
    env.run()
    assert [r.finish_time for r in rs] == pytest.approx([3 * 0.001 + 300 * 0.00002] * 3)
    assert all(r.first_token_time == r.finish_time and r.generated == 0 for r in rs)
    assert engine.steps == 1
    assert (engine.stats.prompt_tokens, engine.stats.generation_tokens) == (300, 0)


def test_front_end_cost_delays_requests_before_the_engine_sees_them() -> None:
    # One API worker at 2 ms + 0.01 ms/token: 100-token requests reach the engine at 3 ms and 6 ms. The first
    # runs its 10 ms step at once; the second arrives mid-step and is scheduled when that step ends.
    env = simpy.Environment()
    preset = tiny_preset(frontend=FrontEndCost(fixed_ms=2.0, per_token_ms=0.01), max_num_batched_tokens=256)
    server = Server(env, preset)
    first, second = Request(100, 1), Request(100, 1)
    server.submit(first)
    server.submit(second)
    env.run(until=0.004)
    assert first.state != RequestState.FRONTEND and second.state == RequestState.FRONTEND
    assert server.engines[0].num_waiting + server.engines[0].num_running == 1
    env.run()
    assert (first.queued_time, second.queued_time) == pytest.approx((0.003, 0.006))
    assert (first.finish_time, second.finish_time) == pytest.approx((0.013, 0.023))


def test_oversized_requests_are_refused() -> None:
    _env, engine = make_engine(num_gpu_blocks=4)
    with pytest.raises(ValueError, match="KV blocks"):
        engine.submit(Request(40, 10))  # 50 tokens > 3 usable blocks of 16
    _env2, embed = make_engine(chunked_prefill=False)
    with pytest.raises(ValueError, match="chunked prefill"):
        embed.submit(Request(100, embedding=True))


def test_set_capacity_speed_and_slots() -> None:
    env, engine = make_engine()
    rs = [Request(8, 3) for _ in range(8)]
    for r in rs:
        engine.submit(r)
    env.run(until=0.005)
    engine.set_capacity(max_num_seqs=8, speed=2.0)
    env.run(until=0.0101)
    # The step in flight keeps its 10 ms; the next one admits the other 4 and lasts 5 ms.
    assert engine.gauge_running == 8 and engine.gauge_waiting == 0
    env.run()
    assert rs[0].finish_time == pytest.approx(0.02)  # 0.01 + 2 decode steps of 5 ms
    assert rs[7].first_token_time == pytest.approx(0.015)
    with pytest.raises(ValueError):
        engine.set_capacity(max_num_seqs=100)  # above max_num_batched_tokens


def test_shrinking_the_kv_cache_preempts_until_the_running_set_fits() -> None:
    env, engine = make_engine(num_gpu_blocks=101)
    rs = [Request(100, 40) for _ in range(4)]  # 7 blocks each at admission, up to 9
    for r in rs:
        engine.submit(r)
    env.run(until=0.1)
    engine.set_capacity(num_gpu_blocks=20)  # 19 usable: two requests at most
    env.run(until=0.2)
    check_invariants(engine)
    assert engine.stats.num_preemptions >= 2
    env.run()
    assert all(r.finished_reason == "stop" and r.generated == 40 for r in rs)


def test_abort_frees_the_request_wherever_it_is() -> None:
    env, engine = make_engine(max_num_seqs=2)
    decoding, prefilled, waiting = Request(8, 100), Request(8, 100), Request(8, 100)
    for r in (decoding, prefilled, waiting):
        engine.submit(r)
    env.run(until=0.055)
    assert engine.abort(waiting) and engine.abort(decoding)
    assert not engine.abort(decoding)
    check_invariants(engine)
    env.run(until=0.1)
    check_invariants(engine)
    assert (decoding.finished_reason, waiting.finished_reason) == (ABORT, ABORT)
    assert engine.stats.finished[ABORT] == 2
    assert list(engine.running) == [prefilled]


def test_down_engine_aborts_everything_and_comes_back_fresh() -> None:
    env = simpy.Environment()
    server = Server(env, tiny_preset())
    events = [server.submit(Request(8, 100)) for _ in range(6)]
    env.run(until=0.05)
    server.set_down()
    assert all(e.triggered for e in events)
    assert all(e.value.finished_reason == ABORT for e in events)
    assert server.inflight == 0 and server.aborted == 6
    late = server.submit(Request(8, 2))
    assert late.triggered and late.value.finished_reason == ABORT
    with pytest.raises(ConnectionError):
        server.snapshot()
    with pytest.raises(ConnectionError):
        server.render_metrics()
    server.set_up()
    back = Request(8, 2)
    server.submit(back)
    env.run()
    assert back.finish_time == pytest.approx(0.05 + 0.02)
    assert server.snapshot().success_total == 1.0  # a restarted engine counts from zero
