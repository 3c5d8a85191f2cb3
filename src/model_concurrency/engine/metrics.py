"""Render engines' signals as the Prometheus text a real vLLM ``/metrics`` page carries.

A custom collector reads the engines when scraped (nothing is mirrored into prometheus_client's own metric objects,
so a sim step costs nothing extra) and yields Gauge/Counter/Histogram families under vLLM's names and labels:
``model_name`` and ``engine`` on every series, labels in alphabetical order as real pages print them, ``_total``
counters, ``_bucket``/``_sum``/``_count`` histograms with vLLM V1's buckets, and ``vllm:cache_config_info`` with
its ``num_gpu_blocks`` label. ``parse_vllm_metrics`` reads this page back into exactly ``Server.snapshot()``.

Two deliberate choices: every waiting request is reported under ``reason="capacity"`` (the model has no LoRA,
KV-transfer or grammar deferrals, so ``deferred`` is always 0), and ``cache_config_info`` carries ``model_name``
so a parser that selects by served model name can sum ``num_gpu_blocks`` per model.

Flavors (:data:`METRICS_FLAVORS`; the emulator's ``--metrics-flavor``), so the lab and the emulator render the
same engines as the pages users really scrape:

* ``vllm-new`` (the default): vLLM's latest metrics design, as above: ``kv_cache_usage_perc`` only (no ``gpu_``
  names), ``num_requests_waiting_by_reason{capacity|deferred}``, and the KV limits ``cache_config_info`` states
  from 0.24 on: ``kv_cache_size_tokens`` (the engine's KV tokens) and ``kv_cache_max_concurrency`` (requests of
  the longest length the engine takes, ``(num_gpu_blocks − 1) × block_size``, whose KV fits at once);
* ``vllm``: a release from before the by-reason gauge: ``num_requests_waiting`` alone (a parser must fall back to
  it) and ``cache_config_info`` without the 0.24 labels (a parser counts ``num_gpu_blocks × block_size``),
  everything else the same;
* ``sglang``: SGLang's ``--enable-metrics`` page (:class:`SglangCollector`): ``sglang:num_running_reqs``,
  ``num_queue_reqs``, ``token_usage``, ``num_used_tokens``, ``max_total_num_tokens``,
  ``num_retracted_requests_total`` (preemptions are SGLang's retractions) and ``queue_time_seconds`` per
  scheduler (``dp_rank`` when there are several engines), ``num_requests_total``, ``prompt_tokens_total``,
  ``generation_tokens_total`` and the TTFT / e2e histograms per model, as SGLang's tokenizer manager counts them.
  The histograms keep the engine model's (vLLM's) buckets; parsers read their sums and counts only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from model_concurrency.engine.engine import Engine
from model_concurrency.engine.stats import FINISHED_REASONS, Histogram

__all__ = ["DEFAULT_FLAVOR", "METRICS_FLAVORS", "SglangCollector", "VllmCollector", "make_registry", "render_engines"]

METRICS_FLAVORS = ("vllm-new", "vllm", "sglang")
DEFAULT_FLAVOR = "vllm-new"

_LABELS = ["engine", "model_name"]
_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("vllm:time_to_first_token_seconds", "ttft", "Histogram of time to first token in seconds."),
    ("vllm:inter_token_latency_seconds", "itl", "Histogram of inter-token latency in seconds."),
    ("vllm:e2e_request_latency_seconds", "e2e", "Histogram of e2e request latency in seconds."),
    ("vllm:request_queue_time_seconds", "queue_time", "Histogram of time spent in WAITING phase for request."),
    ("vllm:request_prefill_time_seconds", "prefill_time", "Histogram of time spent in PREFILL phase for request."),
    ("vllm:request_decode_time_seconds", "decode_time", "Histogram of time spent in DECODE phase for request."),
)


def _buckets(hist: Histogram) -> list[tuple[str, float]]:
    return [(floatToGoString(bound), float(count)) for bound, count in hist.cumulative()]  # type: ignore[no-untyped-call]


class VllmCollector:
    """A prometheus_client collector over whatever engines ``engines()`` returns at scrape time."""

    def __init__(self, engines: Callable[[], Sequence[Engine]], *, by_reason: bool = True) -> None:
        self._engines = engines
        self._by_reason = by_reason  # False: the ``vllm`` flavor, a release without the by-reason gauge

    def describe(self) -> list[Any]:
        return []  # unchecked collector: families are produced at scrape time only

    def collect(self) -> Iterator[Any]:
        engines = [e for e in self._engines() if e.up]
        running = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.",
                                    labels=_LABELS)  # fmt: skip
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                                    labels=_LABELS)  # fmt: skip
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason.",
            labels=["engine", "model_name", "reason"],
        )
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                               labels=_LABELS)  # fmt: skip
        new = self._by_reason  # the 0.24 cache labels come with the latest design only
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[
                "block_size", "engine", "gpu_memory_utilization",
                *(["kv_cache_max_concurrency", "kv_cache_size_tokens"] if new else []),
                "model_name", "num_gpu_blocks",
            ],
        )  # fmt: skip
        preemptions = CounterMetricFamily("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                                          labels=_LABELS)  # fmt: skip
        prompt = CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.", labels=_LABELS)
        generation = CounterMetricFamily("vllm:generation_tokens", "Number of generation tokens processed.",
                                         labels=_LABELS)  # fmt: skip
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.",
            labels=["engine", "finished_reason", "model_name"],
        )  # fmt: skip
        histograms = [HistogramMetricFamily(name, doc, labels=_LABELS) for name, _, doc in _HISTOGRAMS]
        for e in engines:
            labels = [e.label, e.model_name]
            stats = e.stats
            running.add_metric(labels, float(e.gauge_running))
            waiting.add_metric(labels, float(e.gauge_waiting))
            by_reason.add_metric([e.label, e.model_name, "capacity"], float(e.gauge_waiting))
            by_reason.add_metric([e.label, e.model_name, "deferred"], 0.0)
            kv.add_metric(labels, e.gauge_kv_usage)
            info.add_metric(
                [
                    str(e.block_size), e.label, str(e.preset.gpu_memory_utilization),
                    *(_cache_limits(e) if new else []),
                    e.model_name, str(e.num_gpu_blocks),
                ],
                1.0,
            )  # fmt: skip
            preemptions.add_metric(labels, float(stats.num_preemptions))
            prompt.add_metric(labels, float(stats.prompt_tokens))
            generation.add_metric(labels, float(stats.generation_tokens))
            for reason in FINISHED_REASONS:
                success.add_metric([e.label, reason, e.model_name], float(stats.finished.get(reason, 0)))
            for family, (_, attr, _) in zip(histograms, _HISTOGRAMS, strict=True):
                hist: Histogram = getattr(stats, attr)
                family.add_metric(labels, _buckets(hist), hist.sum)
        gauges = (running, waiting, by_reason) if self._by_reason else (running, waiting)
        yield from (*gauges, kv, info, preemptions, prompt, generation, success, *histograms)


def _cache_limits(engine: Engine) -> list[str]:
    """``kv_cache_max_concurrency`` and ``kv_cache_size_tokens`` as vLLM 0.24 labels them, for one engine.

    The engine model has no ``max_model_len`` of its own: the longest request it takes is what its KV holds less
    the reserved block, so that is the length the concurrency is counted at (vLLM counts it at ``max_model_len``)."""
    tokens = engine.num_gpu_blocks * engine.block_size
    longest = (engine.num_gpu_blocks - 1) * engine.block_size
    return [f"{tokens / longest:.2f}", str(tokens)]


_SGLANG_SCHEDULER = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]


class SglangCollector:
    """The same engines as SGLang's ``/metrics`` page: one scheduler per engine (see the module docstring)."""

    def __init__(self, engines: Callable[[], Sequence[Engine]]) -> None:
        self._engines = engines

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        engines = [e for e in self._engines() if e.up]
        labels = [*_SGLANG_SCHEDULER, *(["dp_rank"] if len(self._engines()) > 1 else [])]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"sglang:{name}", doc, labels=labels)

        running = gauge("num_running_reqs", "The number of running requests.")
        queue = gauge("num_queue_reqs", "The number of requests in the waiting queue.")
        grammar = gauge("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.")
        usage = gauge("token_usage", "The token usage.")
        used = gauge("num_used_tokens", "The number of used tokens.")
        pool = gauge("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.")
        retracted = CounterMetricFamily("sglang:num_retracted_requests", "Total number of retracted requests.",
                                        labels=labels)  # fmt: skip
        queue_time = HistogramMetricFamily("sglang:queue_time_seconds", "Histogram of queueing time in seconds.",
                                           labels=labels)  # fmt: skip
        per_model = ["model_name"]
        requests = CounterMetricFamily("sglang:num_requests", "Number of requests processed.", labels=per_model)
        prompt = CounterMetricFamily("sglang:prompt_tokens", "Number of prefill tokens processed.", labels=per_model)
        generation = CounterMetricFamily("sglang:generation_tokens", "Number of generation tokens processed.",
                                         labels=per_model)  # fmt: skip
        ttft = HistogramMetricFamily("sglang:time_to_first_token_seconds",
                                     "Histogram of time to first token in seconds.", labels=per_model)  # fmt: skip
        e2e = HistogramMetricFamily("sglang:e2e_request_latency_seconds",
                                    "Histogram of End-to-end request latency in seconds", labels=per_model)  # fmt: skip
        totals: dict[str, list[float]] = {}  # model -> finished, prompt tokens, generated tokens
        merged: dict[tuple[str, str], tuple[list[tuple[str, float]], float]] = {}  # per model: buckets, sum
        for e in engines:
            values = [e.model_name, "unified", "0", "0", "0", *([e.label] if len(labels) > 5 else [])]
            r, w, kv, _, tokens, pre, ok, gen, _, _ = e.signals()
            stats = e.stats
            running.add_metric(values, r)
            queue.add_metric(values, w)
            grammar.add_metric(values, 0.0)
            usage.add_metric(values, kv)
            used.add_metric(values, float(round(kv * tokens)))
            pool.add_metric(values, float(tokens))
            retracted.add_metric(values, pre)
            queue_time.add_metric(values, _buckets(stats.queue_time), stats.queue_time.sum)
            model = totals.setdefault(e.model_name, [0.0, 0.0, 0.0])
            model[0] += ok
            model[1] += float(stats.prompt_tokens)
            model[2] += gen
            for kind, hist in (("ttft", stats.ttft), ("e2e", stats.e2e)):
                buckets, total = _buckets(hist), hist.sum
                seen = merged.get((e.model_name, kind))
                if seen is not None:  # the same bounds on every engine: add the cumulative counts
                    buckets = [
                        (edge, count + before) for (edge, count), (_, before) in zip(buckets, seen[0], strict=True)
                    ]
                    total += seen[1]
                merged[(e.model_name, kind)] = (buckets, total)
        for name, (ok, prompt_tokens, generated) in totals.items():
            requests.add_metric([name], ok)
            prompt.add_metric([name], prompt_tokens)
            generation.add_metric([name], generated)
        for (name, kind), (buckets, total) in merged.items():
            (ttft if kind == "ttft" else e2e).add_metric([name], buckets, total)
        yield from (running, queue, grammar, usage, used, pool, retracted, queue_time)
        yield from (requests, prompt, generation, ttft, e2e)


def make_registry(engines: Callable[[], Sequence[Engine]], flavor: str = DEFAULT_FLAVOR) -> CollectorRegistry:
    """A registry holding only the engines' collector in ``flavor`` (no process or GC collectors: simulated time
    has none). ``ValueError`` for an unknown flavor."""
    registry = CollectorRegistry(auto_describe=False)
    if flavor == "sglang":
        registry.register(SglangCollector(engines))
    elif flavor in ("vllm-new", "vllm"):
        registry.register(VllmCollector(engines, by_reason=flavor == "vllm-new"))
    else:
        raise ValueError(f"unknown metrics flavor {flavor!r}; known: {', '.join(METRICS_FLAVORS)}")
    return registry


def render_engines(engines: Iterable[Engine], flavor: str = DEFAULT_FLAVOR) -> str:
    """One-off rendering of some engines as a ``/metrics`` page."""
    fixed = list(engines)
    return generate_latest(make_registry(lambda: fixed, flavor)).decode("utf-8")
