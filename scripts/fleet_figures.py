"""The lab's 1,000-client figures: convergence, and fairness with and without jitter.

``converge``: runs ``sims/fleet-1000.toml`` (scaled by ``--scale``) under the default policy and judges it against
the fleet's peak, measured as 64 × the peak of one engine of the same preset, workload and seed (the oracle's own
sweep of that one engine; the replicas are identical and the 1,000 clients spread over them, so the fleet's knee
is the sum). The full oracle sweeps the whole 64-engine fleet at every power of two up to 128,000 in flight,
which costs several times the run itself. Prints the summary plus ``goodput_vs_peak``,
``time_to_90pct_of_peak_s``, the second half's goodput against the peak, wall and CPU time and peak RSS.

``jitter``: the multi-client scenarios at full size, several seeds, poll jitter 0 and 0.1; Jain per run and the
median.

``split``: where the unfairness is made. Jain over each quarter of the run, the per-client target's percentiles at
a few instants, and the clients grouped by their target at 60 s (after the first ramp) with the Jain the run would
have had if that group had earned the median. ``--no-guard`` turns the client-side growth guard off.

    .venv/bin/python scripts/fleet_figures.py converge --scale 1
    .venv/bin/python scripts/fleet_figures.py jitter multi-client --seeds 5
    .venv/bin/python scripts/fleet_figures.py split --scale 0.25
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import resource
import statistics
import time

import numpy as np

from model_concurrency.lab.experiment import run_scenario
from model_concurrency.lab.oracle import Oracle
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.lab.summary import jain_index, summarize, time_to_fraction
from model_concurrency.lab.world import phases
from model_concurrency.policies.registry import load_policy


def one_engine_peak(scenario_name: str) -> tuple[float, int, int]:
    """(peak items/s, knee, engines) of the scenario's fleet, from one engine's sweep."""
    fleet = load_scenario(scenario_name)
    one = dataclasses.replace(
        fleet,
        fleet=dataclasses.replace(fleet.fleet, replicas=1, engines=1),
        clients=dataclasses.replace(fleet.clients, count=4, ceiling=512),
    )
    sweep = Oracle(one).sweep(phases(one)[0][1])
    return sweep.peak, sweep.knee, fleet.fleet.replicas * fleet.fleet.engines


def converge(args: argparse.Namespace) -> None:
    peak1, knee1, engines = one_engine_peak(args.scenario)
    peak = peak1 * engines
    scenario = load_scenario(args.scenario).scaled(args.scale)
    start, cpu = time.perf_counter(), time.process_time()
    trace = simulate(scenario, policy_factory=lambda: load_policy(args.policy))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    summary = summarize(trace)
    rate = trace.throughput(30.0)
    second_half = trace.time >= trace.duration_s / 2
    summary.update(
        fleet_peak_items_s=peak,
        fleet_knee=knee1 * engines,
        goodput_vs_peak=summary["goodput"] / peak,
        time_to_90pct_of_peak_s=time_to_fraction(trace, peak),
        second_half_goodput_vs_peak=float(np.mean(rate[second_half])) / peak,
        summed_target_final=float(sum(c.target[-1] for c in trace.clients)),
        wall_s=wall,
        cpu_s=cpu,
        maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    print(json.dumps(summary, indent=1))


def jitter(args: argparse.Namespace) -> None:
    base = load_scenario(args.scenario)
    for value in (0.0, 0.1):
        jains = []
        for offset in range(args.seeds):
            clients = dataclasses.replace(base.clients, poll_jitter=value)
            scenario = dataclasses.replace(base, seed=base.seed + offset, clients=clients)
            s = run_scenario(scenario, lambda: load_policy(args.policy)).summary
            jains.append(s["jain_fairness"])
            print(f"{base.name} seed {base.seed + offset} jitter {value}: jain {s['jain_fairness']:.3f} "
                  f"ratio {s['goodput_ratio']:.3f} saturated {s['saturated_fraction']:.3f}", flush=True)  # fmt: skip
        print(f"{base.name} jitter {value}: median jain {statistics.median(jains):.3f}, min {min(jains):.3f}")


def split(args: argparse.Namespace) -> None:
    scenario = load_scenario(args.scenario).scaled(args.scale)
    if args.no_guard:
        scenario = dataclasses.replace(scenario, clients=dataclasses.replace(scenario.clients, guard=False))
    trace = simulate(scenario, policy_factory=lambda: load_policy(args.policy))
    s = summarize(trace)
    print(f"goodput {s['goodput']:.1f} items/s, jain {s['jain_fairness']:.3f}, saturated {s['saturated_fraction']:.3f}")
    t, end = trace.time, trace.duration_s
    done = np.array([c.completions for c in trace.clients])
    target = np.array([c.target for c in trace.clients])

    def at(second: float) -> int:
        return min(int(np.searchsorted(t, second)), len(t) - 1)

    quarters = [jain_index(done[:, at((k + 1) * end / 4)] - done[:, at(k * end / 4)]) for k in range(4)]
    print("jain by quarter:", " ".join(f"{j:.3f}" for j in quarters))
    for second in sorted({min(x, end) for x in (12, 24, 36, 60, end / 4, end / 2, end)}):
        p = np.percentile(target[:, at(second)], [5, 25, 50, 75, 95])
        print(f"t {t[at(second)]:6.0f} s: target p5/p25/p50/p75/p95 " + "/".join(f"{v:.0f}" for v in p))
    goodput = done[:, -1] / end
    after_ramp = target[:, at(60)]
    for low, high in ((0, 8), (8, 20), (20, math.inf)):
        group = (after_ramp >= low) & (after_ramp < high)
        if group.any():
            lifted = np.where(group, np.median(goodput), goodput)
            print(f"target at 60 s in [{low}, {high}): {group.sum()} clients, goodput {goodput[group].mean():.2f} "
                  f"items/s; at the median, jain would be {jain_index(lifted):.3f}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("converge")
    c.add_argument("scenario", nargs="?", default="fleet-1000")
    c.add_argument("--scale", type=float, default=1.0)
    c.add_argument("--policy", default="adaptive")
    j = sub.add_parser("jitter")
    j.add_argument("scenario")
    j.add_argument("--seeds", type=int, default=5)
    j.add_argument("--policy", default="adaptive")
    t = sub.add_parser("split")
    t.add_argument("scenario", nargs="?", default="fleet-1000")
    t.add_argument("--scale", type=float, default=1.0)
    t.add_argument("--policy", default="adaptive")
    t.add_argument("--no-guard", action="store_true")
    args = parser.parse_args()
    {"converge": converge, "jitter": jitter, "split": split}[args.command](args)
