"""The lab's clients told the engines' limits (``[clients] stated_limits``): their Observations carry them, merged
by the runtime's own rule, contradiction included."""

from __future__ import annotations

from typing import Any

import pytest

from model_concurrency import EngineLimits
from model_concurrency.lab.client import SimClient
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import scenario_from_dict
from model_concurrency.lab.world import StatedFront, stated_limits_for
from model_concurrency.policies.registry import load_policy
from model_concurrency.signals.limits import StatedLimits

STATED = {"max_num_seqs": "stated", "max_num_batched_tokens": "stated"}


def scenario(stated: bool | None, **changes: Any) -> dict[str, Any]:
    clients: dict[str, Any] = {"count": 2, "floor": 4, "ceiling": 128, "poll_s": 2}
    if stated is not None:
        clients["stated_limits"] = stated
    return {
        "name": "told",
        "seed": 3,
        "duration_s": 40,
        "fleet": {"preset": "llama-8b-h100", "engines": 2, "replicas": 1, "engine": {"max_num_seqs": 16}},
        "workload": {"prompt_tokens": 128, "output_tokens": 32},
        "clients": clients,
        **changes,
    }


def run(data: dict[str, Any]) -> list[SimClient]:
    seen: list[SimClient] = []
    simulate(scenario_from_dict(data), policy_factory=lambda: load_policy("adaptive"), inspect=seen.extend)
    return seen


def test_the_key_defaults_to_false_and_takes_only_a_bool() -> None:
    assert scenario_from_dict(scenario(None)).clients.stated_limits is False
    assert scenario_from_dict(scenario(True)).clients.stated_limits is True
    with pytest.raises(ValueError, match=r"clients.stated_limits = \"yes\": expected true or false"):
        scenario_from_dict(scenario("yes"))  # type: ignore[arg-type]


def test_the_stated_limits_are_the_fleets_engine_config_over_its_engines() -> None:
    told = scenario_from_dict(scenario(True, fleet={"preset": "llama-8b-h100", "engines": 2, "replicas": 3}))
    # The H100 preset's vllm serve defaults: 1024 sequences, 8192 batched tokens, per engine.
    assert stated_limits_for(told) == StatedLimits(max_num_seqs=1024, max_num_batched_tokens=8192, engines=6)
    assert stated_limits_for(scenario_from_dict(scenario(False))) is None


def test_told_clients_observe_the_stated_limits() -> None:
    clients = run(scenario(True))
    assert len(clients) == 2 and all(isinstance(c.target, StatedFront) for c in clients)
    for client in clients:
        obs = client.runtime.core.last_observation
        assert obs is not None and obs.ok
        # 16 sequences on each of 2 engines; the step budget is one engine's (the preset's 8192).
        assert obs.limits == EngineLimits(max_num_seqs=32, max_num_batched_tokens=8192, source=STATED)
        assert client.runtime.state().limits == obs.limits.as_dict()
        assert client.completed > 0


def test_untold_clients_observe_no_limits() -> None:
    clients = run(scenario(False))
    assert all(c.runtime.core.last_observation is not None for c in clients)
    assert all(c.runtime.core.last_observation.limits is None for c in clients)  # type: ignore[union-attr]


def test_a_fleet_that_outgrows_the_stated_total_contradicts_it() -> None:
    """Told 16 slots on one engine; three engines join: running passes 16, and the stated figure is dropped."""
    grown = scenario(
        True,
        duration_s=120,
        fleet={"preset": "llama-8b-h100", "engines": 1, "engine": {"max_num_seqs": 16}},
        events=[{"at_s": 10, "action": "add_engines", "count": 3}],
    )
    clients = run(grown)
    for client in clients:
        obs = client.runtime.core.last_observation
        assert obs is not None and obs.running > 16  # four engines of 16 serve more than the stated total
        assert client.runtime.stated_limits.seqs_ignored
        # No page states the sequence cap in the lab; the stated step budget stands.
        assert obs.limits == EngineLimits(max_num_batched_tokens=8192, source={"max_num_batched_tokens": "stated"})
