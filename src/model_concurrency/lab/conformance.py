"""Conformance: one scenario run twice, in the lab and through the production stack, on the same virtual clock.

The lab's figures are evidence about production only if production behaves the same. So the "live" side here is
the real thing, in process: ``map_concurrent`` over an async ``fn`` that posts each item with httpx to the
emulator's ASGI app (the same engine model the lab simulates), and the model's
:class:`~model_concurrency.runtime.ModelRuntime` with its background poll thread reading ``/metrics`` from that
app and parsing it with the production parser. Time is virtual (:mod:`.virtual_loop`): the loop's clock jumps to
the next timer, so a 30-minute scenario takes seconds and no figure depends on this machine's speed or load. The
lab side is :func:`~model_concurrency.lab.run.simulate`. Both use the scenario's seed for item sizes.

The two differ only where production differs from the lab's client: the gate's workers follow a larger target on
their next re-read (every 16 starts or 0.1 s), not at the instant of the poll; each call is an HTTP request; the
poll parses Prometheus text instead of reading the engine's objects. Both draw their poll jitter from the same
seeded stream (:func:`~model_concurrency.lab.run.poll_jitter_rng`), so a wait differs only where the polls did.

Scenarios supported live: one client, one replica, no background traffic, events that add engines. Each item is
posted to the API the engine's model serves, as vLLM refuses the other with a 400: ``/v1/embeddings`` with the
item as ``input`` on an embedding preset, ``/v1/completions`` otherwise; so the scenario's workload must be of the
model's kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from model_concurrency import config, knobs
from model_concurrency.config import get_model, register_model
from model_concurrency.emulator.app import Emulator, create_app
from model_concurrency.emulator.core import EmulatorConfig
from model_concurrency.emulator.links import LocalLink
from model_concurrency.engine.request import Request
from model_concurrency.gate.aio import map_concurrent
from model_concurrency.lab.client import request_stream
from model_concurrency.lab.oracle import MEASURE_S, WARMUP_S, Oracle, Sweep
from model_concurrency.lab.run import poll_jitter_rng, simulate
from model_concurrency.lab.scenario import Scenario
from model_concurrency.lab.summary import summarize
from model_concurrency.lab.trace import ClientTrace, Trace
from model_concurrency.lab.virtual_loop import VirtualTimeLoop, run_virtual
from model_concurrency.lab.world import phases, preset_for
from model_concurrency.observation import EngineSnapshot
from model_concurrency.policies.registry import load_policy
from model_concurrency.runtime import ModelRuntime, forget_runtime, install_runtime
from model_concurrency.signals.interval import IntervalMeter
from model_concurrency.signals.vllm import parse_vllm_metrics

__all__ = ["Comparison", "Side", "compare", "live_sweep", "run_lab", "run_live", "side_figures", "summary_line"]

_BASE = "http://emulator"


@dataclass(frozen=True, slots=True)
class Side:
    """One run's figures: the summary's goodput ratio, time to 90 % and saturated share, and where it settled."""

    goodput_ratio: float
    t90_s: float | None
    saturated_fraction: float
    settled_target: float  # median limit over the second half of the last phase
    polls: int


@dataclass(frozen=True, slots=True)
class Comparison:
    scenario: str
    poll_s: float
    knee: int  # the oracle's knee (concurrency sweep of throughput) in the last phase
    lab: Side
    live: Side

    @property
    def goodput_gap(self) -> float:
        return abs(self.lab.goodput_ratio - self.live.goodput_ratio)

    @property
    def t90_gap_polls(self) -> float:
        """|lab − live| time to 90 %, in polls; infinite when only one side got there."""
        if self.lab.t90_s is None and self.live.t90_s is None:
            return 0.0
        if self.lab.t90_s is None or self.live.t90_s is None:
            return math.inf
        return abs(self.lab.t90_s - self.live.t90_s) / self.poll_s

    @property
    def knee_ratio(self) -> float:
        return self.live.settled_target / self.knee


def side_figures(trace: Trace, oracle: Trace) -> Side:
    summary = summarize(trace, oracle)
    start = trace.capacity_changes[-1] if trace.capacity_changes else 0.0
    steady = trace.time >= start + (trace.duration_s - start) / 2
    target = trace.clients[0].target[steady]
    return Side(
        goodput_ratio=float(summary["goodput_ratio"] or 0.0),
        t90_s=summary["time_to_90pct_s"],
        saturated_fraction=float(summary["saturated_fraction"]),
        settled_target=float(np.median(target)) if len(target) else math.nan,
        polls=len(trace.clients[0].poll_times),
    )


def _check_supported(scenario: Scenario) -> None:
    c = scenario.clients
    problems = []
    if c.count != 1:
        problems.append(f"{c.count} clients")
    if scenario.fleet.replicas != 1:
        problems.append(f"{scenario.fleet.replicas} replicas")
    background = scenario.background.rate_rps or scenario.background.fraction_of_capacity
    if background or any(e.action != "add_engines" for e in scenario.events):
        problems.append("background traffic or events other than add_engines")
    if scenario.workload.embedding != preset_for(scenario).embedding:
        # The emulator answers an API its model does not serve with a 400, as vLLM does: no item would complete.
        if scenario.workload.embedding:
            problems.append("an embedding workload on a generative model")
        else:
            problems.append("a generative workload on an embedding model")
    if c.items is not None:
        problems.append("a fixed item count")
    if problems:
        raise ValueError(f"scenario {scenario.name!r}: the live run supports one client on one replica, not {problems}")


def run_lab(scenario: Scenario, policy: str = "adaptive") -> Trace:
    return simulate(scenario, policy_factory=lambda: load_policy(policy))


class AsgiMetricsSource:
    """``/metrics`` of the in-process emulator app, parsed by the production parser.

    The poll thread's ``read`` hands the request to the loop that owns the app (only that loop may touch it).
    """

    def __init__(self, client: httpx.AsyncClient, loop: asyncio.AbstractEventLoop, served_model_name: str) -> None:
        self.client = client
        self.loop = loop
        self.served_model_name = served_model_name
        self.poll_times: list[float] = []
        self.meter = IntervalMeter()

    @property
    def description(self) -> str:
        return f"{_BASE}/metrics (ASGI, virtual time)"

    async def aread(self) -> EngineSnapshot:
        self.poll_times.append(self.loop.time())
        response = await self.client.get("/metrics")
        response.raise_for_status()
        return self.meter.advance(parse_vllm_metrics(response.text, self.served_model_name))

    def read(self) -> EngineSnapshot:
        return asyncio.run_coroutine_threadsafe(self.aread(), self.loop).result(timeout=60)


@contextlib.contextmanager
def _knobs(scenario: Scenario) -> Iterator[None]:
    """The scenario's poll interval, jitter, ceiling and grace, passed to production's ``setting()`` as overrides."""
    c = scenario.clients
    values = {
        "MODEL_CONCURRENCY_POLL_S": str(c.poll_s),
        "MODEL_CONCURRENCY_POLL_JITTER": str(
            c.poll_jitter if c.poll_jitter is not None else config.setting(*config.POLL_JITTER)
        ),
        "MODEL_MAX_CONCURRENCY": str(c.ceiling),
        "MODEL_CONCURRENCY_GRACE_POLLS": str(c.grace_polls),
        "KG_ADAPTIVE_CONCURRENCY": "on",
    }
    with knobs.overrides(values):  # passed as settings: the process's environment is left alone
        yield


def run_live(scenario: Scenario, policy: str = "adaptive", *, capacity: int | None = None) -> Trace:
    """The production stack on virtual time; returns a trace on the lab's grid. ``capacity`` pins the fan-out's
    limit (``map_concurrent(capacity=...)``), as a sweep needs; the controller still polls."""
    _check_supported(scenario)
    with _knobs(scenario):
        return run_virtual(lambda loop: _live(scenario, policy, loop, capacity))


async def _live(scenario: Scenario, policy: str, loop: VirtualTimeLoop, capacity: int | None) -> Trace:
    c, w = scenario.clients, scenario.workload
    config = EmulatorConfig(preset=preset_for(scenario), engines=scenario.fleet.engines)
    link = LocalLink(config, clock=loop.time)
    server = link.core.server
    app = create_app(emulator=Emulator(config, link=link))
    name = f"conformance-{scenario.name}"
    completed: list[float] = []
    latencies: list[float] = []
    errors = 0

    embedding = config.engine_preset().embedding

    async def call(request: Request) -> None:
        nonlocal errors
        started = loop.time()
        text = "a" * (4 * request.prompt_tokens)  # the emulator's default tokenizer: 4 characters a token
        body: dict[str, Any] = {"model": server.model_name}
        if embedding:  # a pooling model serves only embeddings; its completions API answers 400, as vLLM's
            path = "/v1/embeddings"
            body["input"] = text
        else:
            path = "/v1/completions"
            body |= {"prompt": text, "max_tokens": request.output_tokens, "ignore_eos": True}
        response = await client.post(path, json=body)
        if response.status_code != 200:
            errors += 1
            return
        completed.append(loop.time())
        latencies.append(loop.time() - started)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=_BASE, timeout=None) as client:
        source = AsgiMetricsSource(client, loop, server.model_name)
        register_model(name, base_url=f"{_BASE}/v1", served_model_name=server.model_name, max_parallel_calls=c.floor)
        runtime = install_runtime(
            ModelRuntime(get_model(name), source=source, policy=load_policy(policy), clock=loop.time, poll_loop=loop)
        )
        # The lab's client 0 draws its poll jitter from this stream: both sides draw the same waits, poll for poll.
        runtime.core.jitter_rng = poll_jitter_rng(scenario, 0)
        loop.add_barrier(runtime.scheduled_poll_at)
        try:
            for event in (e for e in scenario.events if e.at_s < scenario.duration_s):
                loop.call_at(event.at_s, _spawn, loop, _add_engines(client, event.count))
            items = request_stream(
                np.random.default_rng([scenario.seed, 0]),
                w.prompt_tokens,
                w.output_tokens,
                w.prompt_sigma,
                w.output_sigma,
                w.embedding,
                tag=0,
            )
            run = map_concurrent(items, call, model=name, capacity=capacity, return_exceptions=True)
            fanout = asyncio.ensure_future(run)
            series = ("time", "running", "waiting", "kv", "preemptions", "t", "i")
            samples: dict[str, list[float]] = {k: [] for k in series}
            done: list[float] = []
            failed: list[float] = []
            t = 0.0
            while t < scenario.duration_s:
                await asyncio.sleep(max(0.0, t - loop.time()))
                link.core.driver.sync()
                engines = [e for e in server.engines if e.up]
                samples["time"].append(t)
                samples["running"].append(server.num_running)
                samples["waiting"].append(sum(e.gauge_waiting for e in engines))
                samples["kv"].append(max((e.kv_usage for e in engines), default=0.0))
                samples["preemptions"].append(sum(e.stats.num_preemptions for e in server.engines))
                samples["t"].append(runtime.limiter.limit)
                samples["i"].append(runtime.inflight())
                done.append(len(completed))
                failed.append(errors)
                t += scenario.trace_dt_s
            fanout.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fanout
        finally:
            forget_runtime(name)
            await link.stop()
    return Trace.sampled(
        samples,
        clients=[
            ClientTrace(
                target=np.asarray(samples["t"], dtype=float),
                inflight=np.asarray(samples["i"], dtype=float),
                completions=np.asarray(done, dtype=float),
                errors=np.asarray(failed, dtype=float),
                poll_times=np.asarray(source.poll_times, dtype=float),
            )
        ],
        queue_times=np.zeros(0),
        latencies=np.asarray(latencies, dtype=float),
        finish_times=np.asarray(completed, dtype=float),
        duration_s=scenario.duration_s,
        capacity_changes=scenario.capacity_change_times,
    )


def _spawn(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> None:
    loop.create_task(coro)


async def _add_engines(client: httpx.AsyncClient, count: int) -> Any:
    state = (await client.get("/admin/capacity")).json()
    response = await client.post("/admin/capacity", json={"engines": state["engines"] + count})
    response.raise_for_status()
    return response.json()


def compare(scenario: Scenario, policy: str = "adaptive") -> Comparison:
    """Lab and live on one scenario, each judged against the lab's oracle."""
    oracle = Oracle(scenario)
    oracle_trace = oracle.run()
    lab = side_figures(run_lab(scenario, policy), oracle_trace)
    live = side_figures(run_live(scenario, policy), oracle_trace)
    return Comparison(scenario.name, scenario.clients.poll_s, oracle.knees()[-1][1], lab, live)


