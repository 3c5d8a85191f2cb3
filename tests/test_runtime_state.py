"""One owner per model: the runtime is the limiter's only writer, config knows no runtime, telemetry reads a
frozen state the runtime publishes, and ``get_utilization`` is that state's ``as_dict()``."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from model_concurrency import get_utilization, map_concurrent_sync, register_model, resolve_capacity
from model_concurrency.runtime import ModelRuntime, install_runtime, runtime_for
from model_concurrency.signals.source import ClientOnlySource
from model_concurrency.state import RuntimeState
from servers import Behaviour, EngineState, metrics_server, vllm_page
from test_original_names import ORIGINAL_KEYS

SRC = Path(__file__).resolve().parents[1] / "src" / "model_concurrency"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top, in functions or under TYPE_CHECKING."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("module", ["config.py", "telemetry.py", "state.py"])
def test_config_telemetry_and_state_never_import_the_runtime(module: str) -> None:
    assert not {n for n in imported_modules(SRC / module) if "runtime" in n}


@pytest.mark.parametrize("module", ["target.py", "slot.py", "aio.py", "threaded.py"])
def test_nothing_in_the_gate_resizes_a_limiter_but_its_runtime(module: str) -> None:
    calls = [
        node
        for node in ast.walk(ast.parse((SRC / "gate" / module).read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "resize"
    ]
    assert calls == []


def test_re_registration_rebuilds_even_an_installed_runtime() -> None:
    spec = register_model("m", base_url=None, max_parallel_calls=3)
    installed = install_runtime(ModelRuntime(spec, source=ClientOnlySource()))
    assert runtime_for("m") is installed
    register_model("m", base_url=None, max_parallel_calls=3)  # the same spec: still a new registration
    fresh = runtime_for("m")
    assert fresh is not installed and fresh.source is None
    assert runtime_for("m") is fresh


def test_the_state_is_frozen_and_the_static_view_has_the_same_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    page = vllm_page({"served": [EngineState(running=2, waiting_capacity=0)]})
    with metrics_server(Behaviour(body=page)) as server:
        register_model("m", base_url=f"{server.url}/v1", served_model_name="served", max_parallel_calls=4)
        assert resolve_capacity("m") == 4  # the first poll, inline
        adaptive = get_utilization("m")
        state = runtime_for("m").state()
        with pytest.raises(dataclasses.FrozenInstanceError):
            state.current_target = 99  # type: ignore[misc]
        assert adaptive == state.as_dict()
        assert adaptive["adaptive"] is True and adaptive["metrics_ok"] is True and adaptive["floor"] == 4
        monkeypatch.setenv("KG_ADAPTIVE_CONCURRENCY", "0")
        static = get_utilization("m")
    assert static.keys() == adaptive.keys() == {f.name for f in dataclasses.fields(RuntimeState)}
    assert set(ORIGINAL_KEYS) <= static.keys()
    assert static["current_target"] == 4 and static["adaptive"] is False and static["metrics_ok"] is None
    assert static["metrics_url"] == f"{server.url}/metrics"


def test_a_fan_out_leaves_the_limiter_at_the_runtime_target() -> None:
    page = vllm_page({"served": [EngineState(running=0, waiting_capacity=0)]})
    with metrics_server(Behaviour(body=page)) as server:
        register_model("m", base_url=f"{server.url}/v1", served_model_name="served", max_parallel_calls=4)
        map_concurrent_sync(range(20), lambda x: x, model="m")
        runtime = runtime_for("m")
        assert runtime.limiter.limit == runtime.current() == runtime.state().current_target
