"""Soak: 200,000 items through ``map_concurrent`` against the vLLM emulator, with faults and moving capacity.

What runs:

* the emulator (``model_concurrency.emulator``, preset ``bge-m3``) in its own process on a free loopback port,
  its simulated clock running ``--time-scale`` times faster than the wall (so is everything time-based below),
  its engine slowed by ``--engine-speed`` so that the engine, not the Python HTTP stacks on two cores, is what
  saturates when ``max_num_seqs`` drops (at full speed the capacity moves would never bind);
* one adaptive model registered on it (``--policy``, default the configured one), ceiling
  ``MODEL_MAX_CONCURRENCY=512``, the poll interval scaled with the emulator (12 s of emulated time);
* ``map_concurrent`` over a lazy generator of ``--items`` items; each item POSTs ``/v1/embeddings`` through a
  minimal keep-alive HTTP/1.1 client (:class:`KeepAliveClient`; httpx's pool costs more CPU than everything else
  at 512 in flight); 1 % of the calls (a fixed, known set of items) fail in the client fn after their response;
* every 30 s of emulated time, ``/admin/capacity`` moves the engine's ``max_num_seqs`` through 512, 64, 256, 128
  (``target_by_step`` reports the target's range and the share of saturated polls in each step);
* a side task sleeps 10 ms in a loop and records how late it wakes: the event loop's lag.

What it checks and reports: every item accounted for (a result or its own injected exception, nothing else),
permits held at the end (the model limiter's in-flight and waiting, must be 0), peak in-flight, peak RSS of this
process (and of the emulator's), event-loop lag p50/p99/max, the target's range, and throughput. Exit status 1 if
an invariant fails.

    .venv/bin/python benchmarks/soak.py [--items 200000] [--time-scale 10] [--change-every 30] [--fail-every 100]
                                        [--engine-speed 0.02] [--max-inflight 512] [--policy NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import httpx

MODEL = "soak"
SCHEDULE = (512, 64, 256, 128)  # max_num_seqs, one step every --change-every emulated seconds


class InjectedFailure(RuntimeError):
    """The 1 % of calls the soak fails on purpose (raised in the client fn, after the response)."""


def injected(i: int, every: int) -> bool:
    return every > 0 and (i * 2654435761) % (2**32) % every == 0  # a fixed, evenly spread 1/every of the items


# -- the emulator, in its own process (the GIL stays with the client) -----------------------------------------------
def _emulator_main(conn: Connection, time_scale: float, max_num_seqs: int) -> None:
    from model_concurrency.emulator import EmulatorConfig, serve_in_thread

    config = EmulatorConfig(preset="bge-m3", max_num_seqs=max_num_seqs, time_scale=time_scale, simulate_frontend=False)
    with serve_in_thread(config) as emu:
        conn.send((emu.url, emu.model))
        conn.recv()  # block until the parent says stop
        usage = resource.getrusage(resource.RUSAGE_SELF)
    conn.send(usage.ru_maxrss)


@dataclass
class Emulator:
    process: Any
    conn: Connection
    url: str
    model: str

    @classmethod
    def start(cls, time_scale: float, max_num_seqs: int) -> Emulator:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_emulator_main, args=(child, time_scale, max_num_seqs), daemon=True)
        process.start()
        if not parent.poll(60):
            process.kill()
            raise RuntimeError("the emulator did not start within 60 s")
        url, model = parent.recv()
        return cls(process, parent, url, model)

    def stop(self) -> int | None:
        """Stop the emulator; its peak RSS in KiB."""
        self.conn.send("stop")
        rss = self.conn.recv() if self.conn.poll(30) else None
        self.process.join(30)
        return rss


# -- the client side -------------------------------------------------------------------------------------------------
class HttpStatusError(RuntimeError):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status_code = status  # what the gate's stats read


class KeepAliveClient:
    """A minimal HTTP/1.1 keep-alive POST client on asyncio streams.

    Why not httpx here: at 512 requests in flight its connection pool costs more CPU per request than the gate
    and the emulator together, and on two cores the soak would measure httpx. This client keeps a LIFO list of
    idle connections and speaks just enough HTTP/1.1 for the emulator (Content-Length bodies).
    """

    IDLE_S = 3.0  # uvicorn closes keep-alive connections idle for 5 s; never reuse one near that age

    def __init__(self, url: str) -> None:
        parts = httpx.URL(url)
        self.host, self.port = parts.host, parts.port or 80
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []

    async def _connection(self, fresh: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        now = time.monotonic()
        while self.idle and not fresh:
            reader, writer, since = self.idle.pop()
            if now - since < self.IDLE_S:
                return reader, writer, False
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return reader, writer, True

    async def post_json(self, path: str, payload: bytes) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        for attempt in range(2):
            reader, writer, fresh = await self._connection(fresh=attempt > 0)
            try:
                writer.write(head + payload)
                status_line = await reader.readline()
                if not status_line:
                    raise ConnectionResetError("closed by the server")
                status = int(status_line.split(b" ", 2)[1])
                length, close = 0, False
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection" and value.strip().lower() == b"close":
                        close = True
                body = await reader.readexactly(length)
            except (ConnectionError, asyncio.IncompleteReadError):
                writer.close()
                if fresh:
                    raise
                continue  # a reused connection the server had closed: retry once on a fresh one
            except BaseException:
                writer.close()  # cancelled or broken mid-exchange: the connection is unusable
                raise
            if close:
                writer.close()
            else:
                self.idle.append((reader, writer, time.monotonic()))
            return status, body
        raise AssertionError("unreachable")

    def close(self) -> None:
        for _, writer, _ in self.idle:
            writer.close()
        self.idle.clear()


@dataclass
class Tally:
    inflight: int = 0
    peak_inflight: int = 0
    calls: int = 0
    targets: list[tuple[float, int, bool]] = field(default_factory=list)  # (time, target, saturated)
    lags: list[float] = field(default_factory=list)
    changes: list[tuple[float, int]] = field(default_factory=list)


async def lag_probe(tally: Tally, stop: asyncio.Event, interval: float = 0.01) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        start = loop.time()
        await asyncio.sleep(interval)
        tally.lags.append(max(0.0, loop.time() - start - interval))


async def capacity_mover(url: str, every_s: float, tally: Tally, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        step = 0
        while True:
            try:
                await asyncio.wait_for(stop.wait(), every_s)
                return
            except TimeoutError:
                pass
            step += 1
            seqs = SCHEDULE[step % len(SCHEDULE)]
            response = await client.post(f"{url}/admin/capacity", json={"max_num_seqs": seqs})
            response.raise_for_status()
            tally.changes.append((time.monotonic(), seqs))


async def target_watch(tally: Tally, stop: asyncio.Event, every_s: float) -> None:
    from model_concurrency.hooks import controller_for

    while not stop.is_set():
        controller = controller_for(MODEL)
        if controller is not None:
            tally.targets.append((time.monotonic(), controller.peek(), controller.core.saturated))
        await asyncio.sleep(every_s)


async def soak(args: argparse.Namespace, emu: Emulator) -> dict[str, Any]:
    from model_concurrency import gate_stats, map_concurrent, register_model
    from model_concurrency.gate import registered_limiters

    register_model(
        MODEL, base_url=f"{emu.url}/v1", served_model_name=emu.model, max_parallel_calls=8, policy=args.policy
    )
    if args.engine_speed != 1.0:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as admin:
            (await admin.post(f"{emu.url}/admin/capacity", json={"speed": args.engine_speed})).raise_for_status()
    tally = Tally()
    stop = asyncio.Event()
    client = KeepAliveClient(emu.url)
    model_json = json.dumps(emu.model)
    try:

        async def call(i: int) -> int:
            tally.inflight += 1
            tally.calls += 1
            tally.peak_inflight = max(tally.peak_inflight, tally.inflight)
            try:
                payload = f'{{"model": {model_json}, "input": "soak item {i}"}}'.encode()
                status, body = await client.post_json("/v1/embeddings", payload)
                if status != 200:
                    raise HttpStatusError(status, body)
                if injected(i, args.fail_every):
                    raise InjectedFailure(f"item {i}: injected failure")
                return i
            finally:
                tally.inflight -= 1

        side = [
            asyncio.create_task(lag_probe(tally, stop)),
            asyncio.create_task(capacity_mover(emu.url, args.change_every / args.time_scale, tally, stop)),
            asyncio.create_task(target_watch(tally, stop, 0.25)),
        ]
        started = time.monotonic()
        progress = asyncio.create_task(report_progress(tally, args.items, started, stop))
        results = await map_concurrent((i for i in range(args.items)), call, model=MODEL, return_exceptions=True)
        elapsed = time.monotonic() - started
        stop.set()
        await asyncio.gather(*side, progress)
    finally:
        client.close()

    expected_failures = {i for i in range(args.items) if injected(i, args.fail_every)}
    ok = sum(1 for i, r in enumerate(results) if r == i)
    own_failures = sum(
        1 for i, r in enumerate(results) if isinstance(r, InjectedFailure) and str(r).startswith(f"item {i}:")
    )
    other = [(i, r) for i, r in enumerate(results) if r != i and not isinstance(r, InjectedFailure)]
    limiter = registered_limiters()[MODEL]
    lags = sorted(tally.lags)
    stats = gate_stats(MODEL)
    from model_concurrency.hooks import controller_for

    controller = controller_for(MODEL)
    return {
        "policy": type(controller.core.policy).__name__ if controller is not None else None,
        "items": args.items,
        "results": len(results),
        "ok": ok,
        "injected_failures": own_failures,
        "expected_injected": len(expected_failures),
        "other_errors": len(other),
        "other_error_examples": [f"{i}: {type(r).__name__}: {r}" for i, r in other[:5]],
        "accounted": ok + own_failures + len(other) == args.items == len(results),
        "calls_made": tally.calls,
        "permits_held": limiter.inflight(),
        "waiting": limiter.waiting,
        "peak_inflight": tally.peak_inflight,
        "capacity_changes": len(tally.changes),
        "target_by_step": target_by_step(tally, started),
        "gate_calls": stats.calls,
        "gate_errors": stats.errors,
        "elapsed_s": elapsed,
        "items_per_s": args.items / elapsed if elapsed else float("nan"),
        "lag_p50_ms": 1000 * statistics.median(lags) if lags else None,
        "lag_p99_ms": 1000 * lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else None,
        "lag_max_ms": 1000 * lags[-1] if lags else None,
        "client_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def target_by_step(tally: Tally, started: float) -> str:
    """``max_num_seqs: target min-max (saturated share)`` for each capacity step, in order."""
    bounds = [(started, SCHEDULE[0]), *tally.changes, (float("inf"), 0)]
    steps = []
    for (begin, seqs), (end, _) in itertools.pairwise(bounds):
        seen = [(t, sat) for when, t, sat in tally.targets if begin <= when < end]
        if seen:
            targets = [t for t, _ in seen]
            share = sum(1 for _, sat in seen if sat) / len(seen)
            steps.append(f"{seqs}: {min(targets)}-{max(targets)} ({share:.0%} sat)")
    return "; ".join(steps)


async def report_progress(tally: Tally, total: int, started: float, stop: asyncio.Event) -> None:
    while True:
        try:
            await asyncio.wait_for(stop.wait(), 10)
            return
        except TimeoutError:
            pass
        from model_concurrency.hooks import controller_for

        controller = controller_for(MODEL)
        target = controller.peek() if controller is not None else None
        rate = tally.calls / (time.monotonic() - started)
        print(
            f"  {tally.calls:>7}/{total} calls, {rate:6.0f}/s, in flight {tally.inflight:>3}, target {target}",
            file=sys.stderr,
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--time-scale", type=float, default=10.0, help="emulated seconds per wall second")
    parser.add_argument("--change-every", type=float, default=30.0, help="emulated seconds between capacity moves")
    parser.add_argument("--fail-every", type=int, default=100, help="1 call in N fails in the client fn")
    parser.add_argument(
        "--engine-speed",
        type=float,
        default=0.02,
        help="emulated engine speed factor: slow enough that the engine, not the Python HTTP stack, is the limit",
    )
    parser.add_argument("--policy", help="policy for the model (default: MODEL_CONCURRENCY_POLICY or the built-in)")
    parser.add_argument("--max-inflight", type=int, default=512, help="the ceiling (MODEL_MAX_CONCURRENCY)")
    args = parser.parse_args(argv)

    os.environ["MODEL_MAX_CONCURRENCY"] = str(args.max_inflight)
    os.environ["MODEL_CONCURRENCY_POLL_S"] = f"{12 / args.time_scale:g}"
    emu = Emulator.start(args.time_scale, SCHEDULE[0])
    print(f"emulator {emu.url} serving {emu.model!r}; {args.items} items", file=sys.stderr, flush=True)
    try:
        report = asyncio.run(soak(args, emu))
    finally:
        emulator_rss = emu.stop()
    report["emulator_peak_rss_mib"] = emulator_rss / 1024 if emulator_rss else None
    report["threads_left"] = threading.active_count() - 1
    width = max(len(k) for k in report)
    for key, value in report.items():
        shown = f"{value:.2f}" if isinstance(value, float) else value
        print(f"{key:<{width}}  {shown}")
    good = (
        report["accounted"]
        and report["other_errors"] == 0
        and report["injected_failures"] == report["expected_injected"]
        and report["permits_held"] == 0
        and report["waiting"] == 0
        and report["peak_inflight"] <= args.max_inflight
    )
    print("PASS" if good else "FAIL")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
