"""Read one model's signals out of a vLLM ``/metrics`` page.

Parsing is ``prometheus_client``'s text parser, never string matching: label values in real pages contain
``/``, ``}``, commas and escaped quotes (flaw 9 of the original controller). Series are selected by the model's
*served* name (flaw 8) and summed over the ``engine`` label. KV-cache usage is the maximum across engines,
because the most loaded engine is the one that preempts.

Anything implausible is a :class:`MetricsError` (a failed poll), never a silent zero: a page without the
model's ``vllm:num_requests_running``, non-finite or negative gauges, absurd magnitudes, or the same series
twice. The controller turns failed polls into its grace-then-floor rule.

Two spellings of the same series are read. vLLM's own server exports ``vllm:num_requests_running``. vLLM run
inside Ray (Ray Serve LLM, or engines built with vLLM's ``RayPrometheusStatLogger``) records through
``ray.util.metrics`` instead, and each node's Ray metrics agent exports the series renamed: every character
outside ``[a-zA-Z0-9_]`` becomes ``_`` and the ``ray_`` namespace is prefixed (``ray_vllm_num_requests_running``).
The labels are vLLM's (``model_name``, ``engine``) plus ``ReplicaId`` (the Serve replica) and Ray's own
(``WorkerId``, ``NodeAddress``, ``SessionName``, ``Component``, ``Version``, ``JobId``...). Summing over every
label but the model is the same rule in both forms: engines of one server, replicas of one node. A page that
holds the model in both forms would be counted twice, so it is refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from model_concurrency.observation import EngineLimits, EngineSnapshot
from model_concurrency.signals.saturation import EngineLoads

__all__ = [
    "MAX_PLAUSIBLE",
    "CacheLimits",
    "MetricsError",
    "accumulate",
    "add_cache_config",
    "add_queue_bucket",
    "check_plausible",
    "is_capacity_reason",
    "metric_samples",
    "parse_vllm_metrics",
    "prefer_total_counters",
    "ray_form",
    "ray_forms",
    "snapshot_from_totals",
    "vllm_name",
]

# No engine runs ten million requests; a gauge above this is a broken exporter, not a busy GPU.
MAX_PLAUSIBLE = 1e7

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_CONFIG = "vllm:cache_config_info"
PREEMPTIONS = "vllm:num_preemptions_total"
SUCCESS = "vllm:request_success_total"
GENERATION = "vllm:generation_tokens_total"
QUEUE_SUM = "vllm:request_queue_time_seconds_sum"
QUEUE_COUNT = "vllm:request_queue_time_seconds_count"
QUEUE_BUCKET = "vllm:request_queue_time_seconds_bucket"
E2E_SUM = "vllm:e2e_request_latency_seconds_sum"

# Labels that do not tell one engine from another for the gateway's per-engine score (signals/saturation.py).
GATEWAY_SHARED_LABELS = frozenset({"model_name", "reason", "__name__"})

_WANTED = {
    RUNNING, WAITING, WAITING_BY_REASON, *KV_USAGE, PREEMPTIONS, SUCCESS, GENERATION, QUEUE_SUM, QUEUE_COUNT,
    QUEUE_BUCKET, E2E_SUM,
}  # fmt: skip

RAY_PREFIX = "ray_"


def ray_form(name: str) -> str:
    """The name a Ray metrics agent exports for vLLM series ``name`` (``vllm:x`` -> ``ray_vllm_x``)."""
    return RAY_PREFIX + "".join(ch if ch.isascii() and (ch.isalnum() or ch == "_") else "_" for ch in name)


# Ray-form name -> vLLM name, for every series the parser reads.
_FROM_RAY = {ray_form(name): name for name in (*_WANTED, CACHE_CONFIG)}
# Some Ray exporters print counters without ``_total`` (some print both): the bare spelling counts only when the
# ``_total`` one is absent, so a page carrying both is not counted twice.
RAY_BARE_COUNTERS = {ray_form(name).removesuffix("_total"): name for name in (PREEMPTIONS, SUCCESS, GENERATION)}


def vllm_name(name: str) -> str:
    """The vLLM name of a series the parser reads, whichever form ``name`` is in (other names unchanged)."""
    return _FROM_RAY.get(name) or RAY_BARE_COUNTERS.get(name) or name


def ray_forms(names: Iterable[str]) -> tuple[str, ...]:
    """Every Ray spelling of ``names``, bare counters included (for PromQL selectors)."""
    forms = [ray_form(name) for name in names]
    return (*forms, *(bare for bare, name in RAY_BARE_COUNTERS.items() if name in names))


def prefer_total_counters(totals: dict[str, float], bare: dict[str, float]) -> None:
    """Fill counters missing from ``totals`` from their bare Ray spelling (``bare`` is keyed by vLLM name)."""
    for name, value in bare.items():
        totals.setdefault(name, value)


class MetricsError(ValueError):
    """The page cannot be trusted for this model; the poll counts as failed."""


def _samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                yield sample.name, sample.labels, float(sample.value)
    except MetricsError:
        raise
    except Exception as exc:  # the parser raises ValueError, IndexError, TypeError... on garbage
        raise MetricsError(f"unparseable metrics page: {type(exc).__name__}: {exc}") from None


# The page's samples as (name, labels, value), for the other engines' parsers (signals/sglang.py).
metric_samples = _samples


def check_plausible(name: str, value: float, upper: float = MAX_PLAUSIBLE) -> float:
    """The value, or :class:`MetricsError` if it is not finite, negative, or above ``upper``."""
    if not math.isfinite(value) or value < 0 or value > upper:
        raise MetricsError(f"implausible value {value!r} for {name}")
    return value


def parse_vllm_metrics(text: str, served_model_name: str) -> EngineSnapshot:
    """Sum one model's series over engines; raise :class:`MetricsError` if the page cannot be trusted."""
    totals: dict[str, float] = {}
    bare: dict[str, float] = {}  # Ray counters printed without _total
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    kv_usage: float | None = None
    kv_blocks: int | None = None
    kv_tokens: int | None = None
    waiting_capacity: float | None = None
    buckets: dict[float, float] = {}  # queue-time histogram, summed over engines by bound
    forms: set[bool] = set()  # True for a Ray-form series of this model, False for a native one
    loads = EngineLoads(GATEWAY_SHARED_LABELS)
    cache = CacheLimits()
    for raw_name, labels, value in _samples(text):
        name = vllm_name(raw_name)
        if name not in _WANTED and name != CACHE_CONFIG:
            continue
        model = labels.get("model_name")
        # vLLM's info gauges carry the config as labels and, in some releases, no model_name: a server serves
        # one model, so an unlabelled cache_config_info belongs to it.
        if model != served_model_name and not (name == CACHE_CONFIG and model is None):
            continue
        forms.add(raw_name != name)
        if len(forms) > 1:
            raise MetricsError(f"model_name={served_model_name!r} appears both as vllm: and as ray_vllm_ series")
        key = (raw_name, frozenset(labels.items()))
        if key in seen:
            raise MetricsError(f"duplicate series {raw_name}{labels}")
        seen.add(key)
        if name == CACHE_CONFIG:
            kv_blocks, kv_tokens = add_cache_config(labels, kv_blocks, kv_tokens)
            cache.add(labels)
            continue
        if name in KV_USAGE:
            check_plausible(name, value, upper=1.0)
            kv_usage = value if kv_usage is None else max(kv_usage, value)
            loads.add_kv(labels, value)
            continue
        check_plausible(name, value)
        if name == QUEUE_BUCKET:
            add_queue_bucket(buckets, labels, value)
            continue
        if name == WAITING:
            loads.add_waiting(labels, value)
        summed = bare if raw_name in RAY_BARE_COUNTERS else totals
        waiting_capacity = accumulate(summed, name, labels, value, waiting_capacity)
    if RUNNING not in totals:
        raise MetricsError(f"no {RUNNING} series for model_name={served_model_name!r}")
    prefer_total_counters(totals, bare)
    snapshot = snapshot_from_totals(totals, waiting_capacity, kv_usage, kv_blocks, kv_tokens, buckets)
    return replace(snapshot, gateway_saturation=loads.score(), limits=cache.limits())


