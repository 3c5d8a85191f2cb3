"""The emulator's ASGI application: OpenAI-compatible endpoints over the engine core, wherever it runs.

Every generation or embedding input becomes one engine request, exactly as the simulator submits them, and the
handler waits for the core's report (:mod:`.links`: in this event loop, or in the engine process). So what a
client sees (latency, queueing, the ``/metrics`` gauges) is what the simulator would predict for the same arrivals.

``stream: true`` answers as vLLM does: Server-Sent Events, one chunk per output token as the engine model
produces it (so time to first token and inter-token latency follow the engine's steps), ``finish_reason`` on the
last token's chunk, a usage-only chunk when ``stream_options.include_usage`` is set, then ``data: [DONE]``.

A client that disconnects or is cancelled aborts its simulated requests (``finished_reason="abort"``), as vLLM
aborts a request whose connection dropped; otherwise a test's cancelled calls would keep occupying slots.
A rate-limited call (``requests_per_minute`` / ``tokens_per_minute``) is a 429 with ``Retry-After``.

A model serves one API, as vLLM's does: an embedding (pooling) preset refuses ``/v1/chat/completions`` and
``/v1/completions``, a generative one ``/v1/embeddings``, each with vLLM's 400 and its message ("The model does not
support Chat Completions API"), before the body is read. The SGLang flavour serves SGLang's ``GET /v1/loads``
(emulator/loads.py); a vLLM flavour answers it 404, as vLLM's router answers a path it does not have.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from model_concurrency.emulator.core import EmulatorConfig, JobSpec
from model_concurrency.emulator.links import EngineLink, FrontJob, LocalLink
from model_concurrency.emulator.openai_shapes import (
    ApiError,
    Completion,
    chat_prompt_tokens,
    embedding_dim,
    embedding_inputs,
    embedding_vector,
    encode_vector,
    error_body,
    new_id,
    now_s,
    parse_completion,
    prompt_text,
)
from model_concurrency.emulator.tokens import make_counter

__all__ = ["METRICS_CONTENT_TYPE", "Emulator", "EmulatorConfig", "create_app"]

log = logging.getLogger("model_concurrency.emulator")

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ABORTED = "the engine aborted the request (engine down or capacity lost)"


class Emulator:
    """The HTTP handlers, over an :class:`~.links.EngineLink` (in-process unless one is given)."""

    def __init__(self, config: EmulatorConfig | None = None, *, link: EngineLink | None = None) -> None:
        self.config = config or EmulatorConfig()
        self.config.validate()
        self.link: EngineLink = link or LocalLink(self.config)
        self.model_name = self.link.model_name
        self.count = make_counter(self.config.tokenizer)
        self.embedding = self.config.engine_preset().embedding  # pooling runner: embeddings only, as vLLM's

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise ApiError(404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model")

    async def _wait(self, http: HttpRequest, job: FrontJob) -> None:
        """Wait for the job to finish; a client disconnect or cancellation aborts it."""
        gone = asyncio.ensure_future(_disconnected(http))
        events: asyncio.Future[tuple[str, Any]] | None = None
        try:
            while True:
                events = asyncio.ensure_future(job.events.get())
                await asyncio.wait({events, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not events.done():
                    events.cancel()
                    raise asyncio.CancelledError("client disconnected")
                kind, value = events.result()
                if kind == "done":
                    if value is not None:
                        raise ApiError(503, value, kind="ServiceUnavailableError")
                    return
        except BaseException:
            self.link.abort(job)
            raise
        finally:
            gone.cancel()
            if events is not None:
                events.cancel()  # this handler was cancelled while waiting: no task may be left on the queue

    # ------------------------------------------------------------------ endpoints
    def _serves(self, api: str, *, embedding: bool) -> None:
        """vLLM's refusal of an API the model's runner does not serve (its ``create_error_response``: a 400)."""
        if embedding != self.embedding:
            raise ApiError(400, f"The model does not support {api} API")

    async def embeddings(self, http: HttpRequest) -> Response:
        self._serves("Embeddings", embedding=True)
        body = await _json(http)
        self._check_model(body)
        inputs = embedding_inputs(body, self.count)
        dim = embedding_dim(body)
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise ApiError(400, "'encoding_format' must be 'float' or 'base64'", param="encoding_format")
        tokens = sum(t for t, _ in inputs)
        job = await self.link.submit(
            [JobSpec(t, embedding=True) for t, _ in inputs], stream=False, budget_tokens=tokens
        )
        await self._wait(http, job)
        data = [
            {"object": "embedding", "index": i, "embedding": encode_vector(embedding_vector(key, dim), encoding)}
            for i, (_, key) in enumerate(inputs)
        ]
        return JSONResponse(
            {
                "id": new_id("embd"),
                "object": "list",
                "created": now_s(),
                "model": self.model_name,
                "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
            }
        )

    async def completions(self, http: HttpRequest) -> Response:
        self._serves("Completions", embedding=False)
        body = await _json(http)
        self._check_model(body)
        tokens, seed = prompt_text(body, self.count)
        answer = parse_completion(body, tokens, seed, max_model_len=self.config.max_model_len)
        return await self._generate(http, body, answer, chat=False)

    async def chat_completions(self, http: HttpRequest) -> Response:
        self._serves("Chat Completions", embedding=False)
        body = await _json(http)
        self._check_model(body)
        tokens = chat_prompt_tokens(body, self.count)
        seed = json.dumps(body.get("messages"), sort_keys=True).encode()
        answer = parse_completion(body, tokens, seed, max_model_len=self.config.max_model_len)
        return await self._generate(http, body, answer, chat=True)

    async def _generate(self, http: HttpRequest, body: dict[str, Any], answer: Completion, *, chat: bool) -> Response:
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "'stream' must be a boolean", param="stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise ApiError(400, "'stream_options' must be an object", param="stream_options")
        spec = JobSpec(
            answer.prompt_tokens, answer.output_tokens, finish_reason=answer.finish_reason, priority=_priority(body)
        )
        job = await self.link.submit([spec], stream=stream, budget_tokens=answer.budget_tokens)
        if stream:
            chunks = _sse_chunks(job, answer, self.model_name, chat=chat, usage=bool(options.get("include_usage")))
            return StreamingResponse(self._guard_stream(job, chunks), media_type="text/event-stream")
        await self._wait(http, job)
        usage = _usage(answer.prompt_tokens, answer.output_tokens)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": answer.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": answer.text}
        else:
            choice["text"] = answer.text
        return JSONResponse(
            {
                "id": new_id("chatcmpl" if chat else "cmpl"),
                "object": "chat.completion" if chat else "text_completion",
                "created": now_s(),
                "model": self.model_name,
                "choices": [choice],
                "usage": usage,
            }
        )

    async def _guard_stream(self, job: FrontJob, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        """Abort the engine requests when the client goes (starlette cancels the stream on disconnect)."""
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self.link.abort(job)

    async def models(self, http: HttpRequest) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": now_s(),
                        "owned_by": "vllm",
                        "root": self.model_name,
                        "max_model_len": self.config.max_model_len,
                    }
                ],
            }
        )

    async def health(self, http: HttpRequest) -> Response:
        if not await self.link.call("health"):
            raise ApiError(503, "the engine is down", kind="ServiceUnavailableError")
        return Response(status_code=200)

    async def metrics(self, http: HttpRequest) -> Response:
        text = await self.link.call("metrics")
        return PlainTextResponse(text, media_type=METRICS_CONTENT_TYPE)

    async def loads(self, http: HttpRequest) -> Response:
        """SGLang's load report (``?format=prometheus``: as gauges); 404 unless the SGLang flavour is served."""
        if self.config.metrics_flavor != "sglang":
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        prometheus = http.query_params.get("format") == "prometheus"
        report = await self.link.call("loads", prometheus)
        if prometheus:
            return PlainTextResponse(report, media_type=METRICS_CONTENT_TYPE)
        return JSONResponse(report)

    async def capacity(self, http: HttpRequest) -> Response:
        """GET: the capacity in force. POST ``{max_num_seqs, max_num_batched_tokens, num_gpu_blocks, speed,
        engines, up}`` (any subset): change it now, effective from the next engine step."""
        changes = await _json(http) if http.method == "POST" else None
        return JSONResponse(await self.link.call("capacity", changes))


