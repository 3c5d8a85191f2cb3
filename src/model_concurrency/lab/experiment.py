"""One experiment: a policy's run and the oracle's on the same scenario, and the summary that compares them.

:mod:`.run` simulates; :mod:`.oracle` finds the knees by simulating; this module sits above both and puts a
policy's run beside the oracle's (``run_scenario``: what ``sim``, ``compare`` and ``fuzz`` call). Kept apart from
:mod:`.run` so the oracle can use the simulator without the simulator knowing the oracle (no import circle).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from model_concurrency import knobs
from model_concurrency.knobs import setting
from model_concurrency.lab.neighbour import neighbour_summary
from model_concurrency.lab.oracle import Oracle, store_run
from model_concurrency.lab.run import Progress, simulate, tenant_alone, ungated_run
from model_concurrency.lab.scenario import Scenario
from model_concurrency.lab.summary import summarize
from model_concurrency.lab.trace import Trace
from model_concurrency.policies.base import Policy

__all__ = ["PARALLEL_MIN_ENGINE_SECONDS", "RunResult", "run_scenario"]


@dataclass(slots=True)
class RunResult:
    scenario: Scenario
    policy: str
    trace: Trace
    oracle: Trace | None
    summary: dict[str, Any]


# A cold oracle run goes to a second process only when the run is long enough to repay the worker's start (about a
# second of imports): fleet engines × simulated seconds (fleet-1000: 64 × 1,800; ramp: 1 × 1,200).
PARALLEL_MIN_ENGINE_SECONDS = 20_000.0


def _oracle_in_parallel(scenario: Scenario, parallel: bool | None) -> bool:
    if parallel is not None:
        return parallel
    if setting(*knobs.SERIAL):
        return False
    engine_seconds = scenario.fleet.engines * scenario.fleet.replicas * scenario.duration_s
    return (os.cpu_count() or 1) > 1 and engine_seconds >= PARALLEL_MIN_ENGINE_SECONDS


def run_scenario(
    scenario: Scenario,
    policy_factory: Callable[[], Policy],
    *,
    policy_name: str = "policy",
    with_oracle: bool = True,
    progress: Progress | None = None,
    parallel: bool | None = None,
) -> RunResult:
    """Simulate the policy and (unless told not to) the oracle on the same scenario; summarise both.

    When the oracle's run is not cached yet, it is simulated in a second process while this one simulates the
    policy's run (``parallel``: None decides by the run's size, and ``MODEL_CONCURRENCY_SERIAL=1`` or False keeps
    one process). The two runs are independent and deterministic, so the results are the same bits either way; the
    worker stores its trace in the disk cache and this process reads it back memory-mapped. The worker never
    outlives the call: it is terminated and reaped on the way out, whatever happens here. A worker that fails or
    is killed costs only time: this process then simulates the oracle's run itself.
    """
    oracle = Oracle(scenario)

    def policy_run() -> Trace:
        return simulate(
            scenario, policy_factory=policy_factory, resolve_fraction=oracle.background_rps, progress=progress
        )

    if not with_oracle:
        trace = policy_run()
        return RunResult(scenario, policy_name, trace, None, _with_neighbour(scenario, trace, summarize(trace, None)))
    # The sweeps first, here: both runs need them (the knees, a background sized from capacity), and they are
    # then on disk for the worker too.
    if _oracle_in_parallel(scenario, parallel) and not oracle.run_path().exists():
        worker = multiprocessing.get_context("spawn").Process(
            target=store_run, args=(scenario,), name="oracle-run", daemon=True
        )
        worker.start()
        try:
            trace = policy_run()
            worker.join()
        finally:
            if worker.is_alive():  # the policy's run failed or was interrupted: the oracle's is not wanted
                worker.terminate()
                worker.join()
            worker.close()
        # The worker's stored copy. If it failed (its traceback is on stderr), was killed, or the cache could not take
        # the trace, this simulates the oracle's run here: a bug then raises here too, with the caller's traceback.
        oracle_trace = oracle.run()
    else:
        # The oracle first: its run goes to the disk cache and comes back memory-mapped, so a cold run does not hold
        # the policy's whole trace while it simulates the oracle's clients.
        oracle_trace = oracle.run()
        trace = policy_run()
    summary = _with_neighbour(scenario, trace, summarize(trace, oracle_trace))
    return RunResult(scenario, policy_name, trace, oracle_trace, summary)


def _with_neighbour(scenario: Scenario, trace: Trace, summary: dict[str, Any]) -> dict[str, Any]:
    """The neighbour's keys (lab/neighbour.py) added to a summary, for scenarios with jobs or a tenant."""
    if scenario.interactive is None and scenario.clients.deadlines_s is None:
        return summary
    return {
        **summary,
        **neighbour_summary(
            scenario,
            trace,
            trace.neighbour,
            alone=lambda: tenant_alone(scenario),
            ungated_trace=lambda: ungated_run(scenario),
        ),
    }
