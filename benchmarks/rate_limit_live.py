"""The rate-limit rules live: a real emulator enforcing requests per minute, httpx through ``AsyncSlotTransport``.

The lab's ``rate-limited`` scenario is evidence only if production takes the same path, so this runs the shipped
one: the emulator (engine and front end in child processes) answers 429 with ``retry-after-ms`` beyond its bucket;
every attempt goes through ``slot(model)`` in the transport, whose 429 handling is ``ModelRuntime.note_throttled``
(the target drops to the calls in flight), the Retry-After hold, and at the next poll the guard's throttle cap
(the same :class:`~model_concurrency.controller.ControllerCore` the lab's clients run). Each item retries until
served, as an ingestion job would.

    python benchmarks/rate_limit_live.py --rpm 1200 --seconds 90 --policy adaptive
    python benchmarks/rate_limit_live.py --rpm 1200 --seconds 90 --policy gradient
    python benchmarks/rate_limit_live.py --rpm 300 --seconds 90 --floor 32   # a floor the limit cannot admit

Prints the served rate against the limit and the share of attempts throttled, whole run and after the first
minute of wall time (the bucket starts full, as the lab's). A demonstration, not a test: figures vary with the
machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

os.environ.setdefault("MODEL_CONCURRENCY_POLL_S", "2")

import httpx

from model_concurrency import get_utilization, register_model
from model_concurrency.emulator import EmulatorConfig, serve_in_processes
from model_concurrency.integrations.httpx import AsyncSlotTransport


async def run(base_url: str, served: str, seconds: float, workers: int) -> dict[str, list[float]]:
    """Many items, each retried until served; the gate (in the transport) decides how many are in flight."""
    log: dict[str, list[float]] = {"ok": [], "throttled": [], "targets": []}
    start = time.monotonic()
    limits = httpx.Limits(max_connections=1000)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=120, limits=limits, transport=AsyncSlotTransport(model="llm")
    ) as client:

        async def item() -> None:
            body = {"model": served, "prompt": "hello " * 64, "max_tokens": 64}
            while time.monotonic() - start < seconds:
                response = await client.post("/completions", json=body)
                now = time.monotonic() - start
                if response.status_code == 429:
                    log["throttled"].append(now)
                    continue
                response.raise_for_status()
                log["ok"].append(now)
                return

        async def feeder() -> None:
            pending: set[asyncio.Task[None]] = set()
            while time.monotonic() - start < seconds:
                while len(pending) < workers:
                    pending.add(asyncio.create_task(item()))
                _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*pending)

        async def watch() -> None:
            while time.monotonic() - start < seconds:
                log["targets"].append(float(get_utilization("llm")["current_target"]))
                await asyncio.sleep(1.0)

        await asyncio.gather(feeder(), watch())
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rpm", type=float, default=1200.0, help="the emulator's requests per (simulated) minute")
    parser.add_argument("--seconds", type=float, default=90.0, help="how long to run (wall seconds)")
    parser.add_argument("--policy", default="adaptive", help="the policy (gradient: no engine signal read)")
    parser.add_argument("--workers", type=int, default=256, help="items offered at once (the gate admits fewer)")
    parser.add_argument("--floor", type=int, default=1, help="the model's floor (max_parallel_calls)")
    args = parser.parse_args()
    config = EmulatorConfig(preset="llama-8b-h100", max_num_seqs=256, requests_per_minute=args.rpm)
    with serve_in_processes(config) as emu:
        register_model(
            "llm", base_url=emu.base_url, served_model_name=emu.model, max_parallel_calls=args.floor, policy=args.policy
        )
        log = asyncio.run(run(emu.base_url, emu.model, args.seconds, args.workers))
    ok, thr = log["ok"], log["throttled"]
    after = [t for t in ok if t >= 60.0]
    thr_after = [t for t in thr if t >= 60.0]
    # Items already waiting out a Retry-After hold at the end finish after it (up to the backoff's 30 s): the
    # window runs to the last one served, or "after 60 s" would divide their calls by too short a span.
    end = max([args.seconds, *ok, *thr])
    span = max(end - 60.0, 1e-9)
    limit = args.rpm / 60.0
    print(
        f"policy {args.policy}: {len(ok)} served, {len(thr)} throttled "
        f"({len(thr) / max(1, len(ok) + len(thr)):.3f} of attempts)"
    )
    print(
        f"after 60 s (to {end:.0f} s): {len(after) / span:.2f} served/s = {len(after) / span / limit:.3f} of the limit "
        f"({limit:g}/s); throttled {len(thr_after) / max(1, len(after) + len(thr_after)):.4f} of attempts"
    )
    print("target each second:", " ".join(str(int(t)) for t in log["targets"]))


if __name__ == "__main__":
    main()
