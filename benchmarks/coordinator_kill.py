"""A job's coordinator killed twice mid-job, on a real local Ray: does every item come back, and the target with it?

One emulator (``bge-m3``, ``max_num_seqs`` 32, on a slowed clock so the engine rather than loopback HTTP or Ray
limits throughput) serves ``--actors`` Ray actors that run one job (``FanOut(..., job=...)``), so they lease the
job's target from one coordinator actor. A driver thread reads the coordinator's state every 50 ms. When a third
and again when two thirds of the items are done (the engine's ``vllm:request_success_total``), it records the job's
target and kills the coordinator with ``ray.kill``. The workers keep their grants until the lease's deadline, then
run on their own runtimes from their last grant; the next worker to ask creates a new coordinator.

Figures: the items that came back and the share that succeeded (the actors run with ``return_exceptions``, so a
failed item comes back as its exception), and for each kill the polls from the new coordinator's first state until
its target is back at 0.8x the target before the kill (goal: every item back, >= 99 % succeeded, within two polls
of each restart), and its highest target within those two polls over the one before the kill. The exit status is 1
when an item is missing or under 99 % succeeded. The last line:

    .venv/bin/python benchmarks/coordinator_kill.py                  # 2,000 items, 4 actors, about a minute
    .venv/bin/python benchmarks/coordinator_kill.py --items 600 --actors 2
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field

import httpx
import scale_out
from ray import cloudpickle
from scale_out import Embed, local_ray

from model_concurrency.emulator import EmulatorConfig, RunningEmulator
from model_concurrency.emulator.serve import serve_in_processes
from model_concurrency.signals.vllm import parse_vllm_metrics

cloudpickle.register_pickle_by_value(scale_out)  # the actors get the item's class by value, as scale_out's own

SEQS = 32
FLOOR = 4
RECOVERED = 0.8  # the share of the pre-kill target a restarted job must be back at
JOB = "coordinator-kill"
MODEL = "bge"


@dataclass
class Kill:
    """One kill: the job's target before it, and what the coordinator that replaced it showed."""

    at: float
    pid: int
    target_before: int
    restarted_at: float | None = None
    recovered_at: float | None = None
    peak: int = 0  # the new coordinator's highest target within two polls of its first state
    path: list[int] = field(default_factory=list)  # the new coordinator's targets, one per change


def _done(emu: RunningEmulator, client: httpx.Client) -> float:
    return parse_vllm_metrics(client.get(emu.metrics_url).text, emu.model).success_total or 0.0


def watch(emu: RunningEmulator, items: int, poll_s: float, stop: threading.Event, kills: list[Kill]) -> None:
    """Read the coordinator's state; kill it at a third and at two thirds of the items; time each recovery."""
    import ray

    from model_concurrency.ray import NAMESPACE, coordinator_name

    marks = [items // 3, 2 * items // 3]
    with httpx.Client(timeout=10) as side:
        base = _done(emu, side)
        while not stop.wait(0.05):
            try:
                actor = ray.get_actor(coordinator_name(JOB, MODEL), namespace=NAMESPACE)
                state = ray.get(actor.state.remote(), timeout=2)
            except (ValueError, ray.exceptions.RayError):  # not created yet, or just killed
                continue
            now = time.perf_counter()
            last = kills[-1] if kills else None
            if last is not None and state["pid"] != last.pid:
                if last.restarted_at is None:
                    last.restarted_at = now
                if now - last.restarted_at <= 2 * poll_s:
                    last.peak = max(last.peak, state["target"])
                if not last.path or last.path[-1] != state["target"]:
                    last.path.append(state["target"])
                if last.recovered_at is None and state["target"] >= RECOVERED * last.target_before:
                    last.recovered_at = now
            if marks and _done(emu, side) - base >= marks[0]:
                marks.pop(0)
                kills.append(Kill(at=now, pid=state["pid"], target_before=state["target"]))
                ray.kill(actor)


def main(args: argparse.Namespace) -> int:
    import ray

    from model_concurrency.ray import NAMESPACE, FanOut, coordinator_name, fan_out_actor

    poll_s = 0.0125 / args.time_scale  # one poll per ~12.5 ms of emulated time, as scale_out.py
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=SEQS, time_scale=args.time_scale, simulate_frontend=False)
    kills: list[Kill] = []
    with ExitStack() as stack:
        emu = stack.enter_context(serve_in_processes(config))
        local_ray(stack, poll_s)
        table = {"base_url": emu.base_url, "served_model_name": emu.model, "max_parallel_calls": FLOOR}
        fan_out = FanOut(
            Embed(emu.base_url, emu.model), model=MODEL, config={"models": {MODEL: table}}, job=JOB,
            return_exceptions=True,
        )  # fmt: skip
        actors = [fan_out_actor(num_cpus=0.25).remote(fan_out) for _ in range(args.actors)]
        ray.get([a.utilization.remote() for a in actors])  # every actor up and in the job before the clock starts
        texts = [(f"item {i} " + "lorem ipsum dolor sit amet " * 8)[: args.input_chars] for i in range(args.items)]
        chunks = [texts[i :: args.actors] for i in range(args.actors)]
        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(emu, args.items, poll_s, stop, kills), daemon=True)
        start = time.perf_counter()
        watcher.start()
        try:
            results = ray.get([a.map.remote(chunk) for a, chunk in zip(actors, chunks, strict=True)])
        finally:
            stop.set()
            watcher.join()
            for actor in actors:
                ray.kill(actor)
            with suppress(ValueError):  # already gone
                ray.kill(ray.get_actor(coordinator_name(JOB, MODEL), namespace=NAMESPACE))
        elapsed = time.perf_counter() - start
    returned = sum(len(r) for r in results)
    failed = [x for r in results for x in r if isinstance(x, BaseException)]
    in_order = all(len(r) == len(c) for r, c in zip(results, chunks, strict=True))
    print(f"{args.items} items, {args.actors} actors in one job, {elapsed:.1f} s, poll {poll_s:.2f} s", file=sys.stderr)
    polls: list[str] = []
    peaks: list[str] = []  # each new coordinator's highest target within two polls, over the target before its kill
    for i, kill in enumerate(kills, 1):
        if kill.restarted_at is None:
            back = "never restarted"
        elif kill.recovered_at is None:
            back = "never"
        else:
            back = f"{(kill.recovered_at - kill.restarted_at) / poll_s:.1f}"
        polls.append(back)
        peaks.append(f"{kill.peak / max(1, kill.target_before):.1f}x")
        print(f"kill {i} at {kill.at - start:.1f} s: target {kill.target_before}; a new coordinator after "
              f"{(kill.restarted_at or kill.at) - kill.at:.1f} s, targets {kill.path[:12]}, "
              f"back to {RECOVERED:g}x in {back} polls", file=sys.stderr)  # fmt: skip
    for error in failed[:3]:
        print(f"failed: {error!r}", file=sys.stderr)
    share = (returned - len(failed)) / max(1, args.items)
    print(f"coordinator-kill: items {args.items}, returned {returned}{'' if in_order else ' (short)'}, "
          f"succeeded {share:.1%}, kills {len(kills)}, target back to {RECOVERED:g}x within "
          f"{', '.join(polls) or '-'} polls of each restart, "
          f"peak within two polls {', '.join(peaks) or '-'}")  # fmt: skip
    return 0 if returned == args.items and share >= 0.99 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--time-scale", type=float, default=0.025, help="emulated seconds per wall second")
    parser.add_argument("--input-chars", type=int, default=32, help="characters per input (≈ chars/4 tokens)")
    sys.exit(main(parser.parse_args()))