async def _sse_chunks(job: FrontJob, answer: Completion, model: str, *, chat: bool, usage: bool) -> AsyncIterator[str]:
    """vLLM's chunk shapes, one per output token as the engine reports them."""
    ident = new_id("chatcmpl" if chat else "cmpl")
    created = now_s()
    kind = "chat.completion.chunk" if chat else "text_completion"
    words = answer.words()
    last = len(words)

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        payload = {"id": ident, "object": kind, "created": created, "model": model, "choices": choices, **extra}
        return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"

    def token_choice(i: int) -> dict[str, Any]:
        text = words[i] if i == 0 else " " + words[i]
        finish = answer.finish_reason if i == last - 1 else None
        if chat:
            return {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}

    # vLLM sends the chat role chunk with the first output of the engine, not on arrival: a client timing the
    # first chunk then measures the time to first token, never the HTTP round trip alone.
    role = chat
    sent = 0
    while True:
        what, value = await job.events.get()
        if what == "tokens":
            out = [event([token_choice(i)]) for i in range(sent, min(value, last))]
            sent = max(sent, min(value, last))
            if out:
                if role:
                    role = False
                    first = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                    out.insert(0, event([{**first, "logprobs": None, "finish_reason": None}]))
                yield "".join(out)
        elif what == "done":
            if value is not None:  # aborted mid-stream: vLLM sends an error event, then closes
                yield f"data: {json.dumps(error_body(ApiError(503, value, kind='ServiceUnavailableError')))}\n\n"
                yield "data: [DONE]\n\n"
                return
            break
    if usage:
        yield event([], usage=_usage(answer.prompt_tokens, answer.output_tokens))
    yield "data: [DONE]\n\n"


