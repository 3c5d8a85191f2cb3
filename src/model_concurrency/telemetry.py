"""The controller's own state, exported for operators: Prometheus gauges and a plain snapshot.

Telemetry only reads: it is handed the frozen :class:`~model_concurrency.state.RuntimeState` a runtime publishes
and never imports the runtime (no import circle, one writer per value).

Gauges live in prometheus_client's default registry, so a worker that already exposes ``/metrics`` (or calls
``prometheus_client.start_http_server``) shows the target next to the engine's own gauges with no extra wiring.
"""

from __future__ import annotations

from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from model_concurrency.decision import LIMITS
from model_concurrency.health import FALLBACKS
from model_concurrency.state import RuntimeState

__all__ = ["Publisher", "publish", "snapshot"]

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
LIMITED_BY = Gauge(
    "model_concurrency_limited_by",
    "1 for what holds the target back now (decision.py: ceiling, guard, saturation, app-limited, throttled, floor); "
    "all 0 while it grows freely",
    (*_LABELS, "reason"),
)
FALLBACK = Gauge(
    "model_concurrency_fallback",
    "1 for the fallback in use: grace (last good target held), handover (held while our calls look healthy), "
    "floor (fail-safe); all 0 when the last poll was good",
    (*_LABELS, "kind"),
)
SIGNAL_STALE = Gauge(
    "model_concurrency_signal_stale", "1 when the metrics page stopped moving while our calls completed", _LABELS
)
LIMIT_UNREACHED = Gauge(
    "model_concurrency_limit_unreached",
    "1 when in flight stayed below the limit for many polls: the gate limits nothing",
    _LABELS,
)
COUNTER_RESETS = Gauge(
    "model_concurrency_counter_resets",
    "Engine counters seen going backwards (engine restarts) since this process started polling the model",
    _LABELS,
)
POLLS = Counter("model_concurrency_polls", "Metrics polls by outcome", (*_LABELS, "outcome"))


class Publisher(Protocol):
    """Anything that publishes a :class:`RuntimeState` (a model's runtime); telemetry needs nothing else of it."""

    def state(self) -> RuntimeState: ...


def publish(state: RuntimeState, *, polled: bool = True) -> None:
    """Copy one published state into the exported gauges (the runtime calls this after every poll).

    ``polled=False`` refreshes the gauges without counting a poll (a decision between polls)."""
    model = state.model or "default"
    TARGET.labels(model).set(state.current_target)
    FLOOR.labels(model).set(state.floor)
    CEILING.labels(model).set(state.ceiling)
    INFLIGHT.labels(model).set(state.inflight)
    TOKEN_BUDGET.labels(model).set(state.token_budget or 0)
    INFLIGHT_TOKENS.labels(model).set(state.inflight_tokens)
    SATURATED.labels(model).set(1 if state.saturated else 0)
    METRICS_OK.labels(model).set(1 if state.metrics_ok else 0)
    for reason in LIMITS:
        LIMITED_BY.labels(model, reason).set(1 if state.limited_by == reason else 0)
    for kind in FALLBACKS:
        FALLBACK.labels(model, kind).set(1 if state.fallback == kind else 0)
    SIGNAL_STALE.labels(model).set(1 if state.signal_stale else 0)
    LIMIT_UNREACHED.labels(model).set(1 if state.limit_unreached else 0)
    COUNTER_RESETS.labels(model).set(state.counter_resets)
    if polled:
        POLLS.labels(model, "ok" if state.metrics_ok else "failed").inc()


def snapshot(runtime: Publisher) -> dict[str, Any]:
    """A JSON-ready view of one runtime: what ``get_utilization`` returns. Never includes credentials."""
    return runtime.state().as_dict()
