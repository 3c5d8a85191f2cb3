"""Send a few hundred chat completions with httpx through ``map_concurrent``, and watch the target leave the floor.

    python examples/chat_httpx.py                       # starts a local emulator of Llama-3.1-8B (the [emulator] extra)
    python examples/chat_httpx.py --url http://gpu-1:8000/v1 --served-name meta-llama/Llama-3.1-8B-Instruct

The model is registered with its static capacity as the floor; while the fan-out runs, the model's runtime polls
the engine's /metrics (requests running and waiting, KV-cache usage) and the target follows what the engine can
take. Each change is printed as it happens. Each request is OpenAI's smallest chat completion: one user message and
a small ``max_tokens``, so a run lasts seconds.
"""

from __future__ import annotations

import asyncio
import time

from _shared import parse_args, print_target_path, report, server, texts

from model_concurrency import map_concurrent, register_model
from model_concurrency.integrations.httpx import ShardedAsyncClient

MAX_TOKENS = 16


async def chat_all(base_url: str, served_name: str, prompts: list[str]) -> list[str]:
    # 1,000 connections: the gate bounds concurrency, not the connection pool
    async with ShardedAsyncClient(base_url=base_url, timeout=120, connections=1000) as client:

        async def chat_one(prompt: str) -> str:
            request = {
                "model": served_name,
                "messages": [{"role": "user", "content": f"Summarise in one line: {prompt}"}],
                "max_tokens": MAX_TOKENS,
            }
            response = await client.post("/chat/completions", json=request)
            response.raise_for_status()
            answer: str = response.json()["choices"][0]["message"]["content"]
            return answer

        # No retries=: a completion is billed and may have effects per attempt, so sending one twice is the
        # caller's decision (embed_httpx.py retries its idempotent embeddings).
        return await map_concurrent(prompts, chat_one, model="llama-8b")


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(
        __doc__.split("\n\n")[0],
        argv,
        served_name="meta-llama/Llama-3.1-8B-Instruct",
        items="how many chat completions to send",
    )
    with server(args, preset="llama-8b-h100") as srv:
        register_model(
            "llama-8b", base_url=srv.base_url, served_model_name=srv.served_name, max_parallel_calls=args.floor
        )
        started = time.monotonic()
        with print_target_path("llama-8b") as path:
            answers = asyncio.run(chat_all(srv.base_url, srv.served_name, texts(args.items)))
        return report(len(answers), time.monotonic() - started, path, args.floor, done="completed {count} chats")


if __name__ == "__main__":
    main()
