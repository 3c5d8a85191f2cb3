"""The scenario generator: workloads nobody tuned a policy to, drawn at random, judged as a distribution.

(A little over 400 lines: the draw's ranges, the budget that keeps each draw's oracle affordable and the
distribution's summary lines are read together, and split they would each need the others' constants.)

A rule that helps one named scenario is not evidence; a distribution of workloads is. :func:`draw_scenario` draws
one scenario from a seed and an index, using only the scenario TOML schema (:mod:`.scenario`), so every draw is a
file that ``model-concurrency sim`` re-runs bit for bit. :func:`run_fuzz` draws ``n`` of them and runs every draw ×
policy (and each draw's oracle once) through the comparison study's machinery (:mod:`.compare`), then writes:

* ``DIR/fuzz.csv``: one row per draw × policy, the compare's summary columns and the draw's parameters;
* ``DIR/scenarios/*.toml``: every draw as run (``--scale`` already applied to its durations and event times);
* ``DIR/worst.md``: the draws where the default policy did worst against the oracle.

With ``as_job`` (``fuzz --as-job``) every draw runs with all its clients as one job's workers (``[clients] job``,
lab/job.py): the same draws from the same streams, only ``clients.job`` set after drawing, so the two tables
compare the coordinated rule with independent clients draw for draw, and the oracles (whose cache key leaves the
job out) are the same ones. Its fuzz.csv has a ``job`` column; without it the outputs are as they always were.

What is drawn: every engine preset; 1–4 engines and 1–3 replicas; ``max_num_seqs`` 16–512; prompts 32–4,000 tokens
and outputs 0–1,000 (0: the embedding preset), lognormal spreads up to 1.2, a heavy tail of long documents,
embeddings; 1–16 clients with floors 1–32, ceilings and polls of 5–60 s; events: engines added or removed, a replica
flap, another tenant on and off, a metrics outage, a rate limit; half the draws tell their clients the engine's
limits (``stated_limits``). The draw is a pure function of ``(seed, index)``, so the table is deterministic for a
seed whatever ``--jobs`` is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from model_concurrency.lab.compare import COLUMNS, markdown_table, run_study, write_csv, write_markdown
from model_concurrency.lab.scenario import Scenario, scenario_from_dict

__all__ = [
    "DRAW_COLUMNS",
    "JOB_NAME",
    "FuzzResult",
    "as_one_job",
    "draw_scenario",
    "fuzz_line",
    "queue_ok",
    "run_fuzz",
    "scenario_toml",
]

PRESETS = ("llama-8b-h100-80gb", "llama-8b-a100-80gb", "llama-8b-a100-40gb", "bge-m3")
EMBEDDING_PRESETS = frozenset({"bge-m3"})
# Run length before --scale: long enough for a 60 s poll to take a dozen decisions.
DURATION_S = (900.0, 1800.0)
ENGINES = (1, 4)
REPLICAS = (1, 3)
MAX_NUM_SEQS = (16, 512)
PROMPT_TOKENS = (32, 4000)
OUTPUT_TOKENS = (1, 1000)
MAX_SIGMA = 1.2
LONG_PROMPT_TOKENS = (2000, 12000)
CLIENTS = (1, 16)
FLOOR = (1, 32)
CEILINGS = (64, 128, 256, 512, 1024, 2048)
POLL_S = (5.0, 60.0)
REQUESTS_PER_MINUTE = (300.0, 30000.0)
# The oracle's sweeps of one draw may cost at most this many simulated requests (about 10 s of one idle core at
# 25,000 simulated requests per second), else the draw is drawn again: the sweeps, not the runs, are a draw's cost.
MAX_SWEEP_REQUESTS = 250_000.0
MAX_ATTEMPTS = 256
SWEEP_BISECTIONS = 6  # the knee's bisection after the grid of powers of two (lab/oracle.py)
# The clients' summed ceilings (the oracle's cap, up to which it sweeps) stay within this.
MAX_TOTAL_CEILING = 4096
# How often each ingredient appears in a draw.
P_SPREAD = 0.7
P_HEAVY_TAIL = 0.25
P_EVENT = {"engines": 0.2, "flap": 0.15, "tenant": 0.2, "outage": 0.15, "rate_limit": 0.1}
# Of the draws that add engines and flap a replica, the share whose engines arrive while the replica is down.
P_UNEQUAL = 0.5
# The share of draws whose clients are told the engine's limits (``[clients] stated_limits``), as an operator who
# knows the ``--max-num-seqs`` their engines were started with would; drawn from a stream of its own, so the rest
# of every draw is the same with or without it.
P_STATED = 0.5
STATED_STREAM = 7
# A draw's p99 queue passes "<= 2x the oracle's" below this too: an oracle that queues nothing would otherwise fail
# every policy for one engine step of queueing.
QUEUE_SLACK_S = 0.05
JAIN_GOOD = 0.9

#: The draw's parameters, as they appear beside the summary in fuzz.csv.
DRAW_COLUMNS = (
    "preset",
    "engines",
    "replicas",
    "max_num_seqs",
    "prompt_tokens",
    "output_tokens",
    "prompt_sigma",
    "output_sigma",
    "long_fraction",
    "long_prompt_tokens",
    "clients",
    "floor",
    "ceiling",
    "poll_s",
    "duration_s",
    "events",
    "rate_limit_rpm",
    "stated_limits",
)
FUZZ_COLUMNS = (*COLUMNS, *DRAW_COLUMNS)
#: The job every client of a draw joins under ``as_job``.
JOB_NAME = "fuzz"
#: The worst draws' table: the figures that make a draw bad, then the draw's parameters that explain it most often
#: (what ran on which engines, how long its prompts were, how many clients polled how fast).
_WORST_DRAW = {"output_sigma", "long_prompt_tokens", "ceiling", "duration_s", "rate_limit_rpm"}
WORST_COLUMNS = (
    "scenario",
    "goodput_ratio",
    "queue_time_p99_s",
    "oracle_queue_time_p99_s",
    "jain_fairness",
    *(c for c in DRAW_COLUMNS if c not in _WORST_DRAW),
)


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def _log_int(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    return min(bounds[1], max(bounds[0], round(_log_uniform(rng, bounds[0], bounds[1]))))


def _spread(rng: np.random.Generator) -> float:
    return round(float(rng.uniform(0.0, MAX_SIGMA)), 2) if rng.random() < P_SPREAD else 0.0


def _event_kinds(rng: np.random.Generator) -> frozenset[str]:
    """Which events a draw has, each with its own probability; drawn once per draw, before any redraw of its
    sizes (:func:`draw_dict`), so the budget on the oracle's cost does not thin out the draws with events."""
    kinds = {kind for kind, p in P_EVENT.items() if rng.random() < p}
    if "engines" in kinds:
        # With a flap, engines are only ever added: a replica restarted after a removal comes back whole.
        remove = rng.random() < 0.5 and "flap" not in kinds
        kinds.add("remove_engines" if remove else "add_engines")
        if "flap" in kinds and rng.random() < P_UNEQUAL:
            # The engines arrive while replica 0 is down, so it returns smaller than the others: a fleet that grew
            # one replica at a time (the oracle sweeps each replica shape).
            kinds.add("unequal")
    return frozenset(kinds - {"engines"})


