"""The outage rule (gate/outage.py) through map_concurrent, map_concurrent_sync and slot, over real loopback HTTP:
a model that refuses connections holds the fan-out (one probe at a time) instead of failing its items, resumes
when a call succeeds, fails waiting items with ModelUnreachable only after max_outage_s, and with
MODEL_CONCURRENCY_MAX_OUTAGE_S=0 behaves as before (every item tried and failed)."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import httpx
import pytest

from fault_servers import Fixed, fault_server, refused_url
from model_concurrency import gate_stats, map_concurrent, map_concurrent_sync, slot
from model_concurrency.config import register_model
from model_concurrency.gate.hold import FIRST_PROBE_S
from model_concurrency.gate.outage import ModelUnreachable
from model_concurrency.integrations.httpx import SlotTransport
from model_concurrency.runtime import ModelRuntime, install_runtime, runtime_for
from model_concurrency.signals.source import ClientOnlySource

ITEMS = 40
TARGET = 16  # kept by a fixed policy: the limit after an outage is exactly the one before, whenever a poll falls


class _Ok(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


class LateServer:
    """Nothing listens at ``url`` (connections refused) until :meth:`start`, which binds and listens before it
    returns (so the next connection is accepted, however slow the machine); a thread then answers 200 "ok".

    The tests start it on an event of the outage (after the first failed probe), never after a wall-clock delay:
    how many probes fit in a delay depends on the machine's speed (tests/test_outage_virtual.py times them)."""

    def __init__(self, url: str, *, never: bool = False) -> None:
        self.url, self.never = url, never
        self.server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self.server is not None:
                return
            parts = urlsplit(self.url)
            server = ThreadingHTTPServer((parts.hostname or "127.0.0.1", parts.port or 80), _Ok)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            self.server = server

    def start_after_a_failed_probe(self, runtime: ModelRuntime) -> None:
        """Called before each attempt: the server is up for every attempt after the first failed probe."""
        if runtime.limiter.hold.outage.probes_failed >= 1 and not self.never:
            self.start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@contextmanager
def late_server(*, never: bool = False) -> Iterator[LateServer]:
    server = LateServer(refused_url(), never=never)
    try:
        yield server
    finally:
        server.close()


def model(floor: int = 4) -> ModelRuntime:
    register_model("m", base_url=None, max_parallel_calls=floor)
    spec = runtime_for("m").spec
    runtime = install_runtime(ModelRuntime(spec, name="m", source=ClientOnlySource(), policy=Fixed(TARGET)))
    runtime.core.target_value = float(TARGET)
    runtime.apply_limits()
    return runtime


def fan_out(server: LateServer, runtime: ModelRuntime, **kwargs: object) -> list[object]:
    """map_concurrent over ITEMS GETs of the server through one client (a client per call costs an SSL context);
    the server comes up after the outage's first failed probe."""

    async def main() -> list[object]:
        async with httpx.AsyncClient(timeout=5) as client:

            async def call(_: int) -> str:
                server.start_after_a_failed_probe(runtime)
                response = await client.get(server.url)
                response.raise_for_status()
                return response.text

            return await map_concurrent(range(ITEMS), call, model="m", **kwargs)  # type: ignore[call-overload, no-any-return]

    return asyncio.run(main())


_sync_client = httpx.Client(timeout=5)


def get(url: str) -> str:
    response = _sync_client.get(url)
    response.raise_for_status()
    return response.text


def test_an_outage_holds_items_until_the_model_returns() -> None:
    """Over real sockets, the model down until its first failed probe: with retries= every item succeeds; without,
    only the calls in flight when it broke (at most the target's 16) and the one failed probe fail, not the whole
    list. One outage, one failed probe (the next one finds the server): breaks if the hold lets more than one
    probe out, counts the wave's refusals as probes, or does not restore the target. The exact probe times are
    in tests/test_outage_virtual.py."""
    runtime = model()
    with late_server() as server:
        results = fan_out(server, runtime, retries=4)
    assert results == ["ok"] * ITEMS
    outage = runtime.limiter.hold.outage
    assert (outage.opened, outage.probes_failed, outage.active, runtime.limiter.limit) == (1, 1, False, TARGET)
    assert gate_stats("m").errors <= TARGET + 1  # the first wave (the target's worth) and the one probe, not 40 items

    runtime = model()
    with late_server() as server:
        results = fan_out(server, runtime, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(e, httpx.ConnectError) for e in failed)
    assert runtime.limiter.hold.outage.probes_failed == 1
    assert len(failed) <= TARGET + 1
    assert results.count("ok") == ITEMS - len(failed) >= ITEMS - TARGET - 1


def test_threads_wait_out_an_outage_too() -> None:
    """The same through map_concurrent_sync's threads: one outage, one failed probe, every item succeeds."""
    runtime = model()
    with late_server() as server:

        def call(_: int) -> str:
            server.start_after_a_failed_probe(runtime)
            return get(server.url)

        results = map_concurrent_sync(range(ITEMS), call, model="m", retries=4)
    assert results == ["ok"] * ITEMS
    outage = runtime.limiter.hold.outage
    assert (outage.opened, outage.probes_failed, outage.active) == (1, 1, False)


