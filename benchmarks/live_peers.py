"""Peers on one live workload: the same emulator, the same embedding items, several ways to size the fan-out.

Each run gets a fresh emulator in its own process (``bge-m3``, ``max_num_seqs`` 64, no simulated API-server cost,
on a slowed clock so the engine rather than loopback HTTP limits throughput). When half the items are done the
benchmark raises ``max_num_seqs`` to 256 through ``/admin/capacity``. A side task scrapes ``/metrics`` every
100 ms; "saturated" is the fraction of those samples with capacity-waiting requests.

Runs: this package's default policy (``map_concurrent`` + the adaptive controller, poll interval scaled with the
clock), static concurrency at the floor (4) and a sweep (the best is reported), ``aiometer.amap`` at the floor,
``adaptive-concurrency`` (``arun_adaptive``, as its README sets it up: start at 4 workers, ``max_workers`` as the
ceiling, batch size 1) and ``aimd-limiter`` (``AIMDAsyncLimiter``; a rate limiter, so ``max_rate`` must be
chosen: 500 req/s, above anything the emulator can serve; it only backs off on failures, which never happen here).

With ``--repeat N`` every configuration runs N times (each on a fresh emulator, interleaved: ours, then each
static, then the peers, N rounds) and each row is the median of its runs (makespan, p99 and saturated each their
own median); the runs themselves go to stderr. The best static is chosen on the median makespan. The last line
gives the live goals' ratios: ours ÷ the best static's makespan and p99, and our saturated fraction against
``max(¼ × the static's, 2 %)``.

    .venv/bin/python benchmarks/live_peers.py            # 5,000 items, a few minutes
    .venv/bin/python benchmarks/live_peers.py --items 1000 --statics 64,256
    .venv/bin/python benchmarks/live_peers.py --items 1500 --statics 64,128,256 --repeat 3 --no-peers
    .venv/bin/python benchmarks/live_peers.py --items 5000 --statics 64,128,256 --repeat 3 --no-peers --no-floor
    .venv/bin/python benchmarks/live_peers.py --items 1500 --statics 128 --no-peers --no-floor -v  # our polls
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import httpx

from model_concurrency.integrations.httpx import ShardedAsyncClient
from model_concurrency.signals.vllm import parse_vllm_metrics

FLOOR, OLD, NEW, CEILING = 4, 64, 256, 512


def _emulator_main(conn: Connection, time_scale: float) -> None:
    from model_concurrency.emulator import EmulatorConfig, serve_in_thread

    config = EmulatorConfig(preset="bge-m3", max_num_seqs=OLD, time_scale=time_scale, simulate_frontend=False)
    with serve_in_thread(config) as emu:
        conn.send((emu.url, emu.model))
        conn.recv()  # until told to stop


@dataclass
class Emulator:
    url: str
    model: str
    process: Any
    conn: Connection

    @classmethod
    def start(cls, time_scale: float) -> Emulator:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_emulator_main, args=(child, time_scale), daemon=True)
        process.start()
        url, model = parent.recv()
        return cls(url, model, process, parent)

    def stop(self) -> None:
        self.conn.send("stop")
        self.process.join(10)
        if self.process.is_alive():
            self.process.terminate()


@dataclass
class Result:
    name: str
    makespan_s: float
    ok: int
    p99_s: float
    saturated: float
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        return self.ok / self.makespan_s


Embed = Callable[[int], Awaitable[Any]]
Runner = Callable[[Embed, list[int]], Awaitable[Any]]


async def measure(name: str, runner: Runner, args: argparse.Namespace, setup: Callable[[Emulator], None]) -> Result:
    emu = Emulator.start(args.time_scale)
    try:
        setup(emu)
        texts = [(f"item {i} " + "lorem ipsum dolor sit amet " * 8)[: args.input_chars] for i in range(args.items)]
        latencies: list[float] = []
        done = retried = 0
        raised = asyncio.Event()
        background: set[asyncio.Future[None]] = set()
        samples: list[bool] = []
        spells: list[tuple[float, float, float]] = []  # (from, to, most waiting): -v shows where saturation falls
        raised_at: list[float] = []
        async with ShardedAsyncClient(timeout=120) as client, httpx.AsyncClient(timeout=10) as side:

            async def raise_capacity() -> None:
                raised_at.append(time.perf_counter() - start)
                (await side.post(f"{emu.url}/admin/capacity", json={"max_num_seqs": NEW})).raise_for_status()

            async def embed(i: int) -> int:
                nonlocal done
                t0 = time.perf_counter()
                try:
                    r = await client.post(f"{emu.url}/v1/embeddings", json={"model": emu.model, "input": texts[i]})
                except (httpx.ReadError, httpx.RemoteProtocolError):
                    # A pooled connection idle for uvicorn's 5 s keep-alive is closed by the server as httpx (whose
                    # keep-alive expiry is also 5 s) reuses it. Embeddings are idempotent: send it again, count it.
                    nonlocal retried
                    retried += 1
                    r = await client.post(f"{emu.url}/v1/embeddings", json={"model": emu.model, "input": texts[i]})
                r.raise_for_status()
                latencies.append(time.perf_counter() - t0)
                done += 1
                if done >= args.items // 2 and not raised.is_set():
                    raised.set()
                    background.add(asyncio.ensure_future(raise_capacity()))
                return int(r.json()["usage"]["prompt_tokens"])

            async def sample() -> None:
                while True:
                    try:
                        snap = parse_vllm_metrics((await side.get(f"{emu.url}/metrics")).text, emu.model)
                        waiting = snap.waiting_capacity or 0
                        samples.append(waiting > 0)
                        if waiting > 0:
                            now = time.perf_counter() - start
                            if spells and now - spells[-1][1] < 0.15:
                                spells[-1] = (spells[-1][0], now, max(spells[-1][2], waiting))
                            else:
                                spells.append((now, now, waiting))
                    except (httpx.HTTPError, ValueError):
                        pass
                    await asyncio.sleep(0.1)

            start = time.perf_counter()
            sampler = asyncio.ensure_future(sample())
            await runner(embed, list(range(args.items)))
            makespan = time.perf_counter() - start
            sampler.cancel()
        latencies.sort()
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        result = Result(name, makespan, len(latencies), p99, sum(samples) / max(1, len(samples)))
        print(f"  {name}: {makespan:.1f} s, {result.goodput:.0f}/s, p99 {p99:.2f} s, sat {result.saturated:.0%}, "
              f"{retried} resent after a closed keep-alive connection", file=sys.stderr, flush=True)  # fmt: skip
        if args.verbose:
            shown = ", ".join(f"{a:.1f}-{b:.1f} s (<= {w:.0f})" for a, b, w in spells)
            raised_s = f"{raised_at[0]:.1f} s" if raised_at else "never"
            print(
                f"    saturated spells: {shown or 'none'}; capacity raised at {raised_s}", file=sys.stderr, flush=True
            )
        return result
    finally:
        emu.stop()


def no_setup(emu: Emulator) -> None:
    pass


def static(n: int) -> Runner:
    async def run(embed: Embed, items: list[int]) -> None:
        it = iter(items)

        async def worker() -> None:
            for i in it:
                await embed(i)

        await asyncio.gather(*(worker() for _ in range(n)))

    return run


async def aiometer_run(embed: Embed, items: list[int]) -> None:
    import aiometer

    await aiometer.run_on_each(embed, items, max_at_once=FLOOR)


async def adaptive_concurrency_run(embed: Embed, items: list[int]) -> None:
    from adaptive_concurrency import AdaptiveConfig
    from adaptive_concurrency.aio import arun_adaptive

    async def process_batch(batch: list[int]) -> tuple[bool, int, str]:
        for i in batch:
            await embed(i)
        return True, len(batch), ""

    await arun_adaptive(items, process_batch, AdaptiveConfig(workers=FLOOR, max_workers=CEILING, batch_size=1))


async def aimd_limiter_run(embed: Embed, items: list[int]) -> None:
    from aimd_limiter import AIMDAsyncLimiter

    limiter = AIMDAsyncLimiter(max_rate=500.0)

    async def one(i: int) -> None:
        async with limiter.acquire():
            await embed(i)

    await asyncio.gather(*(one(i) for i in items))


def ours_setup(args: argparse.Namespace) -> Callable[[Emulator], None]:
    def setup(emu: Emulator) -> None:
        from model_concurrency import register_model, reset_runtimes

        # One poll per ~12.5 ms of emulated time: about one bge-m3 step at this batch size.
        os.environ["MODEL_CONCURRENCY_POLL_S"] = str(0.0125 / args.time_scale)
        os.environ["MODEL_MAX_CONCURRENCY"] = str(CEILING)
        reset_runtimes()
        register_model(
            "bge-m3", base_url=f"{emu.url}/v1", served_model_name=emu.model, max_parallel_calls=args.ours_floor
        )

    return setup


async def ours_run(embed: Embed, items: list[int]) -> None:
    from model_concurrency import map_concurrent

    await map_concurrent(items, embed, model="bge-m3")


def median_of(runs: list[Result]) -> Result:
    """One row for several runs of one configuration: each figure its own median (ok: the fewest)."""
    if len(runs) == 1:
        return runs[0]
    return Result(
        runs[0].name,
        statistics.median(r.makespan_s for r in runs),
        min(r.ok for r in runs),
        statistics.median(r.p99_s for r in runs),
        statistics.median(r.saturated for r in runs),
        notes=f"median of {len(runs)}",
    )


async def main(args: argparse.Namespace) -> list[Result]:
    from model_concurrency import config

    ours = f"model-concurrency ({config.setting(*config.POLICY)})"
    if args.ours_floor != FLOOR:
        ours += f" floor {args.ours_floor}"
    configs: list[tuple[str, Runner, Callable[[Emulator], None]]] = [
        (ours, ours_run, ours_setup(args)),
        *([(f"static {FLOOR} (floor)", static(FLOOR), no_setup)] if args.floor else []),
        *((f"static {n}", static(n), no_setup) for n in args.statics),
    ]
    if args.peers:
        configs += [
            (f"aiometer max_at_once={FLOOR}", aiometer_run, no_setup),
            ("adaptive-concurrency", adaptive_concurrency_run, no_setup),
            ("aimd-limiter", aimd_limiter_run, no_setup),
        ]
    runs: dict[str, list[Result]] = {name: [] for name, _, _ in configs}
    for round_ in range(args.repeat):
        if args.repeat > 1:
            print(f"round {round_ + 1} of {args.repeat}", file=sys.stderr, flush=True)
        for name, runner, setup in configs:
            runs[name].append(await measure(name, runner, args, setup))
    rows = {name: median_of(results) for name, results in runs.items()}
    statics = [rows[f"static {n}"] for n in args.statics]
    best = min(statics, key=lambda r: r.makespan_s)
    best.name = f"best static ({best.name.split()[-1]} of {','.join(map(str, args.statics))})"
    names = [name for name, _, _ in configs]
    fixed = 1 + int(args.floor)
    results = [*(rows[name] for name in names[:fixed]), best]
    results += [rows[name] for name in names[fixed + len(args.statics) :]]
    return results


def goal_line(results: list[Result]) -> str:
    """The live goals, as ratios of figures measured in this run."""
    ours = results[0]
    best = next(r for r in results if r.name.startswith("best static"))
    allowed = max(best.saturated / 4, 0.02)
    return (
        f"goals: makespan ÷ {best.name} {ours.makespan_s / best.makespan_s:.2f} (≤ 1.05); saturated "
        f"{ours.saturated:.1%} vs allowed {allowed:.1%}; p99 ÷ its p99 {ours.p99_s / best.p99_s:.2f} (≤ 1)"
    )


def table(results: list[Result]) -> str:
    ours = results[0]
    lines = [
        "| run | makespan s | goodput items/s | p99 latency s | time saturated | makespan ÷ ours | goodput ÷ ours "
        "| p99 ÷ ours |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        p99_ratio = r.p99_s / ours.p99_s if ours.p99_s else float("nan")
        lines.append(
            f"| {r.name} | {r.makespan_s:.1f} | {r.goodput:.0f} | {r.p99_s:.2f} | {r.saturated:.0%} "
            f"| {r.makespan_s / ours.makespan_s:.2f} | {r.goodput / ours.goodput:.2f} | {p99_ratio:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--time-scale", type=float, default=0.025, help="emulated seconds per wall second")
    parser.add_argument("--input-chars", type=int, default=32, help="characters per input (≈ chars/4 tokens)")
    parser.add_argument("--statics", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 128, 256])
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration; rows are their medians")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="skip the third-party libraries")
    parser.add_argument("--no-floor", dest="floor", action="store_false", help="skip static at the floor (slow)")
    parser.add_argument(
        "--ours-floor",
        type=int,
        default=FLOOR,
        help="our floor (the static setting and where the ramp starts); at the engine's 64 the ramp costs nothing, "
        "which tells the ramp's share of the gap from the steady state's",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log our controller's decision at every poll to stderr"
    )
    args = parser.parse_args()
    if args.verbose:
        # Each poll's decision line (controller.py, INFO) with seconds since the benchmark started: where our run's time
        # went (the ramp, a cut, the probes after the capacity change).
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(relativeCreated)9.0f ms %(message)s"))
        logging.getLogger("model_concurrency").addHandler(handler)
        logging.getLogger("model_concurrency").setLevel(logging.DEBUG)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.ours_floor < 1:
        parser.error("--ours-floor must be >= 1")
    t0 = time.perf_counter()
    results = asyncio.run(main(args))
    print(table(results))
    print(goal_line(results))
    print(f"\n{args.items} items, time scale {args.time_scale}, {args.input_chars}-char inputs, "
          f"{'median of ' + str(args.repeat) + ' runs per row' if args.repeat > 1 else 'one run per row'}; "
          f"benchmark wall time {time.perf_counter() - t0:.0f} s")  # fmt: skip
