"""The oracle: a client that knows the fleet's capacity at every moment and holds the knee.

For each capacity phase of a scenario (the fleet between two capacity events, with that phase's background
traffic) the lab sweeps a fixed concurrency and measures the fan-out's throughput once it has settled. The knee
is the smallest concurrency that reaches 99 % of the peak: past it, more concurrency buys only queueing,
preemptions and KV pressure. The oracle's run then holds the knee of each phase from the instant the phase
starts, split evenly across the scenario's clients and never below a client's floor: the floor is the user's
promise to every caller, so the oracle keeps it too (where the floors add up past the knee, a policy cannot hold
the knee, and an oracle that did would charge the floor's queue to the policy: 68 of the 200 draws of
``fuzz --seed 41`` are such draws).

The oracle knows the KV pool too: it weighs every request by its tokens against a budget of the
phase's whole pool (``num_gpu_blocks × block_size`` over the live engines, split like the knee), so it never
over-fills the cache. A count-only oracle loses half the goodput of a heavy-tailed mix to preemptions
(``heavy-tail``: 8.0 items/s, p99 queue 85 s, against 17.7 and 1.7 s for the weighted default); where the pool
never binds, the budget changes nothing.

A fleet of identical replicas behind a balancer is swept one replica at a time: the oracle sweeps one replica (its
engines and its API server) under the replica's share of the background traffic and of the concurrency cap, and
multiplies concurrencies and throughputs by the replica count (:func:`per_replica_sweeps` says when that holds). For
``fleet-1000`` (16 replicas × 4 engines) that is a sixteenth of the simulated requests; one engine × 64 was within
0.4 % of the whole fleet's peak and 1 % of its knee (``scripts/fleet_figures.py converge``). A lost replica, added
engines, a background change or a rate limit keep the full sweep of each phase. Replicas that became unequal
(engines added or removed while one was down) are swept one shape at a time, and the fleet's knee and peak are their
sums. The stored sweep is what it says (one replica's, keyed like any one-replica scenario), so no cached entry
changed meaning.

Sweeps are deterministic (fixed seeds, common random numbers across concurrency levels), so their results are
cached on disk, keyed by everything that can change them; a scaled-down scenario reuses its full-size sweep. The
oracle's run is as deterministic, and at fleet scale as long to simulate as the policy's, so its whole trace is
cached too (``runs/<key>/``, one ``.npy`` per array, read back memory-mapped; about 220 MB for ``fleet-1000``).
Both keys carry :data:`_VERSION`: bump it when the engine model or the sweep change meaning; the run's key also
carries :data:`_RUN_VERSION`, for changes in the lab's clients.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_concurrency import knobs
from model_concurrency.knobs import setting
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import Background, Clients, Fleet, RateLimit, Scenario
from model_concurrency.lab.trace import Trace, load_trace, save_trace
from model_concurrency.lab.world import Phase, phases, preset_for

__all__ = ["KNEE_FRACTION", "Oracle", "Sweep", "cache_dir", "per_replica_sweeps", "store_run"]

KNEE_FRACTION = 0.99
WARMUP_S = 60.0
MEASURE_S = 180.0
# Bump when the engine model or the sweep change meaning (2: sweeps hold the KV pool's budget).
_VERSION = 2
# The oracle's cached run also depends on the lab's clients and engine model (3: they poll on the jittered
# schedule; 4: the 0.2.0 engine and clients, whose runs differ from those cached under 3).
_RUN_VERSION = 4


def cache_dir() -> Path:
    root = setting(*knobs.CACHE) or os.path.join(
        setting("XDG_CACHE_HOME", "") or os.path.expanduser("~/.cache"), "model_concurrency"
    )
    return Path(root) / "oracle"


@dataclass(frozen=True, slots=True)
class Sweep:
    concurrency: tuple[int, ...]
    throughput: tuple[float, ...]

    @property
    def peak(self) -> float:
        return max(self.throughput) if self.throughput else 0.0

    @property
    def knee(self) -> int:
        goal = KNEE_FRACTION * self.peak
        return min(c for c, t in zip(self.concurrency, self.throughput, strict=True) if t >= goal)


def _phase_scenario(scenario: Scenario, phase: Phase, background_rps: float) -> Scenario:
    if len(set(phase.engines)) > 1:
        raise ValueError(f"the oracle needs identical live replicas, got engines per replica {phase.engines}")
    fleet = Fleet(
        preset=scenario.fleet.preset,
        engines=phase.engines[0] if phase.engines else 1,
        replicas=max(1, len(phase.engines)),
        balancer=scenario.fleet.balancer,
        engine=scenario.fleet.engine,
        frontend=scenario.fleet.frontend,  # the API server is part of the fleet the knee is measured on
    )
    return dataclasses.replace(
        scenario,
        duration_s=WARMUP_S + MEASURE_S,
        trace_dt_s=WARMUP_S / 4,
        events=(),
        fleet=fleet,
        clients=Clients(count=1, floor=1, ceiling=10**6),
        background=Background(
            rate_rps=background_rps,
            burstiness=scenario.background.burstiness,
            prompt_tokens=scenario.background.prompt_tokens,
            output_tokens=scenario.background.output_tokens,
        ),
    )


def _scaled_limit(limit: RateLimit, share: float) -> RateLimit:
    rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
    return dataclasses.replace(
        limit,
        requests_per_minute=None if rpm is None else rpm * share,
        tokens_per_minute=None if tpm is None else tpm * share,
    )


def pool_tokens(scenario: Scenario, engines: int) -> int:
    """The KV pool of ``engines`` engines of the scenario's preset, in tokens (what ``kv_tokens`` reads)."""
    preset = preset_for(scenario)
    return engines * preset.num_gpu_blocks * preset.block_size


