"""The neighbour in the lab: an interactive tenant beside the batch, and what the batch costs it.

A batch job rarely owns the engines it calls: a chat UI or agents share them, and when the batch over-drives the
engine they pay first, in time to first token (TTFT). A scenario's ``[interactive]`` table declares such a tenant
(:class:`~model_concurrency.lab.scenario.Interactive`): open-loop gamma arrivals that burst (llm-d-batch-gateway's
benchmark: 15 req/s for 90 s, then 1 req/s), short prompts, its own TTFT target. Its requests carry the request
class :data:`CLASS`, so every engine keeps their TTFT and inter-token latency apart
(:attr:`~model_concurrency.engine.stats.EngineStats.classes`).

The summary keys this module adds (:func:`neighbour_summary`):

* ``neighbour_ttft_p99_ratio``: the tenant's TTFT p99 over requests that arrived in its bursts, beside the batch,
  over the same figure for the same tenant alone (the same scenario without the fan-out clients: the lab runs
  that baseline itself). 1.0 = the batch costs the neighbour nothing;
* ``neighbour_ttft_p99_s`` / ``neighbour_alone_ttft_p99_s`` / ``neighbour_itl_p99_s``: the figures behind it;
* ``batch_idle_throughput_ratio``: batch items per second while the tenant is idle (its idle windows from the end
  of its first burst on, while some job still has items left) over the same figure for the ungated batch (every
  client static at its ceiling, the same scenario);
* ``deadlines_met`` / ``deadlines_total``: jobs (``clients.job_items`` with ``clients.deadlines_s``) whose last
  item finished by the deadline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from model_concurrency.engine import Fleet, Request
from model_concurrency.engine.stats import ClassLatency
from model_concurrency.lab.scenario import Interactive, Scenario
from model_concurrency.lab.trace import Array, Trace

__all__ = [
    "CLASS",
    "InteractiveTenant",
    "NeighbourLatency",
    "batch_idle_rate",
    "deadlines",
    "neighbour_latency",
    "neighbour_summary",
]

CLASS = "interactive"


class InteractiveTenant:
    """The tenant's arrivals: gamma gaps (shape = burstiness) at the rate of the current phase.

    A phase change redraws the next gap at the new rate, as :class:`~model_concurrency.lab.world.Background` does.
    """

    def __init__(self, env: simpy.Environment, fleet: Fleet, spec: Interactive, rng: np.random.Generator) -> None:
        self.env, self.fleet, self.spec, self.rng = env, fleet, spec, rng
        self.sent = 0
        env.process(self._run())

    def _request(self) -> Request:
        spec, rng = self.spec, self.rng

        def draw(mean: int, sigma: float) -> int:
            if sigma <= 0:
                return mean
            return max(1, round(float(rng.lognormal(np.log(mean) - sigma**2 / 2, sigma))))

        return Request(
            draw(spec.prompt_tokens, spec.prompt_sigma),
            draw(spec.output_tokens, spec.output_sigma),
            tag=CLASS,
            priority=spec.priority,
            request_class=CLASS,
        )

    def _discard(self, request: Request) -> None:
        pass

    def _run(self) -> Generator[Any, Any, None]:
        env, spec = self.env, self.spec
        while True:
            now = env.now
            rate = spec.burst_rps if spec.in_burst(now) else spec.idle_rps
            change = spec.next_change(now)
            if rate <= 0:
                yield env.timeout(change - now)
                continue
            gap = float(self.rng.gamma(spec.burstiness, 1.0 / (rate * spec.burstiness)))
            if now + gap >= change:
                yield env.timeout(change - now)  # the phase ends first: draw again at the new rate
                continue
            yield env.timeout(gap)
            self.fleet.submit_callback(self._request(), self._discard)
            self.sent += 1


@dataclasses.dataclass(frozen=True, slots=True)
class NeighbourLatency:
    """The tenant's finished requests, from every engine of the fleet: arrival, TTFT, mean inter-token latency."""

    arrival: Array
    ttft: Array
    itl: Array

    def in_bursts(self, spec: Interactive) -> NeighbourLatency:
        mask = np.fromiter((spec.in_burst(t) for t in self.arrival), bool, len(self.arrival))
        return NeighbourLatency(self.arrival[mask], self.ttft[mask], self.itl[mask])

    def ttft_p99(self) -> float | None:
        return float(np.percentile(self.ttft, 99)) if len(self.ttft) else None

    def itl_p99(self) -> float | None:
        itl = self.itl[np.isfinite(self.itl)]
        return float(np.percentile(itl, 99)) if len(itl) else None


