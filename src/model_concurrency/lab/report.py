"""The results page, generated: Markdown from the CSVs of one run of the comparisons behind it.

A page of figures edited by hand mixes versions of the code: a table measured before a change sits beside one
measured after it, and nothing on the page says which. So docs/results.md is written only by ``model-concurrency
report`` (cli/report.py), which runs the bundled comparison, the generator and the cheap live checks in one go at
one commit, and by this module: pure functions of rows (the CSVs, read back) and of :class:`Run`, the run's record
(commit, commands, the live checks' output), so the page can be rebuilt from a work folder without running
anything and tested on rows made by hand. Each figure sits in the section of the command that made it; every goal
the default policy misses is listed under "Known gaps" with the draws or scenarios that miss it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from model_concurrency.lab.ablation import BUNDLED_GOOD, figures
from model_concurrency.lab.compare import markdown_table
from model_concurrency.lab.fuzz import JAIN_GOOD, QUEUE_SLACK_S, WORST_COLUMNS, queue_ok, worst_rows
from model_concurrency.lab.oracle import KNEE_FRACTION
from model_concurrency.lab.summary import TIME_TO_WINDOW_S

__all__ = ["FAMILIES", "MAX_WORDS", "Family", "Run", "build_page"]

# The goals a default policy is held to on the generator's draws (and each bundled scenario to BUNDLED_GOOD).
MEDIAN_GOAL = 0.99
P10_GOAL = 0.95
SHARE_GOAL = 90.0  # percent of draws (p99 within 2x the oracle's; Jain >= 0.9 of the multi-client draws)
MAX_WORDS = 6000
WORST_SHOWN = 5  # draws named per missed goal
DASH = "—"


@dataclass(frozen=True, slots=True)
class Family:
    """Bundled scenarios that test one thing, shown in one table."""

    title: str
    about: str
    scenarios: tuple[str, ...]


# Each family: its title and scenarios on one line, what they test on the next.
_FAMILIES = """
Single engine: ramp long-prompts heavy-tail metrics-outage
One client on one engine from a cold start: the sequence slots bind (`ramp`), or the KV cache does (long prompts, \
a heavy tail of long documents); `metrics-outage` loses the metrics page for two minutes.
Capacity changes: gpu-added replica-lost
The fleet changes under a running client: engines added (capacity ×4), a replica lost behind the balancer.
Shared engines: multi-client multi-client-32 fleet-1000
Independent clients, each with its own controller and no coordinator, share the engines: fairness counts as much \
as goodput.
One job: multi-client-job fleet-1000-jobs
The same clients as jobs' workers: one runtime per job reads the engines and leases its target to them.
Neighbours and interactive tenants: noisy-neighbor interactive-bursts interactive-bursts-2x interactive-bursts-priority
Another tenant's traffic shares the engine: a burst to 70 % of capacity, or an interactive tenant beside batch jobs \
with deadlines, on a first-come engine or one that schedules by priority (`-priority`).
Rate limits: rate-limited
A hosted endpoint's requests- and tokens-per-minute limit in front of the engine: 429 with Retry-After.
Front end and embeddings: embed-batch embed-shared embed-shared-start front-end-bound
Embedding engines, whose requests finish in one step, alone or shared, and an API server slower than its engine.
"""
_LINES = _FAMILIES.strip().splitlines()
FAMILIES = tuple(
    Family(head.split(":")[0], about, tuple(head.split(":")[1].split()))
    for head, about in zip(_LINES[::2], _LINES[1::2], strict=True)
)
_OTHER = Family("Other scenarios", "Scenarios outside the bundled families.", ())


@dataclass(frozen=True, slots=True)
class Run:
    """The record of one report run: where the code stood, and the commands whose output the page shows."""

    commit: str  # "abc1234", "abc1234 (dirty)" or "unknown"
    version: str
    generated: str  # the date of the run
    command: str  # the report's own command line
    default_policy: str
    policies: tuple[str, ...]
    bundled_command: str | None = None  # None: not run
    fuzz_command: str | None = None
    live_command: str | None = None
    live_output: str | None = None  # the live checks' stdout
    live_status: int | None = None  # their exit status
    live_skipped: str = ""  # why they did not run
    live_misses: tuple[str, ...] = ()  # the live goals missed, as the command read them from the output


def _ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.3f}"


def _pct(value: float | None) -> str:
    return DASH if value is None else f"{value:.0f} %"


def _seconds(value: float | None) -> str:
    return DASH if value is None else f"{value:.3f}" if value < 1 else f"{value:.1f}"


def queue_times(row: dict[str, Any]) -> float | None:
    """The run's p99 queue time over the oracle's (infinite when only the run queued; None without figures)."""
    mine, oracle = row.get("queue_time_p99_s"), row.get("oracle_queue_time_p99_s")
    if mine is None or oracle is None:
        return None
    if oracle > 0:
        return float(mine / oracle)
    return 0.0 if mine == 0 else math.inf


def _times(row: dict[str, Any]) -> str:
    value = queue_times(row)
    return DASH if value is None else "∞" if math.isinf(value) else f"{value:.1f}×"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)]) + "\n"


def _code(*commands: str | None) -> str:
    shown = [c for c in commands if c]
    return "```sh\n" + "\n".join(shown) + "\n```\n" if shown else ""


def _policy_name(policy: str, default: str) -> str:
    return f"`{policy}` (default)" if policy == default else f"`{policy}`"


def _ordered(policies: Sequence[str], default: str) -> list[str]:
    return [p for p in policies if p == default] + [p for p in policies if p != default]


def family_of(scenario: str) -> Family:
    return next((f for f in FAMILIES if scenario in f.scenarios), _OTHER)


def _cell(row: dict[str, Any] | None) -> str:
    if row is None or row.get("unscored"):
        return DASH if row is None else "not scored"
    goodput = row.get("goodput_ratio")
    low = goodput is not None and goodput < BUNDLED_GOOD  # a figure that misses its goal is in bold
    return (f"**{_ratio(goodput)}**" if low else _ratio(goodput)) + (
        f" ({_times(row)})" if queue_ok(row) else f" (**{_times(row)}**)"
    )


def _index(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(str(r["scenario"]), str(r["policy"])): r for r in rows}


def policy_table(
    rows: Sequence[dict[str, Any]], scenarios: Sequence[str], policies: Sequence[str], default: str
) -> str:
    """Scenarios × policies: each cell the goodput ratio and, in brackets, the p99 queue against the oracle's."""
    by = _index(rows)
    order = _ordered(policies, default)
    body = [[f"`{s}`", *(_cell(by.get((s, p))) for p in order)] for s in scenarios]
    return _table(["scenario", *(_policy_name(p, default) for p in order)], body)


