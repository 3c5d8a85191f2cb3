"""Building a simulated world from a scenario: the fleet, background tenants, and the event timeline.

Shared by the scenario runner and the oracle's sweep, so both simulate exactly the same engines and traffic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import simpy

from model_concurrency.engine import Fleet, Request, Server, get_preset
from model_concurrency.engine.presets import EnginePreset
from model_concurrency.lab.neighbour import InteractiveTenant
from model_concurrency.lab.ratelimit import RateLimitedFront
from model_concurrency.lab.scenario import Event, Scenario
from model_concurrency.observation import EngineSnapshot
from model_concurrency.signals.limits import StatedLimits

__all__ = ["Background", "Phase", "StatedFront", "World", "build_fleet", "phases", "preset_for", "stated_limits_for"]


def preset_for(scenario: Scenario) -> EnginePreset:
    preset = get_preset(scenario.fleet.preset)
    preset = preset.replace(**scenario.fleet.engine) if scenario.fleet.engine else preset
    if scenario.fleet.frontend:
        preset = preset.replace(frontend=dataclasses.replace(preset.frontend, **scenario.fleet.frontend))
    return preset


def stated_limits_for(scenario: Scenario) -> StatedLimits | None:
    """What the scenario's clients were told of the engines (``[clients] stated_limits``): the fleet's engine
    config, per engine, over the engines it starts with; None when they were told nothing."""
    if not scenario.clients.stated_limits:
        return None
    preset = preset_for(scenario)
    return StatedLimits(
        max_num_seqs=preset.max_num_seqs,
        max_num_batched_tokens=preset.max_num_batched_tokens,
        engines=scenario.fleet.engines * scenario.fleet.replicas,
    )


class StatedFront:
    """The clients' target, carrying the limits their operator stated (``stated_limits``), which a
    :class:`~model_concurrency.lab.client.SimClient` hands its runtime as a spec's would be.

    Everything else is the wrapped front's own: its bound methods, so a submission costs no extra call."""

    def __init__(self, front: Fleet | RateLimitedFront, stated: StatedLimits) -> None:
        self.front = front
        self.stated_limits = stated
        self.submit_callback: Callable[[Request, Callable[[Request], None]], None] = front.submit_callback
        self.snapshot: Callable[[], EngineSnapshot] = front.snapshot
        self.submit_limited: Callable[..., None] | None = getattr(front, "submit_limited", None)
        self.refusal_latency_s: float = getattr(front, "refusal_latency_s", 0.0)


@dataclass(frozen=True, slots=True)
class Phase:
    """What the fleet can serve between two capacity events: live engines per live replica and background load.

    ``background_fraction`` is kept symbolic (a share of this phase's peak without background) so the oracle can
    resolve it after measuring that peak.
    """

    engines: tuple[int, ...]
    background_rps: float = 0.0
    background_fraction: float | None = None

    @property
    def without_background(self) -> Phase:
        return Phase(self.engines)


def build_fleet(env: simpy.Environment, scenario: Scenario, engines: tuple[int, ...] | None = None) -> Fleet:
    preset = preset_for(scenario)
    balancer: Literal["least_loaded", "round_robin"] = (
        "least_loaded" if scenario.fleet.balancer == "least-loaded" else "round_robin"
    )
    layout = engines if engines is not None else (scenario.fleet.engines,) * scenario.fleet.replicas
    servers = [Server(env, preset, num_engines=n, name=f"replica-{i}") for i, n in enumerate(layout)]
    return Fleet(env, servers, balancer=balancer)


class Background:
    """Open-loop traffic from other tenants: gamma inter-arrival times (shape = burstiness; 1 = Poisson).

    As in vLLM's serving benchmark: the mean rate is ``rate_rps`` whatever the burstiness; lower burstiness
    means burstier arrivals. The rate can change at any time; a change takes effect at the next arrival.
    """

    def __init__(
        self,
        env: simpy.Environment,
        fleet: Fleet,
        rng: np.random.Generator,
        *,
        burstiness: float,
        make_request: Callable[[], Request],
    ) -> None:
        if burstiness <= 0:
            raise ValueError("burstiness must be > 0")
        self.env, self.fleet, self.rng = env, fleet, rng
        self.burstiness = burstiness
        self.make_request = make_request
        self.rate_rps = 0.0
        self.sent = 0
        self._changed: simpy.Event = env.event()
        env.process(self._run())

    def set_rate(self, rate_rps: float) -> None:
        self.rate_rps = max(0.0, float(rate_rps))
        if not self._changed.triggered:
            self._changed.succeed()

    def _discard(self, request: Request) -> None:
        pass

    def _run(self) -> Generator[Any, Any, None]:
        env = self.env
        while True:
            if self.rate_rps <= 0:
                self._changed = env.event()
                yield self._changed
                continue
            gap = self.rng.gamma(self.burstiness, 1.0 / (self.rate_rps * self.burstiness))
            self._changed = env.event()
            yield env.timeout(gap) | self._changed
            if self._changed.triggered:
                continue  # the rate changed while waiting: draw the next gap at the new rate
            self.fleet.submit_callback(self.make_request(), self._discard)
            self.sent += 1


