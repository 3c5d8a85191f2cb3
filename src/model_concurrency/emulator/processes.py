"""The served emulator's processes: one engine process, N HTTP front-end processes, and the parent that owns them.

Why processes: vLLM V1 runs its EngineCore in a process of its own, fed by the API server(s), so a busy HTTP
stack never delays an engine step. Here likewise: the engine process runs only the :class:`~.core.EngineCore`
(its :class:`~.clock.SimDriver` timer wakes at each simulated engine step, on time, because nothing else competes
for its event loop) and a Unix-socket server the front-ends connect to. Each front-end is uvicorn serving the same
ASGI app as the in-process emulator, with a :class:`~.links.RemoteLink` instead of a local core; all front-ends
accept on one listening socket created by the parent.

Lifetime: every child exits when its parent does. The children poll their parent's pid (``os.getppid()``
changes when the parent dies, even by SIGKILL) and stop; a front-end also stops when its engine connection drops.
The parent stops its children by their own pids (terminate, then kill after a grace period).

Children are started with the ``spawn`` method (no fork of a parent that may hold threads), so a script that
starts the emulator from Python must guard its entry point with ``if __name__ == "__main__":``, as for any
``multiprocessing`` program.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from model_concurrency.emulator.core import EmulatorConfig, EngineCore
from model_concurrency.emulator.links import Outbox, RemoteLink, dispatch_call, read_frame
from model_concurrency.emulator.openai_shapes import ApiError

# Idle keep-alive connections are kept this long, past httpx's 5 s expiry, so a client never reuses a connection
# the server is closing at that instant (both at 5 s, a reused connection could die as httpx.ReadError: seen in the
# README snippet's test). vLLM's own API server keeps 5 s; there, resend idempotent calls on that error.
KEEP_ALIVE_S = 30

__all__ = ["EmulatorProcesses", "start_processes"]

log = logging.getLogger("model_concurrency.emulator")

PARENT_POLL_S = 0.5


# ---------------------------------------------------------------------------------------------------- engine
def engine_main(config: EmulatorConfig, socket_path: str, ready: Connection, parent_pid: int) -> None:
    """Entry point of the engine process: serve the core on ``socket_path`` until the parent goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    asyncio.run(_engine(config, socket_path, ready, parent_pid))


async def _engine(config: EmulatorConfig, socket_path: str, ready: Connection, parent_pid: int) -> None:
    core = EngineCore(config)
    core.driver.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve_frontend(core, reader, writer)

    server = await asyncio.start_unix_server(client, path=socket_path)
    ready.send(core.model_name)
    ready.close()
    watcher = asyncio.create_task(_watch_parent(parent_pid, stop))
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        server.close()
        await core.driver.stop()


async def _serve_frontend(core: EngineCore, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    outbox = Outbox(writer)
    jobs: dict[int, Any] = {}

    def sink_for(job_id: int) -> Any:
        def sink(kind: str, value: Any) -> None:
            if kind == "done":
                jobs.pop(job_id, None)
            outbox.send((kind, job_id, value))

        return sink

    try:
        while (messages := await read_frame(reader)) is not None:
            for message in messages:
                kind = message[0]
                if kind == "submit":
                    _, job_id, specs, stream, budget = message
                    try:
                        jobs[job_id] = core.submit(specs, sink_for(job_id), stream=stream, budget_tokens=budget)
                    except ApiError as err:
                        outbox.send(("error", job_id, err))
                    else:
                        outbox.send(("accepted", job_id, None))
                elif kind == "abort":
                    job = jobs.pop(message[1], None)
                    if job is not None:
                        core.abort(job)
                elif kind == "call":
                    _, call_id, method, arg = message
                    try:
                        outbox.send(("reply", call_id, (True, dispatch_call(core, method, arg))))
                    except ApiError as err:
                        outbox.send(("reply", call_id, (False, err)))
    finally:
        for job in jobs.values():  # the front-end went away: its clients are gone too
            core.abort(job)
        writer.close()


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(PARENT_POLL_S)
    log.warning("the emulator's parent process is gone; stopping")
    stop.set()


# ---------------------------------------------------------------------------------------------------- front-end
def frontend_main(
    config: EmulatorConfig,
    socket_path: str,
    model_name: str,
    listen: socket.socket,
    parent_pid: int,
    log_level: str,
) -> None:
    """Entry point of a front-end process: uvicorn on the shared socket, the app over a remote link."""
    import uvicorn

    from model_concurrency.emulator.app import create_app

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    link = RemoteLink(socket_path, model_name, config.time_scale)
    app = create_app(config, link=link)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on", timeout_keep_alive=KEEP_ALIVE_S)
    )

    def lost() -> None:
        server.should_exit = True

    link.on_lost = lost

    def watch() -> None:
        while os.getppid() == parent_pid and not server.should_exit:
            time.sleep(PARENT_POLL_S)
        server.should_exit = True

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    server.run(sockets=[listen])


