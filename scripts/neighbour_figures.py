"""The neighbour's figures for docs: interactive-bursts (and its two-replica variant) under static ungated, the
best static, our default and its neighbour mode (adaptive-neighbour), the summary keys per run, and the tenant's
TTFT over time beside its target.

    .venv/bin/python scripts/neighbour_figures.py                  # both scenarios, full size (~1 min)
    .venv/bin/python scripts/neighbour_figures.py --scale 0.25 --scenarios interactive-bursts

The best static is the static limit (of ``--statics``, per client) with the lowest neighbour ratio among those
that meet every deadline (else the most deadlines). Writes docs/figures/neighbour-<scenario>.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import numpy as np

from model_concurrency.lab.experiment import RunResult, run_scenario
from model_concurrency.lab.neighbour import NeighbourLatency
from model_concurrency.lab.plot import plot_neighbour
from model_concurrency.lab.run import tenant_alone
from model_concurrency.lab.scenario import Scenario, load_scenario
from model_concurrency.policies.adaptive import Adaptive
from model_concurrency.policies.neighbour import AdaptiveNeighbour
from model_concurrency.policies.static import Static

KEYS = ("neighbour_ttft_p99_ratio", "neighbour_ttft_p99_s", "batch_idle_throughput_ratio", "goodput")


def static_at(scenario: Scenario, limit: int) -> Scenario:
    c = scenario.clients
    return dataclasses.replace(scenario, clients=dataclasses.replace(c, floor=limit, ceiling=max(limit, c.ceiling)))


def later_bursts_ratio(scenario: Scenario, result: RunResult, alone: NeighbourLatency) -> float | None:
    """The TTFT p99 ratio over the bursts after the first (the first meets every fan-out's first ramp, and its
    tail alone sets the whole run's p99 under adaptive and its neighbour mode alike)."""
    spec, latency = scenario.interactive, result.trace.neighbour
    if spec is None or latency is None:
        return None
    start = spec.first_burst_s + spec.burst_s

    def p99(of: NeighbourLatency) -> float | None:
        bursts = of.in_bursts(spec)
        later = bursts.ttft[bursts.arrival >= start]
        return float(np.percentile(later, 99)) if len(later) else None

    ours, base = p99(latency), p99(alone)
    return ours / base if ours is not None and base else None


def fmt(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default="interactive-bursts,interactive-bursts-2x")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--statics", default="8,16,32,64")
    p.add_argument("--out", type=Path, default=Path("docs/figures"))
    args = p.parse_args(argv)
    for name in args.scenarios.split(","):
        scenario = load_scenario(name).scaled(args.scale)
        runs: list[tuple[str, RunResult]] = []
        ceiling = scenario.clients.ceiling
        runs.append(
            (f"static ungated ({ceiling})", run_scenario(static_at(scenario, ceiling), Static, with_oracle=False))
        )
        statics = [(f"static {n}", run_scenario(static_at(scenario, int(n)), Static, with_oracle=False))
                   for n in args.statics.split(",")]  # fmt: skip

        def rank(item: tuple[str, RunResult]) -> tuple[int, float]:
            s = item[1].summary
            return (-s["deadlines_met"], s["neighbour_ttft_p99_ratio"] or math.inf)

        best = min(statics, key=rank)
        runs.append((best[0] + " (best static)", best[1]))
        runs.append(("adaptive (default)", run_scenario(scenario, Adaptive, with_oracle=False)))
        runs.append(("adaptive-neighbour", run_scenario(scenario, AdaptiveNeighbour, with_oracle=False)))
        print(f"## {scenario.name} (scale {args.scale:g})")
        alone = tenant_alone(scenario)
        print("| run | " + " | ".join(KEYS) + " | ratio after the 1st burst | deadlines |")
        print("| --- |" + " ---: |" * (len(KEYS) + 2))
        for label, result in [*runs[:1], *statics, *runs[2:]]:
            s = result.summary
            shown = label + (" (best)" if result is best[1] else "")
            cells = " | ".join(fmt(s.get(k)) for k in KEYS)
            later = fmt(later_bursts_ratio(scenario, result, alone))
            print(f"| {shown} | {cells} | {later} | {s['deadlines_met']}/{s['deadlines_total']} |")
        assert scenario.interactive is not None
        path = plot_neighbour(
            [("tenant alone", alone), *((label, r.trace.neighbour) for label, r in runs)],
            scenario.interactive,
            args.out / f"neighbour-{scenario.name}.png",
            end_s=scenario.duration_s,
            title=f"{scenario.name}: the interactive tenant's TTFT beside the batch",
        )
        print(f"figure: {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
