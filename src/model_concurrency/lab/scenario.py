"""Scenarios: a fleet, a workload, fan-out clients and a timeline of events, read from a TOML file.

A scenario is data, so adding one is adding a file under ``sims/``; nothing in the lab special-cases a name.
Every scenario carries its seed, so a run is reproducible bit for bit. ``scale`` shortens a run (tests and
notebooks use it): durations and event times are multiplied by it, engine and workload sizes are not.

```toml
name = "gpu-added"
seed = 7
duration_s = 1500

[fleet]                 # one or more replicas, each a server with one or more engines
preset = "llama-8b-h100"
engines = 1
replicas = 1
balancer = "least-loaded"   # or "round-robin"
[fleet.engine]          # overrides of the preset's fields
max_num_seqs = 256

[workload]              # what each fan-out item asks of the model
prompt_tokens = 512     # mean; lognormal with sigma prompt_sigma (0 = fixed)
output_tokens = 128
prompt_sigma = 0.0
output_sigma = 0.0

[clients]               # closed-loop fan-out clients, each with its own controller and limiter
count = 1
floor = 4
ceiling = 512
poll_s = 12
grace_polls = 3

[background]            # open-loop traffic from other tenants (gamma arrivals; burstiness 1 = Poisson)
rate_rps = 0.0
burstiness = 1.0

[[events]]
at_s = 600
action = "add_engines"  # add_engines, remove_engines, replica_down, replica_up, metrics_down, metrics_up,
count = 3               # background (rate_rps or fraction_of_capacity)
```
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ACTIONS", "Background", "Clients", "Event", "Fleet", "Scenario", "Workload", "load_scenario"]

ACTIONS = frozenset(
    {"add_engines", "remove_engines", "replica_down", "replica_up", "metrics_down", "metrics_up", "background"}
)
# Events that change what the engine can serve: the oracle re-sweeps its knee after each one.
CAPACITY_ACTIONS = frozenset({"add_engines", "remove_engines", "replica_down", "replica_up", "background"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    preset: str = "llama-8b-h100"
    engines: int = 1
    replicas: int = 1
    balancer: str = "least-loaded"
    engine: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    prompt_tokens: int = 512
    output_tokens: int = 128
    prompt_sigma: float = 0.0
    output_sigma: float = 0.0
    embedding: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Clients:
    count: int = 1
    floor: int = 4
    ceiling: int = 512
    poll_s: float = 12.0
    grace_polls: int = 3
    items: int | None = None  # per client; None = as many as the run has time for


@dataclass(frozen=True, slots=True, kw_only=True)
class Background:
    rate_rps: float = 0.0
    fraction_of_capacity: float | None = None  # overrides rate_rps: a share of the fleet's peak throughput
    burstiness: float = 1.0
    prompt_tokens: int | None = None  # defaults to the workload's
    output_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    at_s: float
    action: str
    count: int = 1
    replica: int = 0
    rate_rps: float | None = None
    fraction_of_capacity: float | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown event action {self.action!r}; known: {', '.join(sorted(ACTIONS))}")
        if self.at_s < 0:
            raise ValueError("event at_s must be >= 0")

    @property
    def changes_capacity(self) -> bool:
        return self.action in CAPACITY_ACTIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    description: str = ""
    seed: int = 0
    duration_s: float = 1200.0
    trace_dt_s: float = 1.0
    fleet: Fleet = field(default_factory=Fleet)
    workload: Workload = field(default_factory=Workload)
    clients: Clients = field(default_factory=Clients)
    background: Background = field(default_factory=Background)
    events: tuple[Event, ...] = ()

    def __post_init__(self) -> None:
        if self.duration_s <= 0:
            raise ValueError("duration_s must be > 0")
        if self.clients.count < 1:
            raise ValueError("clients.count must be >= 1")
        if self.fleet.balancer not in ("least-loaded", "round-robin"):
            raise ValueError(f"unknown balancer {self.fleet.balancer!r}")

    def scaled(self, scale: float) -> Scenario:
        """The same scenario with every duration and event time multiplied by ``scale`` (0 < scale <= 1)."""
        if not 0 < scale <= 1:
            raise ValueError("scale must be in (0, 1]")
        if scale == 1:
            return self
        events = tuple(dataclasses.replace(e, at_s=e.at_s * scale) for e in self.events)
        return dataclasses.replace(self, duration_s=self.duration_s * scale, events=events)

    @property
    def capacity_change_times(self) -> list[float]:
        return sorted({e.at_s for e in self.events if e.changes_capacity and e.at_s < self.duration_s})


def _build(cls: type, table: Any, where: str) -> Any:
    if table is None:
        return cls()
    if not isinstance(table, dict):
        raise ValueError(f"[{where}] must be a table")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(table) - known
    if unknown:
        raise ValueError(f"[{where}] has unknown keys {sorted(unknown)}; known: {sorted(known)}")
    return cls(**table)


def scenario_from_dict(data: dict[str, Any], default_name: str = "scenario") -> Scenario:
    data = dict(data)
    events = tuple(_build(Event, e, "events") for e in data.pop("events", []))
    parts = {
        "fleet": _build(Fleet, data.pop("fleet", None), "fleet"),
        "workload": _build(Workload, data.pop("workload", None), "workload"),
        "clients": _build(Clients, data.pop("clients", None), "clients"),
        "background": _build(Background, data.pop("background", None), "background"),
    }
    data.setdefault("name", default_name)
    top = {f.name for f in dataclasses.fields(Scenario)} - set(parts) - {"events"}
    unknown = set(data) - top
    if unknown:
        raise ValueError(f"scenario has unknown keys {sorted(unknown)}")
    return Scenario(events=tuple(sorted(events, key=lambda e: e.at_s)), **parts, **data)


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario TOML file; a clear ValueError names any unknown key."""
    path = Path(path)
    with path.open("rb") as fh:
        try:
            data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: {exc}") from None
    try:
        return scenario_from_dict(data, default_name=path.stem)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
