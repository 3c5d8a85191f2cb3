"""Publish this process's runtime state where ``model-concurrency watch --job`` (or Prometheus) can read it.

``watch`` alone runs controllers of its own: next to a running job it would show its own target, not the
job's. A job publishes instead: the Prometheus page of its metrics (telemetry.py: target, bounds, in flight,
saturation, the last decision's ``limited_by`` reason when the runtime exports it), either

* on an HTTP port, ``HOST:PORT`` (prometheus_client's own server, ``/metrics``), or
* in a file, any other value: rewritten every ``FILE_EVERY_S`` (to a temporary name, then renamed, so a reader
  never sees half a page),

named by ``MODEL_CONCURRENCY_EXPORT`` (read when a model starts being polled) or by :func:`start` (``run
--export``). Starting twice with the same place is a no-op; the export lives as long as the process.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, generate_latest, start_http_server

from model_concurrency import knobs
from model_concurrency._fork import reset_in_forked_child
from model_concurrency.knobs import setting

__all__ = ["FILE_EVERY_S", "ensure_started", "parse_address", "start", "started", "stop"]

log = logging.getLogger("model_concurrency")
FILE_EVERY_S = 0.5
_ADDRESS = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):(?P<port>\d{1,5})$")
_started: set[str] = set()
_stops: dict[str, Callable[[], None]] = {}  # how to stop each running export
_lock = threading.Lock()


def parse_address(where: str) -> tuple[str, int] | None:
    """``(host, port)`` when ``where`` is ``HOST:PORT``; None when it names a file."""
    match = _ADDRESS.match(where.strip())
    if match is None:
        return None
    port = int(match["port"])
    if not 0 < port < 65536:
        raise ValueError(f"export address {where!r}: port must be 1-65535")
    return match["host"].strip("[]"), port


def started() -> set[str]:
    """Where this process publishes now."""
    with _lock:
        return set(_started)


def start(where: str) -> str:
    """Publish the metrics at ``where`` (``HOST:PORT`` or a file path); returns ``where`` as started."""
    where = where.strip()
    if not where:
        raise ValueError("export: empty address")
    with _lock:
        if where in _started:
            return where
        address = parse_address(where)
        if address is not None:
            server, _ = start_http_server(address[1], addr=address[0])
            _stops[where] = _stopper(server)
            log.info("model-concurrency metrics at http://%s:%d/metrics", *address)
        else:
            path = Path(where).expanduser()
            write_page(path)  # fail now (a folder that does not exist), not in a thread
            done = threading.Event()
            threading.Thread(
                target=_write_forever, args=(path, done), name="model-concurrency-export", daemon=True
            ).start()
            _stops[where] = done.set
            log.info("model-concurrency metrics written to %s every %.1f s", path, FILE_EVERY_S)
        _started.add(where)
    return where


def stop(where: str | None = None) -> None:
    """Stop publishing at ``where`` (every place when None): tests, and a job that wants its port back."""
    with _lock:
        for place in [where.strip()] if where is not None else list(_started):
            _started.discard(place)
            halt = _stops.pop(place, None)
            if halt is not None:
                halt()


def _stopper(server: Any) -> Callable[[], None]:
    def halt() -> None:
        server.shutdown()
        server.server_close()

    return halt


def ensure_started() -> None:
    """Start the export ``MODEL_CONCURRENCY_EXPORT`` names, once; a bad value is logged, never raised (a fan-out
    must not fail because its dashboard cannot be published)."""
    where = setting(*knobs.EXPORT).strip()
    if not where or where in _started:
        return
    try:
        start(where)
    except (OSError, ValueError) as exc:
        with _lock:
            _started.add(where)  # said once
        log.error("cannot export metrics to %s=%r: %s", knobs.EXPORT[0], where, exc)


def write_page(path: Path) -> None:
    """The registry's page into ``path``, atomically (a temporary file in the same folder, then a rename)."""
    page = generate_latest(REGISTRY)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(page)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_forever(path: Path, done: threading.Event) -> None:
    while not done.wait(FILE_EVERY_S):
        try:
            write_page(path)
        except OSError as exc:  # a full disk or a removed folder: say so, keep trying
            log.warning("cannot write metrics to %s: %s", path, exc)


# A child inherits neither the parent's server thread nor its writer: it publishes only what it starts itself.
reset_in_forked_child(globals(), "_lock", threading.Lock, _started, _stops)