def detail_table(rows: Sequence[dict[str, Any]], scenarios: Sequence[str], policy: str) -> str:
    """One policy's figures on each scenario, beside the oracle's where it has them."""
    by = _index(rows)
    body = []
    for s in scenarios:
        r = by.get((s, policy), {})
        t90, saturated = r.get("time_to_90pct_s"), r.get("saturated_fraction")
        seconds = [_seconds(r.get(k)) for k in ("queue_time_p99_s", "oracle_queue_time_p99_s")]
        times = ["never" if r and t90 is None else _seconds(t90), _seconds(r.get("oracle_time_to_90pct_s"))]
        sat = _pct(None if saturated is None else 100.0 * saturated)
        body.append([f"`{s}`", _ratio(r.get("goodput_ratio")), *seconds, *times, sat, _ratio(r.get("jain_fairness"))])
    header = ["scenario", "goodput ratio", "p99 queue (s)", "oracle's", "time to 90 % (s)", "oracle's"]
    return _table([*header, "saturated", "Jain"], body)


def bundled_counts(rows: Sequence[dict[str, Any]], policies: Sequence[str], default: str) -> str:
    """Per policy: the scenarios at BUNDLED_GOOD of their oracle, within 2x its p99, and the median saturation."""
    body = []
    for p in _ordered(policies, default):
        mine = [r for r in rows if r["policy"] == p and not r.get("unscored")]
        good = sum((r.get("goodput_ratio") or 0.0) >= BUNDLED_GOOD for r in mine)
        fast = sum(queue_ok(r) for r in mine)
        sat = [r["saturated_fraction"] for r in mine if r.get("saturated_fraction") is not None]
        median = _pct(100.0 * statistics.median(sat) if sat else None)
        body.append([_policy_name(p, default), f"{good} of {len(mine)}", f"{fast} of {len(mine)}", median])
    return _table(["policy", f"≥ {BUNDLED_GOOD:g} of the oracle", "p99 ≤ 2×", "saturated (median)"], body)


