"""The hooks a fan-out calls: how many calls may ``model`` have in flight right now?

``resolve_capacity(model)`` is the one an application uses: the static capacity as the floor, raised by the
adaptive controller when the flag is on and the model has a metrics endpoint. It never raises: an unknown model
gets 1, a broken endpoint gets the floor after its grace polls, the flag off gets exactly the static path with
no scrape at all.
"""

from __future__ import annotations

import logging
from typing import Any

from model_concurrency import config, telemetry
from model_concurrency.config import ModelSpec, get_model, registered_models, setting
from model_concurrency.controller import LiveController, get_controller

__all__ = [
    "adaptive_capacity",
    "aresolve_capacity",
    "controller_for",
    "get_all_utilization",
    "get_utilization",
    "resolve_capacity",
    "static_capacity",
]

log = logging.getLogger("model_concurrency")


def adaptive_enabled() -> bool:
    return bool(setting(*config.ADAPTIVE_FLAG))


def static_capacity(model: str | None) -> int:
    """The configured capacity (``parallel_instances x max_parallel_calls``); 1 for an unknown model."""
    spec = get_model(model)
    return spec.static_capacity if spec is not None else 1


def controller_for(model: str | None, floor: int | None = None) -> LiveController | None:
    """The model's live controller, or None when the static path applies (flag off, unknown, no endpoint)."""
    if not adaptive_enabled():
        return None
    spec = get_model(model)
    if spec is None or (spec.resolved_metrics_url is None and spec.prometheus_url is None):
        return None
    controller = get_controller(spec)
    if floor is not None and floor != controller.floor:
        controller.set_floor(floor)
    return controller


def _spec_floor(model: str | None) -> tuple[ModelSpec | None, int]:
    spec = get_model(model)
    return spec, (spec.static_capacity if spec is not None else 1)


def adaptive_capacity(model: str | None, floor: int) -> int:
    """The adaptive target for ``model`` with ``floor`` as its lower bound; ``floor`` on the static path."""
    floor = max(1, int(floor))
    try:
        controller = controller_for(model, floor)
        return controller.target() if controller is not None else floor
    except Exception:  # the fail-safe is the whole point: never break a fan-out over capacity
        log.exception("model %s: adaptive capacity failed; using the floor %d", model, floor)
        return floor


def resolve_capacity(model: str | None) -> int:
    """Static capacity as the floor, raised by the adaptive controller when enabled."""
    _, floor = _spec_floor(model)
    return adaptive_capacity(model, floor)


async def aresolve_capacity(model: str | None) -> int:
    """:func:`resolve_capacity` for event loops: a due poll is awaited, never run on the loop's thread."""
    _, floor = _spec_floor(model)
    try:
        controller = controller_for(model, floor)
        return await controller.atarget() if controller is not None else floor
    except Exception:
        log.exception("model %s: adaptive capacity failed; using the floor %d", model, floor)
        return floor


def get_utilization(model: str | None) -> dict[str, Any]:
    """What the controller last saw and decided for ``model``; a static view when no controller applies."""
    spec, floor = _spec_floor(model)
    controller = controller_for(model, floor)
    if controller is not None:
        return telemetry.snapshot(controller)
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
