"""Embed a few thousand texts with the official OpenAI client, each request gated by ``slot(model)``.

    python examples/embed_openai.py                     # starts a local emulator (needs the [emulator] extra)
    python examples/embed_openai.py --url http://gpu-1:8000/v1 --served-name BAAI/bge-m3 --items 5000
    python examples/embed_openai.py --map                # unwrapped client on the sharded pool, map_concurrent

The client is wrapped once (``model_concurrency.integrations.openai.wrap``); after that the application keeps its
own loop, here a plain ``asyncio.gather`` of every text at once, and the wrapped client holds each request until
the model's limiter has room. Latency, errors and 429s are recorded for the policy; a 429's Retry-After holds the
model. Each change of the target is printed as it happens. The wrapped client sends through
``ShardedAsyncTransport`` (small pools, so the cost per call stays flat at hundreds in flight).

With ``--map`` the application lets ``map_concurrent`` run the fan-out instead: the client is not wrapped (each
item already holds a slot) and gets the sharded pool as ``http_client=ShardedAsyncClient(...)``.
"""

from __future__ import annotations

import asyncio
import time

import openai
from _shared import parse_args, print_target_path, report, server, texts

from model_concurrency import map_concurrent, register_model
from model_concurrency.integrations.httpx import ShardedAsyncClient
from model_concurrency.integrations.openai import wrap


async def embed_all(base_url: str, served_name: str, items: list[str]) -> list[list[float]]:
    client = wrap(openai.AsyncOpenAI(base_url=base_url, api_key="not-needed-for-the-emulator"), model="bge-m3")
    try:
        results = await asyncio.gather(
            *(client.embeddings.create(model=served_name, input=text, encoding_format="float") for text in items)
        )
    finally:
        await client.close()
    return [result.data[0].embedding for result in results]


async def embed_all_mapped(base_url: str, served_name: str, items: list[str]) -> list[list[float]]:
    http_client = ShardedAsyncClient(timeout=120, connections=1000)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="not-needed-for-the-emulator", http_client=http_client)

    async def embed_one(text: str) -> list[float]:
        result = await client.embeddings.create(model=served_name, input=text, encoding_format="float")
        return result.data[0].embedding

    try:
        return await map_concurrent(items, embed_one, model="bge-m3")
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(__doc__.split("\n\n")[0], argv, with_map=True)
    with server(args) as srv:
        register_model(
            "bge-m3", base_url=srv.base_url, served_model_name=srv.served_name, max_parallel_calls=args.floor
        )
        started = time.monotonic()
        with print_target_path("bge-m3") as path:
            run = embed_all_mapped if args.map else embed_all
            vectors = asyncio.run(run(srv.base_url, srv.served_name, texts(args.items)))
        return report(len(vectors), time.monotonic() - started, path, args.floor)


if __name__ == "__main__":
    main()
