"""``resolve_capacity`` alone (no gate, no slot) ramps on an embedding engine as on a decoder (issue 27 item 1).

A loop sizes each batch from the hook, as the original design's example did, against the served emulator (an
engine process and a front-end process): bge-m3 (an embedding engine, whose calls spend milliseconds on it and
are rarely caught ``running`` at a poll) and a llama decoder. ``map_concurrent`` runs first on the same engine
and sets the bar: its settled target (the median of its last polls) and the polls it took to reach 0.8× that.
The hook must get there within 5× those polls. Counted in polls, never in seconds. Figures at a larger scale:
``benchmarks/hook_ramp.py``.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from model_concurrency import map_concurrent, register_model, reset_runtimes, resolve_capacity
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_processes
from model_concurrency.runtime import ModelRuntime, runtime_for

FLOOR, CEILING, POLL_S, GATE_POLLS = 4, 64, 0.05, 24
# (preset, max_num_seqs, time_scale, endpoint, body): fast calls on an engine with room above the floor.
ENGINES = {
    "bge-m3": ("bge-m3", 32, 1.0, "/embeddings", lambda model, i: {"model": model, "input": f"text {i}"}),
    "llama": ("llama-8b-h100", 64, 20.0, "/completions", lambda m, i: {"model": m, "prompt": f"{i}", "max_tokens": 8}),
}


def targets_by_poll(runtime: ModelRuntime, seen: dict[int, int]) -> None:
    seen[runtime.core.polls] = runtime.current()


def first_poll_at(seen: dict[int, int], want: float) -> int | None:
    return next((poll for poll in sorted(seen) if seen[poll] >= want), None)


def gate_run(emu: RunningEmulator, body: Any, path: str) -> dict[int, int]:
    runtime, seen = runtime_for("m"), {0: FLOOR}

    async def items() -> AsyncIterator[int]:
        i = 0
        while runtime.core.polls < GATE_POLLS:
            targets_by_poll(runtime, seen)
            yield i
            i += 1

    async def main() -> None:
        async with httpx.AsyncClient(base_url=emu.base_url, timeout=60) as client:

            async def call(i: int) -> None:
                (await client.post(path, json=body(emu.model, i))).raise_for_status()

            await map_concurrent(items(), call, model="m")

    asyncio.run(main())
    targets_by_poll(runtime, seen)
    return seen


def hook_run(emu: RunningEmulator, body: Any, path: str, want: float, budget: int) -> dict[int, int]:
    runtime, seen = runtime_for("m"), {0: FLOOR}
    with httpx.Client(base_url=emu.base_url, timeout=60, limits=httpx.Limits(max_connections=CEILING)) as client:

        def call(i: int) -> None:
            client.post(path, json=body(emu.model, i)).raise_for_status()

        while runtime.current() < want and runtime.core.polls <= budget:
            size = resolve_capacity("m")  # the caller's only contact with the library
            targets_by_poll(runtime, seen)
            with ThreadPoolExecutor(max_workers=size) as pool:
                list(pool.map(call, range(size)))
    targets_by_poll(runtime, seen)
    return seen


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_resolve_capacity_alone_ramps_like_map_concurrent(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    preset, seqs, scale, path, body = ENGINES[engine]
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", str(POLL_S))
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", str(CEILING))
    config = EmulatorConfig(preset=preset, max_num_seqs=seqs, time_scale=scale, simulate_frontend=False)
    with serve_in_processes(config) as emu:
        register_model("m", base_url=emu.base_url, served_model_name=emu.model, max_parallel_calls=FLOOR)
        gate = gate_run(emu, body, path)
        settled = statistics.median([gate[p] for p in sorted(gate)[-GATE_POLLS // 3 :]])
        want = 0.8 * settled
        gate_polls = first_poll_at(gate, want)
        assert settled > 2 * FLOOR and gate_polls is not None, gate
        reset_runtimes()
        budget = 5 * gate_polls
        hook = hook_run(emu, body, path, want, budget)
        reset_runtimes()  # no poller outlives the emulator
    hook_polls = first_poll_at(hook, want)
    print(f"{engine}: map_concurrent settled {settled} ({gate_polls} polls to 0.8x); hook {hook_polls} polls")
    assert hook_polls is not None and hook_polls <= budget, hook
