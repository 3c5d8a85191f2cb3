"""The neighbour in the lab: an interactive tenant beside batch jobs with deadlines (lab/neighbour.py), small."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from model_concurrency.lab.experiment import run_scenario
from model_concurrency.lab.neighbour import deadlines
from model_concurrency.lab.run import tenant_alone
from model_concurrency.lab.scenario import Interactive, load_scenario, scenario_from_dict
from model_concurrency.policies.adaptive import Adaptive
from model_concurrency.policies.static import Static

SMALL: dict[str, Any] = {
    "name": "small-bursts",
    "seed": 5,
    "duration_s": 60.0,
    "fleet": {"preset": "llama-8b-h100", "engine": {"max_num_seqs": 64}},
    "workload": {"prompt_tokens": 512, "output_tokens": 64},
    "clients": {"count": 2, "floor": 4, "ceiling": 64, "poll_s": 2.0, "job_items": [300, 600],
                "deadlines_s": [30.0, 60.0]},
    "interactive": {"burst_rps": 10.0, "idle_rps": 1.0, "burst_s": 10.0, "idle_s": 10.0, "first_burst_s": 5.0,
                    "prompt_tokens": 128, "output_tokens": 32, "ttft_target_s": 0.1},
}  # fmt: skip


def test_bursts_follow_the_declared_windows() -> None:
    spec = Interactive(burst_s=10.0, idle_s=20.0, first_burst_s=5.0)
    assert [spec.in_burst(t) for t in (0.0, 4.9, 5.0, 14.9, 15.0, 34.9, 35.0)] == [
        False, False, True, True, False, False, True,
    ]  # fmt: skip
    assert [spec.next_change(t) for t in (0.0, 5.0, 14.0, 15.0, 34.0)] == [5.0, 15.0, 15.0, 35.0, 35.0]


def test_a_run_reports_the_neighbour_beside_the_batch() -> None:
    scenario = scenario_from_dict(SMALL)
    result = run_scenario(scenario, Adaptive, with_oracle=False)
    s = result.summary
    alone = tenant_alone(scenario).in_bursts(scenario.interactive)  # type: ignore[arg-type]
    assert s["neighbour_alone_ttft_p99_s"] == pytest.approx(float(np.percentile(alone.ttft, 99)))
    assert s["neighbour_ttft_p99_ratio"] == pytest.approx(s["neighbour_ttft_p99_s"] / s["neighbour_alone_ttft_p99_s"])
    assert s["neighbour_ttft_p99_ratio"] >= 1.0  # the batch never makes the neighbour faster here
    assert s["batch_idle_throughput_ratio"] is not None and s["batch_idle_throughput_ratio"] > 0
    assert (s["deadlines_met"], s["deadlines_total"]) == deadlines(scenario, result.trace)
    assert s["deadlines_total"] == 2
    # The tenant's arrivals are its own stream: the same requests alone and beside the batch.
    assert np.isin(result.trace.neighbour.arrival, tenant_alone(scenario).arrival).all()
    # Each client stops at its job's size.
    assert [c.completions[-1] for c in result.trace.clients] == [300, 600]


def test_ungated_batch_hurts_the_neighbour_more_than_a_small_static_limit() -> None:
    scenario = scenario_from_dict(SMALL)
    high = dataclasses.replace(scenario, clients=dataclasses.replace(scenario.clients, floor=64))
    low = dataclasses.replace(scenario, clients=dataclasses.replace(scenario.clients, floor=2, ceiling=64))
    ratio_high = run_scenario(high, Static, with_oracle=False).summary["neighbour_ttft_p99_ratio"]
    ratio_low = run_scenario(low, Static, with_oracle=False).summary["neighbour_ttft_p99_ratio"]
    assert ratio_high > ratio_low >= 1.0


def test_scaling_shortens_windows_jobs_and_deadlines() -> None:
    scenario = load_scenario("interactive-bursts").scaled(0.5)
    assert scenario.interactive is not None and scenario.interactive.burst_s == 45.0
    assert scenario.clients.deadlines_s == (200.0, 350.0, 450.0)
    assert scenario.clients.job_items == (1000, 2000, 2000)


@pytest.mark.parametrize(
    ("clients", "message"),
    [
        ({"count": 2, "job_items": [10]}, "one per client"),
        ({"count": 1, "deadlines_s": [-1.0]}, "positive numbers"),
    ],
)
def test_bad_jobs_are_named(clients: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scenario_from_dict({"name": "x", "clients": clients})