def _events(rng: np.random.Generator, kinds: frozenset[str], duration: float, engines: int) -> list[dict[str, Any]]:
    """The events of ``kinds``, placed after the start's ramp.

    A change of engines comes before a replica flap, except in the draws marked ``unequal``: there the engines
    arrive while replica 0 is down, and it returns smaller than the others."""
    events: list[dict[str, Any]] = []

    def at(low: float, high: float) -> float:
        return round(float(rng.uniform(low, high)) * duration, 1)

    if "unequal" in kinds:
        down = at(0.2, 0.3)
        events.append({"at_s": down, "action": "replica_down", "replica": 0})
        events.append({"at_s": at(0.35, 0.5), "action": "add_engines", "count": int(rng.integers(1, 3))})
        events.append({"at_s": at(0.55, 0.7), "action": "replica_up", "replica": 0})
        kinds = kinds - {"add_engines", "flap"}
    if "remove_engines" in kinds:
        events.append({"at_s": at(0.25, 0.5), "action": "remove_engines", "count": int(rng.integers(1, engines))})
    if "add_engines" in kinds:
        events.append({"at_s": at(0.25, 0.5), "action": "add_engines", "count": int(rng.integers(1, 3))})
    if "flap" in kinds:
        down = at(0.55, 0.7)
        events.append({"at_s": down, "action": "replica_down", "replica": 0})
        events.append({"at_s": round(down + at(0.05, 0.2), 1), "action": "replica_up", "replica": 0})
    if "tenant" in kinds:
        on = at(0.2, 0.5)
        share = round(float(rng.uniform(0.2, 0.6)), 2)
        events.append({"at_s": on, "action": "background", "fraction_of_capacity": share})
        events.append({"at_s": round(on + at(0.15, 0.35), 1), "action": "background", "rate_rps": 0.0})
    if "outage" in kinds:
        down = at(0.3, 0.6)
        events.append({"at_s": down, "action": "metrics_down"})
        events.append({"at_s": round(down + at(0.05, 0.2), 1), "action": "metrics_up"})
    return sorted(events, key=lambda e: float(e["at_s"]))


