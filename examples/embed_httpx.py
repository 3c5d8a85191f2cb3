"""Embed a few thousand texts with httpx through ``map_concurrent``, and watch the target leave the floor.

    python examples/embed_httpx.py                      # starts a local emulator (needs the [emulator] extra)
    python examples/embed_httpx.py --url http://gpu-1:8000/v1 --served-name BAAI/bge-m3 --items 5000

The model is registered with its static capacity as the floor; while the fan-out runs, the model's runtime polls
the engine's /metrics and the target follows what the engine can take. Each change is printed as it happens.
The client is ``ShardedAsyncClient``, an ``httpx.AsyncClient`` whose cost per call does not grow with the number
of calls in flight (one httpx pool of N connections costs O(N) per call).
"""

from __future__ import annotations

import asyncio
import time

from _shared import parse_args, print_target_path, report, server, texts

from model_concurrency import map_concurrent, register_model
from model_concurrency.integrations.httpx import ShardedAsyncClient


async def embed_all(base_url: str, served_name: str, items: list[str]) -> list[list[float]]:
    # 1,000 connections: the gate bounds concurrency, not the connection pool
    async with ShardedAsyncClient(base_url=base_url, timeout=120, connections=1000) as client:

        async def embed_one(text: str) -> list[float]:
            response = await client.post("/embeddings", json={"model": served_name, "input": text})
            response.raise_for_status()
            vector: list[float] = response.json()["data"][0]["embedding"]
            return vector

        # An embedding is idempotent, so a call refused (429/503) or dropped (the server closing an idle keep-alive
        # connection as a request goes out on it: uvicorn's and vLLM's 5 s keep-alive race a reused connection) may
        # be sent again: retries= does it with backoff, honouring Retry-After, and counts each attempt.
        return await map_concurrent(items, embed_one, model="bge-m3", retries=2)


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(__doc__.split("\n\n")[0], argv)
    with server(args) as srv:
        register_model(
            "bge-m3", base_url=srv.base_url, served_model_name=srv.served_name, max_parallel_calls=args.floor
        )
        started = time.monotonic()
        with print_target_path("bge-m3") as path:
            vectors = asyncio.run(embed_all(srv.base_url, srv.served_name, texts(args.items)))
        return report(len(vectors), time.monotonic() - started, path, args.floor)


if __name__ == "__main__":
    main()
