"""Read one model's signals out of an SGLang ``/metrics`` page, and choose between SGLang and vLLM per model.

SGLang (``--enable-metrics``) exports, per scheduler, gauges and counters under ``sglang:`` names
(``python/sglang/srt/metrics/collector.py``), labelled ``model_name`` (the served name) plus the scheduler's ranks
(``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` and, with data parallelism, ``dp_rank``). What a
controller needs maps one to one onto vLLM's:

===========================================  ==================================================================
SGLang                                       snapshot field
===========================================  ==================================================================
``sglang:num_running_reqs``                  ``running`` (required: without it the model is not on the page)
``sglang:num_queue_reqs``                    ``waiting`` and ``waiting_capacity``: the scheduler's waiting queue
                                             holds requests waiting for a batch slot or KV room only (requests
                                             waiting for a grammar are in ``num_grammar_queue_reqs``, not read)
``sglang:token_usage``                       ``kv_cache_usage`` (a fraction of the KV pool; the max over
                                             schedulers, as vLLM's KV is the max over engines); else
                                             ``num_used_tokens / max_total_num_tokens``
``sglang:max_total_num_tokens``              ``kv_tokens``, and ``kv_num_blocks`` counted in one-token blocks (the
                                             page size is not on the page; the pool's size is what counts)
``sglang:num_retracted_requests_total``      ``preemptions_total``: a retraction is SGLang's preemption
``sglang:num_requests_total``                ``success_total`` (requests finished, counted by the tokenizer)
``sglang:generation_tokens_total``           ``generation_tokens_total``
``sglang:queue_time_seconds_{sum,count}``    ``queue_time_{sum,count}_total``
``sglang:queue_time_seconds_bucket``         ``queue_time_buckets`` (the interval's queue waits)
===========================================  ==================================================================

**Ranks are not engines.** With tensor (or pipeline, or expert) parallelism several ranks run one scheduler, and
with ``--enable-metrics-for-all-schedulers`` each of them exports the same numbers: summing them would count one
batch once per GPU. So a series is first reduced to the max over ``tp_rank``/``pp_rank``/``moe_ep_rank`` (and the
attention ranks), then summed over what is left (``dp_rank``: separate schedulers with separate queues).

The same plausibility rules as a vLLM page apply (:mod:`model_concurrency.signals.vllm`): non-finite, negative or
absurd values, a token usage above 1 and a series printed twice are :class:`MetricsError` (a failed poll).

:func:`parse_metrics_page` is what a ``/metrics`` source calls: it reads the page as SGLang's when the model's
running gauge is an ``sglang:`` one, as vLLM's otherwise, so a user never says which engine serves a model. A page
that holds the model under both names is refused: it would be read twice.
"""

from __future__ import annotations

from collections import defaultdict

from model_concurrency.observation import EngineLimits, EngineSnapshot
from model_concurrency.signals.saturation import EngineLoads
from model_concurrency.signals.vllm import (
    MAX_PLAUSIBLE,
    MetricsError,
    add_queue_bucket,
    check_plausible,
    metric_samples,
    parse_vllm_metrics,
    queue_buckets,
)

__all__ = ["SGLANG", "SGLANG_RANK_LABELS", "VLLM", "parse_metrics_page", "parse_sglang_metrics", "read_metrics_page"]

# Which engine's page a model was read from (read_metrics_page): a source asks SGLang's /v1/loads only of SGLang.
SGLANG = "sglang"
VLLM = "vllm"

RUNNING = "sglang:num_running_reqs"
QUEUE = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
USED_TOKENS = "sglang:num_used_tokens"
MAX_TOKENS = "sglang:max_total_num_tokens"
RETRACTED = "sglang:num_retracted_requests_total"
FINISHED = "sglang:num_requests_total"
GENERATION = "sglang:generation_tokens_total"
QUEUE_SUM = "sglang:queue_time_seconds_sum"
QUEUE_COUNT = "sglang:queue_time_seconds_count"
QUEUE_BUCKET = "sglang:queue_time_seconds_bucket"
_WANTED = frozenset(
    {
        RUNNING, QUEUE, TOKEN_USAGE, USED_TOKENS, MAX_TOKENS, RETRACTED, FINISHED, GENERATION, QUEUE_SUM, QUEUE_COUNT,
        QUEUE_BUCKET,
    }
)  # fmt: skip

# Ranks inside one scheduler: they repeat its numbers (module docstring).
SGLANG_RANK_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_cp_rank", "attn_dp_rank"})
_NOT_A_SCHEDULER = SGLANG_RANK_LABELS | {"model_name"}