def _figure_cells(rows: Sequence[dict[str, Any]]) -> list[str]:
    f = figures(rows)
    draws = f"{len(rows) - f.unscored}" + (f" ({f.unscored} not scored)" if f.unscored else "")
    goodput = [_ratio(f.median), _ratio(f.p10), _ratio(f.min)]
    return [draws, *goodput, _pct(f.p99_share), _pct(f.jain_share), _pct(f.saturated)]


_FUZZ_HEADER = ("draws", "goodput median", "p10", "min", "p99 ≤ 2×", f"Jain ≥ {JAIN_GOOD:g}", "saturated (median)")
_FUZZ_GOALS = ("", f"≥ {MEDIAN_GOAL:g}", f"≥ {P10_GOAL:g}", "", f"≥ {SHARE_GOAL:.0f} %", f"≥ {SHARE_GOAL:.0f} %", "")


def fuzz_table(rows: Sequence[dict[str, Any]], policies: Sequence[str], default: str) -> str:
    """One line per policy: ``lab.ablation.figures`` of its draws (the figures ``fuzz_line`` prints), then goals."""
    body = [[_policy_name(p, default), *_figure_cells([r for r in rows if r["policy"] == p])] for p in policies]
    return _table(["policy", *_FUZZ_HEADER], [*body, ["goal", *_FUZZ_GOALS]])


def stated_table(rows: Sequence[dict[str, Any]], policies: Sequence[str], default: str) -> str:
    """The same figures on the draws whose clients were told the engine's limits, and on the others."""
    body = []
    for p in _ordered(policies, default):
        mine = [r for r in rows if r["policy"] == p]
        for label, told in (("stated", True), ("not stated", False)):
            if part := [r for r in mine if bool(r.get("stated_limits")) is told]:
                body.append([_policy_name(p, default), label, *_figure_cells(part)])
    return _table(["policy", "limits", *_FUZZ_HEADER], body)


def _names(rows: Sequence[dict[str, Any]], show: Callable[[dict[str, Any]], str]) -> str:
    return ", ".join(f"`{r['scenario']}` {show(r)}" for r in rows[:WORST_SHOWN])


def generator_gaps(rows: Sequence[dict[str, Any]], policy: str) -> list[str]:
    """The generator's goals the policy misses, each with the count and the worst of the draws that miss it."""
    mine = [r for r in rows if r["policy"] == policy]
    scored = sorted((r for r in mine if r.get("goodput_ratio") is not None), key=lambda r: float(r["goodput_ratio"]))
    f = figures(mine)
    gaps = []
    for name, value, goal in (("median", f.median, MEDIAN_GOAL), ("p10", f.p10, P10_GOAL)):
        if value is not None and value < goal:
            under = [r for r in scored if r["goodput_ratio"] < goal]
            gaps.append(
                f"Generator, goodput {name} {value:.3f} (goal ≥ {goal:g}): {len(under)} of {len(scored)} draws under "
                f"{goal:g}; worst: {_names(under, lambda r: _ratio(r['goodput_ratio']))}."
            )
    if f.p99_share is not None and f.p99_share < SHARE_GOAL:
        slow = sorted((r for r in scored if not queue_ok(r)), key=lambda r: -(queue_times(r) or 0.0))
        mine_s, oracle_s = "queue_time_p99_s", "oracle_queue_time_p99_s"
        worst = _names(slow, lambda r: f"{_seconds(r[mine_s])} s against {_seconds(r[oracle_s])} s")
        gaps.append(
            f"Generator, p99 queue within 2× the oracle's on {f.p99_share:.0f} % of draws (goal ≥ {SHARE_GOAL:.0f} "
            f"%): {len(slow)} of {len(scored)} draws over; worst (p99 against the oracle's): {worst}."
        )
    if f.jain_share is not None and f.jain_share < SHARE_GOAL:
        multi = [r for r in scored if (r.get("clients") or 1) > 1]
        unfair = sorted(
            (r for r in multi if (r.get("jain_fairness") or 0.0) < JAIN_GOOD), key=lambda r: r["jain_fairness"] or 0.0
        )
        worst = _names(unfair, lambda r: f"{r['jain_fairness'] or 0.0:.2f} ({r['clients']:.0f} clients)")
        gaps.append(
            f"Generator, Jain ≥ {JAIN_GOOD:g} on {f.jain_share:.0f} % of multi-client draws (goal ≥ {SHARE_GOAL:.0f} "
            f"%): {len(unfair)} of {len(multi)} under {JAIN_GOOD:g}; worst: {worst}."
        )
    if unscored := [r for r in mine if r.get("goodput_ratio") is None]:
        why = _names(unscored, lambda r: f"({r.get('unscored') or 'no figures'})")
        gaps.append(f"Generator, {len(unscored)} draws not scored: {why}.")
    return gaps