class _NoTraffic:
    def set_rate(self, rate_rps: float) -> None:
        pass


class World:
    """A fleet plus the scenario's timeline: applies events at their times, tracks the current phase.

    ``front`` is what the fan-out clients submit to: the fleet itself, or the fleet behind the scenario's
    ``[rate_limit]`` (:mod:`.ratelimit`), carrying the limits the clients were told when the scenario says so
    (:class:`StatedFront`); background tenants always submit to the fleet.

    ``live=False`` builds the fleet without traffic or timeline, for replaying events by hand (:func:`phases`).
    """

    def __init__(
        self,
        env: simpy.Environment,
        scenario: Scenario,
        *,
        resolve_fraction: Callable[[Phase, float], float],
        rng: np.random.Generator,
        live: bool = True,
    ) -> None:
        self.env = env
        self.scenario = scenario
        self.fleet = build_fleet(env, scenario)
        # What the fan-out clients call: the fleet, or the fleet behind the scenario's rate limit.
        self.front: Fleet | RateLimitedFront | StatedFront = self.fleet
        limit = scenario.rate_limit
        if limit.active:
            self.front = RateLimitedFront(
                env,
                self.fleet,
                requests_per_minute=limit.requests_per_minute,
                tokens_per_minute=limit.tokens_per_minute,
                refusal_latency_s=limit.refusal_latency_s,
            )
        self.stated_limits = stated_limits_for(scenario)
        if self.stated_limits is not None:
            self.front = StatedFront(self.front, self.stated_limits)
        self.metrics_up = True
        self.resolve_fraction = resolve_fraction
        w, bg = scenario.workload, scenario.background
        prompt = bg.prompt_tokens or w.prompt_tokens
        output = bg.output_tokens or w.output_tokens
        self.background: Background | _NoTraffic = _NoTraffic()
        if live:
            self.background = Background(
                env,
                self.fleet,
                rng,
                burstiness=bg.burstiness,
                make_request=lambda: Request(prompt, output, embedding=w.embedding, tag="background"),
            )
        self._bg_rps = bg.rate_rps
        self._bg_fraction = bg.fraction_of_capacity
        # The interactive tenant (lab/neighbour.py), on a stream of its own so its arrivals are the same with or
        # without the batch beside it.
        self.tenant: InteractiveTenant | None = None
        if live and scenario.interactive is not None:
            tenant_rng = np.random.default_rng([scenario.seed, 23])
            self.tenant = InteractiveTenant(env, self.fleet, scenario.interactive, tenant_rng)
        if live:
            self._apply_background()
            env.process(self._timeline())

    def phase(self) -> Phase:
        engines = tuple(sum(1 for e in s.engines if e.up) for s in self.fleet.replicas if s.up)
        return Phase(engines, self._bg_rps if self._bg_fraction is None else 0.0, self._bg_fraction)

    def _apply_background(self) -> None:
        if self._bg_fraction is not None:
            self.background.set_rate(self.resolve_fraction(self.phase(), self._bg_fraction))
        else:
            self.background.set_rate(self._bg_rps)

    def apply(self, event: Event) -> None:
        fleet = self.fleet
        if event.action == "add_engines":
            for server in fleet.live:
                for _ in range(event.count):
                    downed = next((e for e in server.engines if not e.up), None)
                    if downed is not None:
                        downed.set_up()
                    else:
                        server.add_engine()
        elif event.action == "remove_engines":
            for server in fleet.live:
                live = [e for e in server.engines if e.up]
                for engine in live[max(1, len(live) - event.count) :][::-1]:
                    engine.set_down()
        elif event.action == "replica_down":
            fleet.replicas[event.replica].set_down()
        elif event.action == "replica_up":
            fleet.replicas[event.replica].set_up()
        elif event.action == "metrics_down":
            self.metrics_up = False
        elif event.action == "metrics_up":
            self.metrics_up = True
        elif event.action == "background":
            self._bg_rps = event.rate_rps if event.rate_rps is not None else 0.0
            self._bg_fraction = event.fraction_of_capacity
        if event.changes_capacity:
            self._apply_background()

    def _timeline(self) -> Generator[Any, Any, None]:
        for event in self.scenario.events:
            if event.at_s > self.env.now:
                yield self.env.timeout(event.at_s - self.env.now)
            self.apply(event)


def phases(scenario: Scenario) -> list[tuple[float, Phase]]:
    """The scenario's capacity phases ``(start time, phase)``, by replaying its events on a fleet without traffic."""
    world = World(
        simpy.Environment(),
        scenario,
        resolve_fraction=lambda phase, fraction: 0.0,
        rng=np.random.default_rng(0),
        live=False,
    )
    out = [(0.0, world.phase())]
    for event in scenario.events:
        if event.at_s >= scenario.duration_s:
            break
        world.apply(event)
        if event.changes_capacity:
            out.append((event.at_s, world.phase()))
    return out
