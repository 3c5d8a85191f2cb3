"""Scenarios: a fleet, a workload, fan-out clients and a timeline of events, read from a TOML file.

(Over 400 lines: the TOML schema's dataclasses and their validation, one per table, kept with the loader that checks
them.)

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
[fleet.frontend]        # overrides of the preset's API-server cost (FrontEndCost: fixed_ms, per_token_ms,
workers = 1             # workers, latency_ms): a front-end that limits before the engine does

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
guard = true            # the client-side growth guard (false: the policy's answer unchanged)
outage_handover = true  # after the grace, hold while own calls look healthy (false: the floor)
poll_jitter = 0.1       # each wait is poll_s x (1 +- up to this), per poll; absent: MODEL_CONCURRENCY_POLL_JITTER (0.1)
stated_limits = false   # true: the clients were told the engines' max_num_seqs and max_num_batched_tokens (the
                        # fleet's engine config, over its engines x replicas at the start), as an operator states
                        # them in a ModelSpec; their Observations then carry them in ``limits``
job = "ingest"          # the clients are one job's workers (lab/job.py); or one name per client, "" = independent

[background]            # open-loop traffic from other tenants (gamma arrivals; burstiness 1 = Poisson)
rate_rps = 0.0
burstiness = 1.0

[interactive]           # an interactive tenant beside the batch (lab/neighbour.py): open-loop, bursty, short prompts
burst_rps = 15.0        # arrivals while it bursts, for burst_s seconds, then idle_rps for idle_s, from first_burst_s
idle_rps = 1.0
ttft_target_s = 0.5     # its own time-to-first-token goal (the plot's line)

[rate_limit]            # a hosted endpoint's limit in front of the fleet (429 + Retry-After); absent = none
requests_per_minute = 600
tokens_per_minute = 400000

[[events]]
at_s = 600
action = "add_engines"  # add_engines, remove_engines, replica_down, replica_up, metrics_down, metrics_up,
count = 3               # background (rate_rps or fraction_of_capacity)
```
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from model_concurrency.bundled import bundled_dir

__all__ = [
    "ACTIONS",
    "Background",
    "Clients",
    "Event",
    "Fleet",
    "Interactive",
    "RateLimit",
    "Scenario",
    "Workload",
    "bundled_scenarios",
    "find_scenario",
    "load_scenario",
]

ACTIONS = frozenset(
    {"add_engines", "remove_engines", "replica_down", "replica_up", "metrics_down", "metrics_up", "background"}
)
# Events that change what the engine can serve: the oracle re-sweeps its knee after each one.
CAPACITY_ACTIONS = frozenset({"add_engines", "remove_engines", "replica_down", "replica_up", "background"})

_T = TypeVar("_T")
_LOW = "at_least"  # a field's metadata key: (the bound, whether the bound itself is excluded)


def _toml(value: Any) -> str:
    """A value as it would be written in the TOML file, so an error quotes what the user typed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return f"[{', '.join(_toml(item) for item in value)}]"
    return repr(value)


def _at_least(where: str, key: str, value: float | None, low: float, *, strict: bool = False) -> None:
    if value is None:
        return
    if value < low or (strict and value == low):
        raise ValueError(f"{where}{key} = {_toml(value)}: must be {'>' if strict else '>='} {low:g}")


def _ge(default: _T, low: float) -> _T:
    """A field whose value must be ``>= low`` (None: absent, passes). The bound stands beside the field it limits,
    and :func:`_check_bounds` checks every bounded field of a table in one loop."""
    return field(default=default, metadata={_LOW: (low, False)})


def _gt(default: _T, low: float) -> _T:
    """A field whose value must be ``> low`` (None: absent, passes)."""
    return field(default=default, metadata={_LOW: (low, True)})


