"""The emulator refuses the API its model does not serve, as vLLM does: a 400 with vLLM's message and error shape.

vLLM's server answers a handler its runner lacks with ``create_error_response("The model does not support ...
API")``: HTTP 400, ``{"error": {"message", "type": "BadRequestError", "param": null, "code": 400}}``.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread


@pytest.fixture(scope="module")
def embedder() -> Iterator[RunningEmulator]:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", time_scale=1.0)) as running:
        yield running


@pytest.fixture(scope="module")
def generator() -> Iterator[RunningEmulator]:
    with serve_in_thread(EmulatorConfig(preset="llama-8b-h100", time_scale=1.0)) as running:
        yield running


def refusal(api: str) -> dict[str, object]:
    return {"error": {"message": f"The model does not support {api} API", "type": "BadRequestError", "param": None,
                      "code": 400}}  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "api"),
    [
        ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, "Chat Completions"),
        ("/completions", {"prompt": "hi", "max_tokens": 2}, "Completions"),
    ],
)
def test_an_embedding_model_refuses_generation(
    embedder: RunningEmulator, path: str, body: dict[str, object], api: str
) -> None:
    before = httpx.get(embedder.metrics_url).text
    r = httpx.post(f"{embedder.base_url}{path}", json={"model": embedder.model, **body})
    assert (r.status_code, r.json()) == (400, refusal(api))
    # Refused before the engine saw anything: no request counted on the page.
    assert _successes(httpx.get(embedder.metrics_url).text) == _successes(before)


def test_a_generative_model_refuses_embeddings(generator: RunningEmulator) -> None:
    r = httpx.post(f"{generator.base_url}/embeddings", json={"model": generator.model, "input": "hello"})
    assert (r.status_code, r.json()) == (400, refusal("Embeddings"))


def test_each_serves_its_own_api(embedder: RunningEmulator, generator: RunningEmulator) -> None:
    embedded = httpx.post(f"{embedder.base_url}/embeddings", json={"model": embedder.model, "input": "hello"})
    assert embedded.status_code == 200 and embedded.json()["object"] == "list"
    chat = httpx.post(
        f"{generator.base_url}/chat/completions",
        json={"model": generator.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 2


def test_the_openai_client_reads_the_refusal_as_a_bad_request(embedder: RunningEmulator) -> None:
    client = openai.OpenAI(base_url=embedder.base_url, api_key="emulator", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="The model does not support Chat Completions API") as caught:
        client.chat.completions.create(model=embedder.model, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 400


def _successes(page: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith("vllm:request_success_total")
    )
