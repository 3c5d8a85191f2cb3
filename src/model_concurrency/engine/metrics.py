"""Render engines' signals as the Prometheus text a real vLLM ``/metrics`` page carries.

A custom collector reads the engines when scraped (nothing is mirrored into prometheus_client's own metric objects,
so a sim step costs nothing extra) and yields Gauge/Counter/Histogram families under vLLM's names and labels:
``model_name`` and ``engine`` on every series, labels in alphabetical order as real pages print them, ``_total``
counters, ``_bucket``/``_sum``/``_count`` histograms with vLLM V1's buckets, and ``vllm:cache_config_info`` with
its ``num_gpu_blocks`` label. ``parse_vllm_metrics`` reads this page back into exactly ``Server.snapshot()``.

Two deliberate choices: every waiting request is reported under ``reason="capacity"`` (the model has no LoRA,
KV-transfer or grammar deferrals, so ``deferred`` is always 0), and ``cache_config_info`` carries ``model_name``
so a parser that selects by served model name can sum ``num_gpu_blocks`` per model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from model_concurrency.engine.engine import Engine
from model_concurrency.engine.stats import FINISHED_REASONS, Histogram

__all__ = ["VllmCollector", "make_registry", "render_engines"]

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

    def __init__(self, engines: Callable[[], Sequence[Engine]]) -> None:
        self._engines = engines

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
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "engine", "gpu_memory_utilization", "model_name", "num_gpu_blocks"],
        )
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
                [str(e.block_size), e.label, str(e.preset.gpu_memory_utilization), e.model_name, str(e.num_gpu_blocks)],
                1.0,
            )
            preemptions.add_metric(labels, float(stats.num_preemptions))
            prompt.add_metric(labels, float(stats.prompt_tokens))
            generation.add_metric(labels, float(stats.generation_tokens))
            for reason in FINISHED_REASONS:
                success.add_metric([e.label, reason, e.model_name], float(stats.finished.get(reason, 0)))
            for family, (_, attr, _) in zip(histograms, _HISTOGRAMS, strict=True):
                hist: Histogram = getattr(stats, attr)
                family.add_metric(labels, _buckets(hist), hist.sum)
        yield from (running, waiting, by_reason, kv, info, preemptions, prompt, generation, success, *histograms)


def make_registry(engines: Callable[[], Sequence[Engine]]) -> CollectorRegistry:
    """A registry holding only the vLLM collector (no process or GC collectors: simulated time has none)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VllmCollector(engines))
    return registry


def render_engines(engines: Iterable[Engine]) -> str:
    """One-off rendering of some engines as a ``/metrics`` page."""
    fixed = list(engines)
    return generate_latest(make_registry(lambda: fixed)).decode("utf-8")
