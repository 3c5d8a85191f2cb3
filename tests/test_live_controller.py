"""The live controller against a real HTTP server on 127.0.0.1 serving a vLLM-shaped page.

The clock is fake (polls happen when the test advances it), the sockets are real.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import POLL_WAIT_MAX_S, FakeClock
from model_concurrency import get_utilization, register_model, resolve_capacity
from model_concurrency.config import get_model
from model_concurrency.hooks import aresolve_capacity, controller_for
from model_concurrency.runtime import ModelRuntime
from model_concurrency.signals.scrape import ScrapeLimits
from servers import Behaviour, EngineState, MetricsServer, metrics_server, vllm_page
from test_original_names import ORIGINAL_KEYS

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
OTHER = "BAAI/bge-m3"


def two_model_page(running: float, capacity_waiting: float = 0, kv: float = 0.3) -> bytes:
    half = running / 2
    return vllm_page(
        {
            LLAMA: [
                EngineState(running=half, waiting_capacity=capacity_waiting, kv=kv),
                EngineState(running=running - half, kv=kv / 2),
            ],
            OTHER: [EngineState(running=1)],
        }
    )


def make_controller(server: MetricsServer, clock: FakeClock, **kwargs: object) -> ModelRuntime:
    spec = register_model("llama", base_url=f"{server.url}/v1", served_model_name=LLAMA, max_parallel_calls=4, **kwargs)  # type: ignore[arg-type]
    controller = ModelRuntime(spec, clock=clock)
    assert controller.source is not None
    controller.source.limits = ScrapeLimits(timeout_s=0.5, deadline_s=1.0)  # type: ignore[attr-defined]
    return controller


@pytest.mark.parametrize("policy", ["aimd", "adaptive"])
def test_ramp_saturation_outage(clock: FakeClock, policy: str) -> None:
    with metrics_server() as server:
        controller = make_controller(server, clock, policy=policy)
        # Nothing here counts calls in flight (no gate, no slot), so the runtime judges use from the engine's
        # running, which the page sets to what this client sends.
        inflight = [0]
        assert controller.target() == 4  # first call polls at once (an empty page: failed, within grace)
        # Ramp: the engine has room; we use our whole target each poll, and the engine runs what we send.
        targets = []
        for _ in range(10):
            clock.advance(POLL_WAIT_MAX_S)
            inflight[0] = controller.peek()
            server.serve(two_model_page(running=inflight[0]))
            targets.append(controller.target())
        assert targets == sorted(targets) and targets[-1] > 30
        # Throttle: no poll until 12 s have passed.
        requests = len(server.requests)
        clock.advance(5)
        controller.target()
        assert len(server.requests) == requests
        # Saturation: capacity-waiting appears; the target is cut, never raised.
        before = controller.peek()
        server.serve(two_model_page(running=before, capacity_waiting=40))  # the engine runs what we send
        clock.advance(POLL_WAIT_MAX_S)
        inflight[0] = before
        after = controller.target()
        assert after < before
        if policy == "aimd":
            assert after <= int(0.8 * before)
        assert get_utilization_for(controller)["saturated"] is True
        # Outage: 3 failed polls hold the last good target, the 4th drops to the floor.
        server.serve(b"", status=503)
        held = []
        for _ in range(4):
            clock.advance(POLL_WAIT_MAX_S)
            held.append(controller.target())
        assert held == [after, after, after, 4]
        snap = get_utilization_for(controller)
        assert snap["metrics_ok"] is False and "503" in snap["last_error"]


def get_utilization_for(controller: ModelRuntime) -> dict[str, object]:
    from model_concurrency.telemetry import snapshot

    return snapshot(controller)


def test_hooks_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")  # every call polls: fine against a local server
    with metrics_server(Behaviour(body=two_model_page(running=3))) as server:
        register_model("llama", base_url=f"{server.url}/v1", served_model_name=LLAMA, max_parallel_calls=4)
        assert resolve_capacity("llama") == 4  # not near-full: inflight is 0, hold at the floor
        util = get_utilization("llama")
        assert util["metrics_ok"] is True and util["running"] == 3 and util["metrics_url"] == f"{server.url}/metrics"
        for key in ("model", *ORIGINAL_KEYS):
            assert key in util
        assert resolve_capacity("unknown-model") == 1


def test_flag_off_never_scrapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KG_ADAPTIVE_CONCURRENCY", "0")
    with metrics_server(Behaviour(body=two_model_page(running=3))) as server:
        register_model(
            "llama", base_url=f"{server.url}/v1", served_model_name=LLAMA, parallel_instances=2, max_parallel_calls=3
        )
        assert resolve_capacity("llama") == 6
        assert get_utilization("llama")["adaptive"] is False
        assert server.requests == []


def test_served_name_mismatch_is_a_failed_poll(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    with metrics_server(Behaviour(body=two_model_page(running=3))) as server:
        spec = register_model("llama", base_url=f"{server.url}/v1", max_parallel_calls=2)  # no served name
        controller = ModelRuntime(spec, clock=clock)
        with caplog.at_level(logging.WARNING, "model_concurrency"):
            assert controller.target() == 2
        assert controller.core.last_ok is False
        assert "model_name='llama'" in caplog.text


def test_bearer_token_goes_only_to_the_models_origin(clock: FakeClock) -> None:
    with (
        metrics_server(Behaviour(body=two_model_page(1))) as own,
        metrics_server(Behaviour(body=two_model_page(1))) as elsewhere,
    ):
        spec = register_model("a", base_url=f"{own.url}/v1", served_model_name=LLAMA, api_key="tok-123")
        ModelRuntime(spec, clock=clock).target()
        assert own.requests[-1][1].get("Authorization") == "Bearer tok-123"
        spec = register_model(
            "b",
            base_url=f"{own.url}/v1",
            metrics_url=f"{elsewhere.url}/metrics",
            served_model_name=LLAMA,
            api_key="tok-123",
        )
        controller = ModelRuntime(spec, clock=clock)
        controller.target()
        assert controller.core.last_ok is True
        assert "Authorization" not in elsewhere.requests[-1][1]
        assert "tok-123" not in repr(controller) and "tok-123" not in str(get_utilization_for(controller))


def test_gzip_body_is_read(clock: FakeClock) -> None:
    body = gzip.compress(two_model_page(running=9))
    with metrics_server(Behaviour(body=body, headers={"Content-Encoding": "gzip"})) as server:
        controller = make_controller(server, clock)
        controller.target()
        assert controller.core.last_ok is True and controller.core.last_observation.running == 9  # type: ignore[union-attr]


def test_slow_endpoint_never_blocks_the_event_loop(clock: FakeClock) -> None:
    """A heartbeat on the loop keeps ticking while a poll waits out a server that answers after the timeout."""

    async def main(server: MetricsServer) -> tuple[int, int, int]:
        controller = make_controller(server, clock)
        controller.source.limits = ScrapeLimits(timeout_s=0.3, deadline_s=0.6)  # type: ignore[union-attr]
        ticks = 0
        stop = asyncio.Event()

        async def heartbeat() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        beat = asyncio.create_task(heartbeat())
        await asyncio.sleep(0)
        start_ticks = ticks
        target = await controller.atarget()  # the async path: awaited, not blocking
        sync_target = controller.target()  # the sync path inside a loop: background thread, returns at once
        mid_ticks = ticks
        stop.set()
        await beat
        return target, mid_ticks - start_ticks, sync_target

    with metrics_server(Behaviour(body=two_model_page(3), delay_s=2.0)) as server:
        target, ticks, sync_target = asyncio.run(main(server))
    assert target == 4 and sync_target == 4
    assert ticks >= 5  # the loop ran its heartbeat throughout the 0.3 s timeout


def test_sync_caller_inside_loop_polls_in_background(clock: FakeClock) -> None:
    async def main(server: MetricsServer) -> ModelRuntime:
        controller = make_controller(server, clock)
        controller.target()
        return controller

    with metrics_server(Behaviour(body=two_model_page(7))) as server:
        controller = asyncio.run(main(server))
        for _ in range(200):
            if controller.core.polls:
                break
            time.sleep(0.01)
    assert controller.core.last_ok is True


def test_concurrent_callers_share_one_poll(clock: FakeClock) -> None:
    with metrics_server(Behaviour(body=two_model_page(3), delay_s=0.2)) as server:
        controller = make_controller(server, clock)
        threads = [threading.Thread(target=controller.target) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(server.requests) == 1


def test_aresolve_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    # Used alone, the hook judges use from the engine's running: 1 of a floor of 3 is application-limited.
    with metrics_server(Behaviour(body=two_model_page(1))) as server:
        register_model("llama", base_url=f"{server.url}/v1", served_model_name=LLAMA, max_parallel_calls=3)
        assert asyncio.run(aresolve_capacity("llama")) == 3
        assert len(server.requests) == 1
        assert asyncio.run(aresolve_capacity("nope")) == 1


# One server for the property below: hypothesis examples swap its body.
@pytest.fixture(scope="module")
def garbage_server() -> object:
    with metrics_server() as server:
        yield server


@settings(max_examples=40)
@given(body=st.binary(max_size=2000), status=st.sampled_from([200, 200, 200, 404, 500]))
def test_any_bytes_give_a_failed_poll_never_an_exception(
    garbage_server: MetricsServer, body: bytes, status: int
) -> None:
    clock = FakeClock()
    garbage_server.serve(two_model_page(running=10))
    controller = make_controller(garbage_server, clock, policy=_Fixed(40))
    controller.source.limits = ScrapeLimits(timeout_s=1, deadline_s=2)  # type: ignore[union-attr]
    assert controller.target() == 40
    garbage_server.serve(body, status=status)
    got = []
    for _ in range(4):
        clock.advance(POLL_WAIT_MAX_S)
        got.append(controller.target())
    if controller.core.last_ok:
        return  # the random bytes happened to be a valid page for the model
    assert got == [40, 40, 40, 4]


class _Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def next_target(self, target: float, obs: object) -> float:
        return self.value


@given(
    flag=st.sampled_from(["0", "false", "no", "off", "FALSE", " Off "]),
    parallel=st.integers(0, 50),
    calls=st.integers(1, 50),
)
def test_flag_off_is_static_for_any_input(
    monkeypatch: pytest.MonkeyPatch, flag: str, parallel: int, calls: int
) -> None:
    monkeypatch.setenv("KG_ADAPTIVE_CONCURRENCY", flag)
    register_model("m", base_url="http://127.0.0.1:9/v1", parallel_instances=parallel, max_parallel_calls=calls)
    assert resolve_capacity("m") == max(1, parallel * calls)
    assert controller_for("m") is None
    spec = get_model("m")
    assert spec is not None


class ClientOnly:
    """A policy that declares it reads no engine gauges (like ``gradient``)."""

    uses_engine_signals = False

    def next_target(self, target: float, obs: object) -> float:
        return target + 1


def test_client_only_policy_polls_without_scraping(clock: FakeClock) -> None:
    with metrics_server(Behaviour(body=b"", status=500)) as server:
        spec = register_model("hosted", base_url=f"{server.url}/v1", max_parallel_calls=2, policy=ClientOnly())
        controller = controller_for("hosted")
        assert controller is not None
        assert controller.target() == 3  # a poll happened and succeeded, from client-side figures only
        assert server.requests == []  # and nothing was scraped
        assert controller.core.last_ok is True
        assert "no /metrics" in get_utilization_for(controller)["metrics_url"]  # type: ignore[operator]
        assert spec.name == "hosted"
