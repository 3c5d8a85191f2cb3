"""Saturation as gateways count it: the Gateway API Inference Extension's utilization detector.

Our own "saturated" is the engine's word: requests waiting for capacity (``waiting_capacity > 0``). Gateways in
front of vLLM or SGLang judge a pool differently, and operators compare the two, so the lab summary and ``watch``
report theirs beside ours. The published rule (``kubernetes-sigs/gateway-api-inference-extension``):

* per engine (pod): ``max(waiting / 5, kv_usage / 0.8)``, where ``waiting`` is every waiting request (the gauge
  ``num_requests_waiting``, deferred ones included: the gateway does not look at reasons);
* an engine with stale or missing metrics counts as 1.0 (saturated);
* the pool is saturated when the mean over its engines reaches 1.0.

This module holds the arithmetic only; parsers feed it per-engine readings, the lab feeds it simulated engines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "GATEWAY_KV_THRESHOLD",
    "GATEWAY_QUEUE_THRESHOLD",
    "STALE",
    "EngineLoads",
    "engine_saturation",
    "gateway_view",
    "pool_saturated",
    "pool_saturation",
]

GATEWAY_QUEUE_THRESHOLD = 5.0
GATEWAY_KV_THRESHOLD = 0.8
# What an engine without fresh metrics counts as, and the pool mean at which the pool is saturated.
STALE = 1.0


def engine_saturation(waiting: float, kv_usage: float | None) -> float:
    """One engine's score: ``max(waiting / 5, kv / 0.8)``; a missing KV gauge leaves the queue term alone."""
    score = waiting / GATEWAY_QUEUE_THRESHOLD
    if kv_usage is not None:
        score = max(score, kv_usage / GATEWAY_KV_THRESHOLD)
    return score


def pool_saturation(scores: Iterable[float | None]) -> float | None:
    """The pool's mean score; ``None`` entries (stale or missing metrics) count as 1.0; None for an empty pool."""
    values = [STALE if s is None else s for s in scores]
    return sum(values) / len(values) if values else None


def pool_saturated(score: float | None) -> bool:
    """Whether a pool score means saturated (≥ 1.0); no score at all (no engine, no metrics) is stale: saturated."""
    return score is None or score >= STALE


def gateway_view(ok: bool | None, score: float | None) -> tuple[float | None, bool | None]:
    """The gateway's (score, saturated) after a poll. A failed poll is stale metrics, saturated as the gateway counts
    a stale pod; a good poll from a source that cannot tell engines apart (a PromQL sum), or no poll yet, is unknown
    (None, None)."""
    if ok is False:
        return None, True
    if not ok or score is None:
        return None, None
    return score, pool_saturated(score)


_Key = frozenset[tuple[str, str]]


@dataclass(slots=True)
class EngineLoads:
    """Per-engine waiting and KV readings gathered while a page is parsed, scored as the gateway would.

    An engine is the label set of a series minus the labels in ``shared`` (the model name, the series' own
    dimensions, and ranks that report one scheduler's state several times, such as SGLang's ``tp_rank``). A
    reading seen twice for one engine keeps the larger value (the ranks of one scheduler repeat it)."""

    shared: frozenset[str]
    waiting: dict[_Key, float] = field(default_factory=dict)
    kv: dict[_Key, float] = field(default_factory=dict)

    def _key(self, labels: Mapping[str, str]) -> _Key:
        return frozenset((k, v) for k, v in labels.items() if k not in self.shared)

    def add_waiting(self, labels: Mapping[str, str], value: float) -> None:
        key = self._key(labels)
        self.waiting[key] = max(value, self.waiting.get(key, 0.0))

    def add_kv(self, labels: Mapping[str, str], value: float) -> None:
        key = self._key(labels)
        self.kv[key] = max(value, self.kv.get(key, 0.0))

    def score(self) -> float | None:
        """The pool score over every engine seen (None when the page showed neither gauge)."""
        engines = self.waiting.keys() | self.kv.keys()
        return pool_saturation(engine_saturation(self.waiting.get(k, 0.0), self.kv.get(k)) for k in engines)