# Cheap test before a second parse: a page without these strings cannot hold an SGLang (or vLLM) model.
_SGLANG_MARK = RUNNING
_VLLM_MARKS = ("vllm:num_requests_running", "ray_vllm_num_requests_running")

_Key = frozenset[tuple[str, str]]


class NotOnPage(MetricsError):
    """The page holds no SGLang running gauge for the model (it may still be a vLLM page)."""


def parse_sglang_metrics(text: str, served_model_name: str) -> EngineSnapshot:
    """One model's snapshot from an SGLang page; :class:`MetricsError` if the page cannot be trusted."""
    # name -> scheduler (labels without ranks) -> the max over that scheduler's ranks
    per: dict[str, dict[_Key, float]] = defaultdict(dict)
    seen: set[tuple[str, _Key]] = set()
    loads = EngineLoads(_NOT_A_SCHEDULER)
    for name, labels, value in metric_samples(text):
        if name not in _WANTED or labels.get("model_name") != served_model_name:
            continue
        key = (name, frozenset(labels.items()))
        if key in seen:
            raise MetricsError(f"duplicate series {name}{labels}")
        seen.add(key)
        check_plausible(name, value, upper=1.0 if name == TOKEN_USAGE else MAX_PLAUSIBLE)
        scheduler = frozenset((k, v) for k, v in labels.items() if k not in _NOT_A_SCHEDULER)
        per[name][scheduler] = max(value, per[name].get(scheduler, 0.0))
        if name == QUEUE:
            loads.add_waiting(labels, value)
        elif name == TOKEN_USAGE:
            loads.add_kv(labels, value)
    if RUNNING not in per:
        raise NotOnPage(f"no {RUNNING} series for model_name={served_model_name!r}")

    def total(name: str) -> float | None:
        return sum(per[name].values()) if name in per else None

    # The queue-time buckets per scheduler (``le`` is part of its key), summed over schedulers by bound: the same
    # interval signal (how long the requests that left the queue waited) as a vLLM page's.
    buckets: dict[float, float] = {}
    for scheduler, count in per.get(QUEUE_BUCKET, {}).items():
        add_queue_bucket(buckets, dict(scheduler), count)
    waiting = total(QUEUE) or 0.0
    pool = total(MAX_TOKENS)
    kv_tokens = int(pool) if pool else None
    return EngineSnapshot(
        running=sum(per[RUNNING].values()),
        waiting=waiting,
        waiting_capacity=waiting,
        kv_cache_usage=_kv_usage(per),
        kv_num_blocks=kv_tokens,
        kv_tokens=kv_tokens,
        preemptions_total=total(RETRACTED),
        success_total=total(FINISHED),
        generation_tokens_total=total(GENERATION),
        queue_time_sum_total=total(QUEUE_SUM),
        queue_time_count_total=total(QUEUE_COUNT),
        queue_time_buckets=queue_buckets(buckets),
        gateway_saturation=loads.score(),
        # The pool is a limit too; SGLang's /v1/loads restates it beside max_running_requests (sglang_loads.py).
        limits=EngineLimits(kv_cache_tokens=kv_tokens, source={"kv_cache_tokens": "sglang /metrics"})
        if kv_tokens
        else None,
    )


def _kv_usage(per: dict[str, dict[_Key, float]]) -> float | None:
    """The most loaded scheduler's KV usage: ``token_usage``, else ``num_used_tokens / max_total_num_tokens``."""
    if TOKEN_USAGE in per:
        return max(per[TOKEN_USAGE].values())
    used, pools = per.get(USED_TOKENS, {}), per.get(MAX_TOKENS, {})
    ratios = [min(1.0, used[k] / pools[k]) for k in used.keys() & pools.keys() if pools[k] > 0]
    return max(ratios) if ratios else None


def parse_metrics_page(text: str, served_model_name: str) -> EngineSnapshot:
    """The model's snapshot from a vLLM or an SGLang page, whichever engine's series carry the model."""
    return read_metrics_page(text, served_model_name)[0]


def read_metrics_page(text: str, served_model_name: str) -> tuple[EngineSnapshot, str]:
    """:func:`parse_metrics_page`, and which engine's page it was (:data:`SGLANG` or :data:`VLLM`)."""
    if _SGLANG_MARK not in text:
        return parse_vllm_metrics(text, served_model_name), VLLM
    try:
        snapshot = parse_sglang_metrics(text, served_model_name)
    except NotOnPage:
        return parse_vllm_metrics(text, served_model_name), VLLM
    if any(mark in text for mark in _VLLM_MARKS):
        try:
            parse_vllm_metrics(text, served_model_name)
        except MetricsError:
            return snapshot, SGLANG
        raise MetricsError(f"model_name={served_model_name!r} appears both as sglang: and as vllm: series")
    return snapshot, SGLANG
