"""How a worker registers its models from the shared configuration (in-process: no Ray needed for the rule)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model_concurrency import register_model, resolve_capacity
from model_concurrency.config import registered_models, unregister_all
from model_concurrency.hooks import controller_for
from model_concurrency.ray import FanOut, MapBatches, configure

TOML = """
[models.bge]
base_url = "http://127.0.0.1:9/v1"
served_model_name = "BAAI/bge-m3"
max_parallel_calls = 4
roles = ["embedding"]

[models.pinned]
base_url = "http://127.0.0.1:9/v1"
metrics_url = "http://127.0.0.1:9/metrics"
"""


@pytest.fixture
def toml(tmp_path: Path) -> str:
    path = tmp_path / "models.toml"
    path.write_text(TOML)
    return str(path)


def test_configure_once_per_process_keeps_the_controller(toml: str) -> None:
    specs = configure(toml)
    assert [s.name for s in specs] == ["bge", "pinned"]
    assert resolve_capacity("bge") == 4
    controller = controller_for("bge")
    assert configure(toml) == specs
    assert controller_for("bge") is controller  # not re-registered: what the controller learnt is kept


def test_configure_again_after_the_registry_was_cleared(toml: str) -> None:
    configure(toml)
    unregister_all()
    assert "bge" not in registered_models()
    configure(toml)
    assert registered_models()["bge"].static_capacity == 4


def test_prometheus_url_knob_switches_models_without_their_own_source(
    toml: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_PROMETHEUS_URL", "http://127.0.0.1:9090")
    specs = {s.name: s for s in configure(toml)}
    assert specs["bge"].prometheus_url == "http://127.0.0.1:9090"
    assert specs["pinned"].prometheus_url is None  # its metrics_url was chosen on purpose
    assert registered_models()["bge"].prometheus_url == "http://127.0.0.1:9090"
    # An explicit argument wins over the environment; "" turns the switch off.
    assert {s.name: s.prometheus_url for s in configure(toml, prometheus_url="")}["bge"] is None


def test_mapping_config_reads_the_key_in_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BGE_KEY", " secret\n")
    config = {"models": {"bge": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "BGE_KEY", "roles": ["e"]}}}
    (spec,) = configure(config)
    assert spec.api_key == "secret" and spec.roles == ("e",)
    with pytest.raises(ValueError, match="unknown keys"):
        configure({"models": {"x": {"base_url": None, "colour": "red"}}})
    with pytest.raises(ValueError, match="expected a table"):
        configure({"models": {"x": 3}})


def test_spec_objects_built_in_the_driver() -> None:
    spec = register_model("bge", base_url="http://127.0.0.1:9/v1", max_parallel_calls=2)
    unregister_all()
    assert configure([spec]) == (spec,)
    assert registered_models()["bge"] == spec
    with pytest.raises(TypeError, match="ModelSpec"):
        configure(["bge"])  # type: ignore[list-item]


def test_fan_out_in_process_and_a_model_missing_from_the_config(toml: str) -> None:
    assert FanOut(len, model="embedding", config=toml)(["a", "bb", "ccc"]) == [1, 2, 3]
    with pytest.raises(ValueError, match="not in the configuration"):
        FanOut(len, model="llama", config=toml).configure()


def test_map_batches_columns(toml: str) -> None:
    batch = {"item": np.array(["a", "bb"]), "id": np.array([7, 8])}
    out = MapBatches(FanOut(len, model="bge", config=toml))(batch)
    assert out["result"].tolist() == [1, 2] and out["id"].tolist() == [7, 8]
    vectors = MapBatches(FanOut(lambda s: [len(s)] * 3, model="bge", config=toml), output_column="v")(batch)
    assert vectors["v"].shape == (2, 3)
    ragged = MapBatches(FanOut(lambda s: [0] * len(s), model="bge", config=toml))(batch)
    assert ragged["result"].dtype == object and ragged["result"][1] == [0, 0]
    with pytest.raises(KeyError, match="no column 'text'"):
        MapBatches(FanOut(len, model="bge", config=toml), column="text")(batch)