def _check_bounds(table: Any, where: str) -> None:
    """Each field of ``table`` declared with :func:`_ge` or :func:`_gt` within its bound, in field order, or a
    ValueError that quotes the key as the TOML file spells it (``where`` is the table's prefix)."""
    for f in dataclasses.fields(table):
        if _LOW in f.metadata:
            low, strict = f.metadata[_LOW]
            _at_least(where, f.name, getattr(table, f.name), low, strict=strict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    preset: str = "llama-8b-h100"
    engines: int = _ge(1, 1)
    replicas: int = _ge(1, 1)
    balancer: str = "least-loaded"
    engine: dict[str, Any] = field(default_factory=dict)
    frontend: dict[str, Any] = field(default_factory=dict)  # overrides of the preset's API-server cost

    def __post_init__(self) -> None:
        _check_bounds(self, "fleet.")
        if self.balancer not in ("least-loaded", "round-robin"):
            raise ValueError(f'fleet.balancer = {_toml(self.balancer)}: must be "least-loaded" or "round-robin"')


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    prompt_tokens: int = _ge(512, 1)
    output_tokens: int = _ge(128, 0)
    prompt_sigma: float = _ge(0.0, 0)
    output_sigma: float = _ge(0.0, 0)
    embedding: bool = False
    # A heavy tail (heavy-tail.toml): this share of items is long, in runs of long_burst consecutive items.
    long_fraction: float = _ge(0.0, 0)
    long_prompt_tokens: int = 0
    long_output_tokens: int = _ge(0, 0)
    long_burst: int = _ge(1, 1)

    def __post_init__(self) -> None:
        if self.long_fraction > 1:
            raise ValueError(f"workload.long_fraction = {self.long_fraction}: must be in [0, 1]")
        if self.long_fraction > 0:  # the long items' sizes are read only when there are long items
            _at_least("workload.", "long_prompt_tokens", self.long_prompt_tokens, 1)
            _at_least("workload.", "long_output_tokens", self.long_output_tokens, 0 if self.embedding else 1)
        _check_bounds(self, "workload.")


@dataclass(frozen=True, slots=True, kw_only=True)
class Clients:
    count: int = _ge(1, 1)
    floor: int = _ge(4, 1)
    ceiling: int = 512
    poll_s: float = _gt(12.0, 0)
    grace_polls: int = _ge(3, 0)
    items: int | None = _ge(None, 1)  # per client; None = as many as the run has time for
    guard: bool = True  # the client-side growth guard (MODEL_CONCURRENCY_GROWTH_GUARD)
    outage_handover: bool = True  # after the grace, hand over to the guard (MODEL_CONCURRENCY_OUTAGE_HANDOVER)
    # Batch jobs: one entry per client, its item count and its deadline (simulated seconds from the start); they
    # override ``items`` and make ``deadlines_met`` a summary key.
    job_items: tuple[int, ...] | None = None
    deadlines_s: tuple[float, ...] | None = None
    # vLLM's per-request ``priority`` carried by the batch's calls (read only by a "priority" engine).
    priority: int = 0
    # Each wait between two polls is poll_s × (1 ± up to this), drawn per poll by the controller (the live rule):
    # separate processes drift apart instead of polling in lock-step. None: the production knob,
    # MODEL_CONCURRENCY_POLL_JITTER (0.1 unless set), read when the run starts.
    poll_jitter: float | None = _ge(None, 0)
    # Whether the clients were told the engines' limits (ModelSpec.max_num_seqs, max_num_batched_tokens): from the
    # fleet's engine config, per engine, over the engines the fleet starts with (lab/world.py). A stated total the
    # fleet outgrows (an add_engines event) is then contradicted by the page, as a stale config line would be.
    stated_limits: bool = False
    # One job for every client (its name), or one entry per client naming its job ("": independent): a job's
    # clients share one runtime and lease their permits from it (lab/job.py), as a Ray job's workers do.
    job: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _check_bounds(self, "clients.")
        job = self.job
        if isinstance(job, list | tuple) and all(isinstance(name, str) for name in job):
            if len(job) != self.count:
                raise ValueError(f"clients.job has {len(job)} entries: one per client (count = {self.count})")
            object.__setattr__(self, "job", tuple(job))
        elif job is not None and not (isinstance(job, str) and job):
            raise ValueError(f'clients.job = {_toml(job)}: must be a name, or an array of names per client ("": none)')
        if self.poll_jitter is not None and self.poll_jitter >= 1:
            raise ValueError(f"clients.poll_jitter = {_toml(self.poll_jitter)}: must be < 1 (a share of poll_s)")
        if self.ceiling < self.floor:
            raise ValueError(f"clients.ceiling = {self.ceiling}: must be >= clients.floor ({self.floor})")
        for key, kind in (("job_items", int), ("deadlines_s", float)):
            values = getattr(self, key)
            if values is None:
                continue
            if not isinstance(values, list | tuple) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values
            ):
                raise ValueError(f"clients.{key} = {_toml(values)}: must be an array of positive numbers")
            if len(values) != self.count:
                raise ValueError(f"clients.{key} has {len(values)} entries: one per client (count = {self.count})")
            object.__setattr__(self, key, tuple(kind(v) for v in values))

    def items_of(self, client: int) -> int | None:
        """Client ``client``'s item count: its job's, else ``items`` (None: as many as the run has time for)."""
        return self.job_items[client] if self.job_items is not None else self.items