# Above this a KV pool's token count is a broken label, not a GPU (ten billion tokens).
_MAX_KV_TOKENS = 10**10
CACHE_SOURCE = "vllm cache_config_info"


def _label_count(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() and int(value) <= _MAX_KV_TOKENS else None


def _label_ratio(value: str | None) -> float | None:
    try:
        ratio = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return ratio if math.isfinite(ratio) and 0 <= ratio <= MAX_PLAUSIBLE else None


class CacheLimits:
    """The KV limits ``cache_config_info`` states, summed over the engines (one series each).

    ``kv_cache_size_tokens`` (vLLM 0.24 on) is the engine's own count, right for hybrid models, whose layers do
    not all hold one block per ``block_size`` tokens; before it, ``num_gpu_blocks × block_size`` is the count. A
    figure one engine leaves out is unknown for all: a partial sum would read as a smaller pool."""

    __slots__ = ("concurrency", "engines", "tokens")

    def __init__(self) -> None:
        self.engines = 0
        self.tokens: int | None = 0
        self.concurrency: float | None = 0.0

    def add(self, labels: dict[str, str]) -> None:
        self.engines += 1
        size = _label_count(labels.get("kv_cache_size_tokens"))
        if size is None:
            blocks, block = _label_count(labels.get("num_gpu_blocks")), _label_count(labels.get("block_size"))
            size = blocks * block if blocks is not None and block is not None else None
        self.tokens = None if size is None or self.tokens is None else self.tokens + size
        fits = _label_ratio(labels.get("kv_cache_max_concurrency"))
        self.concurrency = None if fits is None or self.concurrency is None else self.concurrency + fits

    def limits(self) -> EngineLimits | None:
        """The engines' KV limits, or None when no series stated any."""
        if not self.engines or (self.tokens is None and self.concurrency is None):
            return None
        source = {name: CACHE_SOURCE for name, value in (("kv_cache_tokens", self.tokens),
                  ("kv_cache_max_concurrency", self.concurrency)) if value is not None}  # fmt: skip
        return EngineLimits(kv_cache_tokens=self.tokens, kv_cache_max_concurrency=self.concurrency, source=source)


def add_queue_bucket(buckets: dict[float, float], labels: dict[str, str], value: float) -> None:
    """Add one engine's queue-time bucket (cumulative count at bound ``le``) to the sum over engines.

    A bucket without a readable ``le`` is a broken exporter: the poll fails rather than guess which bound it is."""
    try:
        bound = float(labels["le"])
    except (KeyError, ValueError):
        raise MetricsError(f"queue-time bucket without a numeric le label: {labels}") from None
    buckets[bound] = buckets.get(bound, 0.0) + value


def queue_buckets(buckets: dict[float, float]) -> tuple[tuple[float, float], ...] | None:
    """The summed queue-time buckets as sorted cumulative pairs; None unless they end with ``+Inf``."""
    if not buckets or max(buckets) != math.inf:
        return None
    return tuple(sorted(buckets.items()))


def add_cache_config(labels: dict[str, str], blocks: int | None, tokens: int | None) -> tuple[int | None, int | None]:
    """Add one engine's ``cache_config_info`` labels to the running block and token totals.

    The pool is stated in labels (``num_gpu_blocks``, ``block_size``), not in the value; an engine that leaves
    them out (or spells them oddly) adds nothing rather than a guess."""
    count = labels.get("num_gpu_blocks")
    if count is None or not count.isdigit():
        return blocks, tokens
    blocks = (blocks or 0) + int(count)
    size = labels.get("block_size")
    if size is not None and size.isdigit():
        tokens = (tokens or 0) + int(count) * int(size)
    return blocks, tokens


def accumulate(
    totals: dict[str, float], name: str, labels: dict[str, str], value: float, waiting_capacity: float | None
) -> float | None:
    """Add one summed series to ``totals``, or to the capacity-waiting count; returns that count.

    Any by-reason series makes the count known (0 when every waiting request is deferred): a page that shows only
    ``reason="deferred"`` has nobody waiting for capacity, and must not fall back to ``num_requests_waiting``,
    which counts the deferred ones too (:func:`is_capacity_reason`).
    """
    if name == WAITING_BY_REASON:
        return (waiting_capacity or 0.0) + (value if is_capacity_reason(labels.get("reason", "")) else 0.0)
    totals[name] = totals.get(name, 0.0) + value
    return waiting_capacity


def is_capacity_reason(reason: str) -> bool:
    """Whether a ``num_requests_waiting_by_reason`` label value means "waiting for scheduling capacity".

    vLLM's latest design has two values: ``capacity`` (queued, not yet attempted: the engine is full) and
    ``deferred`` (skipped for a LoRA budget, an async KV transfer or a block: a request the engine cannot take
    whatever its load, so no capacity signal). One release spelt the values out in prose; a prose value that
    mentions deferral is a deferral even when it also mentions capacity ("deferred, not a capacity wait")."""
    text = reason.lower()
    return "capacity" in text and "defer" not in text


def snapshot_from_totals(
    totals: dict[str, float],
    waiting_capacity: float | None,
    kv_usage: float | None,
    kv_blocks: int | None,
    kv_tokens: int | None = None,
    buckets: dict[float, float] | None = None,
) -> EngineSnapshot:
    """The snapshot a page or a PromQL answer adds up to (``totals`` must hold the running series)."""
    return EngineSnapshot(
        running=totals[RUNNING],
        waiting=totals.get(WAITING, 0.0),
        waiting_capacity=waiting_capacity,
        kv_cache_usage=kv_usage,
        kv_num_blocks=kv_blocks,
        kv_tokens=kv_tokens,
        preemptions_total=totals.get(PREEMPTIONS),
        success_total=totals.get(SUCCESS),
        generation_tokens_total=totals.get(GENERATION),
        queue_time_sum_total=totals.get(QUEUE_SUM),
        queue_time_count_total=totals.get(QUEUE_COUNT),
        queue_time_buckets=queue_buckets(buckets or {}),
        e2e_latency_sum_total=totals.get(E2E_SUM),
    )