def test_items_fail_clearly_after_max_outage_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_MAX_OUTAGE_S", "0.4")
    """Never up, max_outage_s 0.4: items fail unrun with ModelUnreachable, not by the hundred against the port."""
    runtime = model()
    with late_server(never=True) as server:
        results = fan_out(server, runtime, return_exceptions=True)
    unreachable = [r for r in results if isinstance(r, ModelUnreachable)]
    refused = [r for r in results if isinstance(r, httpx.ConnectError)]
    assert len(unreachable) + len(refused) == ITEMS
    assert len(refused) <= TARGET + 4  # tried: the first wave and the probes; the rest waited, then failed unrun
    assert "MODEL_CONCURRENCY_MAX_OUTAGE_S" in str(unreachable[0])
    assert gate_stats("m").errors == len(refused)


def test_max_outage_s_0_keeps_the_old_behaviour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_MAX_OUTAGE_S", "0")
    runtime = model()
    url = refused_url()
    results = map_concurrent_sync(range(ITEMS), lambda _: get(url), model="m", return_exceptions=True)
    assert all(isinstance(r, httpx.ConnectError) for r in results)  # every item tried, every one failed at once
    assert runtime.limiter.hold.outage.opened == 0


def test_a_proxys_502_holds_slot_callers_until_a_call_succeeds() -> None:
    """A gateway answering 502 through the httpx transport (slot inside): the limiter admits one probe, and the
    first 200 puts it back to the target."""
    runtime = model()
    answers = iter([502, 502] + [200] * 10)

    def respond(h: BaseHTTPRequestHandler) -> None:
        status = next(answers)
        h.send_response(status)
        h.send_header("Content-Length", "0")
        h.end_headers()

    with fault_server(respond) as server, httpx.Client(transport=SlotTransport(model="m"), timeout=5) as client:
        assert client.get(server.url).status_code == 502
        outage = runtime.limiter.hold.outage
        assert outage.active and runtime.limiter.limit == 1
        assert outage.since is not None and runtime.limiter.hold.remaining(outage.since) == pytest.approx(FIRST_PROBE_S)
        assert client.get(server.url).status_code == 502  # the probe, after the hold: backs off
        assert runtime.limiter.hold.outage.backoff_s == 0.5
        with slot("m"):  # waits for the next probe time, then holds the one probe slot
            assert runtime.held_for() == 0
        assert client.get(server.url).status_code == 200
    assert not runtime.limiter.hold.outage.active
    assert runtime.limiter.limit == TARGET


def test_the_outage_state_exact() -> None:
    """The rule on a clock given by hand: open, ignore the stragglers, back off on failed probes, close."""
    from model_concurrency.gate.outage import Outage

    outage = Outage()
    assert not outage.fail(sent_at=0.0, now=1.0, reason="r", max_s=0)  # 0: the rule is off
    assert not outage.active
    assert outage.fail(sent_at=0.0, now=10.0, reason="refused", max_s=30)  # opens
    assert (outage.since, outage.until, outage.opened) == (10.0, 10.25, 1)
    assert not outage.fail(sent_at=9.0, now=10.1, reason="reset", max_s=30)  # in flight when it broke: no change
    assert outage.until == 10.25
    assert not outage.fail(sent_at=10.3, now=10.3, reason="refused", max_s=30)  # the probe failed: 0.5 s
    assert (outage.until, outage.backoff_s) == (10.8, 0.5)
    for now in (11.0, 12.0, 13.0, 14.0):
        outage.fail(sent_at=now, now=now, reason="refused", max_s=30)
    assert (outage.backoff_s, outage.until, outage.probes_failed) == (2.0, 16.0, 5)
    outage.check(40.0)  # 30 s: not yet
    with pytest.raises(ModelUnreachable, match=r"unreachable for 30\.1 s .*max_outage_s = 30 s.*refused"):
        outage.check(40.1)
    assert not outage.succeed(sent_at=9.5)  # sent before it opened: says nothing about now
    assert outage.succeed(sent_at=41.0)
    assert (outage.active, outage.until) == (False, -math.inf)
    outage.check(1000.0)  # closed: nothing to raise


def test_the_wrapped_openai_client_opens_and_ends_an_outage() -> None:
    """openai's APIConnectionError (wrapping httpx's ConnectError) through the wrapped client is an outage; the
    SDK's own retry waits in the hold like any call, and the first answer from the server ends it."""
    import openai

    from model_concurrency.integrations.openai import wrap

    runtime = model()
    url = refused_url()
    client = wrap(openai.OpenAI(base_url=url, api_key="k", max_retries=0), model="m")
    with pytest.raises(openai.APIConnectionError):
        client.embeddings.create(model="x", input="a")
    assert runtime.limiter.hold.outage.active and runtime.limiter.limit == 1
    server = LateServer(url)
    server.start()  # listening before the call: the probe after the hold finds it, however slow the machine
    try:
        retrying = wrap(openai.OpenAI(base_url=url, api_key="k", max_retries=1), model="m")
        with pytest.raises(openai.APIStatusError):  # the test server answers 200 "ok" to GET only: 501 to POST
            retrying.embeddings.create(model="x", input="a")
    finally:
        server.close()
    assert not runtime.limiter.hold.outage.active
    assert runtime.limiter.limit == TARGET
