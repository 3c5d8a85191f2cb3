"""``resolve_capacity`` alone (no gate, no slot) ramps on an embedding engine as on a decoder.

A loop sizes each batch from the hook, as the original design's example did: bge-m3 (an embedding engine, whose
calls spend milliseconds on it and are rarely caught ``running`` at a poll) and a llama decoder.
``map_concurrent`` runs first on the same engine and sets the bar: its settled target (the median of its last
polls) and the polls it took to reach 0.8× that. The hook must get there within 5× those polls. Counted in polls,
never in seconds.

The claim runs twice. On virtual time (the emulator's app over its engine model, tests/virtual_stack.py) it is
exact on any machine: an interval holds the same calls however loaded the machine is. Over real sockets to the
served emulator (an engine process and a front-end process) a CPU-starved client finishes fewer calls than the
engine could, and the growth guard then rightly holds growth that bought nothing, so there the test asks only
what no machine speed excuses: the hook leaves its floor. Figures at a larger scale: ``benchmarks/hook_ramp.py``.
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
from model_concurrency.lab.virtual_loop import VirtualTimeLoop
from model_concurrency.runtime import ModelRuntime, runtime_for
from virtual_stack import VirtualEmulator, emulator_app, install_on_loop, run_virtual

FLOOR, CEILING, GATE_POLLS = 4, 64, 24
Body = Any  # (served model name, item) -> the request's JSON
# (preset, max_num_seqs, time_scale on the wall clock, endpoint, body, poll seconds on virtual time):
# fast calls on an engine with room above the floor.
ENGINES: dict[str, tuple[str, int, float, str, Body, float]] = {
    "bge-m3": ("bge-m3", 32, 1.0, "/embeddings", lambda m, i: {"model": m, "input": f"text {i}"}, 0.05),
    "llama": (
        "llama-8b-h100",
        64,
        20.0,
        "/completions",
        lambda m, i: {"model": m, "prompt": f"{i}", "max_tokens": 32},
        1.0,
    ),
}
WALL_POLL_S = 0.05


def targets_by_poll(runtime: ModelRuntime, seen: dict[int, int]) -> None:
    seen[runtime.core.polls] = runtime.current()


def first_poll_at(seen: dict[int, int], want: float) -> int | None:
    return next((poll for poll in sorted(seen) if seen[poll] >= want), None)


def settled_and_polls(gate: dict[int, int]) -> tuple[float, int]:
    """map_concurrent's bar: the median of its last third of polls, and the first poll at 0.8× that."""
    settled = statistics.median([gate[p] for p in sorted(gate)[-GATE_POLLS // 3 :]])
    gate_polls = first_poll_at(gate, 0.8 * settled)
    assert settled > 2 * FLOOR and gate_polls is not None, gate
    return settled, gate_polls


# -- on virtual time: the exact claim --------------------------------------------------------------------------
async def virtual_gate(emu: VirtualEmulator, runtime: ModelRuntime, path: str, body: Body) -> dict[int, int]:
    seen = {0: FLOOR}

    async def items() -> AsyncIterator[int]:
        i = 0
        while runtime.core.polls < GATE_POLLS:
            targets_by_poll(runtime, seen)
            yield i
            i += 1

    async def call(i: int) -> None:
        (await emu.client.post(f"/v1{path}", json=body(emu.model, i))).raise_for_status()

    await map_concurrent(items(), call, model="m")
    targets_by_poll(runtime, seen)
    return seen


async def virtual_hook(
    emu: VirtualEmulator, runtime: ModelRuntime, path: str, body: Body, want: float, budget: int
) -> dict[int, int]:
    seen = {0: FLOOR}

    async def call(i: int) -> None:
        (await emu.client.post(f"/v1{path}", json=body(emu.model, i))).raise_for_status()

    while runtime.current() < want and runtime.core.polls <= budget:
        size = resolve_capacity("m")  # the caller's only contact with the library
        targets_by_poll(runtime, seen)
        await asyncio.gather(*(call(i) for i in range(size)))
    targets_by_poll(runtime, seen)
    return seen


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_resolve_capacity_alone_ramps_like_map_concurrent(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    preset, seqs, _, path, body, poll_s = ENGINES[engine]
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", str(poll_s))
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_JITTER", "0")  # every poll on its beat: runs repeat
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", str(CEILING))
    config = EmulatorConfig(preset=preset, max_num_seqs=seqs, simulate_frontend=False)
    found: dict[str, Any] = {}

    async def main(loop: VirtualTimeLoop) -> None:
        async with emulator_app(loop, config) as emu:
            register_model(
                "m", base_url=f"{emu.client.base_url}v1", served_model_name=emu.model, max_parallel_calls=FLOOR
            )
            gate = await virtual_gate(emu, install_on_loop(loop, "m", emu.source), path, body)
            settled, gate_polls = settled_and_polls(gate)
            reset_runtimes()
            budget = 5 * gate_polls
            hook = await virtual_hook(emu, install_on_loop(loop, "m", emu.source), path, body, 0.8 * settled, budget)
            reset_runtimes()  # no poller outlives the loop
            found.update(gate=gate, settled=settled, gate_polls=gate_polls, hook=hook, budget=budget)

    run_virtual(main)
    hook_polls = first_poll_at(found["hook"], 0.8 * found["settled"])
    print(f"{engine}: map_concurrent settled {found['settled']} ({found['gate_polls']} polls); hook {hook_polls}")
    assert hook_polls is not None and hook_polls <= found["budget"], found


# -- over real sockets: the hook leaves its floor ----------------------------------------------------------------
def wall_hook(emu: RunningEmulator, body: Body, path: str, want: float, budget: int) -> dict[int, int]:
    runtime, seen = runtime_for("m"), {0: FLOOR}
    with httpx.Client(base_url=emu.base_url, timeout=60, limits=httpx.Limits(max_connections=CEILING)) as client:

        def call(i: int) -> None:
            client.post(path, json=body(emu.model, i)).raise_for_status()

        while runtime.current() < want and runtime.core.polls <= budget:
            size = resolve_capacity("m")
            targets_by_poll(runtime, seen)
            with ThreadPoolExecutor(max_workers=size) as pool:
                list(pool.map(call, range(size)))
    targets_by_poll(runtime, seen)
    return seen


def test_resolve_capacity_alone_leaves_its_floor_on_the_served_embedding_emulator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real processes and sockets: the hook alone grows past twice its floor within the polls map_concurrent is
    given above."""
    preset, seqs, scale, path, body, _ = ENGINES["bge-m3"]
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", str(WALL_POLL_S))
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", str(CEILING))
    config = EmulatorConfig(preset=preset, max_num_seqs=seqs, time_scale=scale, simulate_frontend=False)
    with serve_in_processes(config) as emu:
        register_model("m", base_url=emu.base_url, served_model_name=emu.model, max_parallel_calls=FLOOR)
        hook = wall_hook(emu, body, path, 2 * FLOOR + 1, GATE_POLLS)
        reset_runtimes()  # no poller outlives the emulator
    grown = first_poll_at(hook, 2 * FLOOR + 1)
    assert grown is not None and grown <= GATE_POLLS, hook
