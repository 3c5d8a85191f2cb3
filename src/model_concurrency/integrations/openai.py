"""An ``OpenAI`` or ``AsyncOpenAI`` client whose every request goes through ``slot(model)``::

    from openai import OpenAI
    from model_concurrency.integrations.openai import wrap

    client = wrap(OpenAI(base_url=..., api_key=...), model="bge-m3")
    client.embeddings.create(model="BAAI/bge-m3", input=texts)   # waits its turn, counted, recorded

Without ``model=`` each request's ``model`` field (the served name) picks the registered model serving it. The
wrapped client is a copy (``with_options``) that sends through a :class:`~.httpx.SlotTransport` on a plain
``httpx`` client (the SDK takes one; SDKs built on ``httpx2`` take it as their "legacy" client), so each attempt
the SDK makes, retries included, is one gated call; a 429/503 counts as throttled and its ``Retry-After`` holds the
model's admissions (the SDK's own retry waits too, by the same header). A client built with its own
``http_client`` keeps its transport only if it is passed as ``transport=``.
"""

from __future__ import annotations

from typing import Any, overload

import httpx

from model_concurrency.extras import raise_missing
from model_concurrency.integrations.client import ShardedAsyncTransport, ShardedTransport
from model_concurrency.integrations.httpx import AsyncSlotTransport, SlotTransport

try:
    import openai
except ModuleNotFoundError as exc:  # the [openai] extra
    raise_missing(exc, "openai", "openai", "model_concurrency.integrations.openai")

__all__ = ["wrap"]

# The OpenAI SDK's own connection limits: httpx's default of 100 connections would queue a fan-out beyond that
# in the pool, where no limiter sees it. Only max_connections is used now: the wrapped clients send through sharded
# transports (integrations/client.py), since one pool of 1,000 costs the caller O(connections) per request.
CONNECTION_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)


def _timeout(client: openai.OpenAI | openai.AsyncOpenAI) -> httpx.Timeout:
    """The client's timeout as a ``httpx.Timeout`` (newer SDKs hold an ``httpx2.Timeout``, older ones httpx's)."""
    timeout: Any = client.timeout
    if isinstance(timeout, (int, float)) or timeout is None:
        return httpx.Timeout(timeout)
    return httpx.Timeout(**timeout.as_dict())


@overload
def wrap(
    client: openai.OpenAI, *, model: str | None = None, transport: httpx.BaseTransport | None = None
) -> openai.OpenAI: ...
@overload
def wrap(
    client: openai.AsyncOpenAI, *, model: str | None = None, transport: httpx.AsyncBaseTransport | None = None
) -> openai.AsyncOpenAI: ...
def wrap(
    client: openai.OpenAI | openai.AsyncOpenAI,
    *,
    model: str | None = None,
    transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
) -> openai.OpenAI | openai.AsyncOpenAI:
    """A copy of ``client`` whose requests hold a slot of ``model`` (or of the model each request names)."""
    forms: tuple[tuple[Any, ...], ...] = (
        (openai.AsyncOpenAI, httpx.AsyncBaseTransport, ShardedAsyncTransport, AsyncSlotTransport, httpx.AsyncClient),
        (openai.OpenAI, httpx.BaseTransport, ShardedTransport, SlotTransport, httpx.Client),
    )
    for sdk, base, sharded, gated, http_client in forms:
        if not isinstance(client, sdk):
            continue
        if transport is not None and not isinstance(transport, base):
            raise TypeError(f"an {sdk.__name__} client needs an httpx.{base.__name__}")
        # Sharded: one pool of 1,000 connections would cost the caller O(connections) CPU per request.
        inner = transport or sharded(connections=CONNECTION_LIMITS.max_connections or 1000)
        http = http_client(transport=gated(inner, model=model), timeout=_timeout(client), follow_redirects=True)
        wrapped: openai.OpenAI | openai.AsyncOpenAI = client.with_options(http_client=http)
        return wrapped
    raise TypeError(f"wrap() takes an openai.OpenAI or openai.AsyncOpenAI client, got {type(client).__name__}")
