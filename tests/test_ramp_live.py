"""The default's first ramp through the user's entry point (``map_concurrent``), over real HTTP to the emulator.

A decoder served as ``model-concurrency emulate --max-num-seqs 48`` serves it (an engine process and an API-server
process on 127.0.0.1), whose operator stated that limit, polled every 0.5 s from the smallest floor a user has (4):
the target reaches 40 and never passes 53 (1.1 × the limit). An embedding server whose API front end is the
bottleneck, polled every 2 s, is held near its knee by the growth guard.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from model_concurrency import get_utilization, map_concurrent, register_model, reset_runtimes
from model_concurrency.emulator import EmulatorConfig, serve_in_processes
from model_concurrency.integrations.httpx import ShardedAsyncClient
from model_concurrency.runtime import runtime_for

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0.5")
    monkeypatch.delenv("MODEL_MAX_CONCURRENCY", raising=False)
    reset_runtimes()
    yield
    reset_runtimes()


async def _fan_out(
    base_url: str, model: str, path: str, body: dict[str, object], items: int, stop_at: int
) -> list[int]:
    """Send up to ``items`` calls through ``map_concurrent``; every target seen after a call, in order. Stops feeding
    new items once the target has stood at ``stop_at`` or more for 300 calls (the ramp has been judged)."""
    seen: list[int] = []

    async def feed() -> AsyncIterator[int]:
        since = None
        for i in range(items):
            if since is None and seen and seen[-1] >= stop_at:
                since = len(seen)
            if since is not None and len(seen) - since >= 300:
                return
            yield i

    async with ShardedAsyncClient(base_url=base_url, timeout=60, connections=600) as client:

        async def call(_: int) -> None:
            response = await client.post(path, json=body)
            response.raise_for_status()
            seen.append(int(get_utilization(model)["current_target"]))

        await map_concurrent(feed(), call, model=model)
    return seen


def test_a_stated_sequence_limit_is_reached_and_never_passed() -> None:
    config = EmulatorConfig(preset="llama-8b-h100", max_num_seqs=48, served_model_name="llama")
    with serve_in_processes(config) as server:
        register_model("llama48", base_url=server.base_url, served_model_name="llama", max_parallel_calls=4,
                       max_num_seqs=48)  # fmt: skip
        body = {"model": "llama", "messages": [{"role": "user", "content": "hello " * 20}], "max_tokens": 32}
        seen = asyncio.run(_fan_out(server.base_url, "llama48", "/chat/completions", body, 6000, stop_at=40))
    assert get_utilization("llama48")["limits"]["max_num_seqs"] == 48
    assert max(seen) >= 40, seen[-20:]
    assert max(seen) <= 53


def test_growth_past_a_front_end_bottleneck_is_held_near_the_knee(monkeypatch: pytest.MonkeyPatch) -> None:
    """bge-m3 behind one API-server process: the engine runs a handful of calls, the front end queues the rest.

    On this machine throughput is flat from about 64 in flight up (the knee). The engine's gauges never show the
    queue, so nothing but the growth guard stops growth at the ceiling (512): the first ramp jumps past the knee (4,
    32, 256), and the guard holds the target under 192 from a cap of twice the bandwidth-delay product and the knee
    rule's sawtooth above the knee (61-91 in runs here). Polled every 2 s: a poll of ~1,200 completions gives a rate
    within a few percent of the truth, where the knee rule's plateau is 5 % wide (0.5 s polls read one load at
    570-880 calls/s, and the knee wandered with the noise).
    """
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "2")
    config = EmulatorConfig(preset="bge-m3", served_model_name="bge")
    with serve_in_processes(config) as server:
        register_model("bge-fe", base_url=server.base_url, served_model_name="bge", max_parallel_calls=4)
        body = {"model": "bge", "input": "a sentence to embed " * 10}
        seen = asyncio.run(_fan_out(server.base_url, "bge-fe", "/embeddings", body, 16000, stop_at=10**6))
    assert len(seen) == 16000
    assert runtime_for("bge-fe").core.guard.fired >= 1  # the engine showed room all along: the guard stopped it
    assert max(seen[-2000:]) < 192, seen[::200]  # under 3 x the knee, for good