def items_per_s(preset_name: str, max_num_seqs: int, prompt: float, output: float) -> float:
    """A rough throughput of one engine at its knee, from the preset's step model: each item costs its prompt's
    prefill and its share of ``output`` full decode steps. Only to keep draws affordable (:func:`sweep_cost`)."""
    from model_concurrency.engine.presets import get_preset

    step = get_preset(preset_name).step
    decode_step_ms = step.a_ms + step.memory_ms + step.b_ms_per_token * max_num_seqs
    ms = prompt * step.b_ms_per_token + output * decode_step_ms / max_num_seqs
    return 1000.0 / max(ms, 1e-3)


def sweep_cost(data: dict[str, Any]) -> float:
    """Simulated requests the oracle's knee sweeps of a draw cost (an estimate): levels × sweep length × the
    fleet's rate, per phase. The sweeps do not shorten with ``--scale``; they are what a draw costs."""
    from model_concurrency.lab.oracle import MEASURE_S, WARMUP_S

    fleet, w, c = data["fleet"], data["workload"], data["clients"]
    prompt = w["prompt_tokens"] + w.get("long_fraction", 0.0) * w.get("long_prompt_tokens", 0)
    rate = items_per_s(fleet["preset"], fleet["engine"]["max_num_seqs"], prompt, w["output_tokens"])
    engines = fleet["engines"] + sum(e.get("count", 0) for e in data["events"] if e["action"] == "add_engines")
    capacity_events = [e for e in data["events"] if e["action"] != "metrics_down" and e["action"] != "metrics_up"]
    replicas = fleet["replicas"] if capacity_events or "rate_limit" in data else 1  # else one replica is swept
    levels = math.log2(max(2, c["count"] * c["ceiling"])) + SWEEP_BISECTIONS
    return float(levels * (WARMUP_S + MEASURE_S) * rate * engines * replicas * (1 + len(capacity_events)))


