"""What-if for issue 15 item 2: the lab's clients poll every ``poll_s / DIV`` while their policy is ``ramping``.

Evidence only, not the knob: the knob belongs in the controller's poll schedule (being rewritten by the
one-runtime issue). This wraps the current lab client's poll loop so each wait is shortened while
``core.policy.ramping`` is true (a client's first wait, its phase, is kept). Once the runtime owns the schedule,
delete this file and measure the real knob instead.

    python benchmarks/first_ramp_fast_polls.py 6 sims/ramp.toml sims/gpu-added.toml

prints, per scenario, the summary figures that item 3 names, next to the oracle's (no arguments: 6, ramp and
gpu-added, as ``make bench`` runs it).
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from typing import Any

import model_concurrency.lab.client as lab_client
from model_concurrency.lab.run import run_scenario
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.policies import load_policy

KEYS = ("goodput_ratio", "time_to_90pct_s", "oracle_time_to_90pct_s", "queue_time_p99_s", "oracle_queue_time_p99_s")


def patch(div: float) -> None:
    original = lab_client.SimClient._poll

    def _poll(self: lab_client.SimClient, first_poll_s: float) -> Generator[Any, Any, None]:
        inner = original(self, first_poll_s)
        event = next(inner)
        if first_poll_s > 0:
            event = inner.send((yield event))
        while True:
            if getattr(self.core.policy, "ramping", False):
                event = self.env.timeout(self.core.poll_interval_s / div)
            event = inner.send((yield event))

    lab_client.SimClient._poll = _poll  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    div = float(argv[0]) if argv else 6.0
    paths = argv[1:] or ["sims/ramp.toml", "sims/gpu-added.toml"]
    patch(div)
    for path in paths:
        scenario = load_scenario(path)
        summary = run_scenario(scenario, lambda: load_policy("adaptive"), policy_name="adaptive").summary
        print(scenario.name, " ".join(f"{k}={summary[k]:.3g}" for k in KEYS))


if __name__ == "__main__":
    main(sys.argv[1:])