@dataclass(frozen=True, slots=True, kw_only=True)
class Background:
    rate_rps: float = _ge(0.0, 0)
    fraction_of_capacity: float | None = _ge(None, 0)  # overrides rate_rps: a share of the fleet's peak throughput
    burstiness: float = _gt(1.0, 0)
    prompt_tokens: int | None = _ge(None, 1)  # defaults to the workload's
    output_tokens: int | None = _ge(None, 0)

    def __post_init__(self) -> None:
        _check_bounds(self, "background.")


@dataclass(frozen=True, slots=True, kw_only=True)
class Interactive:
    """An interactive tenant (lab/neighbour.py): open-loop gamma arrivals at ``burst_rps`` for ``burst_s``, then
    ``idle_rps`` for ``idle_s``, repeating from ``first_burst_s`` (``idle_rps`` before it); short prompts; its own
    TTFT target. Modelled on llm-d-batch-gateway's benchmark (15 req/s for 90 s, then 1 req/s)."""

    burst_rps: float = _ge(15.0, 0)
    idle_rps: float = _ge(1.0, 0)
    burst_s: float = _gt(90.0, 0)
    idle_s: float = _gt(90.0, 0)
    first_burst_s: float = _ge(60.0, 0)
    burstiness: float = _gt(1.0, 0)
    prompt_tokens: int = _ge(256, 1)
    output_tokens: int = _ge(128, 1)
    prompt_sigma: float = _ge(0.0, 0)
    output_sigma: float = _ge(0.0, 0)
    ttft_target_s: float = _gt(0.5, 0)
    priority: int = 0  # vLLM's request priority for its calls (lower first on a "priority" engine)

    def __post_init__(self) -> None:
        _check_bounds(self, "interactive.")

    def in_burst(self, t: float) -> bool:
        """Whether the tenant bursts at simulated time ``t``."""
        if t < self.first_burst_s:
            return False
        return (t - self.first_burst_s) % (self.burst_s + self.idle_s) < self.burst_s

    def next_change(self, t: float) -> float:
        """The next time after ``t`` at which the tenant starts or stops a burst."""
        if t < self.first_burst_s:
            return self.first_burst_s
        period = self.burst_s + self.idle_s
        start = self.first_burst_s + (t - self.first_burst_s) // period * period
        return start + self.burst_s if t < start + self.burst_s else start + period

    def scaled(self, scale: float) -> Interactive:
        return dataclasses.replace(
            self, burst_s=self.burst_s * scale, idle_s=self.idle_s * scale, first_burst_s=self.first_burst_s * scale
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """Requests and tokens per minute for the fan-out clients' calls (lab/ratelimit.py); both absent = none."""

    requests_per_minute: float | None = _gt(None, 0)
    tokens_per_minute: float | None = _gt(None, 0)
    refusal_latency_s: float = _ge(0.01, 0)

    def __post_init__(self) -> None:
        _check_bounds(self, "rate_limit.")

    @property
    def active(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None

    def items_per_s(self, tokens_per_item: float) -> float | None:
        """The most items per second the limit lets through, for items of ``tokens_per_item`` tokens."""
        rates = []
        if self.requests_per_minute is not None:
            rates.append(self.requests_per_minute / 60.0)
        if self.tokens_per_minute is not None:
            rates.append(self.tokens_per_minute / 60.0 / max(tokens_per_item, 1.0))
        return min(rates) if rates else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    at_s: float
    action: str
    count: int = 1
    replica: int = 0
    rate_rps: float | None = None
    fraction_of_capacity: float | None = None

    def __post_init__(self) -> None:
        where = f"[[events]] {self.action} at {self.at_s:g} s: "
        if self.action not in ACTIONS:
            known = ", ".join(sorted(ACTIONS))
            action = _toml(self.action)
            raise ValueError(f"[[events]] at {self.at_s:g} s: unknown event action {action}; known: {known}")
        _at_least(where, "at_s", self.at_s, 0)
        _at_least(where, "count", self.count, 1)
        _at_least(where, "replica", self.replica, 0)
        _at_least(where, "rate_rps", self.rate_rps, 0)
        _at_least(where, "fraction_of_capacity", self.fraction_of_capacity, 0)

    @property
    def changes_capacity(self) -> bool:
        return self.action in CAPACITY_ACTIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    description: str = ""
    seed: int = _ge(0, 0)
    duration_s: float = _gt(1200.0, 0)
    trace_dt_s: float = _gt(1.0, 0)
    fleet: Fleet = field(default_factory=Fleet)
    workload: Workload = field(default_factory=Workload)
    clients: Clients = field(default_factory=Clients)
    background: Background = field(default_factory=Background)
    rate_limit: RateLimit = field(default_factory=RateLimit)
    interactive: Interactive | None = None
    events: tuple[Event, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must be a non-empty string")
        _check_bounds(self, "")
        for event in self.events:
            if event.action in ("replica_down", "replica_up") and event.replica >= self.fleet.replicas:
                raise ValueError(
                    f"[[events]] {event.action} at {event.at_s:g} s: replica = {event.replica} does not exist "
                    f"(fleet.replicas = {self.fleet.replicas}; replicas are numbered from 0)"
                )

    def scaled(self, scale: float) -> Scenario:
        """The same scenario with every duration and event time multiplied by ``scale`` (0 < scale <= 1)."""
        if not 0 < scale <= 1:
            raise ValueError("scale must be in (0, 1]")
        if scale == 1:
            return self
        events = tuple(dataclasses.replace(e, at_s=e.at_s * scale) for e in self.events)
        clients = self.clients
        if clients.deadlines_s is not None:
            deadlines = tuple(d * scale for d in clients.deadlines_s)
            clients = dataclasses.replace(clients, deadlines_s=deadlines)
        if clients.job_items is not None:
            clients = dataclasses.replace(clients, job_items=tuple(max(1, round(n * scale)) for n in clients.job_items))
        interactive = self.interactive.scaled(scale) if self.interactive is not None else None
        return dataclasses.replace(
            self, duration_s=self.duration_s * scale, events=events, clients=clients, interactive=interactive
        )

    @property
    def capacity_change_times(self) -> list[float]:
        return sorted({e.at_s for e in self.events if e.changes_capacity and e.at_s < self.duration_s})


# What a TOML value must be for each field annotation (the dataclasses above, read as strings under
# ``from __future__ import annotations``): a wrong type is reported with the key before anything compares it.
_EXPECTED: dict[str, tuple[str, tuple[type, ...]]] = {
    "int": ("an integer", (int,)),
    "int | None": ("an integer", (int,)),
    "float": ("a number", (int, float)),
    "float | None": ("a number", (int, float)),
    "str": ("a string", (str,)),
    "bool": ("true or false", (bool,)),
    "dict[str, Any]": ("a table", (dict,)),
}


def _check_types(cls: type, table: dict[str, Any], where: str) -> None:
    for f in dataclasses.fields(cls):
        if f.name not in table or str(f.type) not in _EXPECTED:
            continue
        value = table[f.name]
        expected, types = _EXPECTED[str(f.type)]
        # TOML true/false are Python bools, which are ints: a count of `true` is a mistake, not 1.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ValueError(f"{where}{f.name} = {_toml(value)}: expected {expected}")


def _build(cls: type, table: Any, where: str) -> Any:
    if table is None:
        return cls()
    if not isinstance(table, dict):
        raise ValueError(f"[{where}] must be a table")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(table) - known
    if unknown:
        raise ValueError(f"[{where}] has unknown keys {sorted(unknown)}; known: {sorted(known)}")
    prefix = "[[events]] " if where == "events" else f"{where}."
    _check_types(cls, table, prefix)
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in table]
    if missing:
        raise ValueError(f"{prefix.rstrip(' .')} {table!r} is missing {', '.join(missing)}")
    return cls(**table)


def scenario_from_dict(data: dict[str, Any], default_name: str = "scenario") -> Scenario:
    data = dict(data)
    raw_events = data.pop("events", [])
    if not isinstance(raw_events, list):
        raise ValueError("events must be an array of tables ([[events]])")
    events = tuple(_build(Event, e, "events") for e in raw_events)
    parts = {
        "fleet": _build(Fleet, data.pop("fleet", None), "fleet"),
        "workload": _build(Workload, data.pop("workload", None), "workload"),
        "clients": _build(Clients, data.pop("clients", None), "clients"),
        "background": _build(Background, data.pop("background", None), "background"),
        "rate_limit": _build(RateLimit, data.pop("rate_limit", None), "rate_limit"),
        "interactive": _build(Interactive, data.pop("interactive"), "interactive") if "interactive" in data else None,
    }
    data.setdefault("name", default_name)
    top = {f.name for f in dataclasses.fields(Scenario)} - set(parts) - {"events"}
    unknown = set(data) - top
    if unknown:
        raise ValueError(f"scenario has unknown keys {sorted(unknown)}")
    _check_types(Scenario, data, "")
    _check_engine(parts["fleet"])
    return Scenario(events=tuple(sorted(events, key=lambda e: e.at_s)), **parts, **data)


def _check_engine(fleet: Fleet) -> None:
    """The engine preset exists and ``[fleet.engine]`` overrides fields it has, with values it accepts."""
    try:
        from model_concurrency.engine.presets import EnginePreset, get_preset
    except ModuleNotFoundError:  # no simulator installed: the command that simulates reports the missing extra
        return
    try:
        preset = get_preset(fleet.preset)
    except ValueError as exc:
        raise ValueError(f"fleet.preset = {_toml(fleet.preset)}: {exc}") from None
    known = {f.name for f in dataclasses.fields(EnginePreset)} - {"name", "model_name", "step", "frontend"}
    unknown = set(fleet.engine) - known
    if unknown:
        raise ValueError(f"[fleet.engine] has unknown keys {sorted(unknown)}; known: {sorted(known)}")
    _check_types(EnginePreset, fleet.engine, "fleet.engine.")
    try:
        preset.replace(**fleet.engine)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"[fleet.engine] {exc}") from None
    from model_concurrency.engine.steptime import FrontEndCost

    known = {f.name for f in dataclasses.fields(FrontEndCost)}
    unknown = set(fleet.frontend) - known
    if unknown:
        raise ValueError(f"[fleet.frontend] has unknown keys {sorted(unknown)}; known: {sorted(known)}")
    _check_types(FrontEndCost, fleet.frontend, "fleet.frontend.")
    try:
        dataclasses.replace(preset.frontend, **fleet.frontend)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"[fleet.frontend] {exc}") from None


def bundled_scenarios() -> dict[str, Path]:
    """The scenarios shipped with the package (the repository's ``sims/``), by file stem."""
    return {p.stem: p for p in sorted(bundled_dir("sims").glob("*.toml"))}


def find_scenario(ref: str | Path) -> Path:
    """A scenario file: ``ref`` itself when it exists, else the bundled scenario of that name (``ramp``).

    Raises ``ValueError`` naming the bundled scenarios when neither exists.
    """
    path = Path(ref)
    if path.is_file():
        return path
    bundled = bundled_scenarios()
    stem = path.stem if path.suffix == ".toml" else path.name
    if path.parent in (Path("."), Path("sims")) and stem in bundled:
        return bundled[stem]
    raise ValueError(
        f"no scenario file {str(ref)!r} and no bundled scenario of that name; bundled: {', '.join(bundled)}"
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario TOML file (or a bundled scenario by name); a ValueError names any bad or unknown key."""
    path = find_scenario(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return scenario_from_dict(data, default_name=path.stem)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
