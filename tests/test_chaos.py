"""The chaos run, scaled down (benchmarks/chaos.py has the full size): map_concurrent over 600 embeddings while the
emulator, a subprocess, is SIGKILLed and restarted on the same port three times (1 s down each)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def chaos_module() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "chaos.py"
    spec = importlib.util.spec_from_file_location("chaos_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_an_engine_killed_three_times_fails_almost_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0.25")
    report = chaos_module().run(items=600, kills=3, down_s=1.0, retries=3, poll_s=0.25, speed=0.2)
    assert report.goals() == {
        ">= 99 % succeed": True,
        "none lost": True,
        "0 in flight": True,
        "target back within 10 polls": True,
    }, report
    assert report.outages_opened >= 3  # each kill was seen as an outage, not as 600 failed items
