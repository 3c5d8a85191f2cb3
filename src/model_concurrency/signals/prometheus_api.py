"""A fleet's signals from a Prometheus server, for models served by several replicas behind a balancer.

Behind a load balancer, ``/metrics`` reaches one replica per scrape, so the sum a controller needs lives in a
Prometheus server that scrapes every replica. Three instant queries per poll, through the same guarded fetch as a
``/metrics`` scrape (caps, deadline, no cross-origin redirects):

* ``sum by (__name__, reason, le) ({__name__=~"<counts and counters>", model_name="<served>"})``: running,
  waiting, waiting by reason, preemptions, successes, generated tokens, queue-time sum, count and buckets, summed
  over replicas and engines;
* ``max by (__name__) ({__name__=~"<kv gauges>", model_name="<served>"})``: the most loaded engine's KV usage;
* ``{__name__=~"<cache_config_info>"} and on (instance) <running of the served model>``: each engine's KV pool
  (block count and size are labels, so the series are read one by one and summed here). The join keeps the info
  gauges of the servers that run the model, since some vLLM releases leave ``model_name`` off them.

Both spellings are asked for: vLLM's own (``vllm:num_requests_running``) and the one a Ray metrics agent exports
for engines inside Ray (``ray_vllm_num_requests_running``, see :mod:`model_concurrency.signals.vllm`); a model
found in both is refused, since it would be counted twice.

The answer goes through the same plausibility rules as a page (:func:`parse_vllm_metrics` semantics): no
running series for the model, a malformed answer, or an implausible value is a failed poll.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx

from model_concurrency.observation import EngineSnapshot
from model_concurrency.signals.interval import IntervalMeter
from model_concurrency.signals.scrape import ScrapeLimits, afetch_text, check_metrics_url, fetch_text
from model_concurrency.signals.vllm import (
    CACHE_CONFIG,
    E2E_SUM,
    GENERATION,
    KV_USAGE,
    PREEMPTIONS,
    QUEUE_BUCKET,
    QUEUE_COUNT,
    QUEUE_SUM,
    RAY_BARE_COUNTERS,
    RUNNING,
    SUCCESS,
    WAITING,
    WAITING_BY_REASON,
    MetricsError,
    accumulate,
    add_cache_config,
    add_queue_bucket,
    check_plausible,
    prefer_total_counters,
    ray_forms,
    snapshot_from_totals,
    vllm_name,
)

__all__ = ["PrometheusSource", "promql_string"]

Vector = list[tuple[dict[str, str], float]]
_SUMMED = (
    RUNNING, WAITING, WAITING_BY_REASON, PREEMPTIONS, SUCCESS, GENERATION, QUEUE_SUM, QUEUE_COUNT, QUEUE_BUCKET,
    E2E_SUM,
)  # fmt: skip


def promql_string(value: str) -> str:
    """Quote ``value`` as a PromQL string literal (model names hold ``/``, ``.``, quotes...)."""
    return json.dumps(value)


def _names(names: tuple[str, ...]) -> str:
    """A ``__name__`` regex matching ``names`` in both spellings."""
    return "|".join(name.replace(".", "\\\\.") for name in (*names, *ray_forms(names)))


def _selector(names: tuple[str, ...], served: str) -> str:
    return f'{{__name__=~"{_names(names)}",model_name={promql_string(served)}}}'


def _vector(text: str) -> Vector:
    try:
        payload = json.loads(text)
        if payload.get("status") != "success":
            raise MetricsError(f"prometheus query failed: {payload.get('error', 'unknown error')}")
        data = payload["data"]
        if data["resultType"] != "vector":
            raise MetricsError(f"expected an instant vector, got {data['resultType']!r}")
        out = []
        for item in data["result"]:
            labels = {str(k): str(v) for k, v in item["metric"].items()}
            out.append((labels, float(item["value"][1])))
        return out
    except MetricsError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise MetricsError(f"malformed prometheus answer: {type(exc).__name__}: {exc}") from None


def _snapshot(summed: Vector, maxed: Vector, pools: Vector | None = None, served: str = "") -> EngineSnapshot:
    """The fleet's snapshot from the three answers; ``pools`` (KV pool info series) may be absent."""
    totals: dict[str, float] = {}
    capacity: float | None = None
    ray_forms = {vllm_name(n) != n for n in (labels.get("__name__", "") for labels, _ in summed)}
    if len(ray_forms) > 1:
        raise MetricsError("prometheus holds the model both as vllm: and as ray_vllm_ series")
    bare: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for labels, value in summed:
        raw_name = labels.get("__name__", "")
        name = vllm_name(raw_name)
        if name == QUEUE_BUCKET:
            add_queue_bucket(buckets, labels, check_plausible(name, value))
            continue
        into = bare if raw_name in RAY_BARE_COUNTERS else totals
        capacity = accumulate(into, name, labels, check_plausible(name, value), capacity)
    if RUNNING not in totals:
        raise MetricsError(f"prometheus has no {RUNNING} series for the model")
    prefer_total_counters(totals, bare)
    kv = [check_plausible(labels.get("__name__", "kv"), value, 1.0) for labels, value in maxed]
    blocks: int | None = None
    tokens: int | None = None
    for labels, _ in pools or ():
        model = labels.get("model_name")
        if model is None or model == served:
            blocks, tokens = add_cache_config(labels, blocks, tokens)
    return snapshot_from_totals(totals, capacity, max(kv) if kv else None, blocks, tokens, buckets)


@dataclass(slots=True)
class PrometheusSource:
    """Reads one served model's fleet-wide gauges from a Prometheus server's HTTP API."""

    prometheus_url: str
    served_model_name: str
    limits: ScrapeLimits = field(default_factory=ScrapeLimits)
    # The previous reading's totals: each snapshot read carries the interval since it (signals/interval.py).
    meter: IntervalMeter = field(default_factory=IntervalMeter, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_metrics_url(self.prometheus_url)

    @property
    def description(self) -> str:
        return f"{self.prometheus_url} (PromQL, model_name={self.served_model_name!r})"

    def queries(self) -> tuple[str, str, str]:
        served = self.served_model_name
        return (
            f"sum by (__name__, reason, le) ({_selector(_SUMMED, served)})",
            f"max by (__name__) ({_selector(KV_USAGE, served)})",
            f'{{__name__=~"{_names((CACHE_CONFIG,))}"}} and on (instance) {_selector((RUNNING,), served)}',
        )

    def _url(self, query: str) -> str:
        base = self.prometheus_url.rstrip("/")
        return str(httpx.URL(f"{base}/api/v1/query", params={"query": query}))

    def read(self) -> EngineSnapshot:
        summed, maxed, pools = (_vector(fetch_text(self._url(q), limits=self.limits)) for q in self.queries())
        return self.meter.advance(_snapshot(summed, maxed, pools, self.served_model_name))

    async def aread(self) -> EngineSnapshot:
        summed, maxed, pools = [_vector(await afetch_text(self._url(q), limits=self.limits)) for q in self.queries()]
        return self.meter.advance(_snapshot(summed, maxed, pools, self.served_model_name))