def bundled_gaps(rows: Sequence[dict[str, Any]], policy: str) -> list[str]:
    """The bundled scenarios where the policy falls under BUNDLED_GOOD of its oracle, or that were not scored."""
    mine = [r for r in rows if r["policy"] == policy]
    low = [r for r in mine if r.get("goodput_ratio") is not None and r["goodput_ratio"] < BUNDLED_GOOD]
    gaps = [
        f"Bundled `{r['scenario']}` ({family_of(str(r['scenario'])).title}): goodput {_ratio(r['goodput_ratio'])} "
        f"(goal ≥ {BUNDLED_GOOD:g}), p99 {_times(r)}."
        for r in sorted(low, key=lambda r: float(r["goodput_ratio"]))
    ]
    gaps += [f"Bundled `{r['scenario']}` not scored: {r['unscored']}." for r in mine if r.get("unscored")]
    return gaps


_GLOSSARY = """## Glossary

* **Oracle**: the client that knows the fleet's capacity at every moment. For each phase of a scenario (the fleet \
between two capacity events) the lab sweeps a fixed concurrency and measures the settled throughput; the oracle \
holds that phase's knee from the instant the phase starts, split evenly across the scenario's clients and never \
below a client's floor (where the floors add up past the knee, it queues as any policy must), and weighs requests \
by their tokens against the phase's KV pool. Its run of the same scenario is the yardstick of every ratio below.
* **Knee**: the smallest concurrency whose throughput reaches {knee:.0%} of the peak in that sweep: past it, more \
concurrency buys only queueing, preemptions and KV pressure. One definition, used everywhere on this page.
* **Goodput ratio**: items completed per simulated second over the whole run, all clients together, over the \
oracle's on the same scenario. A policy that queues past the knee can finish a few more items than the oracle, so \
a ratio may exceed 1.
* **p99 ×**: the run's 99th-percentile engine queue time (the clients' requests waiting for a slot) over the \
oracle's. The goal is at most 2×; a p99 under {slack:g} s passes too, since an oracle that queues nothing would \
otherwise fail every policy for one engine step of queueing. ∞: the oracle queued nothing and the run did.
* **Jain**: Jain's index of the clients' goodputs, (Σx)² / (n·Σx²): 1 when every client got the same, 1/n when \
one got everything, 1 with one client. A multi-client run is fair at {jain:g} or more.
* **Saturated**: the share of the run's trace samples in which requests waited for capacity on an engine: how long \
a policy keeps a queue on engines others share. On the generator, the median over draws.
* **Time to 90 %**: seconds from the last capacity change (or the start) until the throughput over {window:g} s \
first reaches 90 % of the oracle's settled throughput in that last phase; the oracle's own time, on the same \
definition, is what measurement costs even a client that knew. never: not within the run.
* **Draw**: one scenario drawn at random by the generator (`model-concurrency fuzz`) from a seed and an index, \
never used while tuning a policy; its TOML file re-runs it with `model-concurrency sim`.
"""


def glossary() -> str:
    """The terms every table uses, each defined once, with the constants the lab judges by."""
    return _GLOSSARY.format(knee=KNEE_FRACTION, slack=QUEUE_SLACK_S, jain=JAIN_GOOD, window=TIME_TO_WINDOW_S)


def _header(run: Run) -> str:
    commit, _, rest = run.commit.partition(" ")
    dirty = f" {rest}" if rest else ""
    return (
        "# Results\n\n"
        f"Generated by `{run.command}` at commit `{commit}`{dirty}, model-concurrency {run.version}, on "
        f"{run.generated}. Do not edit this page; `make results` makes it anew. Every figure on it comes from that "
        "one run, and each section gives the command that made its figures (run from the repository's root; the "
        "work folder keeps their CSVs, from which `model-concurrency report --from DIR` rebuilds the page).\n\n"
        f"The default policy is `{run.default_policy}`; beside it: "
        + ", ".join(f"`{p}`" for p in run.policies if p != run.default_policy)
        + ". `model-concurrency list` describes each.\n"
    )


