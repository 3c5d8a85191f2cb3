"""How an HTTP front-end reaches the engine core: in the same event loop, or in the engine process over a socket.

Why two: the in-process link keeps the whole emulator in one loop (tests, httpx's ASGI transport, virtual-time
use), while the remote link lets ``model-concurrency emulate`` run the core in its own process, so HTTP load never
delays an engine step. The app's handlers see one interface either way:

* ``await link.submit(specs, stream=..., budget_tokens=...)`` -> a :class:`FrontJob` (or raises
  :class:`~.openai_shapes.ApiError`: 429, 503, 400), whose ``events`` queue receives ``("tokens", n)`` and finally
  ``("done", error_message_or_None)``;
* ``link.abort(job)`` when the client went away;
* ``await link.call("metrics" | "health" | "capacity" | "loads", arg)``.

The wire (remote) is length-prefixed pickle frames over a Unix socket, each frame a list of messages, written
through asyncio transports (never blocking either side; several messages per loop turn go out as one frame).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import pickle
import struct
import time
from collections.abc import Callable
from typing import Any, Protocol

from model_concurrency.emulator.core import EmulatorConfig, EngineCore, JobSpec
from model_concurrency.emulator.openai_shapes import ApiError

__all__ = ["EngineLink", "FrontJob", "LocalLink", "Outbox", "RemoteLink", "read_frame"]

_HEADER = struct.Struct("<I")
ENGINE_GONE = "the engine process is gone"


class FrontJob:
    """The front-end's view of one submitted job."""

    __slots__ = ("accepted", "done", "events", "handle", "id")

    def __init__(self, job_id: int) -> None:
        self.id = job_id
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.handle: Any = None  # the core's job (local link only)
        self.accepted = False
        self.done = False

    def push(self, kind: str, value: Any) -> None:
        if kind == "done":
            self.done = True
        self.events.put_nowait((kind, value))


class EngineLink(Protocol):
    model_name: str
    time_scale: float

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def submit(self, specs: list[JobSpec], *, stream: bool, budget_tokens: int) -> FrontJob: ...
    def abort(self, job: FrontJob) -> None: ...
    async def call(self, method: str, arg: Any = None) -> Any: ...


class LocalLink:
    """The core lives in this event loop, driven by its :class:`~.clock.SimDriver` timer."""

    def __init__(self, config: EmulatorConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.core = EngineCore(config, clock=clock)
        self.model_name = self.core.model_name
        self.time_scale = self.core.driver.time_scale
        self._ids = itertools.count()

    async def start(self) -> None:
        self.core.driver.start()

    async def stop(self) -> None:
        await self.core.driver.stop()

    async def submit(self, specs: list[JobSpec], *, stream: bool, budget_tokens: int) -> FrontJob:
        self.core.driver.start()
        job = FrontJob(next(self._ids))
        job.handle = self.core.submit(specs, job.push, stream=stream, budget_tokens=budget_tokens)
        job.accepted = True
        return job

    def abort(self, job: FrontJob) -> None:
        if not job.done and job.handle is not None:
            self.core.abort(job.handle)

    async def call(self, method: str, arg: Any = None) -> Any:
        self.core.driver.start()
        return dispatch_call(self.core, method, arg)


def dispatch_call(core: EngineCore, method: str, arg: Any) -> Any:
    if method == "metrics":
        return core.metrics()
    if method == "health":
        return core.health()
    if method == "capacity":
        return core.capacity(arg)
    if method == "loads":
        return core.loads(bool(arg))
    raise ApiError(500, f"unknown engine call {method!r}", kind="InternalServerError")


class Outbox:
    """Messages queued during one loop turn, written as one frame at the end of it."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._pending: list[Any] = []

    def send(self, message: Any) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(message)

    def _flush(self) -> None:
        messages, self._pending = self._pending, []
        if messages and not self.writer.is_closing():
            payload = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
            self.writer.write(_HEADER.pack(len(payload)) + payload)


async def read_frame(reader: asyncio.StreamReader) -> list[Any] | None:
    """The next frame's messages, or ``None`` at end of stream."""
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        messages: list[Any] = pickle.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return messages


class RemoteLink:
    """The core lives in the engine process at ``socket_path``; this front-end is one of its clients."""

    def __init__(self, socket_path: str, model_name: str, time_scale: float) -> None:
        self.socket_path = socket_path
        self.model_name = model_name
        self.time_scale = time_scale
        self._ids = itertools.count()
        self._jobs: dict[int, FrontJob] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._outbox: Outbox | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.on_lost: Callable[[], None] | None = None

    async def start(self) -> None:
        reader, writer = await asyncio.open_unix_connection(self.socket_path)
        self._writer = writer
        self._outbox = Outbox(writer)
        self._reader_task = asyncio.create_task(self._read(reader))

    async def stop(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        if self._writer is not None:
            self._writer.close()
        self._fail_all()

    def _send(self, message: Any) -> None:
        if self._outbox is None:
            raise ApiError(503, ENGINE_GONE, kind="ServiceUnavailableError")
        self._outbox.send(message)

    async def submit(self, specs: list[JobSpec], *, stream: bool, budget_tokens: int) -> FrontJob:
        job = FrontJob(next(self._ids))
        self._jobs[job.id] = job
        self._send(("submit", job.id, specs, stream, budget_tokens))
        try:
            kind, value = await job.events.get()  # "accepted", or "error" with the ApiError
        except BaseException:
            self.abort(job)
            raise
        if kind == "error":
            self._jobs.pop(job.id, None)
            job.done = True
            raise value
        job.accepted = True
        return job

    def abort(self, job: FrontJob) -> None:
        if not job.done:
            job.done = True
            self._jobs.pop(job.id, None)
            with contextlib.suppress(ApiError):
                self._send(("abort", job.id))

    async def call(self, method: str, arg: Any = None) -> Any:
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self._send(("call", call_id, method, arg))
        try:
            ok, value = await future
        finally:
            self._calls.pop(call_id, None)
        if not ok:
            raise value
        return value

    async def _read(self, reader: asyncio.StreamReader) -> None:
        jobs, calls = self._jobs, self._calls
        try:
            while (messages := await read_frame(reader)) is not None:
                for kind, key, value in messages:
                    if kind == "reply":
                        future = calls.get(key)
                        if future is not None and not future.done():
                            future.set_result(value)
                        continue
                    job = jobs.get(key)
                    if job is None:
                        continue
                    if kind in ("done", "error"):
                        del jobs[key]
                    job.push(kind, value)
        finally:
            self._outbox = None
            self._fail_all()
            if self.on_lost is not None:
                self.on_lost()

    def _fail_all(self) -> None:
        gone = ApiError(503, ENGINE_GONE, kind="ServiceUnavailableError")
        for job in list(self._jobs.values()):
            if job.accepted:
                job.push("done", ENGINE_GONE)
            else:
                job.push("error", gone)
        self._jobs.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_result((False, gone))
