"""The emulator over real loopback sockets: endpoints, shapes, /metrics, admin capacity, errors and aborts."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
import time
from collections.abc import Iterator

import httpx
import pytest

from model_concurrency.emulator import METRICS_CONTENT_TYPE, EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.emulator.openai_shapes import embedding_vector
from model_concurrency.observation import EngineSnapshot
from model_concurrency.signals.vllm import parse_vllm_metrics


def wait_until(predicate: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout_s}s")


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", max_num_seqs=64, time_scale=1.0)) as running:
        yield running


@pytest.fixture(scope="module")
def llm() -> Iterator[RunningEmulator]:
    """A generative model: the chat and completions endpoints are its (an embedding model refuses them)."""
    with serve_in_thread(EmulatorConfig(preset="llama-8b-h100", max_num_seqs=64, time_scale=1.0)) as running:
        yield running


def test_embeddings_shape_and_determinism(emu: RunningEmulator) -> None:
    body = {"model": emu.model, "input": ["hello world", "a second, longer input of text"]}
    r = httpx.post(f"{emu.base_url}/embeddings", json=body)
    assert r.status_code == 200, r.text
    payload = r.json()
    assert payload["object"] == "list" and payload["model"] == emu.model and payload["id"].startswith("embd-")
    assert [d["index"] for d in payload["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 16 for d in payload["data"])
    assert payload["data"][0]["embedding"] == pytest.approx(embedding_vector(b"hello world", 16))
    assert payload["usage"]["prompt_tokens"] == payload["usage"]["total_tokens"] == 3 + 8
    again = httpx.post(f"{emu.base_url}/embeddings", json=body).json()
    assert again["data"][1]["embedding"] == payload["data"][1]["embedding"]

    b64 = httpx.post(
        f"{emu.base_url}/embeddings",
        json={"model": emu.model, "input": "hello world", "encoding_format": "base64", "dimensions": 8},
    ).json()
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert list(struct.unpack("<8f", raw)) == pytest.approx(embedding_vector(b"hello world", 8), rel=1e-6)

    tokens = httpx.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": [1, 2, 3, 4, 5]}).json()
    assert tokens["usage"]["prompt_tokens"] == 5


def test_completions_and_chat(llm: RunningEmulator) -> None:
    chat = httpx.post(
        f"{llm.base_url}/chat/completions",
        json={"model": llm.model, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3},
    ).json()
    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
    choice = chat["choices"][0]
    assert choice["message"]["role"] == "assistant" and len(choice["message"]["content"].split()) == 3
    assert choice["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 3
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 3

    text = httpx.post(f"{llm.base_url}/completions", json={"model": llm.model, "prompt": "Once upon"}).json()
    assert text["object"] == "text_completion" and text["choices"][0]["finish_reason"] == "stop"
    assert 8 <= text["usage"]["completion_tokens"] <= 64
    assert len(text["choices"][0]["text"].split()) == text["usage"]["completion_tokens"]


def test_models_health_and_metrics(emu: RunningEmulator) -> None:
    models = httpx.get(f"{emu.base_url}/models").json()
    assert models["data"][0]["id"] == emu.model == "BAAI/bge-m3"
    assert httpx.get(f"{emu.url}/health").status_code == 200
    before = parse_vllm_metrics(httpx.get(emu.metrics_url).text, emu.model).success_total or 0.0
    httpx.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": ["a", "b", "c"]}).raise_for_status()
    page = httpx.get(emu.metrics_url)
    assert page.headers["content-type"] == METRICS_CONTENT_TYPE
    snap = parse_vllm_metrics(page.text, emu.model)
    assert snap.success_total == before + 3
    assert snap.running == 0 and snap.waiting_capacity == 0
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="BAAI/bge-m3"}' in page.text


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/embeddings", {"model": "BAAI/bge-m3"}, 400, "input"),
        ("/embeddings", {"model": "BAAI/bge-m3", "input": ""}, 400, "input"),
        ("/embeddings", {"model": "BAAI/bge-m3", "input": "x", "dimensions": 0}, 400, "dimensions"),
        ("/embeddings", {"model": "BAAI/bge-m3", "input": "x" * 40_000}, 400, "input"),
        ("/embeddings", {"model": "nope", "input": "x"}, 404, "model"),
        ("/chat/completions", {"messages": []}, 400, "messages"),
        ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream"),
        ("/completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
        ("/completions", {"prompt": "x", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
        ("/completions", {"prompt": "x", "ignore_eos": "no"}, 400, "ignore_eos"),
        ("/completions", {"prompt": "x", "max_tokens": 9000}, 400, "max_tokens"),
    ],
)
def test_errors_are_openai_json(
    emu: RunningEmulator, llm: RunningEmulator, path: str, body: dict[str, object], status: int, param: str
) -> None:
    served = emu if path == "/embeddings" else llm  # each endpoint on a model that serves it
    r = httpx.post(f"{served.base_url}{path}", json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == status and error["message"]


def test_bad_json_is_400(emu: RunningEmulator) -> None:
    r = httpx.post(f"{emu.base_url}/embeddings", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_admin_capacity_visible_in_metrics() -> None:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", max_num_seqs=8, time_scale=1.0)) as emu:
        assert emu.capacity()["max_num_seqs"] == 8
        state = emu.set_capacity(engines=2, num_gpu_blocks=5000, max_num_seqs=300)
        assert state["engines"] == 2 and state["max_num_seqs"] == 300 and state["max_num_batched_tokens"] == 8192
        page = httpx.get(emu.metrics_url).text
        assert 'engine="1"' in page
        assert parse_vllm_metrics(page, emu.model).kv_num_blocks == 10_000
        for bad in ({"engines": 1}, {"max_num_seqs": 0}, {"speed": -1}, {"bogus": 1}, {"max_num_seqs": "many"}):
            assert httpx.post(f"{emu.url}/admin/capacity", json=bad).status_code == 400, bad


def test_max_num_seqs_shows_as_capacity_waiting() -> None:
    """Past ``--max-num-seqs`` requests wait for capacity, and /metrics says so: one long generation holds the
    only sequence (8,000 tokens, about a minute of engine time), three more calls wait, and the page shows exactly
    running 1, waiting 3 (for capacity). Read once the three are in (an event, not a wall-clock window the page
    must be scraped in); breaks if queued requests do not show as capacity waits or run past the cap."""
    config = EmulatorConfig(preset="llama-8b-h100", max_num_seqs=1)
    with serve_in_thread(config) as emu:

        async def main() -> tuple[float | None, int, list[int]]:
            async with httpx.AsyncClient(timeout=60) as client:
                url = f"{emu.base_url}/completions"

                async def snapshot() -> EngineSnapshot:
                    return parse_vllm_metrics((await client.get(emu.metrics_url)).text, emu.model)

                body = {"model": emu.model, "prompt": "x", "max_tokens": 8000, "ignore_eos": True}
                holder = asyncio.ensure_future(client.post(url, json=body))
                while (await snapshot()).running < 1:
                    await asyncio.sleep(0.01)
                body = {"model": emu.model, "prompt": "y", "max_tokens": 4}
                calls = [asyncio.ensure_future(client.post(url, json=body)) for _ in range(3)]
                while emu.capacity()["inflight"] < 4:
                    await asyncio.sleep(0.01)
                snap = await snapshot()
                holder.cancel()  # the client goes away: the engine aborts it and the three run
                with contextlib.suppress(asyncio.CancelledError):
                    await holder
                return snap.waiting_capacity, snap.running, [r.status_code for r in await asyncio.gather(*calls)]

        waiting, running, statuses = asyncio.run(main())
        assert (waiting, running) == (3, 1)
        assert statuses == [200] * 3


def test_engine_down_is_503_and_disconnect_aborts() -> None:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", time_scale=0.001)) as emu:
        # A step takes seconds of wall time: the client gives up first and its simulated request is aborted.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": "slow"}, timeout=0.3)
        wait_until(lambda: emu.capacity()["aborted"] == 1)
        assert emu.capacity()["inflight"] == 0

        emu.set_capacity(up=False)
        for r in (
            httpx.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": "x"}),
            httpx.get(emu.metrics_url),
            httpx.get(f"{emu.url}/health"),
        ):
            assert r.status_code == 503 and r.json()["error"]["code"] == 503
        emu.set_capacity(up=True)
        assert httpx.get(f"{emu.url}/health").status_code == 200
        assert parse_vllm_metrics(httpx.get(emu.metrics_url).text, emu.model).running == 0
