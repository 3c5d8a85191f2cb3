"""Serving the emulator: in the foreground (the CLI), in an engine process plus front-end processes started from
Python (benchmarks, live tests), or in a background thread with the engine in uvicorn's own loop (quick tests).

The foreground and process forms run the engine core in its own process (:mod:`.processes`), so HTTP load never
stalls the simulated clock. The thread form keeps everything in one event loop: fine for tests that send a
handful of calls, not for load. Every form binds its socket before serving, so the port is known up front and
two tests can never race for the same "free" port.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from model_concurrency.emulator.app import EmulatorConfig, create_app

__all__ = ["RunningEmulator", "serve", "serve_in_processes", "serve_in_thread"]


@dataclass(frozen=True, slots=True)
class RunningEmulator:
    """Where a started emulator listens. ``base_url`` is what an OpenAI client or ``register_model`` takes."""

    url: str  # http://127.0.0.1:PORT
    model: str  # the served model name

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def host_port(self) -> str:
        return self.url.removeprefix("http://")

    def set_capacity(self, **changes: Any) -> dict[str, Any]:
        """POST /admin/capacity (``max_num_seqs=``, ``engines=``, ``speed=``, ``up=``...); returns the new state."""
        response = httpx.post(f"{self.url}/admin/capacity", json=changes, timeout=10)
        response.raise_for_status()
        state: dict[str, Any] = response.json()
        return state

    def capacity(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/admin/capacity", timeout=10)
        response.raise_for_status()
        state: dict[str, Any] = response.json()
        return state


def _uvicorn_server(config: EmulatorConfig, log_level: str) -> tuple[Any, str]:
    import uvicorn

    app = create_app(config)
    from model_concurrency.emulator.processes import KEEP_ALIVE_S

    config_ = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on", timeout_keep_alive=KEEP_ALIVE_S)
    server = uvicorn.Server(config_)
    return server, app.state.emulator.model_name


@contextmanager
def serve_in_thread(config: EmulatorConfig | None = None, *, log_level: str = "warning") -> Iterator[RunningEmulator]:
    """Start an emulator on a free loopback port in a daemon thread; stop it when the block exits."""
    server, model = _uvicorn_server(config or EmulatorConfig(), log_level)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"emulator-{port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the emulator did not start")
            time.sleep(0.01)
        yield RunningEmulator(url=f"http://127.0.0.1:{port}", model=model)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextmanager
def serve_in_processes(
    config: EmulatorConfig | None = None, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
) -> Iterator[RunningEmulator]:
    """The served emulator as ``model-concurrency emulate`` runs it: an engine process and ``config.frontends``
    HTTP front-end processes (children of this one, stopped by pid when the block exits)."""
    from model_concurrency.emulator.processes import running_processes

    with running_processes(config or EmulatorConfig(), host=host, port=port, log_level=log_level) as procs:
        yield RunningEmulator(url=procs.url, model=procs.model)


def serve(config: EmulatorConfig, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> int:
    """Serve in the foreground until SIGINT/SIGTERM or until a child process dies (then exit code 1)."""
    from model_concurrency.emulator.processes import start_processes

    stopping = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    procs = start_processes(config, host=host, port=port, log_level=log_level)
    code = 0
    try:
        print(
            f"emulating {procs.model} at {procs.url}/v1 (engine pid {procs.engine.pid}, "
            f"front-end pids {[p.pid for p in procs.frontends]}); Ctrl-C stops",
            flush=True,
        )
        while not stopping.wait(0.5):
            if (dead := procs.failed()) is not None:
                print(f"emulator process {dead.name} exited with code {dead.exitcode}; stopping", flush=True)
                code = 1
                break
    finally:
        procs.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code
