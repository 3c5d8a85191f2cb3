"""An ``httpx.AsyncClient`` that stays cheap per call at hundreds of calls in flight.

Why: httpcore's connection pool walks every connection and every queued request on each request and each
release, so one pool of N connections costs O(N) CPU per call. Past about a hundred calls in flight the caller's
CPU, not the server, sets the throughput (``benchmarks/client.py`` measures one shared pool against this
client and against the server's ceiling). A fan-out that the controller sizes to the engine then sees an
engine that is never full, at exactly the targets this package exists to reach.

:class:`ShardedAsyncTransport` spreads the connections over small pools (``per_shard`` each; 1 by default, i.e.
a connection per concurrent call) and sends each request to the pool freed last that has room, so the per-call
cost stays flat in the fan-out and a light load keeps reusing the same few warm connections. A request holds its pool's
place until its response is closed, so a long stream never shares a pool that looks free. Every pool shares one
SSL context: building one loads the CA bundle on the event loop, which is also why hundreds of callers that each
build their own ``httpx.AsyncClient`` complete nothing for their first seconds.

:class:`ShardedAsyncClient` is an ``httpx.AsyncClient`` on that transport: ``get``/``post``/``request``/``stream``,
``base_url``, ``headers``, ``timeout``, ``aclose`` and ``async with`` are httpx's own, and the OpenAI SDK takes it
as ``http_client``::

    async with ShardedAsyncClient(base_url=url, timeout=60, connections=1024) as client:
        await map_concurrent(texts, lambda t: client.post("/embeddings", json={...}), model="bge-m3")

    openai.AsyncOpenAI(base_url=url, api_key=key, http_client=ShardedAsyncClient(timeout=60))

Size ``connections`` at or above the most calls you will have in flight (the model's ceiling); beyond it requests
wait in the pools, as with httpx's ``max_connections``. :class:`ShardedClient` / :class:`ShardedTransport` are the
same for ``httpx.Client`` (thread fan-outs, ``OpenAI``), with a lock around the choice of pool.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

import httpx

from model_concurrency.integrations._net import AsyncioBackend

__all__ = [
    "DEFAULT_CONNECTIONS",
    "DEFAULT_PER_SHARD",
    "ShardedAsyncClient",
    "ShardedAsyncTransport",
    "ShardedClient",
    "ShardedTransport",
]

_T = TypeVar("_T")
_P = TypeVar("_P")

DEFAULT_CONNECTIONS = 1024
# httpcore walks its connections once per connection on each request (O(n²)) and checks each for expiry, so the
# smallest pool is the cheapest: at 512 in flight benchmarks/client.py measured pools of 1 ahead of 2, 4 and 8 (and
# a pool per connection costs ~10 µs to create, 11 ms for 1,024).
DEFAULT_PER_SHARD = 1


class _Placement:
    """Which pool a request goes to: one with a free connection (the last freed), else the least loaded."""

    def __init__(self, pools: int, per_pool: int, lock: contextlib.AbstractContextManager[Any]) -> None:
        self.per_pool = per_pool
        self.in_use = [0] * pools  # requests each pool holds (sent, response not yet closed)
        # Pools with a free connection, most recently freed on top (its connection is warm); pool 0 first.
        self.free = list(range(pools - 1, -1, -1))
        self._lock = lock

    def pick(self) -> int:
        in_use = self.in_use
        with self._lock:
            if self.free:
                index = self.free[-1]
                if in_use[index] + 1 >= self.per_pool:
                    self.free.pop()
            else:
                index = min(range(len(in_use)), key=in_use.__getitem__)
            in_use[index] += 1
        return index

    def done(self, index: int) -> None:
        with self._lock:
            self.in_use[index] -= 1
            if self.in_use[index] == self.per_pool - 1:  # it was full: it has room again
                self.free.append(index)


def _pools(
    factory: Callable[..., Any],
    connections: int,
    per_shard: int,
    verify: ssl.SSLContext | str | bool,
    cert: Any,
    trust_env: bool,
    keepalive_expiry: float | None,
    kwargs: dict[str, Any],
) -> list[Any]:
    """``connections`` split into transports of ``per_shard`` connections that share one SSL context."""
    if isinstance(connections, bool) or not isinstance(connections, int) or connections < 1:
        raise ValueError(f"connections must be an int >= 1, got {connections!r}")
    if isinstance(per_shard, bool) or not isinstance(per_shard, int) or per_shard < 1:
        raise ValueError(f"per_shard must be an int >= 1, got {per_shard!r}")
    per_shard = min(per_shard, connections)
    # One SSL context for every pool: building one per pool would load the CA bundle once per pool.
    context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify, cert, trust_env)
    limits = httpx.Limits(
        max_connections=per_shard, max_keepalive_connections=per_shard, keepalive_expiry=keepalive_expiry
    )
    count = -(-connections // per_shard)
    return [factory(verify=context, trust_env=trust_env, limits=limits, **kwargs) for _ in range(count)]


def _client_transport(
    make: Callable[..., _T], connections: int | None, limits: httpx.Limits | None, kwargs: dict[str, Any], **more: Any
) -> _T:
    """A sharded client's transport, sized by ``connections`` or a drop-in ``limits``; the TLS keywords (``verify``,
    ``cert``, ``trust_env``, ``http2``) stay in ``kwargs``, since the client takes them too."""
    if "transport" in kwargs:
        raise TypeError("a sharded client builds its own transport; use httpx's client to pass one")
    if connections is None:
        connections = (limits.max_connections if limits is not None else None) or DEFAULT_CONNECTIONS
    expiry = limits.keepalive_expiry if limits is not None else 5.0
    tls = {key: kwargs[key] for key in ("verify", "cert", "trust_env", "http2") if key in kwargs}
    return make(connections=connections, keepalive_expiry=expiry, **tls, **more)


class _Held(httpx.AsyncByteStream):
    """A response body whose closing gives its pool's place back (once)."""

    __slots__ = ("_done", "_inner")

    def __init__(self, inner: httpx.AsyncByteStream, done: Callable[[], None]) -> None:
        self._inner = inner
        self._done: Callable[[], None] | None = done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            done, self._done = self._done, None
            if done is not None:
                done()


