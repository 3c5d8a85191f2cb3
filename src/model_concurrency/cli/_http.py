"""An httpx client spread over several connection pools, for fan-outs of hundreds of concurrent calls.

httpcore's pool does work proportional to its number of connections on every request, so one client with 256
connections spends milliseconds of CPU per call and becomes the bottleneck it is meant to measure. Several small
pools, used round-robin, keep the per-call cost flat.
"""

from __future__ import annotations

import itertools
from types import TracebackType
from typing import Any

import httpx

__all__ = ["ShardedClient"]


class ShardedClient:
    """``post``/``get`` over ``shards`` AsyncClients of ``per_shard`` connections each."""

    def __init__(self, *, connections: int = 512, per_shard: int = 16, timeout: float = 120.0) -> None:
        shards = max(1, -(-connections // per_shard))
        limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
        tls = httpx.create_ssl_context()  # one certificate load, not one per shard
        self._clients = [httpx.AsyncClient(timeout=timeout, limits=limits, verify=tls) for _ in range(shards)]
        self._next = itertools.cycle(self._clients)

    async def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return await next(self._next).post(url, **kwargs)

    async def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return await next(self._next).get(url, **kwargs)

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()

    async def __aenter__(self) -> ShardedClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
