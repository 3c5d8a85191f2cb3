"""The real ``openai`` client and plain httpx, wrapped so each request holds a slot: against the emulator over
loopback HTTP, and against the emulator's token bucket answering 429 with Retry-After."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest

from model_concurrency.config import register_model
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.integrations.httpx import AsyncSlotTransport, SlotTransport
from model_concurrency.integrations.openai import wrap
from model_concurrency.runtime import runtime_for


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", time_scale=1.0)) as running:
        yield running


def register(emu: RunningEmulator, floor: int) -> None:
    # No base_url: a static model (no poller), so every call stays in the recorder for the test to read.
    register_model("bge", base_url=None, served_model_name=emu.model, max_parallel_calls=floor)


def test_async_client_is_bounded_by_the_model_limit(emu: RunningEmulator) -> None:
    register(emu, floor=3)
    runtime = runtime_for("bge")
    runtime.limiter.take_usage()

    async def main() -> int:
        client = wrap(openai.AsyncOpenAI(base_url=emu.base_url, api_key="k", max_retries=0))  # key from "model"
        results = await asyncio.gather(*(client.embeddings.create(model=emu.model, input=f"t{i}") for i in range(24)))
        await client.close()
        return len(results)

    assert asyncio.run(main()) == 24
    usage = runtime.limiter.take_usage()
    assert usage.peak == 3  # 24 concurrent requests, never more than the limit in flight
    assert runtime.inflight() == 0
    stats = runtime.calls.drain()
    assert (stats.calls, stats.errors, stats.throttled) == (24, 0, 0)


def test_sync_client_records_outcomes(emu: RunningEmulator) -> None:
    register(emu, floor=2)
    client = wrap(openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0), model="bge")
    result = client.embeddings.create(model=emu.model, input=["a", "b"])
    assert [d.index for d in result.data] == [0, 1]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="not-served", input="x")  # wrapped with model=: counted under "bge"
    assert [m.id for m in client.models.list()] == [emu.model]  # a GET without a JSON body is gated too (model=)
    stats = runtime_for("bge").calls.drain()
    assert (stats.calls, stats.errors, stats.throttled) == (3, 1, 0)
    assert runtime_for("bge").inflight() == 0


def test_streamed_chat_holds_its_slot_until_the_stream_closes() -> None:
    # A generative model: an embedding model refuses the chat API, as vLLM's does.
    with serve_in_thread(EmulatorConfig(preset="llama-8b-h100", time_scale=1.0)) as llm:
        register(llm, floor=2)
        client = wrap(openai.OpenAI(base_url=llm.base_url, api_key="k", max_retries=0))
        runtime = runtime_for("bge")
        stream = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
        assert runtime.inflight() == 1
        chunks = list(stream)
    assert chunks and runtime.inflight() == 0
    assert runtime.calls.drain().calls == 1


def test_plain_httpx_transport(emu: RunningEmulator) -> None:
    register(emu, floor=1)
    with httpx.Client(transport=SlotTransport()) as client:
        response = client.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": "x"})
        assert response.status_code == 200 and response.json()["data"][0]["index"] == 0
        assert client.get(f"{emu.base_url}/models").status_code == 200  # no model named: not gated
    stats = runtime_for("bge").calls.drain()
    assert (stats.calls, stats.errors) == (1, 0)


@pytest.fixture
def limited() -> Iterator[RunningEmulator]:
    # Two requests per minute: the bucket starts full, so the third call in a row is answered 429.
    with serve_in_thread(EmulatorConfig(preset="bge-m3", time_scale=1.0, requests_per_minute=2)) as running:
        yield running


def test_429_is_throttled_and_holds_the_model(limited: RunningEmulator) -> None:
    register(limited, floor=4)
    client = wrap(openai.OpenAI(base_url=limited.base_url, api_key="k", max_retries=0))
    client.embeddings.create(model=limited.model, input="1")
    client.embeddings.create(model=limited.model, input="2")
    with pytest.raises(openai.RateLimitError) as caught:
        client.embeddings.create(model=limited.model, input="3")
    asked = float(caught.value.response.headers["retry-after-ms"]) / 1000
    runtime = runtime_for("bge")
    stats = runtime.calls.drain()
    assert (stats.calls, stats.errors, stats.throttled) == (3, 1, 1)  # the throttled call is no success
    assert runtime.limiter.hold.holds == 1
    assert 0 < runtime.held_for() <= asked <= 60


def test_async_transport_hands_retry_after_over(limited: RunningEmulator) -> None:
    register(limited, floor=4)

    async def main() -> list[int]:
        async with httpx.AsyncClient(transport=AsyncSlotTransport(model="bge")) as client:
            body = {"model": limited.model, "input": "x"}
            return [(await client.post(f"{limited.base_url}/embeddings", json=body)).status_code for _ in range(3)]

    assert asyncio.run(main()) == [200, 200, 429]
    runtime = runtime_for("bge")
    assert runtime.calls.drain().throttled == 1
    assert runtime.held_for() > 0
