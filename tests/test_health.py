"""Failures that show (health.py): each is a field of ``get_utilization``, an exported metric, and one log line
when it starts or ends, none while it lasts. Driven through ``resolve_capacity`` and ``map_concurrent_sync``
against real loopback servers; the fan-out tests run the runtime on a fake clock, one poll per fan-out."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client import REGISTRY

from conftest import POLL_WAIT_MAX_S, FakeClock
from model_concurrency import get_utilization, map_concurrent_sync, register_model, resolve_capacity, slot
from model_concurrency.health import STALE_POLLS, UNREACHED_POLLS
from model_concurrency.runtime import ModelRuntime, install_runtime
from servers import Behaviour, EngineState, metrics_server, vllm_page

SERVED = "served"
FLOOR = 4


def lines_of(caplog: pytest.LogCaptureFixture, model: str, level: int) -> list[str]:
    """Our records at ``level`` about ``model``, without the per-decision INFO lines."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "model_concurrency"
        and r.levelno == level
        and r.getMessage().startswith(f"model {model}:")
        and not r.getMessage().startswith(f"model {model}: target ")
        and "nothing here counts calls" not in r.getMessage()
    ]


def metric(name: str, model: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"model": model, **labels})


def page_with(success: float = 3.0, preemptions: float = 0.0) -> bytes:
    """A vLLM page whose completion counter reads ``success`` (the test server's default page counts 3)."""
    body = vllm_page({SERVED: [EngineState(running=0, preemptions=preemptions)]}).decode()
    old = 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="served"} 3.0'
    assert old in body
    return body.replace(old, old[: -len("3.0")] + f"{success:.1f}").encode()


class Job:
    """A model whose runtime runs on a fake clock: each :meth:`fan_out` first polls (the clock moved a full
    interval), then runs its items through ``map_concurrent_sync``; so the poll at fan-out k sees the calls of
    fan-out k-1."""

    def __init__(self, name: str, url: str, clock: FakeClock) -> None:
        self.name, self.clock = name, clock
        spec = register_model(name, base_url=f"{url}/v1", served_model_name=SERVED, max_parallel_calls=FLOOR)
        self.runtime = install_runtime(ModelRuntime(spec, clock=clock))

    def fan_out(self, items: int, fn: Callable[[int], int] = lambda x: x) -> None:
        self.clock.advance(POLL_WAIT_MAX_S)
        self.runtime.target()  # the due poll, here, before the fan-out's calls (its poller would race them)
        assert map_concurrent_sync(range(items), fn, model=self.name) == [fn(i) for i in range(items)]
        self.settle()

    def settle(self) -> None:
        """Wait until the runtime's background poller has stopped (it stops once nothing uses the model)."""
        deadline = time.monotonic() + 10
        while (self.runtime._poller is not None or self.runtime._polling) and time.monotonic() < deadline:
            time.sleep(0.002)