# ---------------------------------------------------------------------------------------------------- parent
@dataclass
class EmulatorProcesses:
    """The started children, their shared socket and where they listen."""

    url: str
    model: str
    engine: BaseProcess
    frontends: list[BaseProcess]
    listen: socket.socket
    socket_dir: str

    @property
    def children(self) -> list[BaseProcess]:
        return [*self.frontends, self.engine]

    def failed(self) -> BaseProcess | None:
        """A child that exited on its own (the parent then stops the rest)."""
        return next((p for p in self.children if p.exitcode is not None), None)

    def stop(self, grace_s: float = 10.0) -> None:
        """Front-ends first (they drain), then the engine; each by its own pid; kill what outlives the grace."""
        for group in (self.frontends, [self.engine]):
            for process in group:
                if process.is_alive():
                    process.terminate()
            deadline = time.monotonic() + grace_s
            for process in group:
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join(5)
        self.listen.close()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.socket_dir, "engine.sock"))
        with contextlib.suppress(OSError):
            os.rmdir(self.socket_dir)


def start_processes(
    config: EmulatorConfig, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
) -> EmulatorProcesses:
    """Start the engine process, then ``config.frontends`` front-ends on ``host:port`` (0: a free port), and wait
    until ``/health`` answers. The caller must :meth:`~EmulatorProcesses.stop` them."""
    import tempfile

    import httpx

    config.validate()
    ctx = multiprocessing.get_context("spawn")
    socket_dir = tempfile.mkdtemp(prefix="mc-emulator-")
    socket_path = os.path.join(socket_dir, "engine.sock")
    ready_recv, ready_send = ctx.Pipe(duplex=False)
    engine = ctx.Process(
        target=engine_main, args=(config, socket_path, ready_send, os.getpid()), name="emulator-engine", daemon=True
    )
    engine.start()
    ready_send.close()
    listen = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    procs = EmulatorProcesses("", "", engine, [], listen, socket_dir)
    try:
        listen.bind((host, port))
        listen.listen(2048)
        if not ready_recv.poll(60):
            raise RuntimeError("the emulator's engine process did not start")
        model = ready_recv.recv()
        procs.model = model
        for i in range(config.frontends):
            frontend = ctx.Process(
                target=frontend_main,
                args=(config, socket_path, model, listen, os.getpid(), log_level),
                name=f"emulator-frontend-{i}",
                daemon=True,
            )
            frontend.start()
            procs.frontends.append(frontend)
        bound_host, bound_port = listen.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        procs.url = f"http://{shown}:{bound_port}"
        deadline = time.monotonic() + 60
        while True:
            if (dead := procs.failed()) is not None:
                raise RuntimeError(f"emulator process {dead.name} exited with code {dead.exitcode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{procs.url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the emulator did not answer /health within 60 s")
            time.sleep(0.05)
    except BaseException:
        procs.stop()
        raise
    finally:
        ready_recv.close()
    return procs


@contextlib.contextmanager
def running_processes(
    config: EmulatorConfig, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
) -> Iterator[EmulatorProcesses]:
    procs = start_processes(config, host=host, port=port, log_level=log_level)
    try:
        yield procs
    finally:
        procs.stop()
