"""Reading an engine is cheap at fleet scale and still exact: cached signals, and small folds without numpy.

A fleet's clients read every engine at every poll, mostly between two of its steps; the engine keeps its last
snapshot until something it reports changes, and folds a batch of a few finished requests in plain Python. Both
must give the same figures, bit for bit, as reading the page afresh.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from engine_helpers import tiny_preset
from model_concurrency.engine import Fleet, Request, Server, StepTimeModel
from model_concurrency.engine import stats as stats_module
from model_concurrency.engine.bookkeeping import Signals
from model_concurrency.engine.engine import combine_signals, snapshot_of
from model_concurrency.engine.stats import NUMPY_FROM, REQUEST_LATENCY_BUCKETS, EngineStats, Histogram
from model_concurrency.engine.topology import combine_snapshots
from model_concurrency.signals.vllm import parse_vllm_metrics

MODEL = "org/tiny-model-1.0"

times = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)


@given(st.lists(st.lists(times, min_size=1, max_size=NUMPY_FROM - 1), min_size=1, max_size=6))
def test_small_batches_fold_to_the_same_bits_as_numpy(batches: list[list[float]]) -> None:
    python, numpy = Histogram(REQUEST_LATENCY_BUCKETS), Histogram(REQUEST_LATENCY_BUCKETS)
    for batch in batches:
        python.observe_many(batch)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(stats_module, "NUMPY_FROM", 0)  # force the numpy path
            numpy.observe_many(batch)
    assert python.counts == numpy.counts
    assert python.count == numpy.count
    assert python.sum.hex() == numpy.sum.hex()


def test_numpy_sums_fewer_than_eight_values_from_left_to_right() -> None:
    # The premise of the small-batch path: if a numpy release changes it, this fails before any result moves.
    rng = np.random.default_rng(3)
    for n in range(1, NUMPY_FROM):
        for _ in range(200):
            values = rng.lognormal(-3.0, 2.0, n)
            acc = 0.0
            for v in values.tolist():
                acc += v
            assert float(values.sum()).hex() == acc.hex()


def fresh(server: Server) -> Any:
    """The page as a scrape would read it now (the collector reads the engines' counters directly)."""
    return parse_vllm_metrics(server.render_metrics(), MODEL)


def test_a_cached_snapshot_is_always_what_the_page_says() -> None:
    # Two servers of two engines under a closed loop; read between steps, after aborts, capacity changes and a
    # lost and restored engine: every read equals a fresh scrape, and the fleet's sum is the sum of the pages.
    env = simpy.Environment()
    preset = tiny_preset(max_num_seqs=3, step=StepTimeModel(a_ms=7.0, b_ms_per_token=0.01))
    servers = [Server(env, preset, num_engines=2, name=f"r{i}") for i in range(2)]
    fleet = Fleet(env, servers, balancer="least_loaded")
    rng = random.Random(7)
    live: list[Request] = []

    def client() -> Generator[Any, Any, None]:
        while True:
            request = Request(rng.randint(4, 40), rng.randint(1, 6))
            live.append(request)
            yield fleet.submit(request)

    def reader() -> Generator[Any, Any, None]:
        reads = 0
        while True:
            yield env.timeout(rng.choice([0.0, 0.001, 0.003, 0.0105]))
            for server in servers:
                assert server.snapshot() == fresh(server)
                assert server.signals() is server.signals()  # kept between changes
            assert fleet.snapshot() == combine_snapshots(fresh(s) for s in servers)
            reads += 1

    def disturb() -> Generator[Any, Any, None]:
        yield env.timeout(0.2)
        for request in live[-5:]:
            fleet.replicas[0].abort(request) or fleet.replicas[1].abort(request)
        yield env.timeout(0.2)
        servers[1].set_capacity(num_gpu_blocks=500)
        yield env.timeout(0.2)
        servers[0].engines[1].set_down()
        yield env.timeout(0.2)
        servers[0].engines[1].set_up()
        yield env.timeout(0.2)
        servers[1].add_engine()

    for _ in range(12):
        env.process(client())
    env.process(reader())
    env.process(disturb())
    env.run(until=1.5)
    assert sum(s.completed for s in servers) > 100


def finished_request(rng: random.Random, reason: str) -> Request:
    """A request as the engine leaves it at its finish (timestamps in order, some never scheduled or served)."""
    request = Request(rng.randint(1, 4000), rng.randint(1, 300))
    t = rng.uniform(0.0, 1e3)
    request.arrival_time = request.queued_time = t
    if rng.random() < 0.9:
        t += rng.lognormvariate(-3.0, 2.0)
        request.first_scheduled_time = t
        if rng.random() < 0.9:
            t += rng.lognormvariate(-3.0, 2.0)
            request.first_token_time = t
    request.finish_time = t + rng.lognormvariate(-1.0, 2.0)
    request.finished_reason = reason
    return request


@given(st.lists(st.integers(min_value=0, max_value=NUMPY_FROM - 1), min_size=1, max_size=8), st.integers(0, 2**32))
def test_a_small_fold_in_one_pass_is_the_list_fold_bit_for_bit(sizes: list[int], seed: int) -> None:
    # Two engines' books fed the same finished requests in the same batches; one folds them in one pass
    # (EngineStats._fold_few), the other through the lists and Histogram.observe_many: same counts, same float
    # bits, reasons in the same order.
    rng = random.Random(seed)
    one_pass, lists = EngineStats(), EngineStats()
    for size in sizes:
        batch = [finished_request(rng, rng.choice(["stop", "length", "abort", "stop"])) for _ in range(size)]
        first = [r for r in batch if r.first_token_time is not None]
        one_pass.pending_finished, one_pass.pending_first = list(batch), list(first)
        lists.pending_finished, lists.pending_first = list(batch), list(first)
        one_pass.fold()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(stats_module, "NUMPY_FROM", 0)  # never the one-pass path; numpy sums left to right < 8
            lists.fold()
    for name in ("ttft", "e2e", "queue_time", "prefill_time", "decode_time"):
        a, b = getattr(one_pass, name), getattr(lists, name)
        assert (a.counts, a.count, a.sum.hex()) == (b.counts, b.count, b.sum.hex()), name
    assert list(one_pass.finished.items()) == list(lists.finished.items())
    assert one_pass.prompt_tokens == lists.prompt_tokens


signal_values = st.tuples(
    st.integers(0, 512).map(float),
    st.integers(0, 512).map(float),
    st.floats(0.0, 1.0),
    st.integers(2, 10**5),
    st.integers(32, 10**6),
    st.integers(0, 10**6).map(float),
    st.integers(0, 10**7).map(float),
    st.integers(0, 10**8).map(float),
    times,
    st.integers(0, 10**7).map(float),
)


@given(st.lists(st.lists(signal_values, min_size=1, max_size=5), min_size=1, max_size=6))
def test_summed_signals_are_the_summed_snapshots_bit_for_bit(pages: list[list[Signals]]) -> None:
    # A fleet sums tuples of its servers' sums of engines; it must be combine_snapshots of combine_snapshots.
    by_tuples = snapshot_of(combine_signals([combine_signals(page) for page in pages]))
    by_snapshots = combine_snapshots(combine_snapshots(snapshot_of(s) for s in page) for page in pages)
    for field in dataclasses.fields(by_tuples):
        a, b = getattr(by_tuples, field.name), getattr(by_snapshots, field.name)
        assert type(a) is type(b) and (a.hex() == b.hex() if isinstance(a, float) else a == b), field.name
