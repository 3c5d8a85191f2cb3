"""Current pages: vLLM's latest metrics design and SGLang's, parsed to exact values and read through the live path.

Fixtures are rendered by prometheus_client from the published metric lists (tests/servers.py): vLLM's
``docs/design/metrics.md`` (``kv_cache_usage_perc`` only, ``num_requests_waiting_by_reason{capacity|deferred}``)
and SGLang's ``python/sglang/srt/metrics/collector.py``. The source picks the parser from the page, per model.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from model_concurrency import get_utilization, map_concurrent, register_model, resolve_capacity
from model_concurrency.runtime import runtime_for
from model_concurrency.signals.saturation import engine_saturation, pool_saturated, pool_saturation
from model_concurrency.signals.sglang import parse_metrics_page, parse_sglang_metrics
from model_concurrency.signals.vllm import MetricsError, is_capacity_reason, parse_vllm_metrics
from servers import Behaviour, EngineState, SglangScheduler, metrics_server, sglang_page, vllm_page

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen2.5-7B-Instruct"


# -- vLLM, the latest design -------------------------------------------------------------------------------------
def test_latest_vllm_page_exact() -> None:
    page = vllm_page(
        {
            LLAMA: [
                EngineState(running=30, waiting_capacity=2, waiting_deferred=5, kv=0.4, preemptions=5),
                EngineState(running=20, waiting_capacity=1, waiting_deferred=0, kv=0.7, preemptions=1),
            ]
        }
    ).decode()
    assert "gpu_cache_usage_perc" not in page
    snap = parse_metrics_page(page, LLAMA)
    assert (snap.running, snap.waiting, snap.waiting_capacity) == (50, 8, 3)  # deferred: waiting, not capacity
    assert (snap.kv_cache_usage, snap.kv_num_blocks, snap.kv_tokens) == (0.7, 8192, 131072)
    assert (snap.preemptions_total, snap.success_total, snap.queue_time_count_total) == (6, 6, 2)
    # The gateway's score: engine 0 max(7/5, 0.4/0.8) = 1.4, engine 1 max(1/5, 0.7/0.8) = 0.875.
    assert snap.gateway_saturation == pytest.approx((1.4 + 0.875) / 2)


def test_deferred_only_is_no_capacity_wait() -> None:
    """Only deferred requests waiting: the capacity count is 0, never a fall-back to the total waiting."""
    page = vllm_page({LLAMA: [EngineState(running=12, waiting_capacity=0, waiting_deferred=4)]}).decode()
    page = "\n".join(line for line in page.splitlines() if 'reason="capacity"' not in line) + "\n"
    snap = parse_vllm_metrics(page, LLAMA)
    assert (snap.waiting, snap.waiting_capacity) == (4, 0)


@pytest.mark.parametrize(
    ("reason", "capacity"),
    [
        ("capacity", True),
        ("deferred", False),
        ("Waiting for capacity", True),
        ("Deferred (LoRA budget), not a capacity wait", False),
        ("", False),
    ],
)
def test_reason_values(reason: str, capacity: bool) -> None:
    assert is_capacity_reason(reason) is capacity


# -- SGLang -----------------------------------------------------------------------------------------------------
def qwen_page(**kwargs: object) -> str:
    schedulers = [
        SglangScheduler(running=40, queue=3, token_usage=0.55, max_tokens=200_000, retracted=2),
        SglangScheduler(running=25, queue=0, token_usage=0.82, max_tokens=200_000, retracted=1, grammar_queue=4),
    ]
    return sglang_page({QWEN: schedulers, "other": [SglangScheduler(running=9)]}, **kwargs).decode()  # type: ignore[arg-type]


@pytest.mark.parametrize("tp", [1, 4])
def test_sglang_page_exact(tp: int) -> None:
    """Two data-parallel schedulers summed; their TP ranks repeat one scheduler's numbers and count once."""
    snap = parse_metrics_page(qwen_page(tp=tp), QWEN)
    assert (snap.running, snap.waiting, snap.waiting_capacity) == (65, 3, 3)  # the grammar queue is not read
    assert snap.kv_cache_usage == 0.82
    assert (snap.kv_tokens, snap.kv_num_blocks) == (400_000, 400_000)
    assert snap.preemptions_total == 3  # retractions
    assert (snap.success_total, snap.generation_tokens_total) == (3, 150)
    assert snap.queue_time_count_total == 2 and snap.queue_time_sum_total == pytest.approx(0.4)
    # max(3/5, 0.55/0.8) = 0.6875 and max(0, 0.82/0.8) = 1.025
    assert snap.gateway_saturation == pytest.approx((0.6875 + 1.025) / 2)


def test_sglang_kv_from_token_counts_when_usage_is_absent() -> None:
    page = "\n".join(line for line in qwen_page().splitlines() if not line.startswith("sglang:token_usage")) + "\n"
    assert parse_sglang_metrics(page, QWEN).kv_cache_usage == pytest.approx(0.82)


