"""The oracle's run is cached on disk like its sweeps: a warm run reads it back, bit for bit, without simulating.

At fleet scale the oracle's run is a second 1,000-client simulation; a stored trace must be the trace, every array
and header field, and a changed scenario must never read another scenario's run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from model_concurrency.lab import oracle as oracle_module
from model_concurrency.lab.oracle import Oracle, cache_dir
from model_concurrency.lab.scenario import Scenario, scenario_from_dict
from model_concurrency.lab.trace import ClientTrace, Trace, load_trace, save_trace

SERIES = ("time", "running", "waiting_capacity", "kv_usage", "preemptions", "queue_times", "latencies", "finish_times")
CLIENT_SERIES = ("target", "inflight", "completions", "errors", "throttled", "poll_times", "poll_targets")


def tiny(seed: int = 3) -> Scenario:
    return scenario_from_dict(
        {
            "name": "tiny",
            "seed": seed,
            "duration_s": 40.0,
            "fleet": {"engine": {"max_num_seqs": 16}, "replicas": 2},
            "workload": {"prompt_tokens": 256, "output_tokens": 32, "output_sigma": 0.5},
            "clients": {"count": 3, "floor": 1, "ceiling": 8},
            "events": [{"at_s": 20.0, "action": "replica_down", "replica": 1}],
        }
    )


def assert_same(a: Trace, b: Trace) -> None:
    for name in SERIES:
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.dtype == y.dtype == np.float64 and x.tobytes() == y.tobytes(), name
    assert len(a.clients) == len(b.clients)
    for ca, cb in zip(a.clients, b.clients, strict=True):
        for name in CLIENT_SERIES:
            assert np.asarray(getattr(ca, name)).tobytes() == np.asarray(getattr(cb, name)).tobytes(), name
    assert (a.duration_s, a.capacity_changes, a.limit_rps) == (b.duration_s, b.capacity_changes, b.limit_rps)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MODEL_CONCURRENCY_CACHE", str(tmp_path))
    return cache_dir()


def test_a_stored_trace_reads_back_bit_for_bit(tmp_path: Path) -> None:
    trace = Oracle(tiny()).run()
    assert len(trace.finish_times) > 0 and trace.capacity_changes == [20.0]
    save_trace(trace, tmp_path / "t")
    assert_same(load_trace(tmp_path / "t"), trace)


def test_clients_with_polls_of_different_counts_read_back(tmp_path: Path) -> None:
    row = np.arange(4.0)
    clients = [
        ClientTrace(row, row, row, row, row, poll_times=np.arange(float(n)), poll_targets=np.full(n, 2.0))
        for n in (0, 3, 1)
    ]
    trace = Trace(row, row, row, row, row, clients, np.zeros(0), np.ones(2), np.ones(2), 4.0, [], 1.5)
    save_trace(trace, tmp_path / "t")
    assert_same(load_trace(tmp_path / "t"), trace)


def test_a_warm_oracle_run_reads_the_cache_without_simulating(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = Oracle(tiny()).run()
    assert len(list((cache / "runs").iterdir())) == 1

    def no_simulation(*args: object, **kwargs: object) -> Trace:
        raise AssertionError("a warm oracle run simulated")

    monkeypatch.setattr(oracle_module, "simulate", no_simulation)
    assert_same(Oracle(dataclasses.replace(tiny(), name="renamed")).run(), first)


def test_a_changed_scenario_simulates_its_own_run(cache: Path) -> None:
    first = Oracle(tiny()).run()
    other = Oracle(tiny(seed=4)).run()
    assert len(list((cache / "runs").iterdir())) == 2
    assert first.finish_times.tobytes() != other.finish_times.tobytes()


def test_a_damaged_entry_is_simulated_again(cache: Path) -> None:
    first = Oracle(tiny()).run()
    (entry,) = (cache / "runs").iterdir()
    (entry / "trace.json").write_text("{")
    assert_same(Oracle(tiny()).run(), first)
    assert_same(load_trace(entry), first)  # and stored again
