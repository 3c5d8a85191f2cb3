"""The engine model and the emulator state their own limits: cache_config_info's 0.24 labels, SGLang's /v1/loads."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import simpy
from prometheus_client.parser import text_string_to_metric_families

from engine_helpers import tiny_preset
from model_concurrency import EngineLimits
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.engine import Server
from model_concurrency.engine.metrics import render_engines
from model_concurrency.signals.sglang import parse_metrics_page
from model_concurrency.signals.source import VllmMetricsSource

MODEL = "org/tiny-model-1.0"
BLOCKS = 120  # tiny_preset's KV: 120 blocks of 16 tokens


def cache_labels(page: str) -> list[dict[str, str]]:
    return [
        sample.labels
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == "vllm:cache_config_info"
    ]


def test_the_latest_vllm_page_states_the_kv_tokens_and_concurrency() -> None:
    server = Server(simpy.Environment(), tiny_preset(num_gpu_blocks=BLOCKS), num_engines=2)
    page = render_engines(server.engines, "vllm-new")
    labels = cache_labels(page)
    assert [(info["kv_cache_size_tokens"], info["kv_cache_max_concurrency"]) for info in labels] == [
        ("1920", "1.01"),  # 120 × 16 tokens; the longest request the engine takes is 119 blocks
        ("1920", "1.01"),
    ]
    snapshot = parse_metrics_page(page, MODEL)
    assert snapshot.limits == EngineLimits(
        kv_cache_tokens=3840,
        kv_cache_max_concurrency=2.02,
        source={"kv_cache_tokens": "vllm cache_config_info", "kv_cache_max_concurrency": "vllm cache_config_info"},
    )
    assert snapshot == server.snapshot()  # the limits take no part in comparing a page with the engine's reading


def test_an_older_vllm_page_falls_back_to_blocks_times_block_size() -> None:
    server = Server(simpy.Environment(), tiny_preset(num_gpu_blocks=BLOCKS), num_engines=2)
    page = render_engines(server.engines, "vllm")
    assert all("kv_cache_size_tokens" not in info and info["num_gpu_blocks"] == "120" for info in cache_labels(page))
    limits = parse_metrics_page(page, MODEL).limits
    assert limits == EngineLimits(kv_cache_tokens=3840, source={"kv_cache_tokens": "vllm cache_config_info"})


@pytest.fixture(scope="module")
def sglang_emu() -> Iterator[RunningEmulator]:
    config = EmulatorConfig(preset="bge-m3", engines=2, max_num_seqs=32, metrics_flavor="sglang", time_scale=1.0)
    with serve_in_thread(config) as running:
        yield running


def test_the_sglang_emulator_serves_its_load_report(sglang_emu: RunningEmulator) -> None:
    report = httpx.get(f"{sglang_emu.url}/v1/loads").json()
    assert set(report) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    assert report["num_accelerators"] == 2
    assert report["loads"] == [
        {"dp_rank": rank, "num_running_reqs": 0, "num_waiting_reqs": 0, "num_used_tokens": 0,
         "max_total_num_tokens": 27_900 * 16, "max_running_requests": 32, "token_usage": 0.0}
        for rank in (0, 1)
    ]  # fmt: skip


def test_the_load_report_as_prometheus_text(sglang_emu: RunningEmulator) -> None:
    text = httpx.get(f"{sglang_emu.url}/v1/loads", params={"format": "prometheus"}).text
    seen = {
        (sample.name, sample.labels["dp_rank"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert seen[("sglang_max_running_requests", "0")] == seen[("sglang_max_running_requests", "1")] == 32
    assert seen[("sglang_max_total_num_tokens", "1")] == 27_900 * 16
    assert len(seen) == 12  # six gauges, two ranks


def test_a_source_reads_the_emulators_limits_beside_its_sglang_page(sglang_emu: RunningEmulator) -> None:
    source = VllmMetricsSource(metrics_url=sglang_emu.metrics_url, served_model_name=sglang_emu.model)
    limits = source.read().limits
    assert limits == EngineLimits(
        max_num_seqs=64,
        kv_cache_tokens=2 * 27_900 * 16,
        source={"max_num_seqs": "sglang /v1/loads", "kv_cache_tokens": "sglang /v1/loads"},
    )
    assert source.loads is not None and not source.loads.missing and source.loads.last_error is None


@pytest.mark.parametrize("flavor", ["vllm-new", "vllm"])
def test_a_vllm_emulator_has_no_load_report(flavor: str) -> None:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", metrics_flavor=flavor, time_scale=1.0)) as emu:
        r = httpx.get(f"{emu.url}/v1/loads")
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
        limits = VllmMetricsSource(metrics_url=emu.metrics_url, served_model_name=emu.model).read().limits
        assert limits is not None and limits.kv_cache_tokens == 27_900 * 16
