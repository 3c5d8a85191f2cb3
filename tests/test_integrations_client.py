"""ShardedAsyncClient against the emulator over loopback HTTP: results, errors, streams, closing, no leaks."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from model_concurrency import map_concurrent_sync, register_model
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.integrations.httpx import (
    ShardedAsyncClient,
    ShardedAsyncTransport,
    ShardedClient,
    ShardedTransport,
)
from model_concurrency.integrations.openai import wrap


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", time_scale=1.0)) as running:
        yield running


def open_connections(transport: ShardedAsyncTransport) -> int:
    return sum(len(shard._pool.connections) for shard in transport.shards)


def test_results_match_a_plain_client_and_connections_stay_within_the_limit(emu: RunningEmulator) -> None:
    texts = [f"text {i}" for i in range(60)]

    async def main() -> tuple[list[list[float]], list[list[float]], int, int]:
        async with httpx.AsyncClient(base_url=emu.base_url) as plain:
            expected = [
                (await plain.post("/embeddings", json={"model": emu.model, "input": t})).json() for t in texts[:3]
            ]
        async with ShardedAsyncClient(base_url=emu.base_url, timeout=30, connections=8, per_shard=2) as client:
            assert len(client.sharded.shards) == 4 and client.sharded.connections == 8

            async def one(text: str) -> list[float]:
                response = await client.post("/embeddings", json={"model": emu.model, "input": text})
                response.raise_for_status()
                vector: list[float] = response.json()["data"][0]["embedding"]
                return vector

            got = await asyncio.gather(*(one(t) for t in texts))  # 60 at once over 8 connections: 52 queue
            peak_open = open_connections(client.sharded)
            in_use = sum(client.sharded.in_use)
            assert (await client.get("/models")).json()["data"][0]["id"] == emu.model  # base_url + get
        assert open_connections(client.sharded) == 0  # closing the client closed every pool's connections
        return [e["data"][0]["embedding"] for e in expected], list(got), peak_open, in_use

    expected, got, peak_open, in_use = asyncio.run(main())
    assert got[:3] == expected  # the emulator's vectors are deterministic per input
    assert len(got) == 60 and all(len(v) == len(got[0]) for v in got)
    assert 1 <= peak_open <= 8
    assert in_use == 0


def test_a_streamed_response_holds_its_place_until_read_or_closed(emu: RunningEmulator) -> None:
    async def main() -> list[int]:
        seen = []
        async with ShardedAsyncClient(base_url=emu.url, connections=4, per_shard=1) as client:
            async with client.stream("GET", "/metrics") as first:
                async with client.stream("GET", "/metrics") as second:
                    seen.append(sum(client.sharded.in_use))
                    assert second.status_code == 200
                seen.append(sum(client.sharded.in_use))  # closed unread: its place is back
                async for _ in first.aiter_bytes():
                    pass
                seen.append(sum(client.sharded.in_use))  # read to the end: httpx closed it
            response = await client.get("/metrics")
            seen.append(sum(client.sharded.in_use))
            assert response.status_code == 200
            assert sorted(client.sharded.placement.free) == [0, 1, 2, 3]  # every pool has room again
        return seen

    assert asyncio.run(main()) == [2, 1, 0, 0]


def test_errors_reach_the_caller_and_give_the_place_back(emu: RunningEmulator) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]

    async def main() -> None:
        async with ShardedAsyncClient(connections=4, per_shard=2, timeout=5, headers={"x-test": "1"}) as client:
            assert client.headers["x-test"] == "1"
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{dead}/")
            assert sum(client.sharded.in_use) == 0
            response = await client.get(f"{emu.url}/no-such-route")
            assert response.status_code == 404 and sum(client.sharded.in_use) == 0
            bad = await client.post(f"{emu.base_url}/embeddings", json={"model": "unknown", "input": "x"})
            assert bad.status_code >= 400 and sum(client.sharded.in_use) == 0

    asyncio.run(main())


def test_the_openai_client_takes_it_and_wrap_uses_it_by_default(emu: RunningEmulator) -> None:
    async def main() -> tuple[int, object]:
        client = openai.AsyncOpenAI(base_url=emu.base_url, api_key="k", http_client=ShardedAsyncClient(timeout=30))
        results = await asyncio.gather(*(client.embeddings.create(model=emu.model, input=f"t{i}") for i in range(20)))
        await client.close()
        wrapped = wrap(openai.AsyncOpenAI(base_url=emu.base_url, api_key="k"))
        inner = wrapped._client._transport.inner  # type: ignore[attr-defined]
        await wrapped.close()
        return len(results), inner

    count, inner = asyncio.run(main())
    assert count == 20
    assert isinstance(inner, ShardedAsyncTransport) and inner.connections >= 1000


def test_the_blocking_client_from_pool_threads(emu: RunningEmulator) -> None:
    register_model("sharded-sync", base_url=None, max_parallel_calls=12)
    with ShardedClient(base_url=emu.base_url, timeout=30, connections=8) as client:

        def one(i: int) -> int:
            response = client.post("/embeddings", json={"model": emu.model, "input": f"t{i}"})
            return len(response.json()["data"][0]["embedding"])

        sizes = map_concurrent_sync(range(60), one, model="sharded-sync")  # 12 threads over 8 connections
        assert len(set(sizes)) == 1 and len(sizes) == 60
        assert sum(client.sharded.in_use) == 0 and sorted(client.sharded.placement.free) == list(range(8))
        assert 1 <= sum(len(shard._pool.connections) for shard in client.sharded.shards) <= 8
    assert sum(len(shard._pool.connections) for shard in client.sharded.shards) == 0
    wrapped = wrap(openai.OpenAI(base_url=emu.base_url, api_key="k"))
    inner = wrapped._client._transport.inner  # type: ignore[attr-defined]
    assert isinstance(inner, ShardedTransport) and inner.connections >= 1000
    assert len(wrapped.embeddings.create(model=emu.model, input="x").data) == 1
    wrapped.close()


def test_arguments() -> None:
    with pytest.raises(ValueError, match="connections"):
        ShardedAsyncTransport(connections=0)
    with pytest.raises(ValueError, match="per_shard"):
        ShardedAsyncTransport(per_shard=0)
    with pytest.raises(TypeError, match="transport"):
        ShardedAsyncClient(transport=httpx.AsyncHTTPTransport())
    client = ShardedAsyncClient(limits=httpx.Limits(max_connections=40), per_shard=16)  # a drop-in for httpx's
    assert client.sharded.connections == 48 and len(client.sharded.shards) == 3
    assert ShardedAsyncTransport(connections=3, per_shard=16).connections == 3  # never more pools than needed
    asyncio.run(client.aclose())
    with pytest.raises(TypeError, match="transport"):
        ShardedClient(transport=httpx.HTTPTransport())


async def _serve(handler: object, ssl_context: ssl.SSLContext | None = None) -> asyncio.AbstractServer:
    return await asyncio.start_server(handler, "127.0.0.1", 0, ssl=ssl_context)  # type: ignore[arg-type]


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A keep-alive HTTP/1.1 server that answers every request with its own path."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            break
        path = head.split(b" ", 2)[1]
        body = b"x" * (3 << 20) if path == b"/big" else path  # 3 MiB: past the backend's read high-water mark
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
    writer.close()


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(1)
    await asyncio.sleep(30)


def test_asyncio_network_over_tls_and_its_timeouts(tmp_path: Path) -> None:
    """The asyncio network backend: TLS through start_tls, a read timeout as httpx's, cancellation as itself."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(cert))

    async def main() -> None:
        tls = await _serve(_answer, server_context)
        silent = await _serve(_silent)
        tls_port = tls.sockets[0].getsockname()[1]
        silent_port = silent.sockets[0].getsockname()[1]
        # Generous timeouts but the one under test (the silent server's read): ten TLS handshakes through four
        # connections wait for a connection longer than 0.2 s on a loaded machine (httpx.PoolTimeout).
        async with ShardedAsyncClient(verify=client_context, connections=4, per_shard=2, timeout=30) as client:
            got = await asyncio.gather(*(client.get(f"https://127.0.0.1:{tls_port}/p{i}") for i in range(10)))
            assert [r.text for r in got] == [f"/p{i}" for i in range(10)]
            async with client.stream("GET", f"https://127.0.0.1:{tls_port}/big", timeout=30) as big:
                size = 0
                async for chunk in big.aiter_raw():
                    size += len(chunk)
                    await asyncio.sleep(0)  # a consumer slower than loopback
            assert size == 3 << 20
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"http://127.0.0.1:{silent_port}/", timeout=httpx.Timeout(30, read=0.2))
            call = asyncio.ensure_future(client.get(f"http://127.0.0.1:{silent_port}/", timeout=30))
            await asyncio.sleep(0.05)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert sum(client.sharded.in_use) == 0
        for server in (tls, silent):
            server.close()

    asyncio.run(main())
