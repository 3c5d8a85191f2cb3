"""Does the fan-out's HTTP client keep up with the server at hundreds of calls in flight?

Closed-loop workers (each sends one embedding call, waits, sends the next) against one emulator (engine process +
``--frontends`` uvicorn processes, as ``model-concurrency emulate`` runs it), at each in-flight count, three ways,
in one run:

* ``shared``: one plain ``httpx.AsyncClient`` (``max_connections`` = in flight) shared by every worker, the usual
  set-up;
* ``ours``: one :class:`~model_concurrency.integrations.httpx.ShardedAsyncClient` shared by every worker;
* ``ceiling``: what the server serves at that concurrency when the load generator is not the limit: a connection
  per worker, precomputed request bytes written to the socket, the response's status line and length read back,
  no HTTP library. Its CPU per call is a fraction of any HTTP client's, so on a machine where client and server
  share the cores it leaves the server the most CPU a load generator can. (Several processes of httpx clients
  do not serve as a ceiling: on 2 shared cores they take CPU from the server and measure less than one sharded
  client.)

Calls/s are completed 200s in the window after a warm-up, best of ``--rounds`` interleaved rounds; ratios are
against the ceiling measured in the same run, so they hold on a loaded machine where absolute calls/s do not.
Goal: ours >= 0.9x the ceiling at 512.

    nice .venv/bin/python benchmarks/client.py [--inflight 64,128,256,512] [--seconds 6] [--warmup 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable

import httpx

from model_concurrency.emulator import EmulatorConfig, serve_in_processes
from model_concurrency.integrations.httpx import ShardedAsyncClient

Post = Callable[[int], Awaitable[int]]
HEADER = (
    "| in flight | ceiling calls/s | shared pool calls/s (× ceiling) | ours calls/s (× ceiling) "
    "| client CPU ms per call: ceiling / shared / ours |"
)


async def closed_loop(workers: int, post_for: Callable[[int], Post], start_at: float, end_at: float) -> tuple[int, int]:
    """``workers`` loops calling ``post_for(i)(i)`` until ``end_at`` (wall clock); 200s and others in the window."""
    done = errors = 0

    async def worker(i: int) -> None:
        nonlocal done, errors
        post = post_for(i)
        while time.time() < end_at:
            try:
                status = await post(i)
            except httpx.HTTPError:
                status = 0
            if start_at <= time.time() <= end_at:
                if status == 200:
                    done += 1
                else:
                    errors += 1

    tasks = [asyncio.create_task(worker(i)) for i in range(workers)]
    await asyncio.sleep(max(0.0, end_at - time.time()))
    for task in tasks:  # calls still out at the window's end are dropped, not waited for (a slow pool drains
        task.cancel()  # its queue for tens of seconds)
    await asyncio.gather(*tasks, return_exceptions=True)
    return done, errors


def _body(model: str, i: int) -> dict[str, str]:
    return {"model": model, "input": f"item {i:05d} " + "x" * 21}  # 32 characters: 8 tokens


async def run_shared(url: str, model: str, workers: int, start_at: float, end_at: float) -> tuple[int, int]:
    limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def post(i: int) -> int:
            return (await client.post("/v1/embeddings", json=_body(model, i))).status_code

        return await closed_loop(workers, lambda i: post, start_at, end_at)


async def run_ours(url: str, model: str, workers: int, start_at: float, end_at: float) -> tuple[int, int]:
    async with ShardedAsyncClient(base_url=url, timeout=120, connections=workers) as client:

        async def post(i: int) -> int:
            return (await client.post("/v1/embeddings", json=_body(model, i))).status_code

        return await closed_loop(workers, lambda i: post, start_at, end_at)


async def run_raw(url: str, model: str, workers: int, start_at: float, end_at: float) -> tuple[int, int]:
    """The ceiling's load generator: a connection per worker, precomputed request bytes, no HTTP library.

    It reads the status line and ``content-length`` and skips the body, so its CPU per call is a small fraction
    of any HTTP client's and what it measures is the server's capacity at ``workers`` in flight."""
    parsed = httpx.URL(url)
    host, port = parsed.host, parsed.port or 80

    def request(i: int) -> bytes:
        body = json.dumps(_body(model, i)).encode()
        head = (
            f"POST /v1/embeddings HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    connections = [await asyncio.open_connection(host, port) for _ in range(workers)]
    try:

        def post_for(i: int) -> Post:
            reader, writer = connections[i]
            data = request(i)

            async def post(i: int) -> int:
                writer.write(data)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                return int(head[9:12])

            return post

        return await closed_loop(workers, post_for, start_at, end_at)
    finally:
        for _, writer in connections:
            writer.close()


def measure(way: str, url: str, model: str, workers: int, warmup: float, seconds: float) -> tuple[float, int, float]:
    """(calls/s, errors, CPU s of this process) for one way at one in-flight count."""
    before = os.times()
    start_at = time.time() + warmup
    runner = {"ceiling": run_raw, "shared": run_shared, "ours": run_ours}[way]
    done, errors = asyncio.run(runner(url, model, workers, start_at, start_at + seconds))
    after = os.times()
    return done / seconds, errors, after.user + after.system - before.user - before.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inflight", default="64,128,256,512")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; each way's best counts")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--frontends", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=0.05)
    args = parser.parse_args()
    config = EmulatorConfig(
        preset="bge-m3",
        max_num_seqs=args.max_num_seqs,
        time_scale=args.time_scale,
        simulate_frontend=False,
        frontends=args.frontends,
    )
    print(
        f"emulator: bge-m3, max_num_seqs {args.max_num_seqs}, time scale {args.time_scale}, no front-end cost, "
        f"{args.frontends} front-end process(es); {args.seconds:g} s per run after {args.warmup:g} s warm-up; "
        "ceiling = raw-socket generator"
    )
    print(HEADER)
    print("|---:|---:|---:|---:|---:|")
    last: dict[str, float] = {}
    # Calls still out at a window's end are cancelled: the emulator aborts them and would log each as an error.
    with serve_in_processes(config, log_level="critical") as emu:
        for workers in (int(n) for n in args.inflight.split(",")):
            rows: dict[str, tuple[float, int, float]] = {}
            for _ in range(args.rounds):  # interleaved rounds, best of each: a load swing hits every way alike
                for way in ("ceiling", "shared", "ours"):
                    row = measure(way, emu.url, emu.model, workers, args.warmup, args.seconds)
                    rows[way] = max(rows.get(way, row), row)
            ceiling = rows["ceiling"][0] or float("nan")

            def per_call(way: str, rows: dict[str, tuple[float, int, float]] = rows) -> str:
                # CPU over the whole run (warm-up included) per call at the window's rate: a figure that holds
                # when the machine's load decides how much CPU each process gets.
                rate, _, cpu = rows[way]
                return f"{1000 * cpu / (rate * (args.seconds + args.warmup)):.2f}" if rate else "–"

            errors = sum(r[1] for r in rows.values())
            print(
                f"| {workers} | {ceiling:.0f} | {rows['shared'][0]:.0f} ({rows['shared'][0] / ceiling:.2f}×) | "
                f"{rows['ours'][0]:.0f} ({rows['ours'][0] / ceiling:.2f}×) | "
                f"{per_call('ceiling')} / {per_call('shared')} / {per_call('ours')} |"
                + (f" errors {errors}" if errors else ""),
                flush=True,
            )
            last = {way: rows[way][0] / ceiling for way in ("shared", "ours")}
    ours, shared = last["ours"], last["shared"]
    print(f"client: at {workers} in flight ours {ours:.2f}× the server's ceiling, shared pool {shared:.2f}×")


if __name__ == "__main__":
    main()