def summary_line(results: list[Comparison]) -> str:
    """The benchmark's last line: the worst gaps over all scenarios."""
    if not results:
        raise ValueError("no comparisons to summarise")
    g = max(r.goodput_gap for r in results)
    p = max(r.t90_gap_polls for r in results)
    return f"conformance: max goodput-ratio gap {g:.3f}, max t90 gap {p:.2f} polls"


def live_sweep(scenario: Scenario, concurrency: tuple[int, ...] | None = None) -> tuple[Sweep, Sweep]:
    """The knee of the scenario's last phase found twice: the lab's sweep, and the same sweep through the
    production stack and the emulator (``map_concurrent`` with the limit pinned at each concurrency, throughput
    measured after the lab's warm-up over the lab's window). The live sweep uses the lab's concurrency points
    from half the lab's knee up (the peak and the knee are there) unless given others."""
    oracle = Oracle(scenario)
    last = phases(scenario)[-1][1]
    lab = oracle.sweep(last)
    steady = dataclasses.replace(
        scenario,
        duration_s=WARMUP_S + MEASURE_S,
        trace_dt_s=WARMUP_S / 4,
        events=(),
        fleet=dataclasses.replace(scenario.fleet, engines=last.engines[0]),
    )
    start = round(WARMUP_S / steady.trace_dt_s)
    throughput = []
    points = concurrency or tuple(c for c in lab.concurrency if c >= lab.knee // 2)
    for c in points:
        trace = run_live(steady, capacity=c)
        done = trace.clients[0].completions
        throughput.append(float((done[-1] - done[start]) / (trace.time[-1] - trace.time[start])))
    return lab, Sweep(points, tuple(throughput))
