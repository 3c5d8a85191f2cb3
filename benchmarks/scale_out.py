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

``--job`` adds the coordinated mode to every run: the same actors as workers of one job
(``FanOut(..., job=...)``), so each engine's workers lease from one coordinator, which alone reads that engine.
Each engine's ``/metrics`` is then read through a counting loopback proxy, and "scrapes per poll" is the scrapes
an engine served per poll interval of the run (the independent clients' figure is their count per engine). The
job's floor is the engine's: the per-actor floor times the actors on that engine, so both modes start at the same
total. ``--job`` also measures the lease's overhead: one actor runs ``--overhead-items`` items of a 2 ms sleep at
512 in flight (a static 512), alone and as a job's only worker; the figure is the actor's CPU per item.
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
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class CountingProxy:
    """A loopback server in front of one engine's ``/metrics``: forwards each GET and counts it."""

    def __init__(self, target: str) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                with proxy.lock:
                    proxy.count += 1
                upstream = httpx.get(target, timeout=10)
                body = upstream.content
                self.send_response(upstream.status_code)
                self.send_header("Content-Type", upstream.headers.get("content-type", "text/plain"))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.count = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def take(self) -> int:
        with self.lock:
            count, self.count = self.count, 0
            return count

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def one_run(
    name: str,
    emulators: list[RunningEmulator],
    policy: str,
    per_actor: int,
    args: argparse.Namespace,
    proxies: list[CountingProxy],
    job: str | None = None,
) -> dict[str, float]:
    import ray

    from model_concurrency.ray import NAMESPACE, FanOut, coordinator_name, fan_out_actor

    for emu in emulators:
        emu.set_capacity(max_num_seqs=OLD_SEQS)
    texts = [(f"item {i} " + "lorem ipsum dolor sit amet " * 8)[: args.input_chars] for i in range(args.items)]
    chunks = [texts[i :: args.actors] for i in range(args.actors)]
    with httpx.Client(timeout=10) as side:
        base = sum(s.success_total or 0 for s in _scrape(emulators, side))

    actors = []
    for i in range(args.actors):
        engine = i % len(emulators)
        emu = emulators[engine]
        # A job's floor is the whole job's on that engine: the per-actor floor times the actors sharing it.
        sharing = len(range(engine, args.actors, len(emulators)))
        table = {
            "base_url": emu.base_url,
            "served_model_name": emu.model,
            "max_parallel_calls": per_actor * sharing if job else per_actor,
            "policy": policy,
        }
        if args.job:
            table["metrics_url"] = proxies[engine].url
        # One model per engine: a job has one coordinator per (job, model), so one per engine.
        model = f"bge{engine}"
        fan_out = FanOut(Embed(emu.base_url, emu.model), model=model, config={"models": {model: table}}, job=job)
        actors.append(fan_out_actor(num_cpus=0.25).remote(fan_out))  # a fresh client: no controller carried over
    ray.get([a.utilization.remote() for a in actors])  # every actor up and configured before the clock starts
    for proxy in proxies:
        proxy.take()
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
        scrapes = [proxy.take() for proxy in proxies]
        for actor in actors:
            ray.kill(actor)
        for engine in range(len(emulators) if job else 0):
            with suppress(ValueError):  # already gone
                ray.kill(ray.get_actor(coordinator_name(job, f"bge{engine}"), namespace=NAMESPACE))
    makespan = max(finished.values())
    assert done == args.items, "items lost"
    # Each actor's throughput over its own time: an actor that got less of the engines finishes later.
    throughputs = [len(chunks[i]) / t for i, t in finished.items()]
    result = {
        "makespan_s": makespan,
        "jain": jain_index(throughputs),
        "saturated": sum(samples) / max(1, len(samples)),
        # Scrapes each engine served per poll interval of the run.
        "scrapes_per_poll": statistics.mean(scrapes) / (makespan / args.poll_s) if scrapes else float("nan"),
    }
    per_poll = f", scrapes per poll {result['scrapes_per_poll']:.2f}" if scrapes else ""
    print(f"  {name}: {makespan:.1f} s, {args.items / makespan:.0f} items/s, jain {result['jain']:.3f}, "
          f"saturated {result['saturated']:.0%}{per_poll}", file=sys.stderr, flush=True)  # fmt: skip
    return result


@dataclass(frozen=True)
class Nap:
    """An item that costs the engine nothing: a 2 ms sleep (the lease's overhead is what is left)."""

    def __call__(self, item: int) -> int:
        time.sleep(0.002)
        return item


def _cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds (Linux ``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def overhead(args: argparse.Namespace, emu: RunningEmulator, job: str | None) -> float:
    """Microseconds of the actor's CPU per item at 512 in flight (a static 512: the lease is all that differs)."""
    import ray

    from model_concurrency.ray import NAMESPACE, FanOut, coordinator_name, fan_out_actor

    table = {"base_url": emu.base_url, "served_model_name": emu.model, "max_parallel_calls": 512, "policy": "static"}
    fan_out = FanOut(Nap(), model="nap", config={"models": {"nap": table}}, job=job)
    actor = fan_out_actor(num_cpus=0.25).remote(fan_out)
    pid = ray.get(actor.utilization.remote())["pid"]
    ray.get(actor.map.remote(list(range(2048))))  # warm: the thread pool grown, the lease taken
    before = _cpu_s(pid)
    done = ray.get(actor.map.remote(list(range(args.overhead_items))))
    cost = (_cpu_s(pid) - before) / len(done) * 1e6
    ray.kill(actor)
    if job:
        ray.kill(ray.get_actor(coordinator_name(job, "nap"), namespace=NAMESPACE))
    return cost


def local_ray(stack: ExitStack, poll_s: float) -> None:
    """A local Ray on two CPUs (actors take fractions of one), shut down when ``stack`` closes; its workers poll every
    ``poll_s`` under the benchmark's ceiling and read their engines directly (no Prometheus)."""
    import ray

    temp_dir = tempfile.mkdtemp(prefix="mc-ray-")  # short: Ray's socket paths must fit in 107 bytes
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


def main(args: argparse.Namespace) -> int:
    poll_s = args.poll_s = 0.0125 / args.time_scale  # one poll per ~12.5 ms of emulated time, as live_peers.py
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=OLD_SEQS, time_scale=args.time_scale, simulate_frontend=False)
    rows: list[tuple[float, float, float]] = []
    job_rows: list[tuple[float, float, float, float]] = []
    costs: list[tuple[float, float]] = []
    with ExitStack() as stack:
        emulators = [stack.enter_context(serve_in_processes(config)) for _ in range(2)]
        proxies = [CountingProxy(e.metrics_url) for e in emulators] if args.job else []
        for proxy in proxies:
            stack.callback(proxy.close)
        local_ray(stack, poll_s)
        for run in range(args.runs):
            print(f"run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
            ours = one_run(f"{args.policy} (floor {FLOOR})", emulators, args.policy, FLOOR, args, proxies)
            statics = {n: one_run(f"static {n} per actor", emulators, "static", n, args, proxies) for n in args.statics}
            best_n, best = min(statics.items(), key=lambda kv: kv[1]["makespan_s"])
            ratio = ours["makespan_s"] / best["makespan_s"]
            print(f"run {run + 1}: makespan vs best static ({best_n} per actor) {ratio:.3f}, jain {ours['jain']:.3f}, "
                  f"saturated {ours['saturated']:.0%}")  # fmt: skip
            rows.append((ratio, ours["jain"], ours["saturated"]))
            if args.job:
                name = f"{args.policy} as one job (floor {FLOOR} x actors per engine)"
                coordinated = one_run(name, emulators, args.policy, FLOOR, args, proxies, job=f"scale-out-{run}")
                job_ratio = coordinated["makespan_s"] / best["makespan_s"]
                print(f"run {run + 1}: job: makespan vs best static {job_ratio:.3f}, jain {coordinated['jain']:.3f}, "
                      f"saturated {coordinated['saturated']:.0%}, "
                      f"scrapes per poll {coordinated['scrapes_per_poll']:.2f}")  # fmt: skip
                figures = (coordinated["jain"], coordinated["saturated"], coordinated["scrapes_per_poll"])
                job_rows.append((job_ratio, *figures))
                alone, leased = overhead(args, emulators[0], None), overhead(args, emulators[0], f"overhead-{run}")
                print(f"run {run + 1}: lease overhead at 512 in flight: {alone:.0f} us CPU per item alone, "
                      f"{leased:.0f} us as a job's worker")  # fmt: skip
                costs.append((alone, leased))
    x = statistics.median(r[0] for r in rows)
    j = statistics.median(r[1] for r in rows)
    s = statistics.median(r[2] for r in rows)
    print(f"{args.items} items, {args.actors} actors over 2 emulators (max_num_seqs {OLD_SEQS} -> {2 * OLD_SEQS} "
          f"halfway), time scale {args.time_scale}, median of {args.runs} runs")  # fmt: skip
    line = f"scale-out: actors {args.actors}, makespan vs best static {x:.3f}, jain {j:.3f}, saturated {s:.0%}"
    if job_rows:
        jx, jj, js, jk = (statistics.median(r[i] for r in job_rows) for i in range(4))
        alone, leased = (statistics.median(c[i] for c in costs) for i in range(2))
        print(f"lease overhead at 512 in flight: {alone:.0f} us CPU per item alone, {leased:.0f} us as a job's worker "
              f"({leased / alone:.2f}x), {args.overhead_items} items of a 2 ms sleep")  # fmt: skip
        line += f"; job: makespan vs best static {jx:.2f}, jain {jj:.2f}, saturated {js:.0%}, scrapes per poll {jk:.2f}"
    print(line)
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
    parser.add_argument("--job", action="store_true", help="add the coordinated mode (one job) and the lease overhead")
    parser.add_argument("--overhead-items", type=int, default=20000, help="items per lease-overhead measurement")
    sys.exit(main(parser.parse_args()))