def _measure(scenario: Scenario, concurrency: int) -> float:
    pool = pool_tokens(scenario, scenario.fleet.engines * scenario.fleet.replicas)
    trace = simulate(scenario, schedules=[[(0.0, concurrency)]], budgets=[[(0.0, pool)]])
    done = trace.clients[0].completions
    start = round(WARMUP_S / scenario.trace_dt_s)
    return float((done[-1] - done[start]) / (trace.time[-1] - trace.time[start]))


def _workload(scenario: Scenario) -> dict[str, Any]:
    """The workload's fields, leaving out a heavy tail's while it is off (older sweeps keep their keys)."""
    fields = dataclasses.asdict(scenario.workload)
    if not fields["long_fraction"]:
        for name in ("long_fraction", "long_prompt_tokens", "long_output_tokens", "long_burst"):
            fields.pop(name)
    return fields


def _key(scenario: Scenario, background_rps: float, cap: int) -> str:
    description = {
        "version": _VERSION,
        "preset": dataclasses.asdict(preset_for(scenario)),
        "engines": scenario.fleet.engines,
        "replicas": scenario.fleet.replicas,
        "balancer": scenario.fleet.balancer,
        "workload": _workload(scenario),
        "background_rps": round(background_rps, 9),
        "burstiness": scenario.background.burstiness,
        "seed": scenario.seed,
        "cap": cap,
        "warmup": WARMUP_S,
        "measure": MEASURE_S,
    }
    if scenario.rate_limit.active:  # only then, so the sweeps cached for scenarios without a limit stay valid
        description["rate_limit"] = dataclasses.asdict(scenario.rate_limit)
    if scenario.fleet.frontend:  # sweeps stored before they ran behind the scenario's front end are stale
        description["frontend_overrides_swept"] = True
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()[:24]


_memory: dict[str, Sweep] = {}


