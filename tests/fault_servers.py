"""Hostile loopback endpoints for the fault suite, plus small helpers the fault tests share.

``fault_server()`` is a real ``ThreadingHTTPServer`` on a loopback address whose every GET is answered by a
*responder*: a function of the request handler that writes whatever it likes (a page, a 100 MB stream
produced by a generator, a response trickled byte by byte from the status line on, a hold until an event).
The responder can be swapped while the server runs. ``silent_listener()`` is a socket that completes TCP
handshakes (the kernel's backlog does it) and never reads or answers. ``refused_url()`` names a port nothing
listens on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

T = TypeVar("T")

Responder = Callable[["FaultHandler"], None]

TEXT = {"Content-Type": "text/plain; version=0.0.4"}


class FaultHandler(BaseHTTPRequestHandler):
    server: _FaultHTTPServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        with srv.lock:
            srv.requests.append((self.path, dict(self.headers.items())))
        # A client that gave up (a cap, a deadline) is what the test wants.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            srv.responder(self)

    @property
    def stopping(self) -> threading.Event:
        return self.server.stop_event


class _FaultHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    responder: Responder
    requests: list[tuple[str, dict[str, str]]]
    stop_event: threading.Event
    lock: threading.Lock


@dataclass
class FaultServer:
    server: _FaultHTTPServer

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def respond(self, responder: Responder) -> None:
        self.server.responder = responder

    @property
    def requests(self) -> list[tuple[str, dict[str, str]]]:
        with self.server.lock:
            return list(self.server.requests)


@contextmanager
def fault_server(responder: Responder | None = None, host: str = "127.0.0.1") -> Iterator[FaultServer]:
    srv = _FaultHTTPServer((host, 0), FaultHandler)
    srv.responder = responder or page(b"")
    srv.requests = []
    srv.stop_event = threading.Event()
    srv.lock = threading.Lock()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield FaultServer(srv)
    finally:
        srv.stop_event.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)


# -- responders ------------------------------------------------------------------------------------------------
def page(body: bytes | str, status: int = 200, headers: dict[str, str] | None = None) -> Responder:
    data = body.encode() if isinstance(body, str) else body

    def respond(h: FaultHandler) -> None:
        h.send_response(status)
        for key, value in (TEXT if headers is None else headers).items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return respond


def streamed(
    chunks: Callable[[], Iterator[bytes]], length: int | None, headers: dict[str, str] | None = None
) -> Responder:
    """A body produced chunk by chunk by a generator: never built in memory, stopped when the client leaves."""

    def respond(h: FaultHandler) -> None:
        h.send_response(200)
        for key, value in (headers or TEXT).items():
            h.send_header(key, value)
        if length is not None:
            h.send_header("Content-Length", str(length))
        h.end_headers()
        for chunk in chunks():
            if h.stopping.is_set():
                return
            h.wfile.write(chunk)

    return respond


def zeros(total: int, chunk: int = 256 * 1024) -> Callable[[], Iterator[bytes]]:
    """``total`` bytes of a metrics-looking comment line, ``chunk`` at a time (one chunk object, reused)."""
    block = (b"# " + b"x" * 1021 + b"\n") * (chunk // 1024)

    def gen() -> Iterator[bytes]:
        sent = 0
        while sent < total:
            piece = block if total - sent >= len(block) else block[: total - sent]
            sent += len(piece)
            yield piece

    return gen


def gzip_bomb(inflated: int) -> bytes:
    """A gzip member of ``inflated`` zero bytes, compressed a chunk at a time (the bomb itself is small)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1024 * 1024)
    parts = [compressor.compress(block) for _ in range(inflated // len(block))]
    parts.append(compressor.flush())
    return b"".join(parts)


def trickle(body: bytes, interval_s: float, *, from_status_line: bool = False) -> Responder:
    """One byte every ``interval_s``: the body only, or the whole response starting with its status line."""

    def respond(h: FaultHandler) -> None:
        if from_status_line:
            head = f"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            data = head + body
        else:
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.flush()
            data = body
        for i in range(len(data)):
            h.wfile.write(data[i : i + 1])
            h.wfile.flush()
            if h.stopping.wait(interval_s):
                return

    return respond


def held(release: threading.Event, then: Responder) -> Responder:
    """Accept, read the request, and say nothing until ``release`` is set; then answer with ``then``."""

    def respond(h: FaultHandler) -> None:
        while not release.wait(0.05):
            if h.stopping.is_set():
                return
        then(h)

    return respond


def redirect(location: str, status: int = 302) -> Responder:
    return page(b"", status=status, headers={"Location": location, "Content-Length": "0"})


# -- sockets -------------------------------------------------------------------------------------------------------
@contextmanager
def silent_listener(host: str = "127.0.0.1") -> Iterator[str]:
    """``http://host:port``: connects succeed (the kernel accepts into the backlog), nothing is ever read or sent."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        sock.close()


def refused_url(host: str = "127.0.0.1") -> str:
    """A URL whose port had a listener a moment ago and has none now: connecting is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://{host}:{port}"


# -- helpers -------------------------------------------------------------------------------------------------------
class Bounded:
    """Run a call on a thread and join with a generous bound: the hang guard of "no caller blocked"."""

    def __init__(self, fn: Callable[[], T], limit_s: float = 20.0) -> None:
        self.box: list[tuple[bool, Any]] = []
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.limit_s = limit_s

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.box.append((True, fn()))
        except BaseException as exc:
            self.box.append((False, exc))

    def __call__(self) -> Any:
        self.thread.start()
        self.thread.join(self.limit_s)
        assert not self.thread.is_alive(), f"the call was still blocked after {self.limit_s}s"
        ok, value = self.box[0]
        if not ok:
            raise AssertionError(f"the call raised {type(value).__name__}: {value}") from value
        return value


def bounded(fn: Callable[[], T], limit_s: float = 20.0) -> T:
    """``fn()`` on a thread; fail if it is still running after ``limit_s`` or if it raised."""
    result: T = Bounded(fn, limit_s)()
    return result


class RecordList(logging.Handler):
    """Collects records of one logger (for hypothesis tests, where caplog spans every example)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.WARNING) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]


@contextmanager
def captured_log(name: str = "model_concurrency", level: int = logging.DEBUG) -> Iterator[RecordList]:
    logger = logging.getLogger(name)
    handler = RecordList()
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def wait_until(condition: Callable[[], bool], limit_s: float = 15.0) -> bool:
    """Poll a condition (a hang guard, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


@dataclass
class Fixed:
    """A policy that answers a fixed target on every good poll (so a good poll and a held target differ)."""

    value: float
    seen: list[object] = field(default_factory=list)

    def next_target(self, target: float, obs: object) -> float:
        return self.value
