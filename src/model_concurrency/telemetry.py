"""The controller's own state, exported for operators: Prometheus gauges and a plain snapshot.

Gauges live in prometheus_client's default registry, so a worker that already exposes ``/metrics`` (or calls
``prometheus_client.start_http_server``) shows the target next to the engine's own gauges with no extra wiring.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge

from model_concurrency.observation import EngineSnapshot
from model_concurrency.signals.saturation import pool_saturated

if TYPE_CHECKING:
    from model_concurrency.runtime import ModelRuntime

__all__ = ["publish", "snapshot"]

_LABELS = ("model",)
TARGET = Gauge("model_concurrency_target", "Concurrency target the gate enforces for the model", _LABELS)
FLOOR = Gauge("model_concurrency_floor", "Static capacity: the lowest target", _LABELS)
CEILING = Gauge("model_concurrency_ceiling", "Highest target allowed", _LABELS)
INFLIGHT = Gauge("model_concurrency_inflight", "This process's calls in flight for the model", _LABELS)
TOKEN_BUDGET = Gauge(
    "model_concurrency_token_budget", "Tokens weighted calls may hold at once; 0 when not enforced", _LABELS
)
INFLIGHT_TOKENS = Gauge("model_concurrency_inflight_tokens", "Tokens this process's weighted calls hold", _LABELS)
SATURATED = Gauge("model_concurrency_saturated", "1 when the last poll saw capacity-waiting requests", _LABELS)
METRICS_OK = Gauge("model_concurrency_metrics_ok", "1 when the last metrics poll succeeded", _LABELS)
POLLS = Counter("model_concurrency_polls", "Metrics polls by outcome", (*_LABELS, "outcome"))


def publish(runtime: ModelRuntime) -> None:
    """Copy one model runtime's state into the exported gauges (called after every poll)."""
    core, model = runtime.core, runtime.name
    TARGET.labels(model).set(core.target)
    FLOOR.labels(model).set(core.lower)
    CEILING.labels(model).set(core.upper)
    INFLIGHT.labels(model).set(runtime.inflight())
    TOKEN_BUDGET.labels(model).set(runtime.current_budget() or 0)
    INFLIGHT_TOKENS.labels(model).set(runtime.limiter.units())
    SATURATED.labels(model).set(1 if core.saturated else 0)
    METRICS_OK.labels(model).set(1 if core.last_ok else 0)
    POLLS.labels(model, "ok" if core.last_ok else "failed").inc()


def snapshot(runtime: ModelRuntime) -> dict[str, Any]:
    """A JSON-ready view of one runtime: what ``get_utilization`` returns. Never includes credentials."""
    core = runtime.core
    obs = core.last_observation
    good = obs if (obs is not None and obs.ok) else None
    return {
        "model": runtime.name,
        "served_model_name": runtime.spec.served_name if runtime.spec is not None else None,
        "running": good.running if good else None,
        "waiting": good.waiting if good else None,
        "waiting_capacity": good.waiting_capacity if good else None,
        "kv_cache_usage": good.kv_cache_usage if good else None,
        "inflight": runtime.inflight(),
        "inflight_tokens": runtime.limiter.units(),
        "token_budget": runtime.current_budget(),
        "current_target": core.target,
        "floor": core.lower,
        "ceiling": core.upper,
        "metrics_ok": core.last_ok,
        "saturated": core.saturated,
        **_gateway(core.last_ok, core.last_snapshot),
        "page_hold": core.page_hold.reason,
        "last_poll": _wall(core.last_poll_time, runtime.clock()),
        "consecutive_failures": core.consecutive_failures,
        "last_error": core.last_error,
        "metrics_url": runtime.source.description if runtime.source is not None else None,
        "policy": type(core.policy).__name__,
        "adaptive": True,
    }


def _gateway(ok: bool | None, snapshot: EngineSnapshot | None) -> dict[str, Any]:
    """The Gateway API Inference Extension's view beside ours (signals/saturation.py): the pool score, and whether
    it counts as saturated. A failed poll is stale metrics, saturated as the gateway counts a stale pod; a good poll
    from a source that cannot tell engines apart (a PromQL sum), or no poll yet, is unknown (None)."""
    if ok is False:
        return {"gateway_saturation": None, "gateway_saturated": True}
    score = snapshot.gateway_saturation if ok and snapshot is not None else None
    return {"gateway_saturation": score, "gateway_saturated": None if score is None else pool_saturated(score)}


def _wall(at: float | None, now: float) -> float | None:
    """A time on the runtime's clock as wall-clock seconds since the epoch (dashboards show dates, not uptimes)."""
    return None if at is None else time.time() - (now - at)