class _HeldSync(httpx.SyncByteStream):
    """The blocking form of :class:`_Held`."""

    __slots__ = ("_done", "_inner")

    def __init__(self, inner: httpx.SyncByteStream, done: Callable[[], None]) -> None:
        self._inner = inner
        self._done: Callable[[], None] | None = done

    def __iter__(self) -> Iterator[bytes]:
        yield from self._inner

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            done, self._done = self._done, None
            if done is not None:
                done()


class _Sharding(Generic[_P]):
    """Both sharded transports: ``connections`` split over pools of ``per_shard`` (:func:`_pools`), a request
    placed on a pool (:class:`_Placement`) and its place given back when its response is closed."""

    _factory: Callable[..., _P]
    _lock: Callable[[], contextlib.AbstractContextManager[Any]]

    def __init__(
        self,
        *,
        connections: int = DEFAULT_CONNECTIONS,
        per_shard: int = DEFAULT_PER_SHARD,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        keepalive_expiry: float | None = 5.0,
        **transport_kwargs: Any,
    ) -> None:
        self.shards: list[_P] = _pools(
            self._factory, connections, per_shard, verify, cert, trust_env, keepalive_expiry, transport_kwargs
        )
        self.per_shard = min(per_shard, connections)
        self.placement = _Placement(len(self.shards), self.per_shard, self._lock())

    @property
    def connections(self) -> int:
        return self.per_shard * len(self.shards)

    @property
    def in_use(self) -> list[int]:
        """Requests each pool holds now."""
        return self.placement.in_use

    def _placed(
        self, response: httpx.Response, index: int, held: Callable[[Any, Callable[[], None]], Any]
    ) -> httpx.Response:
        """``response`` with a body (``held``) that gives pool ``index``'s place back when it is closed."""
        placement = self.placement
        response.stream = held(response.stream, lambda: placement.done(index))
        return response

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pools={len(self.shards)}x{self.per_shard}, in_use={sum(self.in_use)})"


class ShardedAsyncTransport(_Sharding[httpx.AsyncHTTPTransport], httpx.AsyncBaseTransport):
    """``connections`` spread over pools of ``per_shard``; other keywords go to each ``httpx.AsyncHTTPTransport``.

    ``asyncio_network`` (default): connections run on asyncio's own transports (:mod:`._net`) rather than anyio's
    streams, which cost more CPU per read and write. Pools are created up front but open connections only when
    used. Like any httpx async transport it belongs to one event loop at a time (the counts are not locked).
    """

    _factory = httpx.AsyncHTTPTransport
    _lock = contextlib.nullcontext

    def __init__(self, *, asyncio_network: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if asyncio_network:  # httpcore's pools take a backend but httpx's transport does not pass one through
            backend = AsyncioBackend()
            for shard in self.shards:
                shard._pool._network_backend = backend

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        index = self.placement.pick()
        try:
            response = await self.shards[index].handle_async_request(request)
        except BaseException:
            self.placement.done(index)
            raise
        return self._placed(response, index, _Held)

    async def aclose(self) -> None:
        for shard in self.shards:
            await shard.aclose()


class ShardedTransport(_Sharding[httpx.HTTPTransport], httpx.BaseTransport):
    """The blocking form of :class:`ShardedAsyncTransport`, for ``httpx.Client``; safe across threads."""

    _factory = httpx.HTTPTransport
    _lock = threading.Lock

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        index = self.placement.pick()
        try:
            response = self.shards[index].handle_request(request)
        except BaseException:
            self.placement.done(index)
            raise
        return self._placed(response, index, _HeldSync)

    def close(self) -> None:
        for shard in self.shards:
            shard.close()


class ShardedAsyncClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` on a :class:`ShardedAsyncTransport` (every other keyword is httpx's own).

    ``limits=httpx.Limits(max_connections=N)`` is accepted for a drop-in swap and means ``connections=N``.
    """

    def __init__(
        self,
        *,
        connections: int | None = None,
        per_shard: int = DEFAULT_PER_SHARD,
        limits: httpx.Limits | None = None,
        asyncio_network: bool = True,
        **kwargs: Any,
    ) -> None:
        transport = _client_transport(
            ShardedAsyncTransport, connections, limits, kwargs, per_shard=per_shard, asyncio_network=asyncio_network
        )
        super().__init__(transport=transport, **kwargs)
        self.sharded = transport


class ShardedClient(httpx.Client):
    """An ``httpx.Client`` on a :class:`ShardedTransport` (every other keyword is httpx's own)."""

    def __init__(
        self,
        *,
        connections: int | None = None,
        per_shard: int = DEFAULT_PER_SHARD,
        limits: httpx.Limits | None = None,
        **kwargs: Any,
    ) -> None:
        transport = _client_transport(ShardedTransport, connections, limits, kwargs, per_shard=per_shard)
        super().__init__(transport=transport, **kwargs)
        self.sharded = transport
