"""Extras a new user installs: ``[all]`` brings the OpenAI integration, ``[ray]`` takes a range,
and a module whose extra is missing says which ``pip install`` fixes it."""

from __future__ import annotations

import importlib
import sys
import tomllib
from pathlib import Path

import pytest

from model_concurrency.extras import MissingExtra

ROOT = Path(__file__).resolve().parent.parent


def extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]["optional-dependencies"]  # type: ignore[no-any-return]


def test_all_includes_openai_and_ray_takes_a_range() -> None:
    table = extras()
    (everything,) = table["all"]
    assert "openai" in everything.split("[", 1)[1]
    (ray,) = table["ray"]
    assert "==" not in ray and ">=" in ray and "<" in ray


def test_openai_integration_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # as if not installed: import openai raises
    monkeypatch.delitem(sys.modules, "model_concurrency.integrations.openai", raising=False)
    with pytest.raises(MissingExtra, match=r"pip install 'model-concurrency\[openai\]'"):
        importlib.import_module("model_concurrency.integrations.openai")
    monkeypatch.delitem(sys.modules, "model_concurrency.integrations.openai", raising=False)


def test_ray_module_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from model_concurrency.ray import fan_out_actor, fan_out_task

    monkeypatch.setitem(sys.modules, "ray", None)
    for make in (fan_out_actor, fan_out_task):
        with pytest.raises(MissingExtra, match=r"pip install 'model-concurrency\[ray\]'"):
            make(num_cpus=0.25)
    assert issubclass(MissingExtra, ImportError)
