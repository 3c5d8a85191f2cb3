"""Parsing a vLLM /metrics page: selection by served name, sums over engines, quirks, and garbage."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency.signals.vllm import MetricsError, parse_vllm_metrics
from servers import EngineState, vllm_page

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
BGE = "BAAI/bge-m3"


def page(**kwargs: object) -> str:
    models = {
        LLAMA: [
            EngineState(running=30, waiting_capacity=2, waiting_deferred=1, kv=0.4, preemptions=5),
            EngineState(running=20, waiting_capacity=0, waiting_deferred=0, kv=0.7, preemptions=1),
        ],
        BGE: [EngineState(running=3)],
    }
    return vllm_page(models, **kwargs).decode()  # type: ignore[arg-type]


def test_sums_over_engines_and_takes_max_kv() -> None:
    snap = parse_vllm_metrics(page(), LLAMA)
    assert snap.running == 50
    assert snap.waiting == 3
    assert snap.waiting_capacity == 2
    assert snap.kv_cache_usage == 0.7
    assert snap.kv_num_blocks == 8192
    assert snap.preemptions_total == 6
    assert snap.success_total == 6
    assert snap.queue_time_count_total == 2
    assert snap.queue_time_sum_total == pytest.approx(0.4)


def test_selects_the_served_name_only() -> None:
    assert parse_vllm_metrics(page(), BGE).running == 3
    with pytest.raises(MetricsError, match="no vllm:num_requests_running"):
        parse_vllm_metrics(page(), "bge-m3")  # the client's id, not the served name


def test_old_kv_gauge_name() -> None:
    assert parse_vllm_metrics(page(old_kv_name=True), LLAMA).kv_cache_usage == 0.7


def test_without_by_reason_gauge_capacity_is_unknown() -> None:
    snap = parse_vllm_metrics(page(by_reason=False), LLAMA)
    assert snap.waiting_capacity is None and snap.waiting == 3


def test_missing_waiting_counts_as_zero() -> None:
    text = f'vllm:num_requests_running{{model_name="{LLAMA}"}} 4\n'
    snap = parse_vllm_metrics(text, LLAMA)
    assert (snap.running, snap.waiting, snap.waiting_capacity) == (4, 0, None)


def test_label_values_with_braces_commas_quotes_and_utf8() -> None:
    name = 'we}ird,"model" ü/ß'
    escaped = name.replace('"', '\\"')
    text = (
        f'vllm:num_requests_running{{engine="0",model_name="{escaped}"}} 7.0\n'
        f'vllm:num_requests_waiting_by_reason{{model_name="{escaped}",'
        'reason="Waiting for capacity, see \\"docs\\""} 2\n'
        f'vllm:num_requests_running{{engine="0",model_name="we"}} 99\n'
    )
    snap = parse_vllm_metrics(text, name)
    assert snap.running == 7 and snap.waiting_capacity == 2


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-1", "1e308"])
def test_implausible_gauges_fail(value: str) -> None:
    text = f'vllm:num_requests_running{{model_name="m"}} {value}\n'
    with pytest.raises(MetricsError, match="implausible"):
        parse_vllm_metrics(text, "m")


def test_kv_usage_out_of_range_fails() -> None:
    text = 'vllm:num_requests_running{model_name="m"} 1\nvllm:kv_cache_usage_perc{model_name="m"} 1.5\n'
    with pytest.raises(MetricsError):
        parse_vllm_metrics(text, "m")


def test_duplicate_series_fails() -> None:
    text = (
        'vllm:num_requests_running{model_name="m",engine="0"} 1\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
    )
    with pytest.raises(MetricsError, match="duplicate"):
        parse_vllm_metrics(text, "m")


def test_empty_and_binary_pages_fail() -> None:
    for text in ["", "\x00\x01\x02garbage{{{", 'vllm:num_requests_running{model_name="m" 3\n']:
        with pytest.raises(MetricsError):
            parse_vllm_metrics(text, "m")


@given(st.text(max_size=400))
def test_any_text_is_a_snapshot_or_a_metrics_error(text: str) -> None:
    try:
        snap = parse_vllm_metrics(text, "m")
    except MetricsError:
        return
    assert math.isfinite(snap.running) and snap.running >= 0


valid = page()


@given(st.data())
def test_mutated_pages_never_raise_anything_else(data: st.DataObject) -> None:
    # Truncations, byte flips and insertions of a real page.
    raw = bytearray(valid.encode())
    cut = data.draw(st.integers(0, len(raw)))
    raw = raw[:cut]
    for _ in range(data.draw(st.integers(0, 5))):
        if raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
    text = raw.decode("utf-8", errors="replace")
    try:
        snap = parse_vllm_metrics(text, LLAMA)
    except MetricsError:
        return
    assert snap.running >= 0


def test_cache_config_info_without_model_name_is_read() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2048"} 1\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="2048"} 1\n'
    )
    assert parse_vllm_metrics(text, "m").kv_num_blocks == 4096