def test_a_fallback_shows_once_at_each_transition(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")  # every ask polls, inline
    monkeypatch.setenv("MODEL_CONCURRENCY_GRACE_POLLS", "2")
    with metrics_server(Behaviour(body=page_with())) as server, caplog.at_level(logging.INFO, "model_concurrency"):
        register_model("fb", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=FLOOR)
        assert resolve_capacity("fb") >= FLOOR
        assert get_utilization("fb")["fallback"] is None
        server.serve(b"down", status=500)
        seen = []
        for _ in range(6):
            resolve_capacity("fb")
            seen.append(get_utilization("fb")["fallback"])
        assert seen == ["grace", "grace", "floor", "floor", "floor", "floor"]
        assert metric("model_concurrency_fallback", "fb", kind="floor") == 1.0
        assert metric("model_concurrency_fallback", "fb", kind="grace") == 0.0
        warnings = lines_of(caplog, "fb", logging.WARNING)
        assert len(warnings) == 2, warnings  # into the grace, then to the floor; nothing while it persists
        assert "1 consecutive" in warnings[0] and "grace" in warnings[0]
        assert "3 consecutive, target 4" in warnings[1] and "floor" in warnings[1]
        server.serve(page_with())
        resolve_capacity("fb")
        assert get_utilization("fb")["fallback"] is None
        assert metric("model_concurrency_fallback", "fb", kind="floor") == 0.0
    back = [line for line in lines_of(caplog, "fb", logging.INFO) if "metrics back" in line]
    assert back == ["model fb: metrics back; the policy decides again (target 4)"]


def test_an_engine_restart_is_counted_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    with metrics_server(Behaviour(body=page_with(success=500, preemptions=40))) as server:
        register_model("rs", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=FLOOR)
        with caplog.at_level(logging.WARNING, "model_concurrency"):
            resolve_capacity("rs")
            server.serve(page_with(success=2, preemptions=0))  # the engine restarted: its counters start over
            resolve_capacity("rs")
            resolve_capacity("rs")  # counting up again from there: no second reset
        assert get_utilization("rs")["counter_resets"] == 1
        assert metric("model_concurrency_counter_resets", "rs") == 1.0
    (line,) = lines_of(caplog, "rs", logging.WARNING)
    assert "preemptions_total, success_total" in line and "engine restart" in line


def test_a_page_that_stopped_moving_is_a_stale_signal(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    with metrics_server(Behaviour(body=page_with(success=100))) as server:
        job = Job("st", server.url, clock)
        with caplog.at_level(logging.INFO, "model_concurrency"):
            stale = []
            for _ in range(STALE_POLLS + 2):  # the first poll has nothing to compare with
                job.fan_out(12)
                stale.append(get_utilization("st")["signal_stale"])
            assert stale == [False] * STALE_POLLS + [True, True]
            assert metric("model_concurrency_signal_stale", "st") == 1.0
            server.serve(page_with(success=160))  # the exporter moves again
            job.fan_out(12)
        assert get_utilization("st")["signal_stale"] is False
        assert metric("model_concurrency_signal_stale", "st") == 0.0
    (warning,) = lines_of(caplog, "st", logging.WARNING)
    assert f"has not moved for {STALE_POLLS} polls while our calls completed" in warning
    assert lines_of(caplog, "st", logging.INFO) == ["model st: the metrics page moves again"]


def test_a_limit_nothing_reaches_shows_the_gate_is_open(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    with metrics_server(Behaviour(render=lambda: page_with(success=time.monotonic()))) as server:
        job = Job("ur", server.url, clock)
        with caplog.at_level(logging.INFO, "model_concurrency"):
            unreached = []
            for _ in range(UNREACHED_POLLS + 2):  # two items at a time never fill a window of 4
                job.fan_out(2)
                unreached.append(get_utilization("ur")["limit_unreached"])
            # The first poll drains nothing yet; from the second on, each saw a peak of 1-2 below the limit 4.
            assert unreached == [False] * UNREACHED_POLLS + [True, True]
            assert metric("model_concurrency_limit_unreached", "ur") == 1.0
            assert get_utilization("ur")["limited_by"] == "app-limited"
            with contextlib.ExitStack() as held:  # now the whole window is held at once, through slot()
                for _ in range(FLOOR):
                    held.enter_context(slot("ur"))
            job.settle()
            job.fan_out(1)  # its poll sees that peak
        assert get_utilization("ur")["limit_unreached"] is False
    (warning,) = lines_of(caplog, "ur", logging.WARNING)
    assert f"in flight stayed below the limit 4 for {UNREACHED_POLLS} polls" in warning
    assert lines_of(caplog, "ur", logging.INFO) == ["model ur: in flight reaches the limit again"]


def test_a_client_side_source_is_never_stale(clock: FakeClock) -> None:
    """A hosted endpoint's source reads no page (an empty snapshot every poll): nothing there can go stale."""
    from model_concurrency.policies import Gradient

    spec = register_model("cs", base_url="http://127.0.0.1:9/v1", policy=Gradient(), max_parallel_calls=FLOOR)
    job = Job.__new__(Job)
    job.name, job.clock = "cs", clock
    job.runtime = install_runtime(ModelRuntime(spec, clock=clock))
    for _ in range(STALE_POLLS + 2):
        job.fan_out(8)
    assert get_utilization("cs")["signal_stale"] is False and get_utilization("cs")["metrics_ok"] is True


def test_an_outage_shows_its_reason_and_age_until_a_call_gets_through(clock: FakeClock) -> None:
    """A refused connection through ``slot()`` opens the outage hold; ``get_utilization`` names it and its age on
    the runtime's clock, and a call sent after it that succeeds clears both."""
    with socket.socket() as probe:  # a port nothing listens on: bound, then closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spec = register_model("out", base_url=f"http://127.0.0.1:{port}/v1", max_parallel_calls=FLOOR)
    install_runtime(ModelRuntime(spec, clock=clock))
    assert (get_utilization("out")["outage"], get_utilization("out")["outage_s"]) == (None, None)
    with contextlib.suppress(httpx.ConnectError), slot("out"):
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
    clock.advance(7.5)
    state = get_utilization("out")
    assert (state["outage"], state["outage_s"]) == ("connection refused or reset", 7.5)
    with slot("out"):  # the probe: the hold lets one call through once its backoff has passed on this clock
        pass
    assert (get_utilization("out")["outage"], get_utilization("out")["outage_s"]) == (None, None)


def test_a_page_never_read_is_not_called_a_held_target(caplog: pytest.LogCaptureFixture) -> None:
    """Failed polls before any page was read: the line names the URL and says the target stays at the floor (there
    is no last good target to hold); once a page was read, the usual grace line, with the URL."""
    from model_concurrency.health import HealthWatch
    from model_concurrency.observation import EngineSnapshot, Observation

    url = "http://127.0.0.1:9/metrics"
    watch = HealthWatch("nr", url=url)
    failed = Observation(ok=False, time=1.0)
    with caplog.at_level(logging.INFO, "model_concurrency"):
        first = watch.judge(fallback="grace", obs=failed, limit=4, target=4, snapshot=None, previous=None, failures=1)
        floor = watch.judge(fallback="floor", obs=failed, limit=4, target=4, snapshot=None, previous=None, failures=4)
        good = watch.judge(
            fallback=None, obs=Observation(time=2.0), limit=4, target=4, snapshot=EngineSnapshot(), previous=None
        )
        again = watch.judge(fallback="grace", obs=failed, limit=4, target=4, snapshot=None, previous=None, failures=1)
    assert (first.metrics_never_read, floor.metrics_never_read) == (True, True)
    assert (good.metrics_never_read, again.metrics_never_read) == (False, False)
    assert lines_of(caplog, "nr", logging.WARNING) == [
        "model nr: metrics poll failed (no snapshot); 1 consecutive, target 4: the metrics page "
        f"{url} has never answered, so the target stays at the floor until it does",
        "model nr: metrics poll failed (no snapshot); 4 consecutive, target 4: the metrics page "
        f"{url} has still never answered: the target stays at the floor until it does",
        "model nr: metrics poll failed (no snapshot); 1 consecutive, target 4: holding the last good target "
        f"through the grace polls ({url})",
    ]
