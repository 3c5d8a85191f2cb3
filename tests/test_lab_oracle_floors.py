"""The oracle keeps the clients' floors, as every policy must.

Where the floors add up past the knee, a policy cannot hold the knee (the runtime never goes below a floor), so an
oracle that did would charge the floors' queue to the policy. Its per-client share is ``max(floor, min(ceiling,
knee / N))``; where the floors fit, the even split of the knee is unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from model_concurrency.lab import oracle as oracle_module
from model_concurrency.lab.oracle import Oracle
from model_concurrency.lab.scenario import Scenario, scenario_from_dict


def small(clients: dict[str, Any]) -> Scenario:
    return scenario_from_dict(
        {
            "name": "small-engine",
            "seed": 3,
            "duration_s": 60.0,
            "fleet": {"engine": {"max_num_seqs": 8}},
            "workload": {"prompt_tokens": 128, "output_tokens": 16},
            "clients": clients,
        }
    )


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_CACHE", str(tmp_path))
    monkeypatch.setattr(oracle_module, "_memory", {})


def test_floors_past_the_knee_bind_the_oracle() -> None:
    scenario = small({"count": 4, "floor": 4, "ceiling": 64})
    oracle = Oracle(scenario)
    [(_, knee)] = oracle.knees()
    assert knee < 4 * 4  # the floors (16) add up past the knee of an 8-sequence engine
    assert oracle.schedules() == [[(0.0, 4)]] * 4


def test_floors_that_fit_leave_the_even_split() -> None:
    scenario = small({"count": 3, "floor": 1, "ceiling": 64})
    oracle = Oracle(scenario)
    [(_, knee)] = oracle.knees()
    shares = [schedule[0][1] for schedule in oracle.schedules()]
    assert sum(shares) == knee
    assert max(shares) - min(shares) <= 1


def test_the_ceiling_caps_each_share() -> None:
    scenario = small({"count": 1, "floor": 1, "ceiling": 2})
    assert Oracle(scenario).schedules() == [[(0.0, 2)]]
