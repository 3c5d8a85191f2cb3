"""The emulator's ASGI application: OpenAI-compatible endpoints over the SimPy engine model.

Every generation or embedding input becomes one :class:`~model_concurrency.engine.Request` on a
:class:`~model_concurrency.engine.Server`, exactly as the simulator submits them, and the handler awaits its
completion on the scaled wall clock (:mod:`.clock`). So what a client sees (latency, queueing, the ``/metrics``
gauges) is what the simulator would predict for the same arrivals.

A client that disconnects or is cancelled aborts its simulated requests (``finished_reason="abort"``), as vLLM
aborts a request whose connection dropped; otherwise a test's cancelled calls would keep occupying slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import simpy
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from model_concurrency.emulator.clock import SimDriver
from model_concurrency.emulator.openai_shapes import (
    ApiError,
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
from model_concurrency.engine import EngineDownError, EnginePreset, FrontEndCost, Request, Server, get_preset
from model_concurrency.engine.request import LENGTH, STOP

__all__ = ["METRICS_CONTENT_TYPE", "Emulator", "EmulatorConfig", "create_app"]

log = logging.getLogger("model_concurrency.emulator")

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorConfig:
    """One emulated ``vllm serve``.

    ``simulate_frontend=False`` drops the preset's API-server CPU cost: the emulator's own HTTP stack is a real
    front-end, and with small embedding models the simulated one would otherwise be the bottleneck, hiding the
    engine capacity a step-response demo changes.
    """

    preset: str | EnginePreset = "bge-m3"
    max_num_seqs: int | None = None
    engines: int = 1
    time_scale: float = 1.0
    served_model_name: str | None = None
    simulate_frontend: bool = True

    def engine_preset(self) -> EnginePreset:
        preset = get_preset(self.preset) if isinstance(self.preset, str) else self.preset
        changes: dict[str, object] = {}
        if self.max_num_seqs is not None:
            changes["max_num_seqs"] = self.max_num_seqs
            if preset.max_num_batched_tokens < self.max_num_seqs:
                changes["max_num_batched_tokens"] = self.max_num_seqs
        if not self.simulate_frontend:
            changes["frontend"] = FrontEndCost()
        return preset.replace(**changes) if changes else preset


class Emulator:
    """The simulated server, its clock driver, and the handlers that submit to it."""

    def __init__(self, config: EmulatorConfig | None = None) -> None:
        self.config = config or EmulatorConfig()
        if self.config.engines < 1:
            raise ValueError("engines must be >= 1")
        self.preset = self.config.engine_preset()
        self.env = simpy.Environment()
        self.server = Server(
            self.env, self.preset, num_engines=self.config.engines, model_name=self.config.served_model_name
        )
        self.model_name = self.server.model_name
        self.driver = SimDriver(self.env, self.config.time_scale)

    # ------------------------------------------------------------------ engine access
    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise ApiError(404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model")

    async def _run(self, http: HttpRequest, requests: list[Request]) -> list[Request]:
        """Submit ``requests`` now and wait for all; a client disconnect or cancellation aborts them."""
        self.driver.start()
        self.driver.sync()
        if not self.server.up:
            raise ApiError(503, "the engine is down", kind="ServiceUnavailableError")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Request]] = []
        try:
            for request in requests:
                future: asyncio.Future[Request] = loop.create_future()
                futures.append(future)
                try:
                    self.server.submit_callback(request, _resolver(future))
                except ValueError as exc:  # too long for the engine, as vLLM rejects over-long prompts
                    raise ApiError(400, str(exc), param="input") from None
            self.driver.poke()
            done = asyncio.ensure_future(asyncio.gather(*futures))
            gone = asyncio.ensure_future(_disconnected(http))
            waiters: set[asyncio.Future[Any]] = {done, gone}
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if not done.done():
                done.cancel()
                raise asyncio.CancelledError("client disconnected")
            finished = done.result()
        except BaseException:
            for request in requests:
                if request.finished_reason is None:
                    self.server.abort(request)
            self.driver.poke()
            raise
        if any(not r.ok for r in finished):
            raise ApiError(
                503, "the engine aborted the request (engine down or capacity lost)", kind="ServiceUnavailableError"
            )
        return finished

    # ------------------------------------------------------------------ endpoints
    async def embeddings(self, http: HttpRequest) -> Response:
        body = await _json(http)
        self._check_model(body)
        inputs = embedding_inputs(body)
        dim = embedding_dim(body)
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise ApiError(400, "'encoding_format' must be 'float' or 'base64'", param="encoding_format")
        requests = [Request(tokens, embedding=True) for tokens, _ in inputs]
        await self._run(http, requests)
        data = [
            {"object": "embedding", "index": i, "embedding": encode_vector(embedding_vector(key, dim), encoding)}
            for i, (_, key) in enumerate(inputs)
        ]
        tokens = sum(t for t, _ in inputs)
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
        body = await _json(http)
        self._check_model(body)
        _no_stream(body)
        tokens, seed = prompt_text(body)
        answer = parse_completion(body, tokens, seed)
        await self._run(http, [_generation(answer.prompt_tokens, answer.output_tokens, answer.finish_reason)])
        return JSONResponse(
            {
                "id": new_id("cmpl"),
                "object": "text_completion",
                "created": now_s(),
                "model": self.model_name,
                "choices": [{"index": 0, "text": answer.text, "logprobs": None, "finish_reason": answer.finish_reason}],
                "usage": _usage(answer.prompt_tokens, answer.output_tokens),
            }
        )

    async def chat_completions(self, http: HttpRequest) -> Response:
        body = await _json(http)
        self._check_model(body)
        _no_stream(body)
        tokens = chat_prompt_tokens(body)
        answer = parse_completion(body, tokens, json.dumps(body.get("messages"), sort_keys=True).encode())
        await self._run(http, [_generation(answer.prompt_tokens, answer.output_tokens, answer.finish_reason)])
        return JSONResponse(
            {
                "id": new_id("chatcmpl"),
                "object": "chat.completion",
                "created": now_s(),
                "model": self.model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": answer.text},
                        "logprobs": None,
                        "finish_reason": answer.finish_reason,
                    }
                ],
                "usage": _usage(answer.prompt_tokens, answer.output_tokens),
            }
        )

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
                        "max_model_len": 8192,
                    }
                ],
            }
        )

    async def health(self, http: HttpRequest) -> Response:
        self.driver.start()
        if not self.server.up:
            raise ApiError(503, "the engine is down", kind="ServiceUnavailableError")
        return Response(status_code=200)

    async def metrics(self, http: HttpRequest) -> Response:
        self.driver.start()
        self.driver.sync()
        try:
            text = self.server.render_metrics()
        except EngineDownError as exc:
            raise ApiError(503, str(exc), kind="ServiceUnavailableError") from None
        return PlainTextResponse(text, media_type=METRICS_CONTENT_TYPE)

    async def capacity(self, http: HttpRequest) -> Response:
        """GET: the capacity in force. POST ``{max_num_seqs, max_num_batched_tokens, num_gpu_blocks, speed,
        engines, up}`` (any subset): change it now, effective from the next engine step."""
        self.driver.start()
        self.driver.sync()
        if http.method == "POST":
            self._apply_capacity(await _json(http))
            self.driver.poke()
        return JSONResponse(self.capacity_state())

    def _apply_capacity(self, body: dict[str, Any]) -> None:
        known = {"max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "speed", "engines", "up"}
        unknown = set(body) - known
        if unknown:
            raise ApiError(400, f"unknown capacity fields {sorted(unknown)}; known: {sorted(known)}")
        engines = body.get("engines")
        if engines is not None and (
            isinstance(engines, bool) or not isinstance(engines, int) or engines < len(self.server.engines)
        ):
            raise ApiError(400, f"'engines' can only grow (now {len(self.server.engines)})", param="engines")
        changes = {
            k: body[k]
            for k in ("max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "speed")
            if body.get(k) is not None
        }
        for key, value in changes.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or (key != "speed" and value != int(value)):
                raise ApiError(400, f"'{key}' must be a number", param=key)
        seqs = changes.get("max_num_seqs")
        if seqs is not None and "max_num_batched_tokens" not in changes:
            # Raising max_num_seqs past the token budget would be refused; lift the budget with it.
            changes["max_num_batched_tokens"] = max(int(seqs), self.server.engines[0].max_num_batched_tokens)
        try:
            if changes:
                self.server.set_capacity(**changes)
            while engines is not None and len(self.server.engines) < engines:
                new = self.server.add_engine()
                first = self.server.engines[0]
                new.set_capacity(
                    max_num_seqs=first.max_num_seqs,
                    max_num_batched_tokens=first.max_num_batched_tokens,
                    num_gpu_blocks=first.num_gpu_blocks,
                    speed=first.speed,
                )
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        up = body.get("up")
        if up is True:
            self.server.set_up()
        elif up is False:
            self.server.set_down()

    def capacity_state(self) -> dict[str, Any]:
        first = self.server.engines[0]
        return {
            "model": self.model_name,
            "preset": self.preset.name,
            "engines": len(self.server.engines),
            "max_num_seqs": first.max_num_seqs,
            "max_num_batched_tokens": first.max_num_batched_tokens,
            "num_gpu_blocks": first.num_gpu_blocks,
            "speed": first.speed,
            "up": self.server.up,
            "time_scale": self.driver.time_scale,
            "sim_time_s": self.env.now,
            "inflight": self.server.inflight,
            "completed": self.server.completed,
            "aborted": self.server.aborted,
        }


def _resolver(future: asyncio.Future[Request]) -> Callable[[Request], None]:
    def on_finish(request: Request) -> None:
        if not future.done():
            future.set_result(request)

    return on_finish


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


def _no_stream(body: dict[str, Any]) -> None:
    if body.get("stream"):
        raise ApiError(400, "the emulator does not stream; send stream=false", param="stream")


def _generation(prompt_tokens: int, output_tokens: int, finish_reason: str) -> Request:
    return Request(prompt_tokens, output_tokens, stop_reason=LENGTH if finish_reason == "length" else STOP)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


Handler = Callable[[HttpRequest], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    """Turn :class:`ApiError` into OpenAI-style JSON; let cancellation through (the client is gone)."""

    async def endpoint(http: HttpRequest) -> Response:
        try:
            return await handler(http)
        except ApiError as err:
            return JSONResponse(error_body(err), status_code=err.status)

    return endpoint


def create_app(config: EmulatorConfig | None = None, *, emulator: Emulator | None = None) -> Starlette:
    """The ASGI app; ``app.state.emulator`` is the :class:`Emulator` behind it."""
    emu = emulator or Emulator(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        emu.driver.start()
        try:
            yield
        finally:
            await emu.driver.stop()

    routes = [
        Route("/v1/embeddings", _guarded(emu.embeddings), methods=["POST"]),
        Route("/v1/completions", _guarded(emu.completions), methods=["POST"]),
        Route("/v1/chat/completions", _guarded(emu.chat_completions), methods=["POST"]),
        Route("/v1/models", _guarded(emu.models), methods=["GET"]),
        Route("/health", _guarded(emu.health), methods=["GET"]),
        Route("/metrics", _guarded(emu.metrics), methods=["GET"]),
        Route("/admin/capacity", _guarded(emu.capacity), methods=["GET", "POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.emulator = emu
    return app
