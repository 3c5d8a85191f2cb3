"""An httpcore network backend on plain asyncio transports, for :class:`~.client.ShardedAsyncTransport`.

Why: httpcore's default backend on asyncio is anyio's, which wraps every read and write in a cancel scope, asks
sniffio which library runs, and answers the pool's per-request "is this connection readable?" by building a dict
of attribute getters. At hundreds of calls in flight on a busy machine that is a quarter of the client's CPU.
This backend does the same work with an ``asyncio.Protocol``: a buffer, one future per read, a timer only when a
timeout is set. Errors are httpcore's own (``ConnectError``, ``ReadTimeout``...), so httpx maps them as usual.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
from httpcore._backends.base import SOCKET_OPTION, AsyncNetworkBackend, AsyncNetworkStream
from httpcore._utils import is_socket_readable

__all__ = ["AsyncioBackend"]


# Past this many unread bytes the socket stops being read (a slow consumer of a long stream), until half is read.
_HIGH_WATER = 1 << 20


class _Protocol(asyncio.Protocol):
    """Received bytes wait in a buffer; a reader waits on a future; writes pause with the transport's buffer."""

    def __init__(self) -> None:
        self.transport: asyncio.BaseTransport | None = None
        self.paused = False
        self.buffer = bytearray()
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.eof = False
        self.error: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > _HIGH_WATER and not self.paused and isinstance(self.transport, asyncio.ReadTransport):
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def consumed(self) -> None:
        """After a read: resume reading the socket once the buffer has drained to half the high-water mark."""
        if self.paused and len(self.buffer) <= _HIGH_WATER // 2 and isinstance(self.transport, asyncio.ReadTransport):
            self.paused = False
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        if self.drained is None:
            self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


async def _within(future: asyncio.Future[Any], timeout: float | None, error: type[Exception]) -> None:
    """Await ``future``; past ``timeout`` seconds raise ``error`` (the future is cancelled)."""
    if timeout is None:
        await future
        return
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        future.cancel()

    timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        await future
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if fired and (current is None or not current.cancelling()):
            raise error("timed out") from None
        raise  # the caller was cancelled
    finally:
        timer.cancel()


class _Stream(AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        if not protocol.buffer and not protocol.eof:
            protocol.waiter = asyncio.get_running_loop().create_future()
            await _within(protocol.waiter, timeout, httpcore.ReadTimeout)
        if protocol.buffer:
            data = bytes(protocol.buffer[:max_bytes])
            del protocol.buffer[:max_bytes]
            protocol.consumed()
            return data
        if protocol.error is not None:
            raise httpcore.ReadError(str(protocol.error)) from protocol.error
        return b""  # the peer closed: httpcore reads that as the end of the connection

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore.WriteError("connection closed")
        self._transport.write(buffer)
        drained = self._protocol.drained
        if drained is not None:
            await _within(drained, timeout, httpcore.WriteTimeout)

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            transport = await loop.start_tls(
                self._transport, self._protocol, ssl_context, server_hostname=server_hostname,
                ssl_handshake_timeout=timeout,
            )  # fmt: skip
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            self._transport.close()
            kind = httpcore.ConnectTimeout if isinstance(exc, TimeoutError) else httpcore.ConnectError
            raise kind(str(exc)) from exc
        if transport is None:
            raise httpcore.ConnectError("TLS handshake failed")
        return _Stream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        transport = self._transport
        if info == "ssl_object":
            return transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "socket":
            return transport.get_extra_info("socket")
        if info == "is_readable":
            # Readable while idle means the peer closed it or sent junk: either way it cannot be reused.
            protocol = self._protocol
            return bool(protocol.buffer) or protocol.eof or is_socket_readable(transport.get_extra_info("socket"))
        return None


class AsyncioBackend(AsyncNetworkBackend):
    """TCP (and TLS over it) on asyncio transports; Unix sockets too."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = (local_address, 0) if local_address is not None else None
        connect = loop.create_connection(_Protocol, host, port, local_addr=local)
        return await self._connected(connect, timeout, socket_options)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[SOCKET_OPTION] | None = None
    ) -> AsyncNetworkStream:
        connect = asyncio.get_running_loop().create_unix_connection(_Protocol, path)
        return await self._connected(connect, timeout, socket_options)

    async def _connected(
        self, connect: Any, timeout: float | None, socket_options: Iterable[SOCKET_OPTION] | None
    ) -> AsyncNetworkStream:
        try:
            transport, protocol = await asyncio.wait_for(connect, timeout)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc) or "connect timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        sock = transport.get_extra_info("socket")
        for option in socket_options or ():  # (asyncio already sets TCP_NODELAY)
            sock.setsockopt(*option)
        return _Stream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
