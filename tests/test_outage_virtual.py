"""The outage rule's timing through map_concurrent, exactly, on virtual time (lab/virtual_loop.py).

tests/test_outage_hold.py proves the rule over real sockets (a refused port, a server that comes up); how many
probes fit before the server is back depends there on how fast the machine runs. Here the same stack
(``map_concurrent``, the model's runtime on ``loop.time``, httpx) runs on a clock that jumps, and the model is the
emulator's ASGI app behind a transport that refuses connections while it is "down" (raising the very
``httpx.ConnectError`` a refused socket gives), so the probe times, the backoff and the counts are exact.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fault_servers import Fixed
from model_concurrency import gate_stats, map_concurrent
from model_concurrency.config import register_model
from model_concurrency.emulator import EmulatorConfig
from model_concurrency.gate.hold import FIRST_PROBE_S
from model_concurrency.gate.outage import ModelUnreachable
from model_concurrency.lab.virtual_loop import VirtualTimeLoop
from model_concurrency.runtime import ModelRuntime
from model_concurrency.signals.source import ClientOnlySource
from virtual_stack import emulator_app, install_on_loop, run_virtual

ITEMS = 40
TARGET = 16  # kept by a fixed policy: the limit after the outage is exactly the one before it
CONNECT_S = 0.001  # a refused connect still costs a loopback round trip: the wave's calls are all sent before it


class Downable(httpx.AsyncBaseTransport):
    """In front of the emulator's app: refuses connections until ``up_at`` (virtual seconds), records each
    attempt's time."""

    def __init__(self, inner: httpx.AsyncBaseTransport, loop: asyncio.AbstractEventLoop, up_at: float) -> None:
        self.inner, self.loop, self.up_at = inner, loop, up_at
        self.refused: list[float] = []
        self.served: list[float] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        now = self.loop.time()
        await asyncio.sleep(CONNECT_S)
        if now < self.up_at:
            self.refused.append(now)
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        self.served.append(now)
        return await self.inner.handle_async_request(request)


def fan_out(up_at: float, **kwargs: object) -> tuple[list[object], Downable, ModelRuntime]:
    """ITEMS embeddings through map_concurrent against an emulator that is down until ``up_at``."""

    async def main(loop: VirtualTimeLoop) -> tuple[list[object], Downable, ModelRuntime]:
        register_model("m", base_url=None, max_parallel_calls=4, policy=Fixed(TARGET))
        runtime = install_on_loop(loop, "m", source=ClientOnlySource())
        runtime.core.target_value = float(TARGET)
        runtime.apply_limits()
        downable: list[Downable] = []

        def wrap(inner: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
            downable.append(Downable(inner, loop, up_at))
            return downable[0]

        async with emulator_app(loop, EmulatorConfig(preset="bge-m3"), wrap=wrap) as emu:

            async def call(i: int) -> int:
                response = await emu.client.post("/v1/embeddings", json={"model": emu.model, "input": f"x{i}"})
                response.raise_for_status()
                return i

            results = await map_concurrent(range(ITEMS), call, model="m", **kwargs)  # type: ignore[call-overload]
        return results, downable[0], runtime

    return run_virtual(main)


def test_one_probe_at_a_time_with_backoff_then_the_target_back() -> None:
    """Down until 0.5 s: the first wave (the target's 16) is refused at t = 0; the outage opens at the first
    refusal and pins the limit to 1; one probe at 0.25 s (refused: backoff 0.5 s), the next at 0.75 s succeeds,
    and the limit is back at 16 for the rest. With ``retries=`` every item succeeds. Breaks if the wave's other
    refusals are counted as failed probes, if more than one probe goes out at a time, if the backoff is not
    0.25 → 0.5 s, or if the target is not restored."""
    results, transport, runtime = fan_out(0.5, retries=4)
    assert results == list(range(ITEMS))
    first_probe = CONNECT_S + FIRST_PROBE_S
    second_probe = first_probe + CONNECT_S + 2 * FIRST_PROBE_S
    assert transport.refused == [0.0] * TARGET + [pytest.approx(first_probe)]
    assert transport.served[0] == pytest.approx(second_probe)
    outage = runtime.limiter.hold.outage
    assert (outage.opened, outage.probes_failed, outage.active, runtime.limiter.limit) == (1, 1, False, TARGET)
    assert gate_stats("m").errors == TARGET + 1


def test_without_retries_only_the_wave_and_the_probe_fail() -> None:
    """The same outage without ``retries=``: exactly the 16 calls in flight when it broke and the one failed
    probe fail; the other 23 items waited and succeeded (without the hold all 40 would have been refused)."""
    results, transport, _ = fan_out(0.5, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(failed) == TARGET + 1 and all(isinstance(e, httpx.ConnectError) for e in failed)
    assert [r for r in results if not isinstance(r, BaseException)] == [
        i for i, r in enumerate(results) if not isinstance(r, BaseException)
    ]
    assert len(transport.served) == ITEMS - TARGET - 1


def test_items_fail_with_model_unreachable_after_max_outage_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never up, MODEL_CONCURRENCY_MAX_OUTAGE_S=0.4: the wave and the probe at 0.25 s are refused; no probe is
    sent after 0.4 s (the next would be at 0.75 s); every other item fails unrun with ModelUnreachable."""
    monkeypatch.setenv("MODEL_CONCURRENCY_MAX_OUTAGE_S", "0.4")
    results, transport, _ = fan_out(float("inf"), return_exceptions=True)
    unreachable = [r for r in results if isinstance(r, ModelUnreachable)]
    refused = [r for r in results if isinstance(r, httpx.ConnectError)]
    assert (len(refused), len(unreachable)) == (TARGET + 1, ITEMS - TARGET - 1)
    assert transport.refused[-1] == pytest.approx(CONNECT_S + FIRST_PROBE_S)
    assert "MODEL_CONCURRENCY_MAX_OUTAGE_S" in str(unreachable[0])
    assert gate_stats("m").errors == TARGET + 1
