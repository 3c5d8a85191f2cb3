"""Shared fixtures: every test starts with an empty registry, no controllers and default knobs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from model_concurrency import config, knobs
from model_concurrency.runtime import reset_runtimes

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
settings.load_profile("default")

# Every runtime knob (the lab's stay: the suite sets MODEL_CONCURRENCY_FAST for the notebooks), from the one table.
_KNOBS = [k.name for k in knobs.KNOBS if k.area == "runtime"]


@pytest.fixture(autouse=True)
def clean_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for knob in _KNOBS:
        monkeypatch.delenv(knob, raising=False)
    config.unregister_all()
    reset_runtimes()
    yield
    config.unregister_all()
    reset_runtimes()


# The longest wait between two regular polls with the default knobs (POLL_S, ± POLL_JITTER of it): a test that
# advances a fake clock this far always finds the next poll due, wherever the jitter put it.
POLL_WAIT_MAX_S = config.POLL_S[1] * (1 + config.POLL_JITTER[1])


class FakeClock:
    """A clock the test advances by hand: controllers take their time from it, never from the wall."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
