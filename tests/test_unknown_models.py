"""Unknown models are loud where it costs nothing: the fan-outs and ``slot`` raise an error naming the registered
models unless asked for the floor; ``resolve_capacity`` never raises; ``adaptive_capacity`` rejects a negative
floor."""

from __future__ import annotations

import asyncio

import pytest

import model_concurrency
from model_concurrency import (
    UnknownModelError,
    adaptive_capacity,
    imap_concurrent,
    map_concurrent,
    map_concurrent_sync,
    register_model,
    resolve_capacity,
    slot,
)
from model_concurrency.runtime import ModelRuntime, install_runtime

MESSAGE = r"model 'bge-m4' is not registered \(registered: bge-m3, llama\).*allow_unregistered=True"


@pytest.fixture(autouse=True)
def two_models() -> None:
    register_model("bge-m3", base_url=None, max_parallel_calls=4)
    register_model("llama", base_url=None, max_parallel_calls=4)


def test_the_error_is_a_value_error_exported_from_the_root() -> None:
    assert "UnknownModelError" in model_concurrency.__all__ and issubclass(UnknownModelError, ValueError)


def test_map_concurrent_sync_raises_before_running_anything() -> None:
    ran: list[int] = []
    with pytest.raises(UnknownModelError, match=MESSAGE) as caught:
        map_concurrent_sync(range(5), ran.append, model="bge-m4")
    assert ran == [] and caught.value.model == "bge-m4" and caught.value.registered == ("bge-m3", "llama")


def test_map_concurrent_and_imap_concurrent_raise() -> None:
    async def main() -> None:
        with pytest.raises(UnknownModelError, match=MESSAGE):
            await map_concurrent(range(5), lambda x: x, model="bge-m4")
        with pytest.raises(UnknownModelError, match=MESSAGE):
            async for _ in imap_concurrent(range(5), lambda x: x, model="bge-m4"):
                pass

    asyncio.run(main())


def test_slot_raises_sync_and_async() -> None:
    with pytest.raises(UnknownModelError, match=MESSAGE), slot("bge-m4"):
        pass

    async def main() -> None:
        with pytest.raises(UnknownModelError, match=MESSAGE):
            async with slot("bge-m4"):
                pass

    asyncio.run(main())


def test_asking_for_the_floor_runs_at_capacity_one() -> None:
    peak = [0, 0]

    def call(x: int) -> int:
        peak[0] += 1
        peak[1] = max(peak)
        peak[0] -= 1
        return x

    assert map_concurrent_sync(range(6), call, model="bge-m4", allow_unregistered=True) == list(range(6))
    with slot("bge-m4", allow_unregistered=True) as held:
        assert held.runtime is not None and held.runtime.current() == 1
    assert asyncio.run(map_concurrent(range(3), lambda x: x, model="bge-m4", allow_unregistered=True)) == [0, 1, 2]


def test_what_never_raises() -> None:
    assert resolve_capacity("bge-m4") == 1  # the hook keeps its contract
    assert map_concurrent_sync(range(3), lambda x: x) == [0, 1, 2]  # no name: nothing asked for in particular
    assert map_concurrent_sync(range(3), lambda x: x, model="bge-m4", capacity=2) == [0, 1, 2]  # its own capacity
    install_runtime(ModelRuntime(None, name="installed"))  # known to the runtimes without a spec
    assert map_concurrent_sync(range(3), lambda x: x, model="installed") == [0, 1, 2]


def test_adaptive_capacity_rejects_a_negative_floor() -> None:
    with pytest.raises(ValueError, match="floor must be >= 0"):
        adaptive_capacity("bge-m3", -1)
    assert adaptive_capacity("bge-m3", 0) == 1 and adaptive_capacity("bge-m3", 6) == 6
