"""The engines' limits as an input: stated in the spec, read from pages, merged by one rule (pure units)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from model_concurrency import EngineLimits
from model_concurrency.config import load_config, register_model, spec_from_table
from model_concurrency.observation import EngineSnapshot, observe
from model_concurrency.signals.limits import StatedLimits, StatedLimitsRule, merge_limits, merge_page_limits
from model_concurrency.signals.sglang_loads import LoadsError, loads_url, parse_loads
from model_concurrency.signals.vllm import parse_vllm_metrics

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


# -- stated by the operator ------------------------------------------------------------------------------------
def test_register_model_takes_the_per_engine_limits() -> None:
    spec = register_model("m", base_url="http://h:8000/v1", max_num_seqs=256, max_num_batched_tokens=8192)
    assert (spec.max_num_seqs, spec.max_num_batched_tokens) == (256, 8192)
    assert register_model("n", base_url="http://h:8000/v1").max_num_seqs is None


def test_toml_keys_set_the_limits(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[models.m]\nbase_url = "http://h:8000/v1"\nparallel_instances = 2\nmax_num_seqs = 128\n'
        "max_num_batched_tokens = 2048\n"
    )
    (spec,) = load_config(path)
    assert (spec.max_num_seqs, spec.max_num_batched_tokens, spec.parallel_instances) == (128, 2048, 2)
    assert StatedLimits.from_spec(spec) == StatedLimits(max_num_seqs=128, max_num_batched_tokens=2048, engines=2)


@pytest.mark.parametrize("key", ["max_num_seqs", "max_num_batched_tokens"])
@pytest.mark.parametrize("bad", [0, -4, 2.0, 2.5, True, False, "64", math.nan])
def test_bad_limits_are_refused_naming_the_key(key: str, bad: object) -> None:
    with pytest.raises(ValueError, match=key):
        register_model("m", base_url="http://h:8000/v1", **{key: bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=key):
        spec_from_table("m", {"base_url": "http://h:8000/v1", key: bad})


def test_bad_limit_in_a_file_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text('[models.m]\nbase_url = "http://h:8000/v1"\nmax_num_seqs = 1.5\n')
    with pytest.raises(ValueError, match="max_num_seqs"):
        load_config(path)


def test_from_spec_counts_at_least_one_engine() -> None:
    spec = register_model("m", base_url="http://h:8000/v1", parallel_instances=0, max_num_seqs=8)
    assert StatedLimits.from_spec(spec) == StatedLimits(max_num_seqs=8, engines=1)
    assert StatedLimits.from_spec(register_model("n", base_url="http://h:8000/v1")) is None


# -- the merge rule ------------------------------------------------------------------------------------------------
PAGE = EngineLimits(
    max_num_seqs=300,
    kv_cache_tokens=900_000,
    source={"max_num_seqs": "sglang /v1/loads", "kv_cache_tokens": "sglang /v1/loads"},
)


def test_stated_only_is_a_total_of_slots_and_a_per_engine_budget() -> None:
    stated = StatedLimits(max_num_seqs=256, max_num_batched_tokens=8192, engines=3)
    limits, ignored = merge_limits(stated, None, running=10)
    assert not ignored
    assert limits == EngineLimits(
        max_num_seqs=768,
        max_num_batched_tokens=8192,
        source={"max_num_seqs": "stated", "max_num_batched_tokens": "stated"},
    )


def test_stated_wins_over_the_page_and_the_page_fills_the_rest() -> None:
    limits, _ = merge_limits(StatedLimits(max_num_seqs=64, engines=2), PAGE, running=100)
    assert limits == EngineLimits(
        max_num_seqs=128,
        kv_cache_tokens=900_000,
        source={"max_num_seqs": "stated", "kv_cache_tokens": "sglang /v1/loads"},
    )


def test_nothing_known_is_none() -> None:
    assert merge_limits(None, None, running=5) == (None, False)
    assert merge_limits(None, PAGE, running=5) == (PAGE, False)


def test_a_contradicted_stated_total_gives_way_to_the_page_for_good() -> None:
    stated = StatedLimits(max_num_seqs=64, max_num_batched_tokens=4096, engines=2)  # 128 slots stated
    assert merge_limits(stated, PAGE, running=128)[1] is False  # at the stated total: no contradiction
    limits, ignored = merge_limits(stated, PAGE, running=129)
    assert ignored
    assert limits is not None and (limits.max_num_seqs, limits.source["max_num_seqs"]) == (300, "sglang /v1/loads")
    assert (limits.max_num_batched_tokens, limits.source["max_num_batched_tokens"]) == (4096, "stated")
    # Ignored from then on, whatever running says; a failed poll (running None) contradicts nothing new.
    again, still = merge_limits(stated, None, running=None, seqs_ignored=True)
    assert still and again == EngineLimits(max_num_batched_tokens=4096, source={"max_num_batched_tokens": "stated"})


def test_the_rule_warns_once_naming_the_model_the_value_and_running(caplog: pytest.LogCaptureFixture) -> None:
    rule = StatedLimitsRule("llama", StatedLimits(max_num_seqs=16, engines=1))
    with caplog.at_level(logging.WARNING, logger="model_concurrency"):
        assert rule.merge(None, 10) == EngineLimits(max_num_seqs=16, source={"max_num_seqs": "stated"})
        assert rule.merge(None, 40) is None
        assert rule.merge(None, 50) is None
        assert rule.merge(None, 1) is None  # below again: still ignored for this runtime
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1
    assert "llama" in lines[0] and "max_num_seqs 16" in lines[0] and "below the 40 requests" in lines[0]


def test_a_quiet_rule_applies_without_a_line(caplog: pytest.LogCaptureFixture) -> None:
    rule = StatedLimitsRule("client-0", StatedLimits(max_num_seqs=2, engines=1), quiet=True)
    with caplog.at_level(logging.DEBUG, logger="model_concurrency"):
        assert rule.merge(None, 3) is None
    assert rule.seqs_ignored and not caplog.records


def test_page_readings_merge_the_later_over_the_earlier() -> None:
    metrics = EngineLimits(kv_cache_tokens=1000, source={"kv_cache_tokens": "sglang /metrics"})
    loads = EngineLimits(max_num_seqs=48, source={"max_num_seqs": "sglang /v1/loads"})
    assert merge_page_limits(metrics, loads) == EngineLimits(
        max_num_seqs=48,
        kv_cache_tokens=1000,
        source={"max_num_seqs": "sglang /v1/loads", "kv_cache_tokens": "sglang /metrics"},
    )
    assert merge_page_limits(metrics, PAGE) == PAGE
    assert merge_page_limits(None, loads) is loads and merge_page_limits(metrics, None) is metrics


def test_observe_carries_the_limits_on_good_and_failed_polls() -> None:
    page = EngineLimits(kv_cache_tokens=7, source={"kv_cache_tokens": "vllm cache_config_info"})
    merged = EngineLimits(max_num_seqs=4, source={"max_num_seqs": "stated"})
    snapshot = EngineSnapshot(running=2, limits=page)
    assert observe(snapshot, None, inflight=0, time=1.0).limits == page
    assert observe(snapshot, None, inflight=0, time=1.0, limits=merged).limits == merged
    assert observe(None, None, inflight=0, time=1.0, limits=merged).limits == merged
    assert EngineSnapshot(running=2, limits=page) == EngineSnapshot(running=2)  # no part in snapshot equality


# -- vLLM's cache_config_info labels ------------------------------------------------------------------------------
class _Info:
    def __init__(self, engines: list[dict[str, str]]) -> None:
        self.engines = engines

    def describe(self) -> list[object]:
        return []

    def collect(self) -> list[GaugeMetricFamily]:
        running = GaugeMetricFamily("vllm:num_requests_running", "Running", labels=["engine", "model_name"])
        names = sorted({key for labels in self.engines for key in labels})
        info = GaugeMetricFamily("vllm:cache_config_info", "Cache config", labels=["engine", "model_name", *names])
        for i, labels in enumerate(self.engines):
            running.add_metric([str(i), MODEL], 1.0)
            info.add_metric([str(i), MODEL, *(labels.get(name, "") for name in names)], 1.0)
        return [running, info]


def _page(*engines: dict[str, str]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Info(list(engines)))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def test_kv_cache_size_tokens_wins_over_blocks_times_block_size() -> None:
    # A hybrid model: the engine's own count is not num_gpu_blocks × block_size.
    hybrid = {
        "block_size": "16",
        "num_gpu_blocks": "1000",
        "kv_cache_size_tokens": "40000",
        "kv_cache_max_concurrency": "2.5",
    }
    limits = parse_vllm_metrics(_page(hybrid, hybrid), MODEL).limits
    assert limits == EngineLimits(
        kv_cache_tokens=80_000,
        kv_cache_max_concurrency=5.0,
        source={"kv_cache_tokens": "vllm cache_config_info", "kv_cache_max_concurrency": "vllm cache_config_info"},
    )


def test_before_0_24_the_tokens_are_blocks_times_block_size() -> None:
    old = {"block_size": "16", "num_gpu_blocks": "4096"}
    snapshot = parse_vllm_metrics(_page(old, old), MODEL)
    assert snapshot.limits == EngineLimits(
        kv_cache_tokens=131_072, source={"kv_cache_tokens": "vllm cache_config_info"}
    )
    assert snapshot.kv_tokens == 131_072


def test_an_engine_without_a_readable_count_leaves_the_total_unknown() -> None:
    good = {"block_size": "16", "num_gpu_blocks": "4096", "kv_cache_max_concurrency": "nan"}
    odd = {"block_size": "sixteen", "num_gpu_blocks": "4096", "kv_cache_max_concurrency": "1.5"}
    assert parse_vllm_metrics(_page(good, odd), MODEL).limits is None
    assert parse_vllm_metrics(_page({"gpu_memory_utilization": "0.9"}), MODEL).limits is None


# -- SGLang's /v1/loads --------------------------------------------------------------------------------------------
def _rank(rank: int, seqs: object = 128, tokens: object = 200_000) -> str:
    return (
        f'{{"dp_rank": {rank}, "num_running_reqs": 3, "num_waiting_reqs": 0, "num_used_tokens": 900, '
        f'"max_total_num_tokens": {tokens}, "max_running_requests": {seqs}, "token_usage": 0.0045}}'
    )


def _loads(*ranks: str) -> str:
    head = '"timestamp": "t", "version": "0.5.9", "accelerator": "cuda", "num_accelerators": 2'
    return f'{{{head}, "loads": [{", ".join(ranks)}]}}'


def test_loads_sum_over_data_parallel_ranks() -> None:
    assert parse_loads(_loads(_rank(0), _rank(1, seqs=64, tokens=100_000))) == EngineLimits(
        max_num_seqs=192,
        kv_cache_tokens=300_000,
        source={"max_num_seqs": "sglang /v1/loads", "kv_cache_tokens": "sglang /v1/loads"},
    )


def test_a_rank_without_a_figure_leaves_that_total_unknown() -> None:
    partial = '{"dp_rank": 1, "max_total_num_tokens": 5}'
    assert parse_loads(_loads(_rank(0), partial)) == EngineLimits(
        kv_cache_tokens=200_005, source={"kv_cache_tokens": "sglang /v1/loads"}
    )
    assert parse_loads(_loads()) is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("<html>busy</html>", "not JSON"),
        ("[1, 2]", "'loads' array"),
        ('{"loads": {"dp_rank": 0}}', "'loads' array"),
        ('{"loads": [3]}', "not an object"),
        (_loads(_rank(0, seqs="NaN")), "NaN"),
        (_loads(_rank(0, tokens="Infinity")), "Infinity"),
        (_loads(_rank(0, seqs=-1)), "implausible max_running_requests"),
        (_loads(_rank(0, seqs=12.5)), "implausible max_running_requests"),
        (_loads(_rank(0, tokens=1e15)), "implausible max_total_num_tokens"),
        (_loads(_rank(0, seqs="true")), "not a number"),
        (_loads(_rank(0, seqs='"128"')), "not a number"),
    ],
)
def test_bad_loads_are_a_clear_error(body: str, reason: str) -> None:
    with pytest.raises(LoadsError, match=reason):
        parse_loads(body)


def test_loads_url_is_at_the_metrics_origin() -> None:
    assert loads_url("http://h:30000/metrics") == "http://h:30000/v1/loads"
    assert loads_url("https://h/prefix/metrics") == "https://h/v1/loads"
