"""Every entry point leaves a floor of 4 with fast calls, counted in polls (never in wall time).

The failure this guards against: a poll that read this process's in-flight at one instant, right after a call
had finished, saw ``target - 1``; with a target of 4 that is below ``0.8 x 4`` and the application-limited hold
held forever. The engine here is a /metrics page (rendered by prometheus_client, served over a real socket)
whose ``running`` is what the client has in flight at the moment of the scrape, with room to spare: the
honest picture of an engine that runs what it is sent. Each run stops at the target sought or at a poll budget,
whichever comes first; the assertion is on the poll count.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from model_concurrency import (
    map_concurrent,
    map_concurrent_sync,
    register_model,
    resolve_capacity,
    slot,
)
from model_concurrency.runtime import ModelRuntime, runtime_for
from servers import Behaviour, EngineState, MetricsServer, metrics_server, vllm_page

FLOOR, CALL_S, POLL_S, WANT = 4, 0.02, 0.05, 16
POLL_BUDGET = 40  # adaptive doubles per full poll: 4 -> 16 takes 2 when every poll sees use; allow for scheduling
SERVED = "engine-model"


class Counter:
    """The test's own in-flight count (for the hook-alone case, where the library counts nothing)."""

    def __init__(self) -> None:
        self.now = 0
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


def engine_page(running: int) -> bytes:
    return vllm_page({SERVED: [EngineState(running=running, kv=0.01)]})


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[MetricsServer, Counter]]:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", str(POLL_S))
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "128")
    counter = Counter()
    with metrics_server() as server:
        register_model("m", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=FLOOR)
        server.behaviour = Behaviour(render=lambda: engine_page(_running(counter)))
        yield server, counter


def _running(counter: Counter) -> int:
    """What the engine runs: the gate's count when the gate is used, else the test's own."""
    runtime = runtime_for("m")
    return max(runtime.inflight(), counter.now)


def done(runtime: ModelRuntime, want: int = WANT) -> bool:
    return runtime.current() >= want or runtime.core.polls >= POLL_BUDGET


def reached(runtime: ModelRuntime, want: int = WANT) -> int:
    """The poll count at the end of the run; fails when the target never got to ``want``."""
    assert runtime.current() >= want, f"target {runtime.current()} after {runtime.core.polls} polls"
    assert runtime.core.polls < POLL_BUDGET
    return runtime.core.polls


def test_async_gate_ramps(engine: tuple[MetricsServer, Counter]) -> None:
    runtime = runtime_for("m")

    async def items() -> AsyncIterator[int]:
        i = 0
        while not done(runtime):
            yield i
            i += 1

    async def call(i: int) -> int:
        await asyncio.sleep(CALL_S)
        return i

    asyncio.run(map_concurrent(items(), call, model="m"))
    print("async gate reached", runtime.current(), "in polls", reached(runtime))


def test_sync_gate_ramps(engine: tuple[MetricsServer, Counter]) -> None:
    runtime = runtime_for("m")

    def items() -> Iterator[int]:
        i = 0
        while not done(runtime):
            yield i
            i += 1

    def call(i: int) -> int:
        time.sleep(CALL_S)
        return i

    map_concurrent_sync(items(), call, model="m")
    print("sync gate reached", runtime.current(), "in polls", reached(runtime))


def test_async_slot_ramps(engine: tuple[MetricsServer, Counter]) -> None:
    """An application's own tasks (more than the target), each call wrapped in ``async with slot``."""
    runtime = runtime_for("m")

    async def worker() -> None:
        while not done(runtime):
            async with slot("m"):
                await asyncio.sleep(CALL_S)

    async def main() -> None:
        await asyncio.gather(*(worker() for _ in range(2 * WANT)))

    asyncio.run(main())
    print("async slot reached", runtime.current(), "in polls", reached(runtime))
    assert runtime.inflight() == 0


def test_sync_slot_ramps(engine: tuple[MetricsServer, Counter]) -> None:
    """An application's own thread pool, each call wrapped in ``with slot``."""
    runtime = runtime_for("m")

    def worker() -> None:
        while not done(runtime):
            with slot("m"):
                time.sleep(CALL_S)

    threads = [threading.Thread(target=worker) for _ in range(2 * WANT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    print("sync slot reached", runtime.current(), "in polls", reached(runtime))
    assert runtime.inflight() == 0


def test_resolve_capacity_alone_ramps(engine: tuple[MetricsServer, Counter], caplog: pytest.LogCaptureFixture) -> None:
    """A caller that sizes its own pool from the hook, batch after batch; nothing in the library counts its calls."""
    _, counter = engine
    runtime = runtime_for("m")

    def call(_: int) -> None:
        with counter:
            time.sleep(CALL_S)

    with caplog.at_level("INFO", "model_concurrency"):
        while not done(runtime):
            size = resolve_capacity("m")
            with ThreadPoolExecutor(max_workers=size) as pool:
                list(pool.map(call, range(4 * size)))
    print("resolve_capacity alone reached", runtime.current(), "in polls", reached(runtime))
    said = [r.getMessage() for r in caplog.records if "judging use from the engine's running" in r.getMessage()]
    assert len(said) == 1


@pytest.mark.slow
def test_emulator_end_to_end_with_the_default_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's use against the emulator (64 sequences): httpx calls through map_concurrent reach 32."""
    from model_concurrency.emulator import EmulatorConfig, serve_in_thread

    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", str(POLL_S))
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "128")
    want = 32
    # The engine at its own speed: a short embedding is a few ms of engine time. With the server and the client in
    # one process, the loopback HTTP stack adds its share as in-flight grows (the printed median says how much).
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=64, time_scale=1.0, simulate_frontend=False)
    with serve_in_thread(config) as emu:
        register_model("bge-m3", base_url=emu.base_url, served_model_name=emu.model, max_parallel_calls=FLOOR)
        runtime = runtime_for("bge-m3")
        latencies: list[float] = []

        async def items() -> AsyncIterator[int]:
            i = 0
            while not done(runtime, want):
                yield i
                i += 1

        async def main() -> None:
            async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=128)) as client:

                async def embed(i: int) -> None:
                    start = time.perf_counter()
                    r = await client.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": f"t {i}"})
                    r.raise_for_status()
                    latencies.append(time.perf_counter() - start)

                await map_concurrent(items(), embed, model="bge-m3")

        asyncio.run(main())
    median_ms = 1000 * sorted(latencies)[len(latencies) // 2]
    print("emulator reached", runtime.current(), "in polls", reached(runtime, want), f"median call {median_ms:.1f} ms")
