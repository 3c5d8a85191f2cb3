"""End to end: map_concurrent with the adaptive controller against an emulator whose capacity is raised mid-run.

The emulator runs on a slowed clock (one bge-m3 step lasts a few hundred milliseconds of wall time) so the engine,
not the loopback HTTP stack, is what limits throughput, and the controller polls every 0.2 s. No assertion is
about timing: the run continues until the target has answered the raise (or a generous item budget runs out).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from model_concurrency import hooks, map_concurrent, register_model
from model_concurrency.emulator import EmulatorConfig, serve_in_thread
from model_concurrency.emulator.openai_shapes import embedding_vector

OLD, NEW, CEILING, FLOOR = 16, 48, 64, 2


def text(i: int) -> str:
    return f"item {i} lorem"


def test_target_follows_a_capacity_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0.2")
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", str(CEILING))
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=OLD, time_scale=0.015, simulate_frontend=False)
    with serve_in_thread(config) as emu:
        register_model("bge-m3", base_url=emu.base_url, served_model_name=emu.model, max_parallel_calls=FLOOR)
        before: list[int] = []
        after: list[int] = []
        raised = asyncio.Event()

        def target() -> int:
            return int(hooks.get_utilization("bge-m3")["current_target"])

        async def items() -> AsyncIterator[int]:
            i, reached_at = 0, None
            async with httpx.AsyncClient() as admin:
                while i < 5000:
                    if not raised.is_set() and i >= 150 and max(before, default=0) >= 0.75 * OLD:
                        (await admin.post(f"{emu.url}/admin/capacity", json={"max_num_seqs": NEW})).raise_for_status()
                        raised.set()
                    if raised.is_set() and reached_at is None and max(after, default=0) >= 0.7 * NEW:
                        reached_at = i
                    if reached_at is not None and i >= reached_at + 100:
                        return
                    yield i
                    i += 1

        async def sample() -> None:
            while True:
                (after if raised.is_set() else before).append(target())
                await asyncio.sleep(0.02)

        async def main() -> list[list[float]]:
            async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=CEILING)) as client:

                async def embed(i: int) -> list[float]:
                    r = await client.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": text(i)})
                    r.raise_for_status()
                    vector: list[float] = r.json()["data"][0]["embedding"]
                    return vector

                sampler = asyncio.ensure_future(sample())
                try:
                    return await map_concurrent(items(), embed, model="bge-m3")
                finally:
                    sampler.cancel()

        results = asyncio.run(main())

    assert raised.is_set(), f"phase 1 never reached the old capacity's neighbourhood: max {max(before)}"
    assert max(before) >= 0.75 * OLD
    assert max(after) >= 0.7 * NEW, f"target did not climb after the raise: {after[-10:]}"
    assert max(before + after) <= CEILING
    assert min(before + after) >= FLOOR
    assert len(results) >= 250
    for i, vector in enumerate(results):
        assert vector == pytest.approx(embedding_vector(text(i).encode(), 16)), f"item {i} out of order"
