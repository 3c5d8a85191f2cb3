"""Knobs, the registry, roles, TOML loading, and URL derivation."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_concurrency import load_config, metrics_url_from_base, register_model, setting
from model_concurrency.config import get_model, registered_models


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://h:8000/v1", "http://h:8000/metrics"),
        ("http://h:8000/v1/", "http://h:8000/metrics"),
        ("https://h", "https://h/metrics"),
        ("https://h/", "https://h/metrics"),
        ("http://10.0.0.1:9000/openai/v1", "http://10.0.0.1:9000/metrics"),
        ("http://[::1]:8000/v1", "http://[::1]:8000/metrics"),
    ],
)
def test_metrics_url_from_base(base: str, expected: str) -> None:
    assert metrics_url_from_base(base) == expected


@pytest.mark.parametrize(
    ("base", "message"),
    [
        ("ftp://h/v1", "http or https"),
        ("file:///etc/passwd", "http or https"),
        ("http://user:pw@h:8000/v1", "credentials"),
        ("http://h:8000/v1?x=1", "query"),
        ("http:///v1", "no host"),
        ("h:8000/v1", "http or https"),
    ],
)
def test_metrics_url_rejects(base: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        metrics_url_from_base(base)


def test_setting_reads_env_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    assert setting("MODEL_MAX_CONCURRENCY", 512) == 512
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "64")
    assert setting("MODEL_MAX_CONCURRENCY", 512) == 64
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "lots")
    assert setting("MODEL_MAX_CONCURRENCY", 512) == 512
    monkeypatch.setenv("KG_ADAPTIVE_CONCURRENCY", "off")
    assert setting("KG_ADAPTIVE_CONCURRENCY", True) is False
    monkeypatch.setenv("KG_ADAPTIVE_CONCURRENCY", "1")
    assert setting("KG_ADAPTIVE_CONCURRENCY", True) is True
    monkeypatch.setenv("X_POLL", "0.5")
    assert setting("X_POLL", 12.0) == 0.5
    assert setting("X_POLL", 0, cast=lambda s: int(float(s) * 10)) == 5


def test_static_capacity_and_roles() -> None:
    spec = register_model(
        "bge", base_url="http://h:1/v1", parallel_instances=2, max_parallel_calls=3, roles=["embedding"]
    )
    assert spec.static_capacity == 6
    assert get_model("embedding") is spec
    assert get_model("bge") is spec
    assert get_model("nope") is None
    assert register_model("z", base_url=None, parallel_instances=0).static_capacity == 1


def test_register_validates() -> None:
    with pytest.raises(ValueError):
        register_model("m", base_url="http://u:p@h/v1")
    with pytest.raises(ValueError):
        register_model("m", base_url="http://h/v1", metrics_url="gopher://h/metrics")
    with pytest.raises(ValueError):
        register_model("m", base_url="http://h/v1", parallel_instances=-1)


def test_api_key_not_in_repr() -> None:
    spec = register_model("m", base_url="http://h/v1", api_key="sk-SECRET-123")
    assert "sk-SECRET-123" not in repr(spec)


def test_toml_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        """
[models.bge-m3]
base_url = "http://127.0.0.1:8000/v1"
served_model_name = "BAAI/bge-m3"
max_parallel_calls = 4
roles = ["embedding"]
api_key_env = "BGE_KEY"

[models.llama]
base_url = "http://127.0.0.1:8001/v1"
roles = ["default"]
"""
    )
    monkeypatch.setenv("BGE_KEY", "k-1")
    monkeypatch.setenv("MODEL_CONCURRENCY_CONFIG", str(path))
    models = registered_models()
    assert set(models) == {"bge-m3", "llama"}
    assert models["bge-m3"].served_name == "BAAI/bge-m3"
    assert models["bge-m3"].api_key == "k-1"
    assert get_model(None) is models["llama"]
    # An explicit registration wins over the file.
    register_model("llama", base_url="http://127.0.0.1:9/v1", max_parallel_calls=9)
    llama = get_model("llama")
    assert llama is not None and llama.static_capacity == 9
    assert get_model("default") is None  # the explicit entry claims no role


def test_bad_toml_is_rejected_clearly(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[models.x]\nbase_url = "http://h/v1"\ncolour = "red"\n')
    with pytest.raises(ValueError, match="unknown keys"):
        load_config(path)


def test_broken_config_file_is_logged_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_CONFIG", str(tmp_path / "missing.toml"))
    assert registered_models() == {}
