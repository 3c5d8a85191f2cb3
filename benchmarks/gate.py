"""Gate overhead: map_concurrent against the plain ways of fanning out, measured in one run.

Async: N no-op ``async def`` items at concurrency C through
  * ``asyncio.Semaphore`` + ``asyncio.gather`` (a task per item, all created up front),
  * ``aiometer.amap`` (anyio task group, ``max_at_once``),
  * ``map_concurrent(..., capacity=C)``.
Sync: M no-op items through ``ThreadPoolExecutor(C).map`` and ``map_concurrent_sync(..., capacity=C)``.

Wall time is the best of ``--repeat`` runs; peak memory is tracemalloc's peak during one separate run (tracing
slows everything, so it is never mixed with timing). Ratios are ours / baseline.

    .venv/bin/python benchmarks/gate.py [--items 100000] [--concurrency 512] [--sync-items 20000] [--repeat 5]
        [--cases async,sync]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiometer

from model_concurrency import map_concurrent, map_concurrent_sync


async def noop(x: int) -> int:
    return x


async def yielding(x: int) -> int:
    await asyncio.sleep(0)  # one trip through the event loop, as any real call makes
    return x


FN = noop


def noop_sync(x: int) -> int:
    return x


async def via_gather(n: int, c: int) -> list[int]:
    sem = asyncio.Semaphore(c)

    async def one(x: int) -> int:
        async with sem:
            return await FN(x)

    return await asyncio.gather(*(one(x) for x in range(n)))


async def via_aiometer(n: int, c: int) -> list[int]:
    out: list[int] = [0] * n
    async with aiometer.amap(FN, range(n), max_at_once=c) as results:
        async for r in results:
            out[r] = r
    return out


async def via_gate(n: int, c: int) -> list[int]:
    return await map_concurrent(range(n), FN, capacity=c)


def via_executor(n: int, c: int) -> list[int]:
    with ThreadPoolExecutor(c) as pool:
        return list(pool.map(noop_sync, range(n)))


def via_gate_sync(n: int, c: int) -> list[int]:
    return map_concurrent_sync(range(n), noop_sync, capacity=c)


def _time(run: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _peak(run: Callable[[], Any]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _async(fn: Callable[[int, int], Awaitable[list[int]]], n: int, c: int) -> Callable[[], Any]:
    def run() -> None:
        result = asyncio.run(fn(n, c))  # type: ignore[arg-type]
        assert len(result) == n and result[-1] == n - 1

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--sync-items", type=int, default=20_000)
    parser.add_argument("--sync-concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cases", default="async,sync", help="which halves to run (comma-separated)")
    args = parser.parse_args()
    n, c = args.items, args.concurrency
    cases = set(args.cases.split(","))

    global FN
    for item_fn, label in ((noop, "no-op"), (yielding, "sleep(0)")) if "async" in cases else ():
        FN = item_fn
        print(f"async: {n:,} {label} items at concurrency {c}, best of {args.repeat}")
        rows: dict[str, tuple[float, int]] = {}
        for name, fn in (
            ("gather+Semaphore", via_gather),
            ("aiometer.amap", via_aiometer),
            ("map_concurrent", via_gate),
        ):
            run = _async(fn, n, c)
            rows[name] = (_time(run, args.repeat), _peak(run))
            print(f"  {name:<18} wall {rows[name][0]:7.3f} s   peak {rows[name][1] / 2**20:8.2f} MiB")
        gate_wall, gate_peak = rows["map_concurrent"]
        fastest = min(("gather+Semaphore", "aiometer.amap"), key=lambda k: rows[k][0])
        print(f"  wall ratio vs faster baseline ({fastest}): {gate_wall / rows[fastest][0]:.2f} (target <= 1.20)")
        print(f"  wall ratio vs aiometer: {gate_wall / rows['aiometer.amap'][0]:.2f}")
        print(f"  peak memory ratio vs gather: {gate_peak / rows['gather+Semaphore'][1]:.3f} (target <= 0.25)")

    if "sync" not in cases:
        return
    sn, sc = args.sync_items, args.sync_concurrency
    print(f"sync: {sn:,} no-op items at concurrency {sc}, best of {args.repeat}, interleaved")
    runs: dict[str, Callable[[], None]] = {}
    for name, sync_fn in (("ThreadPoolExecutor", via_executor), ("map_concurrent_sync", via_gate_sync)):

        def run(f: Callable[[int, int], list[int]] = sync_fn) -> None:
            result = f(sn, sc)
            assert len(result) == sn and result[-1] == sn - 1

        runs[name] = run
    # Interleaved (one of each per round) so a load change on the shared machine hits both alike.
    walls = dict.fromkeys(runs, float("inf"))
    for _ in range(args.repeat):
        for name, run in runs.items():
            walls[name] = min(walls[name], _time(run, 1))
    sync_rows = {name: (walls[name], _peak(run)) for name, run in runs.items()}
    for name, (wall, peak) in sync_rows.items():
        print(f"  {name:<20} wall {wall:7.3f} s   peak {peak / 2**20:8.2f} MiB")
    ratio = sync_rows["map_concurrent_sync"][0] / sync_rows["ThreadPoolExecutor"][0]
    mem = sync_rows["map_concurrent_sync"][1] / sync_rows["ThreadPoolExecutor"][1]
    print(f"  wall ratio vs ThreadPoolExecutor.map: {ratio:.2f} (target <= 1.20); peak memory ratio {mem:.3f}")


if __name__ == "__main__":
    main()
