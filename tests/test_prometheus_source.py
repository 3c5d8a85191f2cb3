"""The fleet signal source against a real Prometheus server scraping two replicas on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import pytest

from model_concurrency import register_model
from model_concurrency.hooks import controller_for
from model_concurrency.signals.prometheus_api import PrometheusSource, _snapshot, _vector, promql_string
from model_concurrency.signals.vllm import MetricsError
from prometheus_server import prometheus_server, wait_for
from servers import Behaviour, EngineState, metrics_server, vllm_page

SERVED = "meta-llama/Llama-3.1-8B-Instruct"


def replica(running: float, capacity: float, kv: float) -> bytes:
    return vllm_page(
        {SERVED: [EngineState(running=running, waiting_capacity=capacity, kv=kv)], "other": [EngineState(running=100)]}
    )


def test_sum_over_two_replicas() -> None:
    with (
        metrics_server(Behaviour(body=replica(30, 2, 0.5))) as a,
        metrics_server(Behaviour(body=replica(12, 1, 0.8))) as b,
    ):
        targets = [s.url.removeprefix("http://") for s in (a, b)]
        with prometheus_server(targets) as prom:
            source = PrometheusSource(prom, SERVED)

            def both_scraped() -> bool:
                try:
                    return source.read().running == 42
                except MetricsError:
                    return False

            wait_for(both_scraped)
            snap = source.read()
            assert snap.running == 42
            assert snap.waiting_capacity == 3
            assert snap.waiting == 3
            assert snap.kv_cache_usage == 0.8
            assert snap.success_total == 6
            # Each replica's one engine of this model states a pool of 4,096 blocks of 16 tokens; "other" is not ours.
            assert snap.kv_num_blocks == 2 * 4096 and snap.kv_tokens == 2 * 4096 * 16
            assert asyncio.run(source.aread()) == snap

            # Through the registry: a model with prometheus_url polls the fleet source.
            register_model("llama", base_url=f"{a.url}/v1", prometheus_url=prom, served_model_name=SERVED)
            controller = controller_for("llama")
            assert controller is not None and isinstance(controller.source, PrometheusSource)
            controller.target()
            assert controller.core.last_ok is True
            assert controller.core.last_observation is not None and controller.core.last_observation.running == 42

            # A model Prometheus has never seen is a failed poll, not zeros.
            with pytest.raises(MetricsError, match="no vllm:num_requests_running"):
                PrometheusSource(prom, "not-served").read()


def test_promql_string_escapes() -> None:
    assert promql_string('a"b\\c/d') == '"a\\"b\\\\c/d"'


def test_malformed_answers_are_metrics_errors() -> None:
    for text in [
        "",
        "{}",
        '{"status":"error","error":"bad"}',
        '{"status":"success","data":{"resultType":"matrix"}}',
        '{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1]}]}}',
        "[]",
    ]:
        with pytest.raises(MetricsError):
            _vector(text)
    answer = json.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [{"metric": {"__name__": "vllm:num_requests_running"}, "value": [1, "NaN"]}],
            },
        }
    )
    with pytest.raises(MetricsError, match="implausible"):
        _snapshot(_vector(answer), [])


def test_pool_series_without_a_model_name_count_and_other_models_do_not() -> None:
    summed = [({"__name__": "vllm:num_requests_running"}, 3.0)]
    pools = [
        ({"__name__": "vllm:cache_config_info", "num_gpu_blocks": "100", "block_size": "16"}, 1.0),
        ({"__name__": "vllm:cache_config_info", "model_name": SERVED, "num_gpu_blocks": "50"}, 1.0),
        ({"__name__": "vllm:cache_config_info", "model_name": "other", "num_gpu_blocks": "7", "block_size": "16"}, 1.0),
        ({"__name__": "vllm:cache_config_info", "num_gpu_blocks": "n/a"}, 1.0),
    ]
    snap = _snapshot(summed, [], pools, SERVED)
    # 100 + 50 blocks; tokens only where the block size is stated.
    assert snap.kv_num_blocks == 150 and snap.kv_tokens == 1600
    assert _snapshot(summed, []).kv_num_blocks is None