def draw_dict(seed: int, index: int, scale: float = 1.0) -> dict[str, Any]:
    """Draw ``index`` of ``seed`` as the TOML tables of a scenario (durations already multiplied by ``scale``).

    The preset and the kinds of events are drawn first, once. A draw whose oracle would cost more than
    :data:`MAX_SWEEP_REQUESTS` has the rest drawn again (from the next stream of the same seed and index): large
    fast fleets get larger items, small items smaller fleets, and every preset and event keeps its share."""
    if not 0 < scale <= 1:
        raise ValueError("scale must be in (0, 1]")
    first = np.random.default_rng([seed, index])
    preset = PRESETS[int(first.integers(0, len(PRESETS)))]
    kinds = _event_kinds(first)
    cheapest: tuple[float, dict[str, Any]] | None = None
    for attempt in range(MAX_ATTEMPTS):
        data = _draw(np.random.default_rng([seed, index, attempt]), preset, kinds, seed, index, scale)
        cost = sweep_cost(data)
        if cost <= MAX_SWEEP_REQUESTS:
            return data
        if cheapest is None or cost < cheapest[0]:
            cheapest = (cost, data)
    assert cheapest is not None
    return cheapest[1]  # none within the budget: the least costly of the attempts


def _draw(
    rng: np.random.Generator, preset: str, kinds: frozenset[str], seed: int, index: int, scale: float
) -> dict[str, Any]:
    embedding = preset in EMBEDDING_PRESETS
    # Removing engines needs two; a replica flap needs a second replica to serve meanwhile.
    engines = int(rng.integers(2 if "remove_engines" in kinds else ENGINES[0], ENGINES[1] + 1))
    replicas = int(rng.integers(2 if "flap" in kinds else REPLICAS[0], REPLICAS[1] + 1))
    duration = round(float(rng.uniform(*DURATION_S)) * scale, 1)
    workload: dict[str, Any] = {
        "prompt_tokens": _log_int(rng, PROMPT_TOKENS),
        "output_tokens": 0 if embedding else _log_int(rng, OUTPUT_TOKENS),
        "prompt_sigma": _spread(rng),
        "output_sigma": 0.0 if embedding else _spread(rng),
        "embedding": embedding,
    }
    if rng.random() < P_HEAVY_TAIL:
        workload |= {
            "long_fraction": round(float(rng.uniform(0.02, 0.2)), 3),
            "long_prompt_tokens": _log_int(rng, LONG_PROMPT_TOKENS),
            "long_output_tokens": 0 if embedding else _log_int(rng, OUTPUT_TOKENS),
            "long_burst": int(rng.integers(1, 9)),
        }
    count = _log_int(rng, CLIENTS)
    floor = _log_int(rng, FLOOR)
    clients = {
        "count": count,
        "floor": floor,
        "ceiling": max(floor, min(int(rng.choice(CEILINGS)), MAX_TOTAL_CEILING // count)),
        "poll_s": round(_log_uniform(rng, *POLL_S), 1),
    }
    data: dict[str, Any] = {
        "name": f"fuzz-{seed}-{index:04d}",
        "description": f"drawn by model-concurrency fuzz --seed {seed} (draw {index}, scale {scale:g})",
        "seed": int(rng.integers(0, 2**31)),
        "duration_s": duration,
        "fleet": {
            "preset": preset,
            "engines": engines,
            "replicas": replicas,
            "engine": {"max_num_seqs": _log_int(rng, MAX_NUM_SEQS)},
        },
        "workload": workload,
        "clients": clients,
        "events": _events(rng, kinds, duration, engines),
    }
    if "rate_limit" in kinds:
        data["rate_limit"] = {"requests_per_minute": round(_log_uniform(rng, *REQUESTS_PER_MINUTE))}
    if np.random.default_rng([seed, index, STATED_STREAM]).random() < P_STATED:
        clients["stated_limits"] = True
    return data


def as_one_job(data: dict[str, Any], name: str = JOB_NAME) -> dict[str, Any]:
    """A drawn scenario's tables with all its clients in one job ``name``, and nothing else changed.

    Set after the draw rather than drawn, so the draw (and every stream it reads) is the one the independent
    clients ran: a difference between the two runs is the job's rule alone."""
    return {**data, "clients": {**data["clients"], "job": name}}


def draw_scenario(seed: int, index: int, scale: float = 1.0) -> Scenario:
    """Draw ``index`` of ``seed``: a checked :class:`Scenario`, the same one its TOML file loads to."""
    return scenario_from_dict(draw_dict(seed, index, scale))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def scenario_toml(data: dict[str, Any]) -> str:
    """A drawn scenario's tables as TOML (the few shapes a draw has: scalars, tables of scalars, ``[[events]]``)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict | list)]

    def table(name: str, body: dict[str, Any]) -> None:
        lines.append(f"\n[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in body.items() if not isinstance(v, dict))
        for key, sub in body.items():
            if isinstance(sub, dict):
                table(f"{name}.{key}", sub)

    for name, body in data.items():
        if isinstance(body, dict):
            table(name, body)
    for event in data.get("events", []):
        lines.append("\n[[events]]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in event.items())
    return "\n".join(lines) + "\n"


def draw_columns(data: dict[str, Any]) -> dict[str, Any]:
    """The draw's parameters as flat CSV columns (:data:`DRAW_COLUMNS`)."""
    fleet, w, c = data["fleet"], data["workload"], data["clients"]
    return {
        "preset": fleet["preset"],
        "engines": fleet["engines"],
        "replicas": fleet["replicas"],
        "max_num_seqs": fleet["engine"]["max_num_seqs"],
        "prompt_tokens": w["prompt_tokens"],
        "output_tokens": w["output_tokens"],
        "prompt_sigma": w["prompt_sigma"],
        "output_sigma": w["output_sigma"],
        "long_fraction": w.get("long_fraction", 0.0),
        "long_prompt_tokens": w.get("long_prompt_tokens", 0),
        "clients": c["count"],
        "floor": c["floor"],
        "ceiling": c["ceiling"],
        "poll_s": c["poll_s"],
        "duration_s": data["duration_s"],
        "events": " ".join(f"{e['action']}@{e['at_s']:g}" for e in data["events"]) or "-",
        "rate_limit_rpm": data.get("rate_limit", {}).get("requests_per_minute"),
        "stated_limits": bool(c.get("stated_limits", False)),
    }


def queue_ok(row: dict[str, Any]) -> bool:
    """The draw's p99 queue time is at most twice the oracle's (or :data:`QUEUE_SLACK_S`); no queue data passes."""
    mine, oracle = row.get("queue_time_p99_s"), row.get("oracle_queue_time_p99_s")
    if mine is None:
        return True
    return bool(mine <= max(2.0 * (oracle or 0.0), QUEUE_SLACK_S))


def _stated_split(rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The draws whose clients were told the engine's limits, and the others (each only when there are some)."""
    told = [r for r in rows if r.get("stated_limits")]
    untold = [r for r in rows if not r.get("stated_limits")]
    return [(label, part) for label, part in (("limits stated", told), ("limits not stated", untold)) if part]


def fuzz_line(rows: Sequence[dict[str, Any]], policy: str, subset: str = "") -> str:
    """``fuzz: policy NAME, n N, goodput median M p10 P min X, p99<=2x F%, jain>=0.9 J% of multi-client``; with
    ``subset``, the policy's name is followed by it in parentheses (``policy adaptive (limits stated)``)."""
    every = [r for r in rows if r["policy"] == policy]
    mine = [r for r in every if not r.get("unscored")]
    ratios = sorted(r["goodput_ratio"] for r in mine if r.get("goodput_ratio") is not None)
    if ratios:
        median = statistics.median(ratios)
        p10 = float(np.percentile(ratios, 10))
        goodput = f"goodput median {median:.3f} p10 {p10:.3f} min {ratios[0]:.3f}"
    else:
        goodput = "goodput median - p10 - min -"
    queue = 100.0 * sum(queue_ok(r) for r in mine) / len(mine) if mine else 0.0
    multi = [r for r in mine if r["clients"] > 1]
    fair = 100.0 * sum((r.get("jain_fairness") or 0.0) >= JAIN_GOOD for r in multi) / len(multi) if multi else 100.0
    unscored = f", unscored {len(every) - len(mine)}" if len(every) > len(mine) else ""
    return (
        f"fuzz: policy {policy}{f' ({subset})' if subset else ''}, n {len(mine)}, {goodput}, p99<=2x {queue:.0f}%, "
        f"jain>={JAIN_GOOD:g} {fair:.0f}% of multi-client{unscored}"
    )


@dataclass(slots=True)
class FuzzResult:
    rows: list[dict[str, Any]]
    lines: list[str]  # one fuzz line per policy, the default policy's last
    written: list[Path]
    unscored: dict[str, str] = field(default_factory=dict)  # draw -> why the lab could not score it


def _line_order(policies: Sequence[str], default: str) -> list[str]:
    return [p for p in policies if p != default] + [p for p in policies if p == default]


def worst_rows(rows: Sequence[dict[str, Any]], policy: str, count: int = 10) -> list[dict[str, Any]]:
    """The ``count`` draws where ``policy`` reached the lowest share of the oracle's goodput."""
    mine = [r for r in rows if r["policy"] == policy and r.get("goodput_ratio") is not None]
    return sorted(mine, key=lambda r: (r["goodput_ratio"], r["scenario"]))[:count]


def run_fuzz(
    n: int,
    seed: int,
    policies: Sequence[str],
    *,
    out: str | Path,
    scale: float = 1.0,
    jobs: int | None = None,
    default_policy: str = "adaptive",
    progress: Callable[[str], None] | None = None,
    as_job: bool = False,
) -> FuzzResult:
    """Draw ``n`` scenarios from ``seed``, run each with every policy and its oracle, write the table and files.

    ``as_job``: every draw's clients run as one job (:func:`as_one_job`); the scenario files are the draws as run
    (with ``job``), and fuzz.csv gains a ``job`` column, only then, so a run without it writes what it always did."""
    if n < 1:
        raise ValueError("n must be >= 1")
    out = Path(out)
    drawn = [draw_dict(seed, i, scale) for i in range(n)]
    if as_job:
        drawn = [as_one_job(d) for d in drawn]
    folder = out / "scenarios"
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for data in drawn:
        path = folder / f"{data['name']}.toml"
        path.write_text(scenario_toml(data))
    scenarios = [scenario_from_dict(d) for d in drawn]
    study = run_study(scenarios, policies, jobs=jobs, progress=progress)
    params = {d["name"]: draw_columns(d) for d in drawn}
    rows = [{**row, **params[row["scenario"]]} for row in study.rows]
    if as_job:
        in_job = {d["name"]: bool(d["clients"].get("job")) for d in drawn}
        rows = [{**row, "job": in_job[row["scenario"]]} for row in rows]
    written.append(write_csv(rows, out / "fuzz.csv", (*FUZZ_COLUMNS, "job") if as_job else FUZZ_COLUMNS))
    judged = default_policy if default_policy in policies else policies[0]
    worst = worst_rows(rows, judged)
    written.append(write_markdown(worst, out / "worst.md", WORST_COLUMNS))
    lines = [fuzz_line(part, p, label) for p in policies for label, part in _stated_split(rows)]
    lines += [fuzz_line(rows, p) for p in _line_order(policies, default_policy)]
    return FuzzResult(rows=rows, lines=lines, written=[*written, folder], unscored=study.unscored)


def worst_table(result: FuzzResult, policy: str, count: int = 10) -> str:
    """The worst draws of ``policy`` as a Markdown table (what ``fuzz`` prints before its summary lines)."""
    return markdown_table(worst_rows(result.rows, policy, count), WORST_COLUMNS)