def neighbour_latency(fleet: Fleet) -> NeighbourLatency:
    """The tenant's latencies as the engines recorded them (class :data:`CLASS`), sorted by arrival."""
    parts: list[ClassLatency] = []
    for server in fleet.replicas:
        for engine in server.engines:
            latency = engine.stats.classes.get(CLASS)
            if latency is not None:
                parts.append(latency)
    arrival = np.asarray([a for p in parts for a in p.arrival], dtype=float)
    order = np.argsort(arrival, kind="stable")
    ttft = np.asarray([v for p in parts for v in p.ttft], dtype=float)
    itl = np.asarray([v for p in parts for v in p.itl], dtype=float)
    return NeighbourLatency(arrival[order], ttft[order], itl[order])


def _idle_mask(spec: Interactive, time: Array) -> Array:
    after_first = time >= spec.first_burst_s + spec.burst_s
    idle = np.fromiter((not spec.in_burst(t) for t in time), bool, len(time))
    out: Array = after_first & idle
    return out


def batch_idle_rate(scenario: Scenario, trace: Trace) -> float | None:
    """Batch items per second over the trace intervals that end while the tenant is idle (after its first burst)
    and while some job still has items left; None if there is no such interval."""
    spec = scenario.interactive
    if spec is None or len(trace.time) < 2 or not trace.clients:
        return None
    completions = np.asarray([c.completions for c in trace.clients])
    items = [scenario.clients.items_of(i) for i in range(len(trace.clients))]
    pending = np.zeros(len(trace.time), dtype=bool)
    for i, n in enumerate(items):
        pending |= True if n is None else completions[i] < n
    done = completions.sum(axis=0)
    mask = _idle_mask(spec, trace.time)[1:] & pending[:-1]
    dt = np.diff(trace.time)[mask]
    if not len(dt) or dt.sum() <= 0:
        return None
    return float(np.diff(done)[mask].sum() / dt.sum())


def deadlines(scenario: Scenario, trace: Trace) -> tuple[int, int]:
    """(jobs whose last item finished by their deadline, jobs with a deadline), on the trace's time grid."""
    c = scenario.clients
    if c.deadlines_s is None:
        return 0, 0
    met = 0
    for i, deadline in enumerate(c.deadlines_s):
        items = c.items_of(i)
        if items is None or i >= len(trace.clients):
            continue
        reached = np.nonzero(trace.clients[i].completions >= items)[0]
        if len(reached) and trace.time[reached[0]] <= deadline + 1e-9:
            met += 1
    return met, len(c.deadlines_s)


def ungated(scenario: Scenario) -> Scenario:
    """The scenario with every client's floor at its ceiling: with the static policy, the ungated batch."""
    return dataclasses.replace(scenario, clients=dataclasses.replace(scenario.clients, floor=scenario.clients.ceiling))


def neighbour_summary(
    scenario: Scenario,
    trace: Trace,
    latency: NeighbourLatency | None,
    *,
    alone: Callable[[], NeighbourLatency],
    ungated_trace: Callable[[], Trace] | None = None,
) -> dict[str, Any]:
    """The neighbour's summary keys (module docstring); empty for a scenario without ``[interactive]``.

    ``alone`` runs the tenant without the fan-out (lab/run.py ``tenant_alone``) for the baseline of the TTFT ratio;
    ``ungated_trace`` runs the ungated batch for the throughput ratio (None: the ratio is left out, None)."""
    met, total = deadlines(scenario, trace)
    out: dict[str, Any] = {"deadlines_met": met, "deadlines_total": total}
    spec = scenario.interactive
    if spec is None or latency is None:
        return out
    bursts = latency.in_bursts(spec)
    alone_in_bursts = alone().in_bursts(spec)
    p99, p99_alone = bursts.ttft_p99(), alone_in_bursts.ttft_p99()
    idle = batch_idle_rate(scenario, trace)
    idle_ungated = batch_idle_rate(scenario, ungated_trace()) if ungated_trace is not None else None
    out.update(
        {
            "neighbour_ttft_p99_ratio": p99 / p99_alone if p99 is not None and p99_alone else None,
            "neighbour_ttft_p99_s": p99,
            "neighbour_alone_ttft_p99_s": p99_alone,
            "neighbour_itl_p99_s": bursts.itl_p99(),
            "neighbour_ttft_target_s": spec.ttft_target_s,
            "batch_idle_throughput": idle,
            "batch_idle_throughput_ratio": idle / idle_ungated if idle is not None and idle_ungated else None,
        }
    )
    return out
