"""An httpx transport that runs every request through ``slot(model)``.

Why a transport: it sees every attempt a client makes (an SDK's own retries included), with the status and headers
of the response, and it is the one extension point httpx, the OpenAI SDK and most HTTP-based clients share.

The model is the one given when wrapping, else the request's JSON ``model`` field (the served name), mapped to the
registry key of the model that serves it. A request with neither (``GET /models``) passes through ungated. The
slot is held until the response body is closed, so a streamed completion counts in flight for as long as it
streams. A response with status >= 400 is a failed call, classified by its status and headers
(gate/outcome.py: a cut, a hold until the delay it names, an outage, no information); a refused connection is an
outage too (the call's exception passes through the slot).

:class:`ShardedAsyncClient` / :class:`ShardedAsyncTransport` (from :mod:`.client`): an ``httpx.AsyncClient`` whose
per-call cost stays flat at hundreds of calls in flight (one pool of N connections costs O(N) per call);
:class:`ShardedClient` / :class:`ShardedTransport` for ``httpx.Client``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

import httpx

from model_concurrency.config import registered_models
from model_concurrency.gate.slot import slot
from model_concurrency.integrations.client import (
    ShardedAsyncClient,
    ShardedAsyncTransport,
    ShardedClient,
    ShardedTransport,
)

__all__ = [
    "AsyncSlotTransport",
    "ShardedAsyncClient",
    "ShardedAsyncTransport",
    "ShardedClient",
    "ShardedTransport",
    "SlotTransport",
    "model_of_request",
    "registry_key",
    "with_priority",
]

_S = TypeVar("_S")


def registry_key(served_name: str) -> str:
    """The registered model serving ``served_name`` (its key, or a role's model), else the served name itself."""
    models = registered_models()
    if served_name in models:
        return served_name
    for key, spec in models.items():
        if spec.served_name == served_name:
            return key
    return served_name


def model_of_request(request: httpx.Request) -> str | None:
    """The ``model`` field of a JSON request body, or None (no body, not JSON, a streamed upload)."""
    body = _json_body(request)
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None


def _json_body(request: httpx.Request) -> Any:
    """A request's JSON body, or None (no body, not JSON, a streamed upload)."""
    if "json" not in request.headers.get("content-type", ""):
        return None
    try:
        return json.loads(request.content or b"null")
    except (httpx.RequestNotRead, ValueError):
        return None


def _key_for(model: str | None, request: httpx.Request) -> str | None:
    if model is not None:
        return model
    served = model_of_request(request)
    return registry_key(served) if served is not None else None


_PRIORITY_PATHS = ("/completions", "/chat/completions")


def with_priority(key: str, request: httpx.Request) -> httpx.Request:
    """``request`` with vLLM's ``priority`` field set to the model's configured one (ModelSpec.priority), for a
    JSON completion or chat call that does not carry one already; otherwise ``request`` unchanged."""
    spec = registered_models().get(key)
    if spec is None or spec.priority is None or not request.url.path.endswith(_PRIORITY_PATHS):
        return request
    body = _json_body(request)
    if not isinstance(body, dict) or "priority" in body:
        return request
    body["priority"] = spec.priority
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    return httpx.Request(
        request.method, request.url, headers=headers, content=json.dumps(body).encode(), extensions=request.extensions
    )


def _report(gate: slot, response: httpx.Response) -> None:
    # The status and headers go to the classification table (gate/outcome.py) through the slot, as every call's do.
    gate.set_response(response.status_code, response.headers)


class _Held(Generic[_S]):
    """A response body holding its call's slot: closing it (or failing to read it) ends the call, once."""

    def __init__(self, inner: _S, gate: slot) -> None:
        self._inner = inner
        self._gate: slot | None = gate

    def _end(self, exc: BaseException | None) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.__exit__(type(exc) if exc is not None else None, exc, None)


class _SlotStream(_Held[httpx.SyncByteStream], httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        except BaseException as exc:
            self._end(exc)
            raise

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._end(None)


class _AsyncSlotStream(_Held[httpx.AsyncByteStream], httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except BaseException as exc:
            self._end(exc)
            raise

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._end(None)


def _gate_for(model: str | None, request: httpx.Request) -> tuple[slot | None, httpx.Request]:
    """The slot a request must hold (None: it names no model of ours) and the request to send (with its priority)."""
    key = _key_for(model, request)
    if key is None:
        return None, request
    request = with_priority(key, request)
    return slot(key, allow_unregistered=model is None), request  # a name read from the body may not be ours


def _failed(gate: slot, exc: BaseException) -> None:
    gate.__exit__(type(exc), exc, exc.__traceback__)


def _holding(gate: slot, response: httpx.Response, held: Callable[[Any, slot], Any]) -> httpx.Response:
    """The answer reported to the slot, and ``response`` with a body (``held``) that keeps the slot until closed."""
    try:
        _report(gate, response)
    except BaseException as exc:
        _failed(gate, exc)
        raise
    stream = held(response.stream, gate)
    return httpx.Response(
        status_code=response.status_code, headers=response.headers, stream=stream, extensions=response.extensions
    )


class SlotTransport(httpx.BaseTransport):
    """Wraps ``transport`` (default: a plain ``httpx.HTTPTransport``) so each request holds a slot of its model."""

    def __init__(self, transport: httpx.BaseTransport | None = None, *, model: str | None = None) -> None:
        self.inner = transport if transport is not None else httpx.HTTPTransport()
        self.model = model

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        gate, request = _gate_for(self.model, request)
        if gate is None:
            return self.inner.handle_request(request)
        gate.__enter__()
        try:
            response = self.inner.handle_request(request)
        except BaseException as exc:
            _failed(gate, exc)
            raise
        return _holding(gate, response, _SlotStream)

    def close(self) -> None:
        self.inner.close()


class AsyncSlotTransport(httpx.AsyncBaseTransport):
    """The asyncio form of :class:`SlotTransport` (for ``httpx.AsyncClient`` and ``AsyncOpenAI``)."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None, *, model: str | None = None) -> None:
        self.inner = transport if transport is not None else httpx.AsyncHTTPTransport()
        self.model = model

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        gate, request = _gate_for(self.model, request)
        if gate is None:
            return await self.inner.handle_async_request(request)
        await gate.__aenter__()
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException as exc:
            _failed(gate, exc)
            raise
        return _holding(gate, response, _AsyncSlotStream)

    async def aclose(self) -> None:
        await self.inner.aclose()
