"""The hooks a fan-out calls: how many calls may ``model`` have in flight right now?

``resolve_capacity(model)`` is the one an application uses: the static capacity as the floor, raised by the
adaptive controller when the flag is on and the model has a metrics endpoint. It never raises: an unknown model
gets 1 (with one warning per name), a broken endpoint keeps its last good target through the grace polls and
then for as long as this process's own calls look healthy (the floor as soon as they do not: failed or throttled
calls, latency past its baseline, nothing finished; docs/operations.md), the flag off gets exactly the static
path with no scrape at all.

Used alone, with nothing in this process counting the model's calls in flight (no ``map_concurrent``, no
``slot``), the hook's runtime judges use from the engine, and logs that once: ``running`` at the poll, and over
each interval the engine's completions and their e2e latency (Little's law) and the calls finished per answer
the hook gave (``runtime.engine_view``), so a pool of short embedding calls, rarely caught running, still counts
as used. With the gate or ``slot`` in use, the limiter's own count (its peak over each interval) is what counts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from model_concurrency import config
from model_concurrency.config import UnknownModelError, get_model, registered_models, setting
from model_concurrency.decision import static_limit
from model_concurrency.runtime import (
    ModelRuntime,
    adaptive_enabled,
    atarget_or_floor,
    is_installed,
    on_reset,
    runtime_for,
    target_or_floor,
)
from model_concurrency.state import RuntimeState

__all__ = [
    "adaptive_capacity",
    "aresolve_capacity",
    "check_registered",
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


def check_registered(model: str | None, allow_unregistered: bool, *, pinned: bool = False) -> None:
    """The fan-outs' and ``slot``'s rule for a name the registry does not know: :class:`UnknownModelError`
    naming the registered ones, or with ``allow_unregistered`` the floor (capacity 1) and one warning per name.

    Known means registered (``register_model``, the config file) or given a runtime by ``install_runtime``. No name
    (None) asks for the ``default`` role and nothing in particular, and a fan-out with a ``capacity`` of its own
    (``pinned``) does not depend on the name's limit: neither raises, since a typo there costs nothing."""
    if model is None or get_model(model) is not None or is_installed(model):
        return
    if not (allow_unregistered or pinned):
        raise UnknownModelError(model, registered_models())
    warn_unknown(model)


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
    while it runs, not only at the moments the caller asks (which are when its calls have finished). A negative
    ``floor`` is a ``ValueError`` (the caller's bug); anything else about the model never raises.
    """
    if floor < 0:
        raise ValueError(f"adaptive_capacity: floor must be >= 0 (0 and 1 both mean a floor of 1), got {floor!r}")
    return _floor_on_error(model, max(1, int(floor)), _asked)


def resolve_capacity(model: str | None) -> int:
    """Static capacity as the floor, raised by the adaptive controller when enabled."""
    return adaptive_capacity(model, static_capacity(model))


async def aresolve_capacity(model: str | None) -> int:
    """:func:`resolve_capacity` for event loops: a due poll is awaited, never run on the loop's thread."""
    return await _afloor_on_error(model, static_capacity(model), _aasked)


def get_utilization(model: str | None) -> dict[str, Any]:
    """What the controller last saw and decided for ``model``; a static view when no controller applies.

    Either way the same keys: the :class:`~model_concurrency.state.RuntimeState` the model's runtime publishes,
    as a dict."""
    spec = get_model(model)
    floor = spec.static_capacity if spec is not None else 1
    runtime = controller_for(model, floor)
    if runtime is not None:
        return runtime.state().as_dict()
    state = RuntimeState.static(
        spec.name if spec is not None else model,
        served_model_name=spec.served_name if spec else None,
        floor=floor,
        ceiling=setting(*config.MAX_CONCURRENCY),
        metrics_url=spec.resolved_metrics_url if spec else None,
    )
    # Off: the floor holds because the switch says so, which is what an operator looking at it needs to read.
    return dataclasses.replace(state, limited_by=static_limit(adaptive_enabled())).as_dict()


def get_all_utilization() -> dict[str, dict[str, Any]]:
    """One snapshot of every registered model, for dashboards."""
    return {name: get_utilization(name) for name in registered_models()}
