"""The Ray form of vLLM's series (``ray_vllm_*`` with replica labels), from a page and from Prometheus."""

from __future__ import annotations

import json

import pytest

from model_concurrency.signals.prometheus_api import PrometheusSource, _snapshot, _vector
from model_concurrency.signals.vllm import MetricsError, parse_vllm_metrics, ray_form, vllm_name
from prometheus_server import prometheus_server, wait_for
from ray_pages import ray_vllm_page
from servers import Behaviour, EngineState, metrics_server, vllm_page

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def node_page() -> str:
    replicas = {
        "abc123": [EngineState(running=30, waiting_capacity=2, waiting_deferred=1, kv=0.4, preemptions=5)],
        "def456": [
            EngineState(running=20, kv=0.7, preemptions=1),
            EngineState(running=6, waiting_capacity=1, kv=0.2),
        ],
    }
    return ray_vllm_page(LLAMA, replicas).decode()


def test_names_map_both_ways() -> None:
    assert ray_form("vllm:num_requests_running") == "ray_vllm_num_requests_running"
    assert ray_form("vllm:num_preemptions_total") == "ray_vllm_num_preemptions_total"
    assert vllm_name("ray_vllm_kv_cache_usage_perc") == "vllm:kv_cache_usage_perc"
    assert vllm_name("ray_tasks") == "ray_tasks"


def test_sums_over_replicas_and_engines() -> None:
    text = node_page()
    assert "ray_vllm_num_requests_running{" in text and 'ReplicaId="def456"' in text
    snap = parse_vllm_metrics(text, LLAMA)
    assert snap.running == 56
    assert snap.waiting == 4
    assert snap.waiting_capacity == 3
    assert snap.kv_cache_usage == 0.7
    assert snap.kv_num_blocks == 3 * 4096
    assert snap.preemptions_total == 6
    assert snap.success_total == 9
    assert snap.queue_time_count_total == 3
    assert snap.queue_time_sum_total == pytest.approx(0.6)


def test_same_answer_as_the_native_page_of_the_same_engines() -> None:
    engines = [EngineState(running=11, waiting_capacity=4, kv=0.5, preemptions=2), EngineState(running=9, kv=0.3)]
    native = parse_vllm_metrics(vllm_page({LLAMA: engines}).decode(), LLAMA)
    ray = parse_vllm_metrics(ray_vllm_page(LLAMA, {"r1": engines}).decode(), LLAMA)
    assert ray == native


def test_selects_the_served_name_and_ignores_rays_own_series() -> None:
    assert "ray_tasks{" in node_page()
    with pytest.raises(MetricsError, match="no vllm:num_requests_running"):
        parse_vllm_metrics(node_page(), "llama")  # the client's id, not the served name


def test_counters_without_total_count_once() -> None:
    with_total = node_page()
    bare_only = with_total.replace("_total{", "{").replace("_total ", " ")
    assert "ray_vllm_num_preemptions{" in bare_only and "ray_vllm_num_preemptions_total" not in bare_only
    assert parse_vllm_metrics(bare_only, LLAMA).preemptions_total == 6
    assert parse_vllm_metrics(bare_only, LLAMA).success_total == 9
    both = with_total + "\n".join(
        line
        for line in bare_only.splitlines()
        if line.startswith(("ray_vllm_num_preemptions{", "ray_vllm_request_success{"))
    )
    snap = parse_vllm_metrics(both + "\n", LLAMA)
    assert (snap.preemptions_total, snap.success_total) == (6, 9)


def test_a_model_in_both_forms_is_refused() -> None:
    mixed = vllm_page({LLAMA: [EngineState(running=3)]}).decode() + node_page()
    with pytest.raises(MetricsError, match="both"):
        parse_vllm_metrics(mixed, LLAMA)


def test_prometheus_answer_in_ray_form() -> None:
    def answer(*pairs: tuple[str, float]) -> str:
        result = [{"metric": {"__name__": n}, "value": [1, str(v)]} for n, v in pairs]
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})

    snap = _snapshot(
        _vector(answer(("ray_vllm_num_requests_running", 40), ("ray_vllm_num_requests_waiting", 2))),
        _vector(answer(("ray_vllm_kv_cache_usage_perc", 0.9))),
    )
    assert (snap.running, snap.waiting, snap.kv_cache_usage) == (40, 2, 0.9)
    with pytest.raises(MetricsError, match="both"):
        _snapshot(_vector(answer(("ray_vllm_num_requests_running", 4), ("vllm:num_requests_running", 4))), [])
    summed, maxed, pools = PrometheusSource("http://127.0.0.1:9090", LLAMA).queries()
    assert "ray_vllm_num_requests_running" in summed and "ray_vllm_kv_cache_usage_perc" in maxed
    assert "ray_vllm_cache_config_info" in pools
    assert "ray_vllm_num_preemptions|" in summed  # the bare counter spelling too
    bare_and_total = answer(
        ("ray_vllm_num_requests_running", 1), ("ray_vllm_num_preemptions", 4), ("ray_vllm_num_preemptions_total", 5)
    )
    assert _snapshot(_vector(bare_and_total), []).preemptions_total == 5


def test_prometheus_scraping_two_ray_nodes() -> None:
    node_a = ray_vllm_page(LLAMA, {"r1": [EngineState(running=30, kv=0.5)]}, node="10.0.0.1")
    node_b = ray_vllm_page(LLAMA, {"r2": [EngineState(running=12, waiting_capacity=1, kv=0.8)]}, node="10.0.0.2")
    with (
        metrics_server(Behaviour(body=node_a)) as a,
        metrics_server(Behaviour(body=node_b)) as b,
        prometheus_server([s.url.removeprefix("http://") for s in (a, b)]) as prom,
    ):
        source = PrometheusSource(prom, LLAMA)

        def both_scraped() -> bool:
            try:
                return source.read().running == 42
            except MetricsError:
                return False

        wait_for(both_scraped)
        snap = source.read()
        assert (snap.running, snap.waiting_capacity, snap.kv_cache_usage) == (42, 1, 0.8)
