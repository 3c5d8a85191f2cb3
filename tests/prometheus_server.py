"""Start a real Prometheus server on 127.0.0.1 with a temporary config and data directory.

CI installs the Debian package (``.ci/run``) and sets ``MODEL_CONCURRENCY_REQUIRE_PROMETHEUS=1``, so there a
missing binary fails the test; elsewhere it skips with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        reason = "the prometheus binary is not installed (apt-get install prometheus; .ci/run does this)"
        if os.environ.get("MODEL_CONCURRENCY_REQUIRE_PROMETHEUS"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@contextmanager
def prometheus_server(targets: list[str], scrape_interval_s: float = 1.0) -> Iterator[str]:
    """Run Prometheus scraping ``targets`` (host:port); yields its base URL; stops it afterwards."""
    binary = prometheus_binary()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="prom-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        quoted = ", ".join(f'"{t}"' for t in targets)
        config.write_text(
            "global:\n"
            f"  scrape_interval: {int(scrape_interval_s * 1000)}ms\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: vllm\n"
            f"    static_configs:\n      - targets: [{quoted}]\n"
        )
        log = open(Path(tmp) / "prometheus.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp}/data",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    raise RuntimeError("prometheus did not start: " + (Path(tmp) / "prometheus.log").read_text())
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def wait_for(predicate: object, timeout_s: float = 30.0) -> None:
    """Poll ``predicate()`` until true (Prometheus scrapes on its own schedule); fail with a reason if never."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.25)
    raise AssertionError(f"condition not met within {timeout_s}s")