def _sweep_cached(key: str, scenario: Scenario, cap: int) -> Sweep:
    if key in _memory:
        return _memory[key]
    path = cache_dir() / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        _memory[key] = Sweep(tuple(data["concurrency"]), tuple(data["throughput"]))
        return _memory[key]
    except (OSError, ValueError, KeyError):
        pass
    measured: dict[int, float] = {}

    def at(c: int) -> float:
        if c not in measured:
            measured[c] = _measure(scenario, c)
        return measured[c]

    grid = sorted({min(cap, 2**i) for i in range(0, cap.bit_length() + 1)} | {cap})
    for c in grid:
        at(c)
    # Bisect between the last grid point below 99 % of the peak and the first at or above it.
    while True:
        peak = max(measured.values())
        above = min(c for c, t in measured.items() if t >= KNEE_FRACTION * peak)
        below = max((c for c in measured if c < above), default=None)
        if below is None or above - below <= max(1, above // 64):
            break
        at((above + below) // 2)
    ordered = sorted(measured)
    sweep = _memory[key] = Sweep(tuple(ordered), tuple(measured[c] for c in ordered))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"concurrency": sweep.concurrency, "throughput": sweep.throughput}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs time
    return sweep


def per_replica_sweeps(scenario: Scenario) -> bool:
    """Whether the oracle may sweep one replica and scale by the replica count instead of sweeping the fleet.

    Only for identical replicas that stay so: no event that changes the fleet or its capacity (a lost replica or
    added engines keep the full sweep of each phase), and no rate limit (one limit for the whole fan-out is not a
    share of it per replica). ``MODEL_CONCURRENCY_ORACLE_FULL_SWEEP=1`` sweeps the whole fleet regardless.
    """
    if setting(*knobs.ORACLE_FULL_SWEEP):
        return False
    return (
        scenario.fleet.replicas > 1
        and not any(event.changes_capacity for event in scenario.events)
        and not scenario.rate_limit.active
    )


class Oracle:
    """Knees per phase of one scenario, the background rates they imply, and the oracle's own run."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.cap = scenario.clients.ceiling * scenario.clients.count
        self.per_replica = per_replica_sweeps(scenario)

    def sweep(self, phase: Phase, background_rps: float | None = None) -> Sweep:
        rps = self.resolved_background(phase) if background_rps is None else background_rps
        replicas = len(phase.engines)
        if len(set(phase.engines)) > 1:
            return self._sweep_shapes(phase, rps)
        if self.per_replica and replicas > 1:
            # One replica with its share of the background, its share of the cap; the fleet is R of them.
            one = Phase(phase.engines[:1])
            sc = _phase_scenario(self.scenario, one, rps / replicas)
            cap = -(-self.cap // replicas)
            swept = _sweep_cached(_key(sc, rps / replicas, cap), sc, cap)
            return Sweep(tuple(c * replicas for c in swept.concurrency), tuple(t * replicas for t in swept.throughput))
        sc = _phase_scenario(self.scenario, phase, rps)
        return _sweep_cached(_key(sc, rps, self.cap), sc, self.cap)

    def _sweep_shapes(self, phase: Phase, rps: float) -> Sweep:
        """A fleet of unequal replicas (engines changed while one was down): each distinct replica shape is swept
        alone, under its share of the background (in proportion to its engines) and of the cap, and the fleet's
        knee and peak are the sums over its replicas. That is the fleet a capacity-aware balancer would make of
        them; behind a round-robin balancer the small replica saturates first, so a policy can only do worse than
        this oracle there, never better."""
        total = sum(phase.engines)
        knee = peak = 0.0
        for engines in sorted(set(phase.engines)):
            count = phase.engines.count(engines)
            one = Phase((engines,))
            share = rps * engines / total
            sc = _phase_scenario(self.scenario, one, share)
            if sc.rate_limit.active:  # the fan-out's one limit, shared in the same proportion
                sc = dataclasses.replace(sc, rate_limit=_scaled_limit(sc.rate_limit, engines / total))
            cap = max(1, round(self.cap * engines / total))
            swept = _sweep_cached(_key(sc, share, cap), sc, cap)
            knee += count * swept.knee
            peak += count * swept.peak
        return Sweep((round(knee),), (peak,))

    def resolved_background(self, phase: Phase) -> float:
        if phase.background_fraction is None:
            return phase.background_rps
        return self.background_rps(phase, phase.background_fraction)

    def background_rps(self, phase: Phase, fraction: float) -> float:
        """Background rate for "``fraction`` of capacity": a share of the phase's peak throughput alone."""
        return fraction * self.sweep(phase.without_background, 0.0).peak

    def knees(self) -> list[tuple[float, int]]:
        return [(t, self.sweep(phase).knee) for t, phase in phases(self.scenario)]

    def schedules(self) -> list[list[tuple[float, int]]]:
        clients = self.scenario.clients
        n = clients.count
        per_client: list[list[tuple[float, int]]] = [[] for _ in range(n)]
        for t, knee in self.knees():
            base, extra = divmod(knee, n)
            for i in range(n):
                # The user's floor binds the oracle as it binds every policy: where the floors add up past the
                # knee, both queue alike, and the comparison measures the policy, not the floor.
                share = min(clients.ceiling, base + (1 if i < extra else 0))
                per_client[i].append((t, max(1, clients.floor, share)))
        return per_client

    def budgets(self) -> list[list[tuple[float, int | None]]]:
        """Per client: the live engines' KV pool in tokens, split evenly, from each phase's start."""
        n = self.scenario.clients.count
        per_client: list[list[tuple[float, int | None]]] = [[] for _ in range(n)]
        for t, phase in phases(self.scenario):
            share = max(1, pool_tokens(self.scenario, sum(phase.engines)) // n)
            for budgets in per_client:
                budgets.append((t, share))
        return per_client

    def run_path(
        self,
        schedules: list[list[tuple[float, int]]] | None = None,
        budgets: list[list[tuple[float, int | None]]] | None = None,
    ) -> Path:
        """Where the oracle's run is (or will be) stored; sweeps every phase not swept yet, to know its knees."""
        schedules = self.schedules() if schedules is None else schedules
        budgets = self.budgets() if budgets is None else budgets
        return cache_dir() / "runs" / _run_key(self.scenario, schedules, budgets)

    def run(self, **kwargs: Any) -> Trace:
        """The oracle's run of the scenario: read from the disk cache when this exact run was simulated before.

        The run is as deterministic as a sweep (the scenario's seeds, the knees' schedules), and at fleet scale it
        is a second simulation as long as the policy's own, so a warm cache skips it. Keyed by the whole scenario
        (its name and description aside), the resolved preset, the schedules and budgets, and :data:`_VERSION`.
        """
        schedules, budgets = self.schedules(), self.budgets()
        path = self.run_path(schedules, budgets)
        try:
            return load_trace(path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError):
            shutil.rmtree(path, ignore_errors=True)  # damaged (an interrupted copy, a full disk): simulate again
        trace = simulate(
            self.scenario,
            schedules=schedules,
            budgets=budgets,
            resolve_fraction=self.background_rps,
            **kwargs,
        )
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            save_trace(trace, tmp)
            tmp.rename(path)  # atomic: a reader sees the whole trace or none (a concurrent writer's copy wins)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # a read-only or full cache only costs time
            return trace
        # The stored copy, memory-mapped, in place of the arrays just simulated (the same values): at fleet scale
        # these are 200 MB, and the caller simulates its own run next.
        return load_trace(path)


def _run_key(
    scenario: Scenario, schedules: list[list[tuple[float, int]]], budgets: list[list[tuple[float, int | None]]]
) -> str:
    fields = dataclasses.asdict(scenario)
    fields.pop("name")
    fields.pop("description")
    fields["clients"].pop("job")  # the oracle's clients follow schedules, each alone: a job changes nothing of theirs
    description = {
        "version": (_VERSION, _RUN_VERSION),
        "scenario": fields,
        "preset": dataclasses.asdict(preset_for(scenario)),
        "schedules": schedules,
        "budgets": budgets,
    }
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()[:24]


def store_run(scenario: Scenario) -> None:
    """Simulate the oracle's run of ``scenario`` into the disk cache: the body of the worker process that runs it
    beside the policy's run (:func:`model_concurrency.lab.experiment.run_scenario`). Nothing comes back through the pipe
    (200 MB at fleet scale): the parent reads the stored copy, memory-mapped."""
    Oracle(scenario).run()
