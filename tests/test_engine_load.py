"""The engine under load: throughput and latency against concurrency, and invariants over random workloads."""

from __future__ import annotations

import random

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_helpers import check_invariants, closed_loop, tiny_preset
from model_concurrency.engine import LLAMA_8B_A100, Engine, Request

WARMUP_S = 20.0
RUN_S = 80.0


def run_closed_loop(concurrency: int) -> tuple[float, float, float]:
    """(completed requests/s, mean e2e latency s, mean inter-token latency s) after warm-up, A100 preset."""
    env = simpy.Environment()
    engine = Engine(env, LLAMA_8B_A100)
    finished: list[Request] = []
    closed_loop(env, engine, concurrency, lambda: Request(256, 64), finished)
    env.run(until=WARMUP_S + RUN_S)
    window = [r for r in finished if r.finish_time is not None and r.finish_time >= WARMUP_S]
    latency = sum(r.latency or 0.0 for r in window) / len(window)
    itl = engine.stats.itl
    return len(window) / RUN_S, latency, itl.sum / itl.count


def test_throughput_rises_with_concurrency_and_flattens_at_capacity() -> None:
    # max_num_seqs is 256 on the A100 preset: beyond it, more concurrency only queues.
    levels = (1, 8, 64, 256, 512)
    results = {c: run_closed_loop(c) for c in levels}
    throughput = [results[c][0] for c in levels]
    assert throughput == sorted(throughput)
    assert throughput[1] > 4 * throughput[0]  # batching: 8 streams cost far less than 8 times one
    assert abs(results[512][0] - results[256][0]) <= 0.03 * results[256][0]
    # Latency rises with the batch (longer steps) and, past capacity, with the queue.
    latencies = [results[c][1] for c in levels]
    assert latencies == sorted(latencies)
    assert results[512][1] > 1.5 * results[256][1]
    itls = [results[c][2] for c in (1, 8, 64, 256)]
    assert itls == sorted(itls)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    blocks=st.integers(12, 80),
    max_num_seqs=st.integers(1, 8),
    budget=st.sampled_from([8, 16, 32, 64]),
)
def test_random_workloads_keep_the_books_straight(seed: int, blocks: int, max_num_seqs: int, budget: int) -> None:
    """Blocks are conserved, every request ends with its full output, counters match the requests."""
    rng = random.Random(seed)
    env = simpy.Environment()
    budget = max(budget, max_num_seqs)
    engine = Engine(env, tiny_preset(num_gpu_blocks=blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget))
    limit = (blocks - 1) * 16
    requests: list[Request] = []

    def arrivals():  # type: ignore[no-untyped-def]
        for _ in range(30):
            prompt = rng.randint(1, min(120, limit - 1))
            request = Request(prompt, rng.randint(1, min(60, limit - prompt)))
            requests.append(request)
            engine.submit(request)
            yield env.timeout(rng.choice([0.0, 0.003, 0.01, 0.05]))

    def monitor():  # type: ignore[no-untyped-def]
        while True:
            yield env.timeout(0.0037)
            check_invariants(engine)

    env.process(arrivals())
    env.process(monitor())
    env.run(until=200.0)
    assert all(r.finished_reason == "stop" for r in requests), [r for r in requests if r.finished_reason != "stop"]
    assert all(r.generated == r.output_tokens for r in requests)
    stats = engine.stats
    assert stats.generation_tokens == sum(r.output_tokens for r in requests)
    assert stats.prompt_tokens == sum(r.prompt_tokens for r in requests)
    assert stats.num_preemptions == sum(r.num_preemptions for r in requests)
    assert engine.free_blocks == blocks - 1
    assert stats.e2e.count == stats.queue_time.count == len(requests)
