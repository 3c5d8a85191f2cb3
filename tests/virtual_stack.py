"""The production stack on virtual time, for tests whose claim must not depend on how fast this machine runs.

A poll every 0.05 s on the wall clock reads a CPU-starved interval (few calls came back, the engine looked idle)
as the engine's doing, and the policy answers it as it should: the growth guard holds, or a cut follows. Such a
test passes on an idle machine and fails on a loaded one. Here time is the loop's (:mod:`model_concurrency.lab.
virtual_loop`): the clock jumps to the next timer when nothing is ready and never past a poll that is due, so an
interval holds the same calls however slow the machine is. The parts are production's: ``map_concurrent``,
``resolve_capacity``, a :class:`~model_concurrency.runtime.ModelRuntime` on the loop's clock, and either the
emulator's ASGI app over its engine model (:func:`emulator_app`) or a real loopback ``/metrics`` server read by
the runtime's own source.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from model_concurrency.config import get_model
from model_concurrency.emulator import EmulatorConfig
from model_concurrency.emulator.app import Emulator, create_app
from model_concurrency.emulator.links import LocalLink
from model_concurrency.lab.conformance import AsgiMetricsSource
from model_concurrency.lab.virtual_loop import VirtualTimeLoop, run_virtual
from model_concurrency.runtime import ModelRuntime, install_runtime
from model_concurrency.signals.source import SignalSource

__all__ = ["BASE", "VirtualEmulator", "emulator_app", "install_on_loop", "run_virtual"]

BASE = "http://emulator"


@dataclass
class VirtualEmulator:
    """The emulator app in this loop: ``client`` posts to it (paths under ``/v1``); ``source`` reads its page."""

    client: httpx.AsyncClient
    model: str
    source: AsgiMetricsSource
    link: LocalLink


Wrap = Callable[[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport]


@asynccontextmanager
async def emulator_app(
    loop: VirtualTimeLoop, config: EmulatorConfig, *, wrap: Wrap | None = None
) -> AsyncIterator[VirtualEmulator]:
    """``wrap``: a transport around the app's (a fault in front of it: refused connections, an outage)."""
    link = LocalLink(config, clock=loop.time)
    app = create_app(emulator=Emulator(config, link=link))
    transport: httpx.AsyncBaseTransport = httpx.ASGITransport(app=app)
    if wrap is not None:
        transport = wrap(transport)
    async with httpx.AsyncClient(transport=transport, base_url=BASE, timeout=None) as client:
        try:
            yield VirtualEmulator(client, link.model_name, AsgiMetricsSource(client, loop, link.model_name), link)
        finally:
            await link.stop()


def install_on_loop(loop: VirtualTimeLoop, name: str, source: SignalSource | None = None) -> ModelRuntime:
    """``name``'s runtime on the loop's clock (its registered source unless ``source`` is given), installed for
    every entry point. Its scheduled poller is a task on the loop (``poll_loop``), not a thread: a thread's
    waits are real, so where its poll landed among the loop's callbacks (how many calls had come back, which
    were admitted) varied from run to run; a task's are the loop's timers. The poll jitter's stream is seeded,
    so a run is the same every time (with a seeded ``RetryPolicy`` where the test retries)."""
    runtime = ModelRuntime(get_model(name), source=source, clock=loop.time, poll_loop=loop)
    runtime.core.jitter_rng = random.Random(0)
    loop.add_barrier(runtime.scheduled_poll_at)  # a poll under way holds the clock (its page may be real I/O)
    return install_runtime(runtime)
