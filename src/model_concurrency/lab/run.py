"""Run a scenario: the world, the fan-out clients, a sampler; then the trace, the oracle and the summary.

``simulate`` is the single entry point the CLI, the compare study, the notebooks and the tests use. Clients get
their policy from a factory so every client owns a fresh, independent policy object, as separate processes
would.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from model_concurrency.engine import Engine
from model_concurrency.lab.client import ScheduledLimit, SimClient, request_stream
from model_concurrency.lab.job import jobs_for
from model_concurrency.lab.neighbour import NeighbourLatency, neighbour_latency, ungated
from model_concurrency.lab.scenario import Scenario
from model_concurrency.lab.trace import Array, ClientTrace, Trace
from model_concurrency.lab.world import Phase, World
from model_concurrency.policies.base import Policy
from model_concurrency.policies.static import Static
from model_concurrency.signals.saturation import STALE, engine_saturation, pool_saturation

__all__ = ["Progress", "poll_jitter_rng", "simulate", "tenant_alone", "ungated_run"]

Progress = Callable[[float], None]


def _no_background(phase: Phase, fraction: float) -> float:
    raise ValueError("this scenario sizes background traffic from capacity: pass resolve_fraction (the oracle)")


def poll_jitter_rng(scenario: Scenario, client: int) -> np.random.Generator:
    """Client ``client``'s stream for its controller's poll jitter: from the scenario's seed, its own per client,
    so a run is reproducible and the live side of a conformance run can draw the same waits."""
    return np.random.default_rng([scenario.seed, client, 1])


def simulate(
    scenario: Scenario,
    *,
    policy_factory: Callable[[], Policy] | None = None,
    schedules: list[list[tuple[float, int]]] | None = None,
    budgets: list[list[tuple[float, int | None]]] | None = None,
    resolve_fraction: Callable[[Phase, float], float] = _no_background,
    progress: Progress | None = None,
    inspect: Callable[[list[SimClient]], None] | None = None,
) -> Trace:
    """Simulate one scenario with either a policy per client or a fixed limit schedule per client (the oracle).

    ``inspect`` is called with the clients once the run has ended (their ledgers, for tests and the fuzzer)."""
    if (policy_factory is None) == (schedules is None):
        raise ValueError("simulate needs a policy_factory or schedules, not both")
    env = simpy.Environment()
    rng = np.random.default_rng(scenario.seed)
    world = World(env, scenario, resolve_fraction=resolve_fraction, rng=np.random.default_rng(scenario.seed + 1))
    c, w = scenario.clients, scenario.workload
    # Every client's per-request figures in one array each (order does not matter: only percentiles read them).
    records: tuple[array[float], array[float], array[float]] = (array("d"), array("d"), array("d"))
    clients = []
    # A job's clients lease from one runtime (lab/job.py); the oracle's scheduled clients are each on their own.
    jobs = jobs_for(env, c, policy_factory, scenario.seed) if policy_factory is not None else {}
    for i in range(c.count):
        # Independent processes do not poll in lock-step, and drift apart as they go.
        first_poll_s = float(rng.uniform(0, c.poll_s)) if c.count > 1 else 0.0
        job = jobs.get(i)
        stream = request_stream(
            np.random.default_rng([scenario.seed, i]),
            w.prompt_tokens,
            w.output_tokens,
            w.prompt_sigma,
            w.output_sigma,
            w.embedding,
            tag=i,
            long_fraction=w.long_fraction,
            long_prompt_tokens=w.long_prompt_tokens,
            long_output_tokens=w.long_output_tokens,
            long_burst=w.long_burst,
            priority=c.priority,
        )
        clients.append(
            SimClient(
                env,
                world.front,
                stream,
                policy=policy_factory() if policy_factory is not None else None,
                schedule=(
                    ScheduledLimit(schedules[i], budgets[i] if budgets is not None else None)
                    if schedules is not None
                    else None
                ),
                floor=c.floor,
                ceiling=c.ceiling,
                poll_s=c.poll_s,
                grace_polls=c.grace_polls,
                first_poll_s=first_poll_s,
                poll_jitter=c.poll_jitter,
                jitter_rng=poll_jitter_rng(scenario, i),
                items=c.items_of(i),
                metrics_up=lambda: world.metrics_up,
                guard=c.guard,
                outage_handover=c.outage_handover,
                name=f"client-{i}",
                shared_records=records,
                lease=job.member() if job is not None else None,
            )
        )
    samples: dict[str, list[Any]] = {k: [] for k in ("time", "running", "waiting", "kv", "preemptions", "gateway")}
    # One column of every client per sample, written into a (clients, samples) matrix per series, so each client's
    # series is a contiguous row of it without a copy at the end (at fleet scale: 5 × 1,000 × 1,801 floats, and
    # stacking and transposing sample rows held them twice over).
    series = ("target", "inflight", "completions", "errors", "throttled")
    capacity = int(scenario.duration_s / scenario.trace_dt_s) + 2  # grown if float steps make one more sample
    per_client: dict[str, Array] = {k: np.empty((len(clients), capacity)) for k in series}
    taken = 0

    def sampler() -> Generator[Any, Any, None]:
        nonlocal per_client, taken
        dt = scenario.trace_dt_s
        n = len(clients)
        while True:
            live = world.fleet.live
            samples["time"].append(env.now)
            samples["running"].append(sum(s.num_running for s in live))
            samples["waiting"].append(sum(e.gauge_waiting for s in live for e in s.engines if e.up))
            samples["kv"].append(max((e.kv_usage for s in live for e in s.engines if e.up), default=0.0))
            samples["preemptions"].append(sum(e.stats.num_preemptions for s in world.fleet.replicas for e in s.engines))
            samples["gateway"].append(gateway_score([e for s in live for e in s.engines], world.metrics_up))
            if taken == per_client["target"].shape[1]:
                per_client = {k: np.concatenate([m, np.empty_like(m)], axis=1) for k, m in per_client.items()}
            k = taken
            per_client["target"][:, k] = np.fromiter((cl.limiter.limit for cl in clients), float, n)
            per_client["inflight"][:, k] = np.fromiter((cl.limiter.inflight for cl in clients), float, n)
            per_client["completions"][:, k] = np.fromiter((cl.completed for cl in clients), float, n)
            per_client["errors"][:, k] = np.fromiter((cl.errors for cl in clients), float, n)
            per_client["throttled"][:, k] = np.fromiter((cl.throttled for cl in clients), float, n)
            taken += 1
            if progress is not None:
                progress(env.now)
            yield env.timeout(dt)

    env.process(sampler())
    env.run(until=scenario.duration_s)
    if inspect is not None:
        inspect(clients)
    columns = {k: matrix[:, :taken] for k, matrix in per_client.items()}  # row i: client i's series, contiguous
    return Trace.sampled(
        samples,
        clients=[
            ClientTrace(
                **{k: column[i] for k, column in columns.items()},
                poll_times=np.asarray(client.poll_times, dtype=float),
                poll_targets=np.asarray(client.poll_targets, dtype=float),
            )
            for i, client in enumerate(clients)
        ],
        queue_times=np.frombuffer(records[0], dtype=float),
        latencies=np.frombuffer(records[1], dtype=float),
        finish_times=np.frombuffer(records[2], dtype=float),
        duration_s=scenario.duration_s,
        capacity_changes=scenario.capacity_change_times,
        limit_rps=scenario.rate_limit.items_per_s(w.prompt_tokens + w.output_tokens),
        gateway_saturation=np.asarray(samples["gateway"], dtype=float),
        neighbour=neighbour_latency(world.fleet) if world.tenant is not None else None,
    )


def gateway_score(engines: list[Engine], metrics_up: bool) -> float:
    """The gateway's pool score over ``engines`` from their exported gauges; a down engine, or every engine during
    a metrics outage, is stale (1.0). An empty pool has no fresh metrics at all: 1.0."""
    if not metrics_up:
        return STALE
    score = pool_saturation(engine_saturation(e.gauge_waiting, e.gauge_kv_usage) if e.up else None for e in engines)
    return STALE if score is None else score


def ungated_run(scenario: Scenario) -> Trace:
    """The batch ungated: every client static at its ceiling (the reference of ``batch_idle_throughput_ratio``)."""
    return simulate(ungated(scenario), policy_factory=Static)


def tenant_alone(scenario: Scenario) -> NeighbourLatency:
    """The same scenario without the fan-out clients: the tenant's own latency, the baseline of the ratio."""
    env = simpy.Environment()
    world = World(env, scenario, resolve_fraction=_no_fraction, rng=np.random.default_rng(scenario.seed + 1))
    env.run(until=scenario.duration_s)
    return neighbour_latency(world.fleet)


def _no_fraction(phase: object, fraction: float) -> float:
    raise ValueError("the neighbour's baseline does not size background traffic from capacity")
