"""Shared helpers for the engine tests: tiny presets with round numbers, closed loops, invariant checks."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from model_concurrency.engine import Engine, EnginePreset, Request, RequestState, StepTimeModel


def tiny_preset(**changes: Any) -> EnginePreset:
    """10 ms per step whatever it holds, unless ``step`` says otherwise: easy to compute by hand."""
    base = EnginePreset(
        name="tiny",
        model_name="org/tiny-model-1.0",
        step=StepTimeModel(a_ms=10.0, b_ms_per_token=0.0),
        max_num_seqs=4,
        max_num_batched_tokens=64,
        num_gpu_blocks=1001,
    )
    return base.replace(**changes)


def closed_loop(
    env: simpy.Environment,
    target: Any,
    concurrency: int,
    make: Callable[[], Request],
    finished: list[Request],
) -> None:
    """``concurrency`` clients, each submitting a new request as soon as its previous one finishes."""

    def client() -> Generator[Any, Any, None]:
        while True:
            request = yield target.submit(make())
            finished.append(request)

    for _ in range(concurrency):
        env.process(client())


def held_blocks(engine: Engine) -> int:
    """KV blocks the running requests hold, recomputed from scratch.

    Mid-step, each decode already holds the block for the token being computed, so count one token more.
    """
    total = 0
    extra = 1 if engine._stepping else 0
    for r in engine.running:
        if r.state == RequestState.DECODE:
            computed, _ = engine.progress(r)
            total += -(-(computed + extra) // engine.block_size)
        else:
            total += r.blocks
    return total


def check_invariants(engine: Engine) -> None:
    assert held_blocks(engine) + engine.free_blocks == engine.num_gpu_blocks - 1
    assert all(r.state == RequestState.WAITING for r in engine.waiting)
    assert all(r.state in (RequestState.PREFILL, RequestState.DECODE) for r in engine.running)
    assert set(engine.prefilling) == {r for r in engine.running if r.state == RequestState.PREFILL}
    for r in engine.running:
        computed, generated = engine.progress(r)
        if r.state == RequestState.DECODE:
            assert computed == r.prompt_tokens + generated - 1
            assert 1 <= generated < r.output_tokens
