"""Each rejection style the emulator speaks (``--max-num-queued-reqs``, ``--reject-style``) through every entry
point (the httpx transport, ``slot``, ``map_concurrent``, ``map_concurrent_sync``, the wrapped OpenAI client) over
real loopback HTTP: the verdict of gate/outcome.py applied by the one path of gate/rejections.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from model_concurrency import map_concurrent, map_concurrent_sync, slot
from model_concurrency.config import register_model
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.emulator.rejections import REJECT_STYLES
from model_concurrency.integrations.httpx import SlotTransport
from model_concurrency.integrations.openai import wrap
from model_concurrency.runtime import ModelRuntime, install_runtime, reset_runtimes, runtime_for
from model_concurrency.signals.source import ClientOnlySource

HELD = 40  # calls in flight when the refusal comes back: a cut leaves int(0.9 x 40) = 36, a gentle one 37
START = 64

# style -> (status, target after the refusal, Retry-After holds, counted throttled)
EXPECTED = {
    "vllm": (503, 36, 0, 1),
    "sglang": (503, 36, 0, 1),
    "llm-d": (429, 36, 0, 1),
    "llm-d-ttl": (503, 37, 0, 1),
    "llm-d-evicted": (429, START, 0, 0),
    "dynamo": (529, 36, 0, 1),
    "openai": (429, 36, 1, 1),
    "anthropic": (429, 36, 1, 1),
}


def fresh_runtime() -> ModelRuntime:
    reset_runtimes()
    register_model("m", base_url=None, max_parallel_calls=4)
    runtime = install_runtime(ModelRuntime(runtime_for("m").spec, name="m", source=ClientOnlySource()))
    runtime.core.target_value = float(START)
    runtime.apply_limits()
    return runtime


def via_transport(emu: RunningEmulator) -> int:
    with httpx.Client(transport=SlotTransport(model="m"), timeout=10) as client:
        return client.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": "x"}).status_code


def _post(emu: RunningEmulator) -> None:
    httpx.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": "x"}, timeout=10).raise_for_status()


def via_slot(emu: RunningEmulator) -> int:
    with pytest.raises(httpx.HTTPStatusError) as caught, slot("m"):
        _post(emu)
    return caught.value.response.status_code


def via_map_sync(emu: RunningEmulator) -> int:
    [error] = map_concurrent_sync([0], lambda _: _post(emu), model="m", return_exceptions=True)
    assert isinstance(error, httpx.HTTPStatusError)
    return error.response.status_code


def via_map_async(emu: RunningEmulator) -> int:
    async def call(_: int) -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": "x"})
            response.raise_for_status()

    [error] = asyncio.run(map_concurrent([0], call, model="m", return_exceptions=True))
    assert isinstance(error, httpx.HTTPStatusError)
    return error.response.status_code


def via_openai(emu: RunningEmulator) -> int:
    client = wrap(openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0), model="m")
    with pytest.raises(openai.APIStatusError) as caught:
        client.embeddings.create(model=emu.model, input="x")
    return caught.value.status_code


ENTRIES: list[Callable[[RunningEmulator], int]] = [via_transport, via_slot, via_map_sync, via_map_async, via_openai]


@contextlib.contextmanager
def refusing(style: str) -> Iterator[RunningEmulator]:
    config = EmulatorConfig(preset="bge-m3", max_num_queued_reqs=0, reject_style=style, reject_retry_after_s=0.05)
    with serve_in_thread(config) as emu:
        yield emu


@pytest.mark.parametrize("style", REJECT_STYLES)
def test_each_style_through_each_entry_point(style: str) -> None:
    status, target, holds, throttled = EXPECTED[style]
    with refusing(style) as emu:
        for entry in ENTRIES:
            runtime = fresh_runtime()
            with contextlib.ExitStack() as stack:
                for _ in range(HELD):
                    stack.enter_context(slot("m"))
                assert entry(emu) == status, entry.__name__
                assert (runtime.current(), runtime.limiter.hold.holds) == (target, holds), entry.__name__
            assert runtime.calls.drain().throttled == throttled, entry.__name__


def test_refusals_of_one_flight_cut_once() -> None:
    """Eight calls sent together, all refused: one cut (0.9 x the 40 others in flight, then no more), not 0.9^8."""
    runtime = fresh_runtime()
    with refusing("vllm") as emu, contextlib.ExitStack() as stack:
        for _ in range(HELD):
            stack.enter_context(slot("m"))

        async def call(_: int) -> int:
            async with httpx.AsyncClient(timeout=10) as client:
                response = await client.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": "x"})
                return response.status_code

        async def burst() -> list[int]:
            async def one(i: int) -> int:
                async with slot("m"):
                    await asyncio.sleep(0.05)  # all eight are sent before the first refusal comes back
                    status = await call(i)
                    if status >= 400:
                        raise httpx.HTTPStatusError(
                            "refused", request=httpx.Request("POST", "http://x"), response=httpx.Response(status)
                        )
                    return status

            return await asyncio.gather(*(one(i) for i in range(8)), return_exceptions=True)  # type: ignore[arg-type]

        outcomes = asyncio.run(burst())
        assert all(isinstance(o, httpx.HTTPStatusError) for o in outcomes)
        assert (runtime.limiter.flights.cuts, runtime.limiter.flights.ignored) == (1, 7)
        assert runtime.current() >= 36  # one cut at >= 40 still in flight; 0.9^8 x 64 would be 27


def test_queue_cap_admits_up_to_the_cap() -> None:
    """Without a cap nothing is refused; with one, calls past it are (503, vLLM's style) and the rest served."""
    fresh_runtime()
    with serve_in_thread(EmulatorConfig(preset="bge-m3")) as emu:
        assert via_transport(emu) == 200
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=1, max_num_queued_reqs=2)
    with serve_in_thread(config) as emu:
        emu.set_capacity(speed=0.01)  # each call holds the one sequence long enough for the others to queue

        async def main() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"model": emu.model, "input": "x"}
                responses = await asyncio.gather(
                    *(client.post(f"{emu.base_url}/embeddings", json=body) for _ in range(8))
                )
                return sorted(r.status_code for r in responses)

        statuses = asyncio.run(main())
        assert set(statuses) == {200, 503}
        # The two the queue holds are always admitted; a third when the first was already running as the rest
        # arrived (the eight race the engine's first step, so it may not be).
        assert statuses.count(200) >= 2
