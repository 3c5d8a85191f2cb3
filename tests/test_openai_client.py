"""The official ``openai`` client against the emulator: it must parse every shape the emulator returns."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.emulator.openai_shapes import embedding_vector


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", time_scale=1.0)) as running:
        yield running


@pytest.fixture(scope="module")
def llm() -> Iterator[RunningEmulator]:
    """A generative model for the chat and completions APIs (an embedding model refuses them, as vLLM's does)."""
    with serve_in_thread(EmulatorConfig(preset="llama-8b-h100", time_scale=1.0)) as running:
        yield running


def test_embeddings(emu: RunningEmulator) -> None:
    client = openai.OpenAI(base_url=emu.base_url, api_key="emulator", max_retries=0)
    result = client.embeddings.create(model=emu.model, input=["first item", "second item"])  # base64 on the wire
    assert [d.index for d in result.data] == [0, 1]
    assert result.data[1].embedding == pytest.approx(embedding_vector(b"second item", 16), rel=1e-6)
    assert result.usage.prompt_tokens == result.usage.total_tokens == 6
    floats = client.embeddings.create(model=emu.model, input="x", encoding_format="float", dimensions=32)
    assert len(floats.data[0].embedding) == 32


def test_chat_completions_and_completions(llm: RunningEmulator) -> None:
    client = openai.OpenAI(base_url=llm.base_url, api_key="emulator", max_retries=0)
    chat = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": "Say something"}], max_tokens=5
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == "length" and chat.usage is not None
    assert chat.usage.completion_tokens == 5 == len((chat.choices[0].message.content or "").split())
    text = client.completions.create(model=llm.model, prompt="Once upon a time", max_tokens=200)
    assert text.choices[0].finish_reason == "stop" and text.usage is not None
    assert [m.id for m in client.models.list()] == [llm.model]


def test_async_client_and_errors(emu: RunningEmulator, llm: RunningEmulator) -> None:
    async def main() -> list[int]:
        client = openai.AsyncOpenAI(base_url=emu.base_url, api_key="emulator", max_retries=0)
        results = await asyncio.gather(*(client.embeddings.create(model=emu.model, input=f"i{i}") for i in range(20)))
        await client.close()
        return [r.usage.prompt_tokens for r in results]

    assert len(asyncio.run(main())) == 20
    client = openai.OpenAI(base_url=emu.base_url, api_key="emulator", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="not-served", input="x")
    with pytest.raises(openai.BadRequestError, match="does not support Chat Completions API"):
        client.chat.completions.create(model=emu.model, messages=[{"role": "user", "content": "x"}])
    generative = openai.OpenAI(base_url=llm.base_url, api_key="emulator", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="messages"):
        generative.chat.completions.create(model=llm.model, messages=[])
