"""The hooks a fan-out calls: how many calls may ``model`` have in flight right now?

``resolve_capacity(model)`` is the one an application uses: the static capacity as the floor, raised by the
adaptive controller when the flag is on and the model has a metrics endpoint. It never raises: an unknown model
gets 1 (with one warning per name), a broken endpoint keeps its last good target through the grace polls and
then for as long as this process's own calls look healthy (the floor as soon as they do not: failed or throttled
calls, latency past its baseline, nothing finished; docs/operations.md), the flag off gets exactly the static
path with no scrape at all.

Used alone, with nothing in this process counting the model's calls in flight (no ``map_concurrent``, no
``slot``), the hook's runtime judges use from the engine's ``running``, as the original hook did, and logs that
once. With the gate or ``slot`` in use, the limiter's own count (its peak over each interval) is what counts.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from model_concurrency import config, telemetry
from model_concurrency.config import get_model, registered_models, setting
from model_concurrency.runtime import (
    ModelRuntime,
    adaptive_enabled,
    atarget_or_floor,
    on_reset,
    runtime_for,
    target_or_floor,
)

__all__ = [
    "adaptive_capacity",
    "aresolve_capacity",
    "controller_for",
    "get_all_utilization",
    "get_utilization",
    "resolve_capacity",
    "static_capacity",
    "warn_unknown",
]

log = logging.getLogger("model_concurrency")
_warned_unknown: set[str] = set()
on_reset(_warned_unknown.clear)  # a reset process warns again


def warn_unknown(model: str | None) -> None:
    """One warning per unknown model name: a typo otherwise silently runs at capacity 1."""
    if model is None:  # no name given: the caller asked for nothing in particular
        return
    key = model
    if key not in _warned_unknown:
        _warned_unknown.add(key)
        known = ", ".join(sorted(registered_models())) or "none"
        log.warning("model %r is not registered (known: %s); using capacity 1", key, known)


def static_capacity(model: str | None) -> int:
    """The configured capacity (``parallel_instances x max_parallel_calls``); 1 for an unknown model."""
    spec = get_model(model)
    return spec.static_capacity if spec is not None else 1


def controller_for(model: str | None, floor: int | None = None) -> ModelRuntime | None:
    """The model's runtime when the adaptive path applies (flag on, known model, a source); else None."""
    if not adaptive_enabled():
        return None
    if get_model(model) is None:
        warn_unknown(model)
        return None
    runtime = runtime_for(model)
    if runtime.source is None:
        return None
    if floor is not None and floor != runtime.floor:
        runtime.set_floor(floor)
    return runtime


def _floor_on_error(model: str | None, floor: int, read: Callable[[ModelRuntime], int]) -> int:
    def adaptive() -> int:
        runtime = controller_for(model, floor)
        return read(runtime) if runtime is not None else floor

    return target_or_floor(model, floor, adaptive)


async def _afloor_on_error(model: str | None, floor: int, read: Callable[[ModelRuntime], Awaitable[int]]) -> int:
    async def adaptive() -> int:
        runtime = controller_for(model, floor)
        return await read(runtime) if runtime is not None else floor

    return await atarget_or_floor(model, floor, adaptive)


def _asked(runtime: ModelRuntime) -> int:
    target = runtime.target()  # a due poll runs here first, so the answer reflects it
    runtime.asked()
    return target


async def _aasked(runtime: ModelRuntime) -> int:
    target = await runtime.atarget()
    runtime.asked()
    return target


def adaptive_capacity(model: str | None, floor: int) -> int:
    """The adaptive target for ``model`` with ``floor`` as its lower bound; ``floor`` on the static path.

    Asking also keeps the model polled on schedule for a while, so a pool sized from this answer is sampled
    while it runs, not only at the moments the caller asks (which are when its calls have finished).
    """
    return _floor_on_error(model, max(1, int(floor)), _asked)


def resolve_capacity(model: str | None) -> int:
    """Static capacity as the floor, raised by the adaptive controller when enabled."""
    return adaptive_capacity(model, static_capacity(model))


async def aresolve_capacity(model: str | None) -> int:
    """:func:`resolve_capacity` for event loops: a due poll is awaited, never run on the loop's thread."""
    return await _afloor_on_error(model, static_capacity(model), _aasked)


def get_utilization(model: str | None) -> dict[str, Any]:
    """What the controller last saw and decided for ``model``; a static view when no controller applies."""
    spec = get_model(model)
    floor = spec.static_capacity if spec is not None else 1
    runtime = controller_for(model, floor)
    if runtime is not None:
        return telemetry.snapshot(runtime)
    name = spec.name if spec is not None else model
    ceiling = max(floor, setting(*config.MAX_CONCURRENCY))
    return {
        "model": name,
        "served_model_name": spec.served_name if spec else None,
        "running": None,
        "waiting": None,
        "waiting_capacity": None,
        "kv_cache_usage": None,
        "inflight": 0,
        "current_target": floor,
        "floor": floor,
        "ceiling": ceiling,
        "metrics_ok": None,
        "saturated": False,
        "gateway_saturation": None,
        "gateway_saturated": None,
        "page_hold": None,
        "last_poll": None,
        "consecutive_failures": 0,
        "last_error": None,
        "metrics_url": spec.resolved_metrics_url if spec else None,
        "policy": "static",
        "adaptive": False,
    }


def get_all_utilization() -> dict[str, dict[str, Any]]:
    """One snapshot of every registered model, for dashboards."""
    return {name: get_utilization(name) for name in registered_models()}
