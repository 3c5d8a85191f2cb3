"""A good neighbour, live: an interactive tenant's time to first token beside the batch fan-out, per policy.

The setup, every run on a fresh emulator (``llama-8b-h100``, ``max_num_seqs`` 256, served as
``model-concurrency emulate`` serves it: engine process apart from the HTTP front-end):

* an interactive tenant: open-loop Poisson arrivals of streamed chat completions (256-token prompts, 128 tokens
  out), in bursts (``--burst-rps`` for ``--burst-s`` simulated seconds, then ``--idle-rps`` for as long), as in
  llm-d-batch-gateway's benchmark (15 req/s for 90 s, then 1 req/s), shortened. Its TTFT is measured over SSE by
  the client: from sending the request to the first chunk that carries content, in simulated seconds (wall ×
  ``--time-scale``);
* the batch: three jobs (``--jobs`` items each, ``--deadlines`` in simulated seconds), each one
  ``map_concurrent`` call on the same registered model (so they share its gate), 1024-token prompts, 256 tokens
  out (``ignore_eos``), under the policy of the run.

Runs: the tenant alone (the baseline: the ratio's denominator), then static ungated (every call at once up to
``--high``), statics from ``--statics`` (the best static: the lowest neighbour ratio among those meeting every
deadline, else the one meeting most), our default policy, its neighbour mode (``adaptive-neighbour``, its seconds
scaled from the lab's 12 s polls to ``--poll-s``) and the published peers when this tree has them
(``batch-gateway-aimd``, ``llmd-aimd``, ``aibrix``). A row per run; the last line is ours (the default policy, or
``MODEL_CONCURRENCY_POLICY``):

    mixed: neighbour ttft p99 X.XX× alone, batch idle throughput Y.YY× ungated, deadlines D/T

The neighbour figure is the TTFT p99 over the tenant's requests that arrived in bursts, over the same in the
tenant-alone run; the throughput figure is batch items per simulated second in the tenant's idle windows (from the
end of its first burst, while a job still has items left) over the same under static ungated. The tenant-alone run
also checks the streaming path: the client's TTFT median against the emulator's own (its TTFT histogram, which the
tenant alone has to itself), printed as ``sse check``.

    .venv/bin/python benchmarks/mixed.py                    # about 10 minutes on 2 loaded cores
    .venv/bin/python benchmarks/mixed.py --statics 32 --time-scale 1 --duration 40   # quicker, noisier
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from model_concurrency.cli._http import ShardedClient
from model_concurrency.signals.vllm import parse_vllm_metrics

MODEL = "batch"
PROMPT_CHARS = 4 * 1024  # the emulator's default tokenizer counts 4 characters per token
TENANT_CHARS = 4 * 256
PEERS = ("batch-gateway-aimd", "llmd-aimd", "aibrix")


@dataclass
class Run:
    name: str
    ttft: list[tuple[float, float]] = field(default_factory=list)  # (arrival, TTFT), simulated seconds
    finishes: list[float] = field(default_factory=list)  # batch item finish times, simulated seconds
    job_done: list[float | None] = field(default_factory=list)
    engine_ttft_mean: float | None = None


class Clock:
    """Simulated seconds since the run started (wall × time scale)."""

    def __init__(self, time_scale: float) -> None:
        self.scale = time_scale
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return (time.perf_counter() - self.t0) * self.scale

    async def sleep_until(self, sim_t: float) -> None:
        await asyncio.sleep(max(0.0, (sim_t - self.now()) / self.scale))


def in_burst(args: argparse.Namespace, t: float) -> bool:
    if t < args.first_burst:
        return False
    return (t - args.first_burst) % (2 * args.cycle) < args.cycle


async def tenant(args: argparse.Namespace, url: str, model: str, clock: Clock, run: Run, stop: asyncio.Event) -> None:
    """Open-loop streamed chat calls; each records its TTFT (first content chunk) in simulated seconds."""
    rng = random.Random(args.seed)
    prompt = ("hello there " * (TENANT_CHARS // 12 + 1))[:TENANT_CHARS]
    pending: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def one(arrival: float) -> None:
            body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 128,
                    "ignore_eos": True, "stream": True}  # fmt: skip
            first = True
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                async for line in response.aiter_lines():  # read to the end: the call holds its slot till then
                    if first and line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                        first = False
                        run.ttft.append((arrival, clock.now() - arrival))

        t = 0.0
        while not stop.is_set():
            rate = args.burst_rps if in_burst(args, t) else args.idle_rps
            t += rng.expovariate(rate)
            await clock.sleep_until(t)
            if stop.is_set():
                break
            task = asyncio.ensure_future(one(clock.now()))
            pending.add(task)
            task.add_done_callback(pending.discard)
        for task in list(pending):
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def batch(args: argparse.Namespace, url: str, model: str, clock: Clock, run: Run, policy: str) -> None:
    """Three jobs, each a ``map_concurrent`` on the registered model; statics are the static policy at a floor."""
    from model_concurrency import map_concurrent

    prompt = ("lorem ipsum " * (PROMPT_CHARS // 12 + 1))[:PROMPT_CHARS]
    run.job_done = [None] * len(args.jobs)
    async with ShardedClient() as client:

        async def call(i: int) -> None:
            body = {"model": model, "prompt": prompt, "max_tokens": 256, "ignore_eos": True}
            for attempt in range(3):
                try:
                    r = await client.post(f"{url}/v1/completions", json=body)
                    break
                except (httpx.ReadError, httpx.RemoteProtocolError):
                    if attempt == 2:
                        raise
            r.raise_for_status()
            run.finishes.append(clock.now())

        async def job(j: int, items: int) -> None:
            await map_concurrent(range(items), call, model=MODEL)
            run.job_done[j] = clock.now()

        await asyncio.gather(*(job(j, n) for j, n in enumerate(args.jobs)))


def register(args: argparse.Namespace, url: str, model: str, policy: str, floor: int) -> None:
    from model_concurrency import register_model, reset_runtimes

    os.environ["MODEL_CONCURRENCY_POLL_S"] = str(args.poll_s / args.time_scale)
    os.environ["MODEL_MAX_CONCURRENCY"] = str(args.high)
    reset_runtimes()
    register_model(
        MODEL, base_url=f"{url}/v1", served_model_name=model, max_parallel_calls=floor, policy=policy or None
    )


async def measure(args: argparse.Namespace, name: str, policy: str | None, floor: int) -> Run:
    """One run on a fresh emulator: the tenant, and (unless ``policy`` is None) the batch under ``policy``."""
    from model_concurrency.emulator import EmulatorConfig, serve_in_processes

    config = EmulatorConfig(preset="llama-8b-h100", max_num_seqs=256, time_scale=args.time_scale)
    run = Run(name)
    with serve_in_processes(config) as emu:
        stop = asyncio.Event()
        clock = Clock(args.time_scale)
        load = asyncio.ensure_future(tenant(args, emu.url, emu.model, clock, run, stop))
        if policy is None:
            await clock.sleep_until(args.duration)
        else:
            register(args, emu.url, emu.model, policy, floor)
            work = asyncio.ensure_future(batch(args, emu.url, emu.model, clock, run, policy))
            await asyncio.wait([work], timeout=max(0.0, args.duration / args.time_scale))
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        stop.set()
        await load
        async with httpx.AsyncClient() as side:
            snap = (await side.get(f"{emu.url}/metrics")).text
        ttft_sum = _series(snap, "vllm:time_to_first_token_seconds_sum")
        ttft_count = _series(snap, "vllm:time_to_first_token_seconds_count")
        if ttft_count:
            run.engine_ttft_mean = ttft_sum / ttft_count
        parse_vllm_metrics(snap, emu.model)  # the page parses: the run's emulator was sane to the end
    return run


def _series(page: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name + "{"))


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]


def burst_ttft_p99(args: argparse.Namespace, run: Run) -> float | None:
    return p99([ttft for arrival, ttft in run.ttft if in_burst(args, arrival)])


def idle_rate(args: argparse.Namespace, run: Run) -> float | None:
    """Batch items per simulated second in idle windows after the first burst, while a job had items left."""
    last = max((d for d in run.job_done if d is not None), default=args.duration)
    end = min(args.duration, last if all(d is not None for d in run.job_done) else args.duration)
    start = args.first_burst + args.cycle
    idle_s = 0.0
    t = start
    while t < end:
        span = min(t + args.cycle, end) - t
        idle_s += span
        t += 2 * args.cycle
    done = sum(1 for f in run.finishes if f >= start and f < end and not in_burst(args, f))
    return done / idle_s if idle_s > 0 else None


def deadlines_met(args: argparse.Namespace, run: Run) -> int:
    return sum(1 for d, limit in zip(run.job_done, args.deadlines, strict=False) if d is not None and d <= limit)


def row(args: argparse.Namespace, run: Run, alone: float | None, ungated_idle: float | None) -> dict[str, Any]:
    ttft = burst_ttft_p99(args, run)
    idle = idle_rate(args, run)
    return {
        "name": run.name,
        "ttft_p99_ms": None if ttft is None else ttft * 1000,
        "ratio": ttft / alone if ttft is not None and alone else None,
        "idle_rate": idle,
        "idle_ratio": idle / ungated_idle if idle is not None and ungated_idle else None,
        "deadlines": deadlines_met(args, run),
        "items": len(run.finishes),
    }


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    lines = [
        "| run | neighbour TTFT p99 in bursts (ms) | × alone | batch items/s while idle | × ungated | deadlines "
        "| items |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {fmt(r['ttft_p99_ms'], '.1f')} | {fmt(r['ratio'], '.2f')} | {fmt(r['idle_rate'], '.2f')} "
            f"| {fmt(r['idle_ratio'], '.2f')} | {r['deadlines']}/{len(args.deadlines)} | {r['items']} |"
        )
    return "\n".join(lines)


NEIGHBOUR_MODE = "adaptive-neighbour"
# The neighbour mode's parameters in seconds, as tuned in the lab (12 s polls, 90 s bursts); scaled here to this
# run's poll interval, since its bursts are as many polls long as the lab's.
NEIGHBOUR_SECONDS = {"min_active_s": 20.0, "max_active_s": 150.0, "settle_s": 30.0, "memory_s": 600.0}


def neighbour_preset(args: argparse.Namespace, folder: Path) -> str:
    """A preset file for the neighbour mode with its seconds scaled from the lab's 12 s polls to this run's."""
    factor = args.poll_s / args.time_scale / 12.0
    lines = [f'name = "{NEIGHBOUR_MODE}-mixed"', f'policy = "{NEIGHBOUR_MODE}"']
    lines += [f"{key} = {value * factor!r}" for key, value in NEIGHBOUR_SECONDS.items()]
    path = folder / f"{NEIGHBOUR_MODE}-mixed.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def known_names() -> set[str]:
    from model_concurrency.policies.registry import policy_names

    return set(policy_names())


def known_peers() -> list[str]:
    names = known_names()
    return [p for p in PEERS if p in names]


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    from model_concurrency import config

    ours = config.setting(*config.POLICY)
    print(f"tenant alone ({args.duration:g} s simulated at time scale {args.time_scale:g}) ...", file=sys.stderr)
    alone_run = await measure(args, "tenant alone", None, 0)
    alone = burst_ttft_p99(args, alone_run)
    sse = statistics.median(t for _, t in alone_run.ttft) if alone_run.ttft else None
    print(
        f"sse check: client TTFT median {fmt(sse and sse * 1000, '.1f')} ms, engine TTFT mean "
        f"{fmt(alone_run.engine_ttft_mean and alone_run.engine_ttft_mean * 1000, '.1f')} ms, "
        f"{len(alone_run.ttft)} tenant requests",
        file=sys.stderr,
    )
    runs: list[Run] = []
    plan = [(f"static ungated ({args.high})", "static", args.high)]
    plan += [(f"static {n}", "static", n) for n in args.statics]
    folder = Path(tempfile.mkdtemp(prefix="mixed-"))
    mode = neighbour_preset(args, folder) if NEIGHBOUR_MODE in known_names() else None
    plan += [(f"{ours} (ours)", mode if ours == NEIGHBOUR_MODE and mode else ours, args.floor)]
    if mode and ours != NEIGHBOUR_MODE:
        plan += [(f"{NEIGHBOUR_MODE} (neighbour mode)", mode, args.floor)]
    plan += [(peer, peer, args.floor) for peer in known_peers()]
    for name, policy, floor in plan:
        print(f"{name} ...", file=sys.stderr, flush=True)
        runs.append(await measure(args, name, policy, floor))
    ungated_idle = idle_rate(args, runs[0])
    rows = [row(args, alone_run, alone, None)] + [row(args, r, alone, ungated_idle) for r in runs]
    statics = [r for r in rows if r["name"].startswith("static ") and not r["name"].startswith("static ungated")]
    if statics:
        best = min(statics, key=lambda r: (-r["deadlines"], r["ratio"] if r["ratio"] is not None else math.inf))
        best["name"] += " (best static)"
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # A slow clock keeps the HTTP round trip (tens of wall ms on a loaded machine) small in simulated time.
    p.add_argument("--time-scale", type=float, default=0.5, help="simulated seconds per wall second")
    p.add_argument("--duration", type=float, default=60.0, help="simulated seconds per run")
    p.add_argument("--first-burst", type=float, default=5.0, help="simulated second the first burst starts")
    p.add_argument("--cycle", type=float, default=10.0, help="simulated seconds of each burst and each idle spell")
    p.add_argument("--burst-rps", type=float, default=15.0)
    p.add_argument("--idle-rps", type=float, default=1.0)
    p.add_argument("--jobs", type=lambda s: [int(x) for x in s.split(",")], default=[120, 240, 240])
    p.add_argument("--deadlines", type=lambda s: [float(x) for x in s.split(",")], default=[30.0, 55.0, 60.0])
    p.add_argument("--statics", type=lambda s: [int(x) for x in s.split(",")], default=[16, 48])
    p.add_argument("--high", type=int, default=256, help="static ungated: every call at once up to this")
    p.add_argument("--floor", type=int, default=4, help="our floor (and the peers')")
    p.add_argument("--poll-s", type=float, default=1.0, help="our poll interval, simulated seconds")
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    results = asyncio.run(main(arguments))
    print(table(arguments, results))
    ours_row = next(r for r in results if r["name"].endswith("(ours)"))
    print(
        f"mixed: neighbour ttft p99 {fmt(ours_row['ratio'], '.2f')}× alone, batch idle throughput "
        f"{fmt(ours_row['idle_ratio'], '.2f')}× ungated, deadlines {ours_row['deadlines']}/{len(arguments.deadlines)}"
    )
