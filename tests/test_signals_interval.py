"""Signals over the interval: requests started and how long they waited (queue-time bucket deltas), preemption and
completion deltas, from a real prometheus_client page over HTTP, the Ray form, a PromQL answer and the simulated
engine; an engine restart makes the interval unknown, never negative."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import simpy

from engine_helpers import tiny_preset
from model_concurrency.engine import Request, Server
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.observation import EngineSnapshot, Interval, Observation, interval_between, observe
from model_concurrency.policies.static import Static
from model_concurrency.signals.interval import IntervalMeter
from model_concurrency.signals.prometheus_api import _snapshot, _vector
from model_concurrency.signals.source import VllmMetricsSource
from model_concurrency.signals.vllm import parse_vllm_metrics
from ray_pages import ray_vllm_page
from servers import QUEUE_BUCKETS, Behaviour, EngineState, metrics_server, vllm_page

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
MODEL = "org/tiny-model-1.0"  # tiny_preset's served name
BOUNDS = (*map(float, QUEUE_BUCKETS), float("inf"))
BEFORE = [EngineState(preemptions=5), EngineState(preemptions=1)]  # one 0.2 s wait each
AFTER = [
    EngineState(preemptions=7, queue_waits=(0.2, 0.4, 1.2, 7.0)),
    EngineState(preemptions=1, queue_waits=(0.2, 3.0)),
]


def cumulative(waits: list[float]) -> tuple[tuple[float, float], ...]:
    return tuple((bound, float(sum(w <= bound for w in waits))) for bound in BOUNDS)


def test_a_page_sums_the_queue_time_buckets_over_engines() -> None:
    snap = parse_vllm_metrics(vllm_page({LLAMA: AFTER}).decode(), LLAMA)
    assert snap.queue_time_buckets == cumulative([0.2, 0.4, 1.2, 7.0, 0.2, 3.0])
    assert snap.queue_time_count_total == 6.0


def test_the_live_source_keeps_the_previous_totals_and_reports_the_interval() -> None:
    pages = iter([vllm_page({LLAMA: BEFORE}), vllm_page({LLAMA: AFTER}), vllm_page({LLAMA: BEFORE})])
    with metrics_server(Behaviour(render=lambda: next(pages))) as srv:
        source = VllmMetricsSource(metrics_url=srv.url + "/metrics", served_model_name=LLAMA)
        first, second, restarted = source.read(), source.read(), source.read()
    assert first.interval is None  # nothing to compare the first reading with
    obs = observe(second, None, inflight=6, time=12.0)
    # Four requests left the queue: waits 0.4, 1.2, 7.0 on engine 0 and 3.0 on engine 1.
    assert obs.started == 4.0
    now, then = cumulative([0.4, 1.2, 7.0, 3.0, 0.2, 0.2]), cumulative([0.2, 0.2])
    assert obs.queue_waits == tuple((b, c - p) for (b, c), (_, p) in zip(now, then, strict=True))
    assert obs.queue_time_mean_s == pytest.approx((0.4 + 1.2 + 7.0 + 3.0) / 4)
    assert (obs.preemptions, obs.completed, obs.interval_known) == (2.0, 0.0, True)
    assert obs.waited_over(1.0) == 0.75  # 1.2, 7.0 and 3.0 of four
    assert obs.waited_over(4.0) == 0.5  # read at the bound 2.5 below it: 7.0 and 3.0
    assert obs.waited_over(5.0) == 0.25  # 7.0
    assert obs.waited_over(0.1) == 1.0  # below the smallest bound: read at 0.3
    # Every counter went back to the first page's: an engine restart, so the interval is unknown.
    late = observe(restarted, None, inflight=0, time=24.0)
    assert not late.interval_known
    assert (late.started, late.queue_waits, late.completed, late.queue_time_mean_s) == (None, None, None, None)
    assert late.preemptions == 0.0 and late.waited_over(1.0) is None


def test_the_ray_form_and_a_promql_answer_give_the_same_interval() -> None:
    page = parse_vllm_metrics(vllm_page({LLAMA: AFTER}).decode(), LLAMA)
    ray = parse_vllm_metrics(ray_vllm_page(LLAMA, {"r1": AFTER[:1], "r2": AFTER[1:]}).decode(), LLAMA)
    assert ray.queue_time_buckets == page.queue_time_buckets
    buckets = page.queue_time_buckets or ()
    summed = [({"__name__": "vllm:num_requests_running"}, 50.0)] + [
        ({"__name__": "vllm:request_queue_time_seconds_bucket", "le": "+Inf" if b == float("inf") else str(b)}, c)
        for b, c in buckets
    ]
    prom = _snapshot(_vector(json.dumps(answer(summed))), [])
    assert prom.queue_time_buckets == buckets


def answer(vector: list[tuple[dict[str, str], float]]) -> object:
    result = [{"metric": labels, "value": [1, str(value)]} for labels, value in vector]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_an_interval_is_never_negative_and_unknown_after_a_restart() -> None:
    before = EngineSnapshot(success_total=10.0, queue_time_count_total=4.0, queue_time_sum_total=2.0)
    assert interval_between(before, EngineSnapshot(success_total=3.0)) == Interval(known=False)
    assert interval_between(None, before) is None
    later = EngineSnapshot(success_total=12.0, queue_time_count_total=9.0, queue_time_sum_total=4.5)
    assert interval_between(before, later) == Interval(completed=2.0, started=5.0, queue_time_sum_s=2.5)
    assert Observation().waited_over(1.0) is None  # built by hand: no histogram


def test_the_simulated_engine_reports_what_its_page_reports() -> None:
    env = simpy.Environment()
    server = Server(env, tiny_preset())
    sim_meter, page_meter = IntervalMeter(), IntervalMeter()

    def both() -> tuple[EngineSnapshot, EngineSnapshot]:
        return sim_meter.advance(server.snapshot()), page_meter.advance(
            parse_vllm_metrics(server.render_metrics(), MODEL)
        )

    both()
    for _ in range(9):
        server.submit(Request(8, 3))
    env.run()
    sim, page = both()
    assert sim == page
    assert sim.interval is not None and sim.interval.started == 9.0 and sim.interval.completed == 9.0
    # Four ran at once (max_num_seqs 4): five waited a step or two, all under the smallest bound.
    assert sim.interval.queue_waits is not None and sim.interval.queue_waits[0][1] == 9.0


def test_each_simulated_client_sees_the_interval_since_its_own_previous_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[int, list[Observation]] = {}
    totals: dict[int, list[float]] = {}
    original = IntervalMeter.advance

    def spy(self: IntervalMeter, snapshot: EngineSnapshot) -> EngineSnapshot:
        totals.setdefault(id(self), []).append(snapshot.queue_time_count_total or 0.0)
        return original(self, snapshot)

    class Recording(Static):
        """Holds the floor and keeps what it was shown."""

        def next_target(self, target: float, obs: Observation) -> float:
            seen.setdefault(id(self), []).append(obs)
            return super().next_target(target, obs)

    monkeypatch.setattr(IntervalMeter, "advance", spy)
    sims = Path(__file__).resolve().parents[1] / "sims"
    simulate(load_scenario(sims / "multi-client.toml").scaled(0.1), policy_factory=Recording)
    assert len(seen) == len(totals) == 4
    for observations, counts in zip(seen.values(), totals.values(), strict=True):
        started = [o.started for o in observations if o.ok]
        assert started[0] is None and all(s is not None for s in started[1:])
        # The intervals tile the run: their sum is the engine's count between this client's first and last poll.
        assert sum(s or 0.0 for s in started) == counts[-1] - counts[0] > 0
        assert all(o.queue_waits is not None and o.queue_waits[-1][1] == o.started for o in observations[1:] if o.ok)
