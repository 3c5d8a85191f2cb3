"""Each rejection style the emulator speaks (``--max-num-queued-reqs``, ``--reject-style``) through every entry
point (the httpx transport, ``slot``, ``map_concurrent``, ``map_concurrent_sync``, the wrapped OpenAI client) over
real loopback HTTP: the verdict of gate/outcome.py applied by the one path of gate/rejections.py."""

from __future__ import annotations

import asyncio
import contextlib
import math
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
from model_concurrency.signals.vllm import parse_vllm_metrics

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
    runtime.core.next_poll_at = math.inf  # no background poll drains the call counts or moves the target
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
    """Without a cap nothing is refused. With ``--max-num-seqs 1 --max-num-queued-reqs 2``, over real sockets:
    one long generation holds the only sequence (8,000 tokens: about a minute of engine time), then eight calls
    are sent at once. Exactly the cap's two are queued and later served; the other six are refused at once with
    vLLM's 503. Counted once the holder runs (seen on /metrics), so no arrival order or machine speed can change
    it; breaks if the cap counts running requests, admits past it, or refuses in another style."""
    fresh_runtime()
    with serve_in_thread(EmulatorConfig(preset="bge-m3")) as emu:
        assert via_transport(emu) == 200
    config = EmulatorConfig(preset="llama-8b-h100", max_num_seqs=1, max_num_queued_reqs=2)
    with serve_in_thread(config) as emu:

        async def main() -> tuple[list[int], list[int]]:
            async with httpx.AsyncClient(timeout=60) as client:
                url = f"{emu.base_url}/completions"
                body = {"model": emu.model, "prompt": "x", "max_tokens": 8000, "ignore_eos": True}
                holder = asyncio.ensure_future(client.post(url, json=body))
                while parse_vllm_metrics((await client.get(emu.metrics_url)).text, emu.model).running < 1:
                    await asyncio.sleep(0.01)
                body = {"model": emu.model, "prompt": "y", "max_tokens": 4}
                calls = [asyncio.ensure_future(client.post(url, json=body)) for _ in range(8)]
                for _ in range(3000):  # until six answered (at most 30 s; the holder runs for about a minute)
                    if sum(c.done() for c in calls) >= 6:
                        break
                    await asyncio.sleep(0.01)
                early = sorted(c.result().status_code for c in calls if c.done())
                holder.cancel()  # the client goes away: the engine aborts it and the queued two run
                with contextlib.suppress(asyncio.CancelledError):
                    await holder
                return early, sorted(r.status_code for r in await asyncio.gather(*calls))

        early, statuses = asyncio.run(main())
        assert early == [503] * 6  # refused at once, while the two queued still wait for the sequence
        assert statuses == [200] * 2 + [503] * 6
