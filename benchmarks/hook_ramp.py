"""Does ``resolve_capacity`` alone ramp like ``map_concurrent``?

Per preset (bge-m3, an embedding engine; llama-8b-h100, a decoder), against the served emulator (an engine process
and a front-end process) from a floor of 4, two runs in the same process and the same machine state:

* ``map_concurrent``: async httpx calls through the gate until ``--polls`` polls were taken; its *settled target* is
  the median target over the last third of them, and its *ramp* the first poll at which the target reached
  0.8× that;
* ``hook``: a loop that sizes each batch from ``resolve_capacity`` (a thread pool of that many workers, that many
  calls), with nothing in the library counting its calls; its ramp is the first poll at which the target reached
  0.8× the gate's settled target.

Goal: the hook's ramp within 5× the gate's. Polls, not seconds, so the figure holds on a loaded
machine. Run it with ``nice``::

    MODEL_MAX_CONCURRENCY=256 nice .venv/bin/python benchmarks/hook_ramp.py --polls 30
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from model_concurrency import knobs, map_concurrent, register_model, reset_runtimes, resolve_capacity
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_processes
from model_concurrency.runtime import ModelRuntime, runtime_for

FLOOR = 4
PRESETS = {
    # (preset, max_num_seqs, time_scale): an engine fast enough that a run takes seconds, full well above the floor.
    "bge-m3": ("bge-m3", 64, 1.0),
    "llama": ("llama-8b-h100", 256, 10.0),
}


def call_body(emu: RunningEmulator, kind: str, i: int) -> tuple[str, dict[str, Any]]:
    if kind == "bge-m3":
        return "/embeddings", {"model": emu.model, "input": f"text number {i}"}
    return "/completions", {"model": emu.model, "prompt": f"say {i}", "max_tokens": 16}


class Trace:
    """The target after each poll, sampled on a thread (the runtime's own poll count is the clock)."""

    def __init__(self, runtime: ModelRuntime) -> None:
        self.runtime = runtime
        self.targets: dict[int, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.targets[self.runtime.core.polls] = self.runtime.current()
            time.sleep(0.002)

    def close(self) -> list[int]:
        self.stop.set()
        self.thread.join()
        self.targets[self.runtime.core.polls] = self.runtime.current()
        return [self.targets.get(p, 0) for p in sorted(self.targets)]


def first_reaching(targets: list[int], want: float) -> int | None:
    return next((poll for poll, t in enumerate(targets) if t >= want), None)


def run_gate(emu: RunningEmulator, kind: str, polls: int) -> list[int]:
    runtime = runtime_for("m")
    trace = Trace(runtime)

    async def items() -> AsyncIterator[int]:
        i = 0
        while runtime.core.polls < polls:
            yield i
            i += 1

    async def main() -> None:
        async with httpx.AsyncClient(base_url=emu.base_url, timeout=60, limits=httpx.Limits(max_connections=512)) as c:

            async def one(i: int) -> None:
                path, body = call_body(emu, kind, i)
                (await c.post(path, json=body)).raise_for_status()

            await map_concurrent(items(), one, model="m")

    asyncio.run(main())
    return trace.close()


def run_hook(emu: RunningEmulator, kind: str, polls: int, done: Callable[[ModelRuntime], bool]) -> list[int]:
    runtime = runtime_for("m")
    trace = Trace(runtime)
    with httpx.Client(base_url=emu.base_url, timeout=60, limits=httpx.Limits(max_connections=512)) as c:

        def one(i: int) -> None:
            path, body = call_body(emu, kind, i)
            c.post(path, json=body).raise_for_status()

        while runtime.core.polls < polls and not done(runtime):
            size = resolve_capacity("m")
            with ThreadPoolExecutor(max_workers=size) as pool:
                list(pool.map(one, range(size)))
    return trace.close()


def measure(kind: str, polls: int) -> dict[str, Any]:
    preset, seqs, scale = PRESETS[kind]
    config = EmulatorConfig(preset=preset, max_num_seqs=seqs, time_scale=scale, simulate_frontend=False)
    with serve_in_processes(config) as emu:
        register_model("m", base_url=emu.base_url, served_model_name=emu.model, max_parallel_calls=FLOOR)
        reset_runtimes()
        gate = run_gate(emu, kind, polls)
        settled = statistics.median(gate[-max(1, len(gate) // 3) :])
        gate_ramp = first_reaching(gate, 0.8 * settled)
        reset_runtimes()
        budget = 5 * max(1, gate_ramp or 1)
        hook = run_hook(emu, kind, budget + 1, lambda r: r.current() >= 0.8 * settled)
        reset_runtimes()
        hook_ramp = first_reaching(hook, 0.8 * settled)
    return {
        "preset": kind,
        "gate_settled": settled,
        "gate_ramp_polls": gate_ramp,
        "hook_ramp_polls": hook_ramp,
        "hook_final": hook[-1],
        "hook_trace": hook,
        "ratio": None if hook_ramp is None or not gate_ramp else round(hook_ramp / gate_ramp, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=30, help="polls of the map_concurrent run")
    parser.add_argument("--poll-s", type=float, default=0.1, help="MODEL_CONCURRENCY_POLL_S for both runs")
    parser.add_argument("--presets", default="bge-m3,llama")
    args = parser.parse_args()
    with knobs.overrides({knobs.POLL_S[0]: str(args.poll_s)}):  # passed as a setting, os.environ untouched
        for kind in args.presets.split(","):
            print(measure(kind, args.polls), flush=True)


if __name__ == "__main__":
    main()
