"""The emulator as a vLLM stand-in: output lengths, SSE streaming, rate limits, token counting, and the served
form (an engine process fed by front-end processes) including its process hygiene."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_processes, serve_in_thread
from model_concurrency.emulator.openai_shapes import ApiError, parse_completion
from model_concurrency.emulator.ratelimit import RateLimited, RateLimiter, TokenBucket
from model_concurrency.emulator.tokens import count_words, make_counter
from model_concurrency.signals.vllm import parse_vllm_metrics

CHAT = "/chat/completions"


def sse_events(response: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    with serve_in_thread(EmulatorConfig(preset="llama-8b-h100", time_scale=1.0)) as running:
        yield running


@pytest.fixture(scope="module")
def served() -> Iterator[RunningEmulator]:
    """The served form: engine process + two front-end processes, on a free loopback port."""
    with serve_in_processes(EmulatorConfig(preset="llama-8b-h100", time_scale=1.0, frontends=2)) as running:
        yield running


# ---------------------------------------------------------------------------------------------------- lengths
def test_output_length_follows_vllm_sampling_parameters() -> None:
    seed = b"prompt"
    natural = parse_completion({}, 10, seed)
    assert natural.finish_reason == "stop" and 8 <= natural.output_tokens <= 64
    n = natural.output_tokens
    assert parse_completion({"max_tokens": n}, 10, seed).finish_reason == "stop"  # the end falls on the last token
    capped = parse_completion({"max_tokens": n - 1}, 10, seed)
    assert (capped.output_tokens, capped.finish_reason) == (n - 1, "length")
    forced = parse_completion({"max_tokens": 500, "ignore_eos": True}, 10, seed)
    assert (forced.output_tokens, forced.finish_reason) == (500, "length")
    longer = parse_completion({"max_tokens": 500, "min_tokens": n + 7}, 10, seed)
    assert (longer.output_tokens, longer.finish_reason) == (n + 7, "stop")
    rest = parse_completion({"ignore_eos": True}, 100, seed, max_model_len=1000)
    assert rest.output_tokens == 900  # no max_tokens: what is left of the context
    assert parse_completion({"max_completion_tokens": 3, "max_tokens": 50}, 10, seed).output_tokens == 3
    with pytest.raises(ApiError, match="min_tokens"):
        parse_completion({"max_tokens": 3, "min_tokens": 4}, 10, seed)
    with pytest.raises(ApiError, match="max_model_len"):
        parse_completion({}, 1000, seed, max_model_len=1000)


@given(
    max_tokens=st.integers(1, 300) | st.none(),
    min_tokens=st.integers(0, 300),
    ignore_eos=st.booleans(),
    seed=st.binary(min_size=1, max_size=8),
)
def test_output_length_properties(max_tokens: int | None, min_tokens: int, ignore_eos: bool, seed: bytes) -> None:
    body = {"max_tokens": max_tokens, "min_tokens": min_tokens, "ignore_eos": ignore_eos}
    if max_tokens is not None and min_tokens > max_tokens:
        with pytest.raises(ApiError):
            parse_completion(body, 5, seed)
        return
    answer = parse_completion(body, 5, seed, max_model_len=1000)
    limit = 995 if max_tokens is None else max_tokens
    assert min_tokens <= answer.output_tokens <= limit
    assert len(answer.words()) == answer.output_tokens == count_words(answer.text)
    if ignore_eos:
        assert (answer.output_tokens, answer.finish_reason) == (limit, "length")
    if answer.finish_reason == "length":
        assert answer.output_tokens == limit


def test_requested_lengths_over_http(emu: RunningEmulator) -> None:
    body = {"prompt": "count these words please", "max_tokens": 300, "min_tokens": 100}
    r = httpx.post(f"{emu.base_url}/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 100
    r = httpx.post(f"{emu.base_url}/completions", json={**body, "ignore_eos": True}, timeout=30)
    assert r.json()["usage"]["completion_tokens"] == 300 and r.json()["choices"][0]["finish_reason"] == "length"


# ---------------------------------------------------------------------------------------------------- streaming
def test_chat_stream_one_chunk_per_token_then_usage_and_done(emu: RunningEmulator) -> None:
    body = {
        "messages": [{"role": "user", "content": "stream me"}],
        "max_tokens": 12,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{emu.base_url}{CHAT}", json=body, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = chunks[1:-1]
    assert len(tokens) == 12
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 11 + ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    text = "".join(c["choices"][0]["delta"]["content"] for c in tokens)
    assert count_words(text) == 12


def test_completion_stream_without_usage(emu: RunningEmulator) -> None:
    body = {"prompt": "once", "max_tokens": 5, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{emu.base_url}/completions", json=body, timeout=30) as response:
        events = sse_events(response)
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and len(chunks) == 5
    assert all("usage" not in c and c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def generation_tokens(page: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name == "vllm:generation_tokens_total"
    )


def test_streamed_tokens_are_counted_by_the_engine(emu: RunningEmulator) -> None:
    before = generation_tokens(httpx.get(emu.metrics_url).text)
    body = {"prompt": "once", "max_tokens": 7, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{emu.base_url}/completions", json=body, timeout=30) as response:
        sse_events(response)
    assert generation_tokens(httpx.get(emu.metrics_url).text) - before == 7


def test_openai_client_streams_from_the_served_processes(served: RunningEmulator) -> None:
    client = openai.OpenAI(base_url=served.base_url, api_key="emulator", max_retries=0)
    stream = client.chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=9,
        extra_body={"ignore_eos": True},
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert count_words(content) == 9
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9
    text = client.completions.create(model=served.model, prompt="x y z", max_tokens=4, stream=True)
    assert [c.choices[0].finish_reason for c in text] == [None, None, None, "length"]
    # A generative model refuses embeddings, as vLLM's does (a 400 from the front-end, not the engine process).
    with pytest.raises(openai.BadRequestError, match="The model does not support Embeddings API"):
        client.embeddings.create(model=served.model, input=["a", "b"])


def test_dropping_a_stream_aborts_its_request_in_the_engine_process(served: RunningEmulator) -> None:
    before = served.capacity()["aborted"]
    body = {"prompt": "long", "max_tokens": 5000, "ignore_eos": True, "stream": True}  # ≈ 30 s of decoding
    with httpx.stream("POST", f"{served.base_url}/completions", json=body, timeout=30) as response:
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["choices"][0]["finish_reason"] is None
    deadline = time.monotonic() + 30
    while served.capacity()["aborted"] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    state = served.capacity()
    assert state["aborted"] == before + 1 and state["inflight"] == 0


def test_served_processes_share_one_engine(served: RunningEmulator) -> None:
    """Calls through both front-ends land in the one engine process: its counters see them all."""
    page = parse_vllm_metrics(httpx.get(served.metrics_url).text, served.model)
    with httpx.Client(timeout=30) as a, httpx.Client(timeout=30) as b:
        for client in (a, b) * 5:
            r = client.post(f"{served.base_url}/completions", json={"prompt": "p", "max_tokens": 2})
            assert r.status_code == 200
    after = parse_vllm_metrics(httpx.get(served.metrics_url).text, served.model)
    assert after.success_total - page.success_total == 10
    state = served.set_capacity(max_num_seqs=8)
    assert state["max_num_seqs"] == 8 and served.capacity()["max_num_seqs"] == 8


# ---------------------------------------------------------------------------------------------------- rate limits
def test_token_bucket_exact() -> None:
    bucket = TokenBucket(60)  # one per second, burst 60
    assert bucket.wait_for(60, now=0.0) == 0.0
    bucket.level -= 60
    assert bucket.wait_for(1, now=0.0) == pytest.approx(1.0)
    assert bucket.wait_for(1, now=0.5) == pytest.approx(0.5)
    assert bucket.wait_for(1, now=1000.0) == 0.0 and bucket.level == 60  # never above one minute's worth


@given(
    rpm=st.integers(1, 100),
    tpm=st.integers(10, 1000),
    calls=st.lists(st.tuples(st.floats(0, 5), st.integers(1, 10)), max_size=60),
)
def test_rate_limiter_never_admits_more_than_the_limits(rpm: int, tpm: int, calls: list[tuple[float, int]]) -> None:
    limiter = RateLimiter(rpm, tpm)
    assert limiter.requests is not None and limiter.tokens is not None
    now = 0.0
    admitted: list[tuple[float, int]] = []
    for gap, tokens in calls:
        now += gap
        try:
            limiter.admit(tokens, now)
        except RateLimited as limited:
            assert limited.retry_after_s > 0
            levels = (limiter.requests.level, limiter.tokens.level)
            limiter.requests.refill(now + limited.retry_after_s)
            limiter.tokens.refill(now + limited.retry_after_s)
            assert levels[0] >= 0 and levels[1] >= 0  # a refusal took nothing
            assert limiter.requests.level >= 1 - 1e-9 and limiter.tokens.level >= tokens - 1e-9  # Retry-After holds
            now += limited.retry_after_s
            continue
        admitted.append((now, tokens))
    # Over any span, admissions never exceed one minute's burst plus what refilled during the span.
    for i, (start, _) in enumerate(admitted):
        for j in range(i, len(admitted)):
            window = [t for _, t in admitted[i : j + 1]]
            span = admitted[j][0] - start
            assert len(window) <= rpm + span * rpm / 60 + 1e-9
            assert sum(window) <= tpm + span * tpm / 60 + 1e-9


def test_429_with_retry_after_from_the_served_processes() -> None:
    config = EmulatorConfig(preset="llama-8b-h100", time_scale=1.0, requests_per_minute=3, tokens_per_minute=200)
    with serve_in_processes(config) as emu:
        body = {"prompt": "a b c d", "max_tokens": 10}
        with httpx.Client(base_url=emu.base_url, timeout=30) as http:
            assert [http.post("/completions", json=body).status_code for _ in range(3)] == [200] * 3
            refused = http.post("/completions", json=body)
            assert refused.status_code == 429
            assert refused.json()["error"]["type"] == "RateLimitError"
            retry_after = int(refused.headers["Retry-After"])
            assert 1 <= retry_after <= 20  # one request refills in 60 / 3 = 20 s
            assert 0 < int(refused.headers["retry-after-ms"]) <= 20_000
            too_big = http.post("/completions", json={"prompt": "x", "max_tokens": 500})
            assert too_big.status_code == 400 and "tokens per minute" in too_big.json()["error"]["message"]
            state = httpx.get(f"{emu.url}/admin/capacity").json()
            assert state["rate_limit"]["limit-requests"] == 3 and state["completed"] == 3
        client = openai.OpenAI(base_url=emu.base_url, api_key="emulator", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=emu.model, prompt="x", max_tokens=2)


# ---------------------------------------------------------------------------------------------------- tokens
def test_token_counters() -> None:
    assert make_counter("chars4")("abcdefgh") == 2 and make_counter("chars4")("") == 1
    words = make_counter("words")
    assert words("Hello, world! It's 42.") == 9  # Hello , world ! It ' s 42 . (\w+ runs and punctuation runs)
    assert words("a  b\nc") == 3
    with pytest.raises(ValueError, match="tokenizer"):
        make_counter("/no/such/tokenizer.json")


def test_words_counter_over_http() -> None:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", tokenizer="words")) as emu:
        r = httpx.post(f"{emu.base_url}/embeddings", json={"input": ["one two three", "four, five"]})
        assert r.json()["usage"]["prompt_tokens"] == 6


# ---------------------------------------------------------------------------------------------------- processes
def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _start_cli(*extra: str) -> tuple[subprocess.Popen[str], list[int], str]:
    entry = "import sys; from model_concurrency.cli import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", entry, "emulate", "--port", "0", "--log-level", "warning"]
    proc = subprocess.Popen([*command, *extra], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("emulating"), line
    url = line.split(" at ")[1].split("/v1")[0]
    engine = int(line.split("engine pid ")[1].split(",")[0])
    frontends = json.loads(line.split("front-end pids ")[1].split(")")[0])
    return proc, [engine, *frontends], url


def _wait_gone(pids: list[int], deadline_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + deadline_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.slow
def test_cli_serves_and_stops_its_children_on_sigterm() -> None:
    proc, children, url = _start_cli("--preset", "bge-m3", "--frontends", "2")
    try:
        assert len(children) == 3 and all(_alive(p) for p in children)
        assert httpx.post(f"{url}/v1/embeddings", json={"input": "x"}, timeout=30).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert _wait_gone(children) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_children_exit_when_the_parent_is_killed() -> None:
    proc, children, _ = _start_cli("--preset", "bge-m3")
    try:
        os.kill(proc.pid, signal.SIGKILL)  # no clean-up code runs in the parent
        proc.wait()
        assert _wait_gone(children) == []
    finally:
        for pid in children:  # only ours, by pid, and only if the test failed
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_in_process_app_over_httpx_asgi_transport() -> None:
    """The same app with the core in the caller's event loop (no server, no lifespan): started lazily."""
    import asyncio

    from model_concurrency.emulator import create_app

    async def main() -> tuple[int, int, str]:
        app = create_app(EmulatorConfig(preset="llama-8b-h100", time_scale=5.0))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://emulator") as http:
            r = await http.post("/v1/completions", json={"prompt": "a b", "max_tokens": 3, "ignore_eos": True})
            streamed = await http.post(
                "/v1/completions", json={"prompt": "a b", "max_tokens": 4, "ignore_eos": True, "stream": True}
            )
            page = (await http.get("/metrics")).text
        await app.state.emulator.link.stop()
        return r.json()["usage"]["completion_tokens"], streamed.text.count("data: "), page

    completion, events, page = asyncio.run(main())
    assert completion == 3 and events == 5  # 4 token chunks + [DONE]
    assert generation_tokens(page) == 7


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"frontends": 0}, "frontends"),
        ({"time_scale": 0.0}, "time_scale"),
        ({"requests_per_minute": -1.0}, "per-minute"),
        ({"tokenizer": "nonsense"}, "tokenizer"),
        ({"max_model_len": 1}, "max_model_len"),
    ],
)
def test_bad_config_fails_before_serving(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message), serve_in_processes(EmulatorConfig(**changes)):  # type: ignore[arg-type]
        pass
