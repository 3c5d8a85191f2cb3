"""Scale-out on a real local Ray: several actors, each one client, embed a fixed item set against two emulators.

The benchmark starts a local Ray (``ray.init(num_cpus=2)``: actors take fractional CPUs, since this machine has
two cores) and two emulator instances in their own processes (``bge-m3``, ``max_num_seqs`` 32, on a slowed clock
so the engines rather than loopback HTTP or Ray limit throughput). Actor ``i`` embeds through emulator ``i % 2``
and reads that emulator's ``/metrics``: each emulator is one engine shared by half the actors, with no
coordinator. When half the items are done (summed over both emulators' ``vllm:request_success_total``) the
driver doubles both engines' ``max_num_seqs`` through ``/admin/capacity``. A driver thread scrapes both pages
every 100 ms; "saturated" is the share of those samples where either engine has capacity-waiting requests.

Each run embeds the same items with the package's default policy, then with static per-actor concurrencies
(``--statics``; the best, chosen with hindsight, is the baseline). Figures per run: makespan against the best
static's, the Jain index of per-actor throughput (items over the actor's own time), the saturated share. The
last line is the median of ``--runs`` runs (goal: makespan ratio <= 1.05, Jain >= 0.95, saturated <= 10 %):

    .venv/bin/python benchmarks/scale_out.py                       # 4 actors, 3 runs, a few minutes
    .venv/bin/python benchmarks/scale_out.py --actors 2 --items 400 --runs 1 --statics 8,32
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx

from model_concurrency.emulator import EmulatorConfig, RunningEmulator
from model_concurrency.emulator.serve import serve_in_processes
from model_concurrency.lab.summary import jain_index
from model_concurrency.signals.vllm import parse_vllm_metrics

OLD_SEQS = 32
FLOOR = 4
CEILING = 256

_clients: dict[str, httpx.Client] = {}  # one connection pool per worker process and emulator


@dataclass(frozen=True)
class Embed:
    """One item, one real embeddings call (picklable: Ray ships it to every actor)."""

    base_url: str
    model: str

    def __call__(self, text: str) -> int:
        client = _clients.get(self.base_url)
        if client is None:
            client = _clients[self.base_url] = httpx.Client(
                timeout=60, limits=httpx.Limits(max_connections=CEILING, max_keepalive_connections=CEILING)
            )
        body = {"model": self.model, "input": text}
        try:
            response = client.post(f"{self.base_url}/embeddings", json=body)
        except (httpx.ReadError, httpx.RemoteProtocolError):
            # A pooled connection idle for uvicorn's 5 s keep-alive can be closed as it is reused (as in
            # live_peers.py); an embedding is idempotent, so it is sent once more.
            response = client.post(f"{self.base_url}/embeddings", json=body)
        response.raise_for_status()
        return int(response.json()["usage"]["prompt_tokens"])


def _scrape(emulators: list[RunningEmulator], client: httpx.Client) -> list[Any]:
    return [parse_vllm_metrics(client.get(e.metrics_url).text, e.model) for e in emulators]


def one_run(
    name: str, emulators: list[RunningEmulator], policy: str, per_actor: int, args: argparse.Namespace
) -> dict[str, float]:
    import ray

    from model_concurrency.ray import FanOut, fan_out_actor

    for emu in emulators:
        emu.set_capacity(max_num_seqs=OLD_SEQS)
    texts = [(f"item {i} " + "lorem ipsum dolor sit amet " * 8)[: args.input_chars] for i in range(args.items)]
    chunks = [texts[i :: args.actors] for i in range(args.actors)]
    with httpx.Client(timeout=10) as side:
        base = sum(s.success_total or 0 for s in _scrape(emulators, side))

    actors = []
    for i in range(args.actors):
        emu = emulators[i % len(emulators)]
        config = {
            "models": {
                "bge": {
                    "base_url": emu.base_url,
                    "served_model_name": emu.model,
                    "max_parallel_calls": per_actor,
                    "policy": policy,
                }
            }
        }
        fan_out = FanOut(Embed(emu.base_url, emu.model), model="bge", config=config)
        actors.append(fan_out_actor(num_cpus=0.25).remote(fan_out))  # a fresh client: no controller carried over
    ray.get([a.utilization.remote() for a in actors])  # every actor up and configured before the clock starts
    stop = threading.Event()
    samples: list[bool] = []
    raised: list[float] = []

    def watch() -> None:
        with httpx.Client(timeout=10) as side:
            while not stop.wait(0.1):
                try:
                    snaps = _scrape(emulators, side)
                except (httpx.HTTPError, ValueError):
                    continue
                samples.append(any((s.waiting_capacity or 0) > 0 for s in snaps))
                done = sum(s.success_total or 0 for s in snaps) - base
                if not raised and done >= args.items // 2:
                    raised.append(time.perf_counter())
                    for emu in emulators:
                        emu.set_capacity(max_num_seqs=2 * OLD_SEQS)

    watcher = threading.Thread(target=watch, daemon=True)
    start = time.perf_counter()
    watcher.start()
    finished: dict[Any, float] = {}
    try:
        refs = {actor.map.remote(chunk): i for i, (actor, chunk) in enumerate(zip(actors, chunks, strict=True))}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            finished[refs[ready[0]]] = time.perf_counter() - start
        done = sum(len(ray.get(ref)) for ref in refs)
    finally:
        stop.set()
        watcher.join()
        for actor in actors:
            ray.kill(actor)
    makespan = max(finished.values())
    assert done == args.items, "items lost"
    # Each actor's throughput over its own time: an actor that got less of the engines finishes later.
    throughputs = [len(chunks[i]) / t for i, t in finished.items()]
    result = {
        "makespan_s": makespan,
        "jain": jain_index(throughputs),
        "saturated": sum(samples) / max(1, len(samples)),
    }
    print(f"  {name}: {makespan:.1f} s, {args.items / makespan:.0f} items/s, jain {result['jain']:.3f}, "
          f"saturated {result['saturated']:.0%}", file=sys.stderr, flush=True)  # fmt: skip
    return result


def main(args: argparse.Namespace) -> int:
    import ray

    poll_s = 0.0125 / args.time_scale  # one poll per ~12.5 ms of emulated time, as benchmarks/live_peers.py
    temp_dir = tempfile.mkdtemp(prefix="mc-ray-")  # short: Ray's socket paths must fit in 107 bytes
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=OLD_SEQS, time_scale=args.time_scale, simulate_frontend=False)
    rows: list[tuple[float, float, float]] = []
    with ExitStack() as stack:
        emulators = [stack.enter_context(serve_in_processes(config)) for _ in range(2)]
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=128 * 1024 * 1024,
            _temp_dir=temp_dir,
            runtime_env={
                "env_vars": {
                    "MODEL_CONCURRENCY_POLL_S": str(poll_s),
                    "MODEL_MAX_CONCURRENCY": str(CEILING),
                    "MODEL_CONCURRENCY_PROMETHEUS_URL": "",
                }
            },
        )
        stack.callback(lambda: shutil.rmtree(temp_dir, ignore_errors=True))
        stack.callback(ray.shutdown)
        for run in range(args.runs):
            print(f"run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
            ours = one_run(f"{args.policy} (floor {FLOOR})", emulators, args.policy, FLOOR, args)
            statics = {n: one_run(f"static {n} per actor", emulators, "static", n, args) for n in args.statics}
            best_n, best = min(statics.items(), key=lambda kv: kv[1]["makespan_s"])
            ratio = ours["makespan_s"] / best["makespan_s"]
            print(f"run {run + 1}: makespan vs best static ({best_n} per actor) {ratio:.3f}, jain {ours['jain']:.3f}, "
                  f"saturated {ours['saturated']:.0%}")  # fmt: skip
            rows.append((ratio, ours["jain"], ours["saturated"]))
    x = statistics.median(r[0] for r in rows)
    j = statistics.median(r[1] for r in rows)
    s = statistics.median(r[2] for r in rows)
    print(f"{args.items} items, {args.actors} actors over 2 emulators (max_num_seqs {OLD_SEQS} -> {2 * OLD_SEQS} "
          f"halfway), time scale {args.time_scale}, median of {args.runs} runs")  # fmt: skip
    print(f"scale-out: actors {args.actors}, makespan vs best static {x:.3f}, jain {j:.3f}, saturated {s:.0%}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--policy", default=os.environ.get("MODEL_CONCURRENCY_POLICY", "adaptive"))
    parser.add_argument("--time-scale", type=float, default=0.025, help="emulated seconds per wall second")
    parser.add_argument("--input-chars", type=int, default=32, help="characters per input (≈ chars/4 tokens)")
    parser.add_argument("--statics", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32, 64])
    sys.exit(main(parser.parse_args()))
