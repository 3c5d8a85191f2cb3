"""Does the served emulator's engine keep stepping under HTTP load?

N closed-loop clients (each sends one embedding call, waits, sends the next) against the emulator, while a
sampler reads ``/metrics`` every 100 ms. Per run: completed calls per second, and the share of samples in which
the engine is *full* (``num_requests_running`` = ``max_num_seqs``) or *nearly idle* (running below half of
``max_num_seqs`` with nothing waiting). Served two ways, in the same run:

* ``thread``: the engine core in uvicorn's own event loop (``serve_in_thread``, one process);
* ``processes``: the engine core in its own process, fed by ``--frontends`` uvicorn processes
  (``serve_in_processes``, what ``model-concurrency emulate`` runs).

Printed ratios (throughput at N clients ÷ throughput at the lowest N) are measured within this run, so they hold
on a loaded machine where absolute req/s do not. Goal: with 128 clients the engine is full in ≥ 80 % of samples
and throughput ≥ 0.9× the 64-client throughput. Run it with ``nice`` on a shared machine::

    nice .venv/bin/python benchmarks/emulator_load.py --clients 64,128,256 --seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_processes, serve_in_thread


def gauges(text: str) -> tuple[float, float]:
    """(running, waiting) summed over engines, from the /metrics page."""
    running = waiting = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_running":
                running += sample.value
            elif sample.name == "vllm:num_requests_waiting":
                waiting += sample.value
    return running, waiting


async def load(
    emu: RunningEmulator, clients: int, seconds: float, warmup: float, max_num_seqs: int, *, shared_pool: bool = False
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    done = 0
    errors = 0
    measuring = False
    stop = False
    samples: list[tuple[float, float]] = []
    # One SSL context for every client: httpx builds one per client otherwise (loading the CA bundle: 0.02-0.1 s of
    # CPU each here), and 512 clients building theirs on the event loop completed nothing in their first 10 s.
    context = httpx.create_ssl_context()
    async with httpx.AsyncClient(base_url=emu.url, limits=limits, timeout=120, verify=context) as http:

        async def client(i: int) -> None:
            # One connection per client, as N independent callers: a shared pool of N connections costs httpx
            # O(N) per call and would make the client, not the emulator, the bottleneck.
            nonlocal done, errors
            body = {"model": emu.model, "input": f"item {i:05d} " + "x" * 21}  # 32 chars: 8 tokens
            async with contextlib.AsyncExitStack() as stack:
                own = (
                    http
                    if shared_pool
                    else await stack.enter_async_context(
                        httpx.AsyncClient(base_url=emu.url, timeout=120, verify=context)
                    )
                )
                while not stop:
                    response = await own.post("/v1/embeddings", json=body)
                    if measuring:
                        if response.status_code == 200:
                            done += 1
                        else:
                            errors += 1

        async def sampler() -> None:
            while not stop:
                started = time.monotonic()
                response = await http.get("/metrics")
                if measuring:
                    samples.append(gauges(response.text))
                await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - started)))

        tasks = [asyncio.create_task(client(i)) for i in range(clients)]
        tasks.append(asyncio.create_task(sampler()))
        await asyncio.sleep(warmup)
        measuring = True
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        measuring = False
        elapsed = time.monotonic() - t0
        stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
    full = sum(1 for r, _ in samples if r >= max_num_seqs) / max(1, len(samples))
    idle = sum(1 for r, w in samples if r < max_num_seqs / 2 and w == 0) / max(1, len(samples))
    return {
        "rps": done / elapsed,
        "errors": errors,
        "full": full,
        "idle": idle,
        "samples": len(samples),
        "running_median": statistics.median(r for r, _ in samples) if samples else 0.0,
        "waiting_median": statistics.median(w for _, w in samples) if samples else 0.0,
    }


@contextlib.contextmanager
def served(mode: str, config: EmulatorConfig) -> Iterator[RunningEmulator]:
    starter = serve_in_thread if mode == "thread" else serve_in_processes
    with starter(config) as emu:
        yield emu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="64,128,256")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--modes", default="thread,processes")
    parser.add_argument("--frontends", type=int, default=1)
    parser.add_argument("--preset", default="bge-m3")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=0.025)
    parser.add_argument(
        "--shared-pool",
        action="store_true",
        help="all clients share one httpx pool (costs the client O(N) per call: the client becomes the bottleneck)",
    )
    args = parser.parse_args()
    config = EmulatorConfig(
        preset=args.preset,
        max_num_seqs=args.max_num_seqs,
        time_scale=args.time_scale,
        simulate_frontend=False,
        frontends=args.frontends,
    )
    counts = [int(c) for c in args.clients.split(",")]
    print(
        f"preset {args.preset}, max_num_seqs {args.max_num_seqs}, time scale {args.time_scale}, no front-end cost, "
        f"{args.seconds:g} s per run after {args.warmup:g} s warm-up, /metrics every 100 ms, "
        f"{'one shared httpx pool' if args.shared_pool else 'one connection per client'}"
    )
    print(
        "| served as | clients | req/s | ÷ first | engine full | nearly idle | median running / waiting "
        "| CPU s this process / server children | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode in args.modes.split(","):
        label = mode if mode == "thread" else f"processes ({args.frontends} front-end{'s' * (args.frontends > 1)})"
        base = None
        for n in counts:
            before = os.times()
            with served(mode, config) as emu:
                result = asyncio.run(
                    load(emu, n, args.seconds, args.warmup, args.max_num_seqs, shared_pool=args.shared_pool)
                )
            after = os.times()
            own = after.user + after.system - before.user - before.system
            children = after.children_user + after.children_system - before.children_user - before.children_system
            base = base or result["rps"]
            print(
                f"| {label} | {n} | {result['rps']:.0f} | {result['rps'] / base:.2f} | {result['full']:.0%} | "
                f"{result['idle']:.0%} | {result['running_median']:.0f} / {result['waiting_median']:.0f} | "
                f"{own:.1f} / {children:.1f} | {result['errors']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
