"""How fast the lab simulates a fleet: ``sims/fleet-1000.toml`` scaled down, without the oracle.

The 1,000-client scenario (goal: ≤ 60 s wall warm) simulates about 3,300 requests per simulated second through
64 engines, 1,000 limiters and their polls. This runs the first ``--scale`` of it (0.02: 36 simulated seconds, the
first ramp) with the default policy and reports, from the same run:

* CPU microseconds per finished request (the figure that scales to the full run: about 6 million requests);
* the ratio to a bare SimPy loop that processes one timeout event per finished request, measured in the same run
  (SimPy's own floor; a request costs several events and the engine, limiter and poll work around them).

The full run takes about ``requests × µs per request``; the warm goal needs ≤ 10 µs per request.

    .venv/bin/python benchmarks/fleet_speed.py [--scale 0.02] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import simpy

from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.policies.registry import load_policy

SCENARIO = Path(__file__).resolve().parents[1] / "sims" / "fleet-1000.toml"


def run_fleet(scale: float) -> tuple[float, int]:
    """CPU seconds and finished client requests of one scaled run."""
    scenario = load_scenario(SCENARIO).scaled(scale)
    start = time.process_time()
    trace = simulate(scenario, policy_factory=lambda: load_policy("adaptive"))
    return time.process_time() - start, len(trace.finish_times)


def run_bare(n_events: int) -> float:
    """CPU seconds for one process doing ``n_events`` timeouts: SimPy's own floor."""
    env = simpy.Environment()

    def loop() -> Generator[Any, Any, None]:
        for _ in range(n_events):
            yield env.timeout(0.001)

    env.process(loop())
    start = time.process_time()
    env.run()
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.02, help="share of the 1,800 s run to simulate")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs of each (noisy machines)")
    args = parser.parse_args(argv)
    # Interleaved, best of each: a burst of load elsewhere on the machine should not land on one side only.
    fleet_cpu = bare_cpu = float("inf")
    requests = 0
    for _ in range(max(1, args.repeat)):
        cpu, requests = run_fleet(args.scale)
        fleet_cpu = min(fleet_cpu, cpu)
        bare_cpu = min(bare_cpu, run_bare(requests))
    per_request = fleet_cpu / requests * 1e6
    print(f"fleet-1000 x {args.scale:g}: {requests} requests finished, {fleet_cpu:.2f} s CPU")
    print(f"  bare SimPy, one event per request: {bare_cpu:.2f} s CPU ({bare_cpu / requests * 1e6:.2f} us each)")
    print(f"fleet speed: {per_request:.1f} us CPU per request, {fleet_cpu / bare_cpu:.1f}x bare SimPy per request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
