"""Conformance, lab against live: scaled ``ramp`` and ``gpu-added``, each run in the lab and through the production
stack (``map_concurrent``, the model runtime with its poll thread, httpx, the emulator's ASGI app) on virtual time.

Per scenario it prints, for both sides, the goodput ratio against the lab's oracle, the time to 90 % of the
oracle's settled throughput after the last capacity change, the saturated fraction (trace samples with
capacity-waiting requests) and where the target settled against the oracle's knee (the smallest concurrency that
reaches 99 % of the peak in a concurrency sweep of throughput). Then the live check: the
live target settles within 0.85-1.3x of the knee with at most 20 % of the time saturated. The last line is
``conformance: max goodput-ratio gap G, max t90 gap P polls`` (goal: G <= 0.05, P <= 2).

    .venv/bin/python benchmarks/conformance.py --quick      # scale 0.1, well under 5 minutes
    .venv/bin/python benchmarks/conformance.py              # scale 0.25
    .venv/bin/python benchmarks/conformance.py --scale 1 --scenarios ramp
    .venv/bin/python benchmarks/conformance.py --quick --knee    # + the knee swept through the live stack
"""

from __future__ import annotations

import argparse
import logging
import math
import time

from model_concurrency.lab.conformance import Comparison, Side, compare, live_sweep, summary_line
from model_concurrency.lab.scenario import load_scenario

KNEE_LOW, KNEE_HIGH, SATURATED_MAX = 0.85, 1.3, 0.20


def _t90(side: Side) -> str:
    return "never" if side.t90_s is None else f"{side.t90_s:.0f} s"


def _report(result: Comparison, elapsed_s: float) -> None:
    print(f"{result.scenario} (poll {result.poll_s:g} s, knee {result.knee}, {elapsed_s:.0f} s to run both):")
    for label, side in (("lab ", result.lab), ("live", result.live)):
        print(
            f"  {label}  goodput ratio {side.goodput_ratio:.3f}  t90 {_t90(side):>6}  "
            f"saturated {side.saturated_fraction:.1%}  settled {side.settled_target:.0f} "
            f"({side.settled_target / result.knee:.2f}x knee)  polls {side.polls}"
        )
    gap_polls = "inf" if math.isinf(result.t90_gap_polls) else f"{result.t90_gap_polls:.2f}"
    print(f"  gap   goodput ratio {result.goodput_gap:.3f}  t90 {gap_polls} polls")
    ok = KNEE_LOW <= result.knee_ratio <= KNEE_HIGH and result.live.saturated_fraction <= SATURATED_MAX
    print(
        f"  knee  live settles at {result.knee_ratio:.2f}x the knee (goal {KNEE_LOW}-{KNEE_HIGH}), saturated "
        f"{result.live.saturated_fraction:.1%} (goal <= {SATURATED_MAX:.0%}): {'met' if ok else 'MISSED'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="scale 0.1 (the CI-sized run)")
    parser.add_argument("--scale", type=float, default=None, help="duration scale (default 0.25; --quick 0.1)")
    parser.add_argument("--scenarios", default="ramp,gpu-added")
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument(
        "--knee",
        action="store_true",
        help="also sweep concurrency through the live stack (minutes): the knee as the emulator shows it",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    scale = args.scale if args.scale is not None else (0.1 if args.quick else 0.25)
    results = []
    for name in args.scenarios.split(","):
        scenario = load_scenario(name.strip()).scaled(scale)
        started = time.perf_counter()
        result = compare(scenario, args.policy)
        _report(result, time.perf_counter() - started)
        results.append(result)
        if args.knee:
            started = time.perf_counter()
            lab, live = live_sweep(scenario)
            points = ", ".join(f"{c}: {t:.1f}" for c, t in zip(live.concurrency, live.throughput, strict=True))
            print(f"  sweep live (items/s) {points}  [{time.perf_counter() - started:.0f} s]")
            print(
                f"  sweep knee lab {lab.knee} (peak {lab.peak:.1f}/s), live {live.knee} (peak {live.peak:.1f}/s); "
                f"live target settles at {result.live.settled_target / live.knee:.2f}x the live knee"
            )
    print(summary_line(results))


if __name__ == "__main__":
    main()