def test_sglang_single_scheduler_has_no_dp_rank() -> None:
    snap = parse_metrics_page(sglang_page({QWEN: [SglangScheduler(running=7, queue=1)]}).decode(), QWEN)
    assert (snap.running, snap.waiting_capacity, snap.kv_tokens) == (7, 1, 100_000)


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (f'sglang:token_usage{{model_name="{QWEN}",tp_rank="9"}} 1.5', "implausible"),
        (f'sglang:num_queue_reqs{{model_name="{QWEN}",tp_rank="9"}} NaN', "implausible"),
        (f'sglang:num_running_reqs{{model_name="{QWEN}",tp_rank="9"}} -1', "implausible"),
    ],
)
def test_sglang_implausible_values_fail(line: str, match: str) -> None:
    with pytest.raises(MetricsError, match=match):
        parse_metrics_page(qwen_page() + line + "\n", QWEN)


def test_sglang_duplicate_series_fails() -> None:
    line = f'sglang:num_running_reqs{{model_name="{QWEN}",tp_rank="0"}} 1\n'
    with pytest.raises(MetricsError, match="duplicate"):
        parse_sglang_metrics(line + line, QWEN)


def test_the_page_chooses_the_parser_per_model() -> None:
    mixed = vllm_page({LLAMA: [EngineState(running=11)]}).decode() + qwen_page()
    assert parse_metrics_page(mixed, LLAMA).running == 11
    assert parse_metrics_page(mixed, QWEN).running == 65
    with pytest.raises(MetricsError, match="no vllm:num_requests_running"):
        parse_metrics_page(mixed, "absent-model")
    both = vllm_page({QWEN: [EngineState(running=1)]}).decode() + qwen_page()
    with pytest.raises(MetricsError, match="both"):
        parse_metrics_page(both, QWEN)


# -- the gateway's arithmetic -----------------------------------------------------------------------------------
def test_gateway_rule() -> None:
    assert engine_saturation(5, 0.1) == 1.0 and engine_saturation(0, 0.8) == 1.0
    assert engine_saturation(2, None) == 0.4
    assert pool_saturation([0.5, None]) == 0.75  # stale counts as 1.0
    assert pool_saturation([]) is None
    assert pool_saturated(1.0) and pool_saturated(None) and not pool_saturated(0.99)


# -- the live path ----------------------------------------------------------------------------------------------
def test_resolve_capacity_reads_an_sglang_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook alone ramps on an SGLang page whose running is what it was told, and cuts on a queue."""
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")  # every call polls: fine against a local server
    queue = [0.0]
    with metrics_server() as server:
        register_model("qwen", base_url=f"{server.url}/v1", served_model_name=QWEN, max_parallel_calls=4)
        runtime = runtime_for("qwen")

        def page() -> bytes:
            running = runtime.current()
            return sglang_page({QWEN: [SglangScheduler(running=running, queue=queue[0], token_usage=0.01)]})

        server.behaviour = Behaviour(render=page)
        targets = [resolve_capacity("qwen") for _ in range(8)]
        assert targets == sorted(targets) and targets[-1] >= 32
        util = get_utilization("qwen")
        assert util["metrics_ok"] is True and util["saturated"] is False
        queue[0] = 20
        assert resolve_capacity("qwen") < targets[-1]
        assert get_utilization("qwen")["saturated"] is True and get_utilization("qwen")["waiting_capacity"] == 20


def test_map_concurrent_ramps_on_an_sglang_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0.05")
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "64")
    with metrics_server() as server:
        register_model("qwen", base_url=f"{server.url}/v1", served_model_name=QWEN, max_parallel_calls=4)
        runtime = runtime_for("qwen")
        server.behaviour = Behaviour(
            render=lambda: sglang_page({QWEN: [SglangScheduler(running=runtime.inflight(), token_usage=0.01)]})
        )

        async def items() -> AsyncIterator[int]:
            # Until the target left the floor and the page was read a few times (the first ramp may leave the
            # floor on its first poll), so the second ask of /v1/loads has had its chances.
            i = 0
            while (runtime.current() < 16 or runtime.core.polls < 3) and runtime.core.polls < 40:
                yield i
                i += 1

        async def call(i: int) -> int:
            await asyncio.sleep(0.02)
            return i

        asyncio.run(map_concurrent(items(), call, model="qwen"))
        assert runtime.current() >= 16 and runtime.core.last_ok is True
        paths = [path for path, _ in server.requests]
        # Beside the SGLang page, /v1/loads once: this server answers it 404, and the source never asks again.
        assert paths.count("/metrics") > 1 and paths.count("/v1/loads") == 1
        assert set(paths) == {"/metrics", "/v1/loads"}


def test_promql_answer_with_deferred_only_has_no_capacity_wait() -> None:
    """The fleet source sums the same series; the same rule holds there."""
    from model_concurrency.signals.prometheus_api import _snapshot

    summed = [
        ({"__name__": "vllm:num_requests_running"}, 40.0),
        ({"__name__": "vllm:num_requests_waiting"}, 5.0),
        ({"__name__": "vllm:num_requests_waiting_by_reason", "reason": "deferred"}, 5.0),
    ]
    snap = _snapshot(summed, [])
    assert (snap.running, snap.waiting, snap.waiting_capacity, snap.gateway_saturation) == (40, 5, 0, None)
