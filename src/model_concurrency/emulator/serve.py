"""Serving the emulator with uvicorn: in the foreground (the CLI) or in a background thread (tests, benchmarks).

The background form binds its own socket to ``127.0.0.1:0`` before uvicorn starts, so the port is known up front
and two tests can never race for the same "free" port.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from model_concurrency.emulator.app import EmulatorConfig, create_app

__all__ = ["RunningEmulator", "serve", "serve_in_thread"]


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
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on"))
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


def serve(config: EmulatorConfig, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve in the foreground until interrupted (``model-concurrency emulate``)."""
    import uvicorn

    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level, access_log=False)