def bundled_sections(run: Run, rows: Sequence[dict[str, Any]]) -> str:
    """The bundled set's counts per policy, then one section per family of scenarios."""
    out = ["## The bundled scenarios\n"]
    if run.bundled_command is None:
        return out[0] + "\nNot run in this report.\n"
    intro = (
        "Each scenario's cell: the goodput ratio, then the p99 × in brackets; a figure that misses its goal (goodput "
        f"under {BUNDLED_GOOD:g} of the oracle, p99 over 2×) is in bold. The second table of each family gives the "
        "default's figures beside the oracle's. All made by one run:\n"
    )
    out += [intro, _code(run.bundled_command), bundled_counts(rows, run.policies, run.default_policy)]
    names = list(dict.fromkeys(str(r["scenario"]) for r in rows))
    for family in (*FAMILIES, _OTHER):
        if mine := [s for s in names if family_of(s) is family]:
            table = policy_table(rows, mine, run.policies, run.default_policy)
            out += [f"### {family.title}\n\n{family.about}\n", _code(run.bundled_command), table]
            out.append(detail_table(rows, mine, run.default_policy))
    return "\n".join(out)


def generator_section(run: Run, rows: Sequence[dict[str, Any]]) -> str:
    """The generator's figures per policy (and split by stated limits, when the draws record it)."""
    out = ["## The generator\n"]
    if run.fuzz_command is None:
        return out[0] + "\nNot run in this report.\n"
    out.append(
        "Scenarios drawn at random, the same draws for every policy; per policy, the goodput ratio's median, 10th "
        "percentile and minimum over the draws, the share of draws within 2× the oracle's p99 queue, the share of "
        f"multi-client draws with Jain ≥ {JAIN_GOOD:g}, and the median saturated share:\n"
    )
    out += [_code(run.fuzz_command), fuzz_table(rows, _ordered(run.policies, run.default_policy), run.default_policy)]
    if any("stated_limits" in r for r in rows):  # a fuzz.csv without the column is shown unsplit
        out.append(
            "The same figures on the draws whose clients were told the engine's limits (`[clients] stated_limits`, "
            "as an operator who knows `--max-num-seqs` would) and on the others; same run:\n"
        )
        out += [_code(run.fuzz_command), stated_table(rows, run.policies, run.default_policy)]
    return "\n".join(out)


def live_section(run: Run) -> str:
    out = ["## Live checks\n"]
    if run.live_output is None:
        return out[0] + f"\nNot run ({run.live_skipped or 'skipped'}).\n"
    out.append(
        "The lab against the production stack (the fan-out gate, the runtime's poll thread, httpx, the emulator's "
        "HTTP app) on a virtual clock, on short `ramp` and `gpu-added`. Goals: lab and live within 0.05 of goodput "
        "ratio and 2 polls of time to 90 %, the live target settled at 0.85–1.3× the knee.\n"
    )
    status = "" if not run.live_status else f"\n(exit status {run.live_status})"
    out += [_code(run.live_command), "```text\n" + run.live_output.rstrip() + status + "\n```\n"]
    return "\n".join(out)


def gaps_section(run: Run, bundled: Sequence[dict[str, Any]], fuzz: Sequence[dict[str, Any]]) -> str:
    """Every goal the default misses in this run, with the draws and scenarios that miss it."""
    policy = run.default_policy
    live = list(run.live_misses) if run.live_output is not None else [f"Live checks not run ({run.live_skipped})."]
    gaps = generator_gaps(fuzz, policy) + bundled_gaps(bundled, policy) + live
    out = [
        "## Known gaps\n",
        f"The goals `{policy}` misses in this run, from the figures above (the same commands):\n",
        _code(run.bundled_command, run.fuzz_command, run.live_command),
    ]
    out.append("\n".join(f"* {g}" for g in gaps) + "\n" if gaps else "None: every goal is met.\n")
    if worst := worst_rows(fuzz, policy):
        out.append(
            f"The draws where `{policy}` reached the lowest share of its oracle's goodput (the generator's `worst.md`; "
            "`model-concurrency sim OUT/scenarios/NAME.toml` re-runs one, OUT the fuzz command's folder):\n\n"
            + markdown_table(worst, WORST_COLUMNS)
        )
    return "\n".join(out)


def build_page(run: Run, bundled: Sequence[dict[str, Any]], fuzz: Sequence[dict[str, Any]]) -> str:
    """The whole page: header, glossary, the bundled families, the generator, the live checks, the known gaps."""
    sections = [bundled_sections(run, bundled), generator_section(run, fuzz), live_section(run)]
    return "\n".join([_header(run), glossary(), *sections, gaps_section(run, bundled, fuzz)])
