"""The oracle sweeps one replica of a fleet of identical replicas and scales it by the replica count.

Sweeping the whole fleet simulated as many requests as the run itself (``fleet-1000``: 64 engines at 24
concurrencies); a replica is a sixteenth of that. It must be exactly the one-replica sweep scaled, and only where
the replicas stay identical: an event that changes the fleet keeps the full sweep of each phase.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from model_concurrency.lab import oracle as oracle_module
from model_concurrency.lab.oracle import Oracle, per_replica_sweeps
from model_concurrency.lab.scenario import Scenario, scenario_from_dict
from model_concurrency.lab.world import Phase


def fleet(**extra: Any) -> Scenario:
    data: dict[str, Any] = {
        "name": "small-fleet",
        "seed": 5,
        "duration_s": 60.0,
        "fleet": {"engine": {"max_num_seqs": 8}, "replicas": 3, "engines": 2},
        "workload": {"prompt_tokens": 128, "output_tokens": 16, "output_sigma": 0.5},
        "clients": {"count": 4, "floor": 1, "ceiling": 8},
        "background": {"rate_rps": 6.0},
    }
    data.update(extra)
    return scenario_from_dict(data)


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_CACHE", str(tmp_path))
    monkeypatch.setattr(oracle_module, "_memory", {})


def test_a_fleet_sweep_is_one_replicas_sweep_scaled_by_the_replica_count() -> None:
    scenario = fleet()
    oracle = Oracle(scenario)
    assert oracle.per_replica
    swept = oracle.sweep(Phase((2, 2, 2), background_rps=6.0))
    one = Oracle(fleet(fleet={"engine": {"max_num_seqs": 8}, "replicas": 1, "engines": 2}))
    one.cap = -(-oracle.cap // 3)  # the replica's share of the fleet's cap of 4 × 8
    alone = one.sweep(Phase((2,), background_rps=2.0))  # a third of the background
    assert swept.concurrency == tuple(3 * c for c in alone.concurrency)
    assert swept.throughput == tuple(3 * t for t in alone.throughput)
    assert swept.knee == 3 * alone.knee


@pytest.mark.parametrize(
    "extra",
    [
        {"events": [{"at_s": 30.0, "action": "replica_down", "replica": 1}]},
        {"events": [{"at_s": 30.0, "action": "add_engines", "count": 1}]},
        {"events": [{"at_s": 30.0, "action": "background", "rate_rps": 1.0}]},
        {"rate_limit": {"requests_per_minute": 600.0}},
        {"fleet": {"engine": {"max_num_seqs": 8}, "replicas": 1, "engines": 2}},
    ],
)
def test_a_fleet_that_changes_or_shares_a_limit_keeps_the_full_sweep(extra: dict[str, Any]) -> None:
    assert not per_replica_sweeps(fleet(**extra))


def test_the_full_sweep_can_be_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_ORACLE_FULL_SWEEP", "1")
    assert not per_replica_sweeps(fleet())


def test_metrics_events_keep_the_per_replica_sweep() -> None:
    events = [{"at_s": 10.0, "action": "metrics_down"}, {"at_s": 20.0, "action": "metrics_up"}]
    assert per_replica_sweeps(fleet(events=events))


def test_unequal_replicas_are_swept_one_shape_at_a_time_and_summed() -> None:
    """Engines added while a replica was down leave it smaller when it returns: the fleet's knee and peak are the
    sums over its replicas of each shape's own sweep, under its share of the background and of the cap."""
    scenario = fleet()
    oracle = Oracle(scenario)
    unequal = oracle.sweep(Phase((2, 2, 3), background_rps=7.0))
    small = Oracle(fleet(fleet={"engine": {"max_num_seqs": 8}, "replicas": 1, "engines": 2}))
    small.cap = round(oracle.cap * 2 / 7)
    large = Oracle(fleet(fleet={"engine": {"max_num_seqs": 8}, "replicas": 1, "engines": 3}))
    large.cap = round(oracle.cap * 3 / 7)
    two = small.sweep(Phase((2,), background_rps=2.0))  # 2 of the 7 engines' share of the background
    three = large.sweep(Phase((3,), background_rps=3.0))
    assert unequal.knee == 2 * two.knee + three.knee
    assert unequal.peak == pytest.approx(2 * two.peak + three.peak)


def test_a_drawn_fleet_that_grew_while_a_replica_was_down_is_scored() -> None:
    from model_concurrency.lab.fuzz import draw_scenario
    from model_concurrency.lab.world import phases

    scenario = draw_scenario(41, 115, 0.05)  # replica 0 down, an engine added, replica 0 back: (1, 2)
    assert [p.engines for _, p in phases(scenario)] == [(1, 1), (1,), (2,), (1, 2)]
    knees = [k for _, k in Oracle(scenario).knees()]
    assert knees[3] == knees[1] + knees[2]
