"""The original design's names, imported from the package root, behave as that design documented.

These are a contract with every caller written against the first version of the hook: a rename keeps the old
name as an alias, and this file fails if one disappears. The engine is a real HTTP server on 127.0.0.1 serving a
vLLM-shaped page whose ``running`` follows what the hook last answered (a caller that sizes its pool from it).
"""

from __future__ import annotations

import pytest

import model_concurrency
from model_concurrency import (
    adaptive_capacity,
    get_utilization,
    register_model,
    reset_controllers,
    reset_runtimes,
    resolve_capacity,
)
from servers import Behaviour, EngineState, metrics_server, vllm_page

SERVED = "meta-llama/Llama-3.1-8B-Instruct"
ORIGINAL_KEYS = (
    "running",
    "waiting_capacity",
    "current_target",
    "floor",
    "ceiling",
    "metrics_ok",
    "saturated",
    "last_poll",
    "metrics_url",
)


class FollowingEngine:
    """An engine page whose running count is the pool the caller sized from the hook's last answer."""

    def __init__(self) -> None:
        self.pool = 0

    def render(self) -> bytes:
        return vllm_page({SERVED: [EngineState(running=self.pool)]})


def size_pools(model: str, times: int, engine: FollowingEngine) -> list[int]:
    """Ask the hook ``times`` times, each time running a pool of exactly the size it answered."""
    answers = []
    for _ in range(times):
        engine.pool = resolve_capacity(model)
        answers.append(engine.pool)
    return answers


def test_every_original_name_is_exported_from_the_root() -> None:
    for name in ("resolve_capacity", "adaptive_capacity", "get_utilization", "reset_controllers"):
        assert name in model_concurrency.__all__
        assert callable(getattr(model_concurrency, name))
    assert reset_controllers is reset_runtimes


def test_the_hook_ramps_reports_nine_keys_and_reset_controllers_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")  # every ask polls: fine against a loopback server
    engine = FollowingEngine()
    with metrics_server(Behaviour(render=engine.render)) as server:
        register_model("llama", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=4)
        answers = size_pools("llama", 8, engine)
        assert answers[0] == 4  # the static capacity is the floor and the first answer
        assert answers == sorted(answers) and answers[-1] > 4  # a full pool with nobody waiting grows
        util = get_utilization("llama")
        for key in ORIGINAL_KEYS:
            assert key in util, key
        assert util["floor"] == 4 and util["ceiling"] == 512 and util["metrics_ok"] is True
        assert util["current_target"] == answers[-1] and util["saturated"] is False
        assert util["metrics_url"] == f"{server.url}/metrics"

        reset_controllers()  # the original name: drops the controller, so the next answer starts from the floor
        engine.pool = 0
        assert resolve_capacity("llama") == 4
        assert adaptive_capacity("llama", 6) == 6  # an explicit floor wins over the static one


def test_kg_adaptive_concurrency_off_is_the_static_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KG_ADAPTIVE_CONCURRENCY", "0")
    engine = FollowingEngine()
    with metrics_server(Behaviour(render=engine.render)) as server:
        register_model(
            "llama", base_url=f"{server.url}/v1", served_model_name=SERVED, parallel_instances=2, max_parallel_calls=3
        )
        assert size_pools("llama", 5, engine) == [6] * 5
        assert server.requests == []  # no scrape at all


def test_model_max_concurrency_is_the_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "7")
    engine = FollowingEngine()
    with metrics_server(Behaviour(render=engine.render)) as server:
        register_model("llama", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=4)
        answers = size_pools("llama", 10, engine)
        assert max(answers) == 7  # grows to the ceiling and no further
        assert get_utilization("llama")["ceiling"] == 7
