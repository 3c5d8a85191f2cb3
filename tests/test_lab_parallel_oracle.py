"""A cold oracle run simulated in a second process beside the policy's run: the same bits, and no process left.

At fleet scale the oracle's run is a second simulation as long as the policy's; on a cold cache the two run at
once. The worker hands its trace over through the disk cache, so what the caller reads must be what a serial run
simulates, array for array, and the worker must be gone when ``run_scenario`` returns, whether it ends well or not.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from model_concurrency.lab import oracle as oracle_module
from model_concurrency.lab.experiment import run_scenario
from model_concurrency.lab.scenario import Scenario, scenario_from_dict
from model_concurrency.policies.base import Policy
from model_concurrency.policies.registry import load_policy
from test_lab_oracle_cache import assert_same


def small() -> Scenario:
    return scenario_from_dict(
        {
            "name": "small",
            "seed": 11,
            "duration_s": 30.0,
            "fleet": {"engine": {"max_num_seqs": 16}, "replicas": 2},
            "workload": {"prompt_tokens": 256, "output_tokens": 32, "output_sigma": 0.5},
            "clients": {"count": 3, "floor": 1, "ceiling": 8},
            "background": {"fraction_of_capacity": 0.3},
        }
    )


def cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_CACHE", str(tmp_path / name))
    monkeypatch.setattr(oracle_module, "_memory", {})


def test_a_parallel_cold_run_gives_the_serial_runs_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cold(tmp_path, monkeypatch, "serial")
    serial = run_scenario(small(), lambda: load_policy("adaptive"), parallel=False)
    cold(tmp_path, monkeypatch, "parallel")
    parallel = run_scenario(small(), lambda: load_policy("adaptive"), parallel=True)
    assert serial.oracle is not None and parallel.oracle is not None
    assert_same(parallel.trace, serial.trace)
    assert_same(parallel.oracle, serial.oracle)
    assert parallel.summary == serial.summary
    assert (tmp_path / "parallel" / "oracle" / "runs").is_dir()  # the worker stored it; the caller read it back
    assert multiprocessing.active_children() == []


def test_a_failed_policy_run_leaves_no_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cold(tmp_path, monkeypatch, "failing")

    def broken() -> Policy:
        raise RuntimeError("policy failed to build")

    with pytest.raises(RuntimeError, match="policy failed to build"):
        run_scenario(small(), broken, parallel=True)
    assert multiprocessing.active_children() == []


def test_serial_is_the_default_for_small_runs_and_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    from model_concurrency.lab.experiment import _oracle_in_parallel

    fleet = scenario_from_dict({"name": "f", "duration_s": 1800.0, "fleet": {"replicas": 16, "engines": 4}})
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.delenv("MODEL_CONCURRENCY_SERIAL", raising=False)
    assert not _oracle_in_parallel(small(), None)
    assert _oracle_in_parallel(fleet, None)
    monkeypatch.setenv("MODEL_CONCURRENCY_SERIAL", "1")
    assert not _oracle_in_parallel(fleet, None)
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    monkeypatch.delenv("MODEL_CONCURRENCY_SERIAL")
    assert not _oracle_in_parallel(fleet, None)


def test_a_worker_that_cannot_store_its_run_costs_only_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cold(tmp_path, monkeypatch, "serial")
    serial = run_scenario(small(), lambda: load_policy("adaptive"), parallel=False)
    cold(tmp_path, monkeypatch, "blocked")
    (tmp_path / "blocked" / "oracle").mkdir(parents=True)
    (tmp_path / "blocked" / "oracle" / "runs").write_text("not a directory")  # the worker's save fails
    blocked = run_scenario(small(), lambda: load_policy("adaptive"), parallel=True)
    assert blocked.oracle is not None and serial.oracle is not None
    assert_same(blocked.oracle, serial.oracle)  # simulated again by the caller, same bits
    assert blocked.summary == serial.summary
    assert multiprocessing.active_children() == []