async def _disconnected(http: HttpRequest) -> None:
    """Returns when the client goes away (the ASGI server sends ``http.disconnect`` once the body is read)."""
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return


async def _json(http: HttpRequest) -> dict[str, Any]:
    try:
        body = await http.json()
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _priority(body: dict[str, Any]) -> int:
    """vLLM's ``priority`` request field: an integer, lower runs first on a ``--scheduling-policy priority``
    engine (vLLM refuses a non-default priority on an FCFS engine; the emulator's FCFS engine ignores it)."""
    value = body.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, "'priority' must be an integer", param="priority")
    return value


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


Handler = Callable[[HttpRequest], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    """Turn :class:`ApiError` into OpenAI-style JSON (a 429 with ``Retry-After``); let cancellation through."""

    async def endpoint(http: HttpRequest) -> Response:
        try:
            return await handler(http)
        except ApiError as err:
            headers = None
            if err.retry_after_s is not None:
                headers = {
                    "Retry-After": str(max(1, math.ceil(err.retry_after_s))),
                    "retry-after-ms": str(max(1, math.ceil(err.retry_after_s * 1000))),
                }
            if err.headers:  # a rejection style's own headers (emulator/rejections.py) replace the defaults
                headers = dict(err.headers)
            return JSONResponse(error_body(err), status_code=err.status, headers=headers)

    return endpoint


def create_app(
    config: EmulatorConfig | None = None, *, emulator: Emulator | None = None, link: EngineLink | None = None
) -> Starlette:
    """The ASGI app; ``app.state.emulator`` is the :class:`Emulator` behind it. Without ``link`` the engine core
    runs in the app's own event loop (started by the lifespan, or lazily by the first request)."""
    emu = emulator or Emulator(config, link=link)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await emu.link.start()
        try:
            yield
        finally:
            await emu.link.stop()

    routes = [
        Route("/v1/embeddings", _guarded(emu.embeddings), methods=["POST"]),
        Route("/v1/completions", _guarded(emu.completions), methods=["POST"]),
        Route("/v1/chat/completions", _guarded(emu.chat_completions), methods=["POST"]),
        Route("/v1/models", _guarded(emu.models), methods=["GET"]),
        Route("/health", _guarded(emu.health), methods=["GET"]),
        Route("/metrics", _guarded(emu.metrics), methods=["GET"]),
        Route("/v1/loads", _guarded(emu.loads), methods=["GET"]),
        Route("/admin/capacity", _guarded(emu.capacity), methods=["GET", "POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.emulator = emu
    return app
