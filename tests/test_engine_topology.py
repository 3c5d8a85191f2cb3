"""Servers with several engines, fleets behind a balancer, replica loss, and fleet-wide snapshots."""

from __future__ import annotations

import pytest
import simpy

from engine_helpers import tiny_preset
from model_concurrency.engine import ABORT, EngineDownError, Fleet, Request, Server, combine_snapshots
from model_concurrency.signals.vllm import parse_vllm_metrics

MODEL = "org/tiny-model-1.0"


def served_by(fleet: Fleet, request: Request) -> int:
    return next(i for i, server in enumerate(fleet.replicas) if request.engine in server.engines)


def test_round_robin_spreads_requests_in_turn() -> None:
    env = simpy.Environment()
    fleet = Fleet.of(env, tiny_preset(), replicas=3, balancer="round_robin")
    requests = [Request(8, 3) for _ in range(6)]
    for r in requests:
        fleet.submit(r)
    assert [served_by(fleet, r) for r in requests] == [0, 1, 2, 0, 1, 2]


def test_least_loaded_sends_to_the_replica_with_fewest_outstanding_requests() -> None:
    env = simpy.Environment()
    fleet = Fleet.of(env, tiny_preset(), replicas=3, balancer="least_loaded")
    for _ in range(3):
        fleet.replicas[0].submit(Request(8, 100))  # replica 0 is busy with traffic from elsewhere
    fleet.replicas[2].submit(Request(8, 100))
    requests = [Request(8, 100) for _ in range(4)]
    for r in requests:
        fleet.submit(r)
    # outstanding (0,1,2) = (3,0,1): -> 1 (3,1,1) -> 1 (ties go to the first) (3,2,1) -> 2 (3,2,2) -> 1
    assert [served_by(fleet, r) for r in requests] == [1, 1, 2, 1]
    assert [s.inflight for s in fleet.replicas] == [3, 3, 2]


def test_a_lost_replica_aborts_its_requests_and_leaves_rotation() -> None:
    env = simpy.Environment()
    fleet = Fleet.of(env, tiny_preset(), replicas=2, balancer="round_robin")
    doomed = [fleet.submit(Request(8, 100)) for _ in range(4)]
    env.run(until=0.05)
    fleet.replicas[1].set_down()
    assert [e.value.finished_reason for e in doomed if e.triggered] == [ABORT, ABORT]
    later = [Request(8, 2) for _ in range(3)]
    for r in later:
        fleet.submit(r)
    assert {served_by(fleet, r) for r in later} == {0}
    with pytest.raises(EngineDownError):
        fleet.render_metrics(1)
    snapshot = fleet.snapshot()  # what Prometheus would sum: only the replica it can still scrape
    assert snapshot == fleet.replicas[0].snapshot()
    fleet.replicas[0].set_down()
    orphan = fleet.submit(Request(8, 2))
    assert orphan.triggered and orphan.value.finished_reason == ABORT
    with pytest.raises(EngineDownError):
        fleet.snapshot()


def test_a_server_with_several_engines_labels_and_balances_them() -> None:
    env = simpy.Environment()
    server = Server(env, tiny_preset(), num_engines=2)
    for _ in range(6):
        server.submit(Request(8, 50))
    # vLLM's data-parallel rule, least 4 x waiting + running: alternate while both are empty and running.
    assert [e.num_waiting + e.num_running for e in server.engines] == [3, 3]
    env.run(until=0.005)
    text = server.render_metrics()
    assert 'engine="1"' in text
    snapshot = server.snapshot()
    assert parse_vllm_metrics(text, MODEL) == snapshot
    assert (snapshot.running, snapshot.kv_num_blocks) == (6.0, 2002)
    added = server.add_engine()
    assert added.label == "2"
    server.submit(Request(8, 50))
    assert added.num_waiting == 1


def test_fleet_snapshot_sums_replicas_like_prometheus() -> None:
    env = simpy.Environment()
    fleet = Fleet.of(env, tiny_preset(), replicas=3, balancer="round_robin")
    for _ in range(20):
        fleet.submit(Request(8, 30))
    env.run(until=0.25)
    pages = [parse_vllm_metrics(fleet.render_metrics(i), MODEL) for i in range(3)]
    snapshot = fleet.snapshot()
    assert snapshot == combine_snapshots(pages)
    assert snapshot.running == sum(p.running for p in pages)
    assert snapshot.kv_cache_usage == max(p.kv_cache_usage or 0.0 for p in pages)
    fleet.set_capacity(max_num_seqs=8)
    env.run()
    assert fleet.completed == 20 and fleet.inflight == 0
