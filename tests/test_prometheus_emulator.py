"""A real Prometheus server scraping two emulator replicas; the fleet source reads their sum."""

from __future__ import annotations

import httpx

from model_concurrency import register_model
from model_concurrency.emulator import EmulatorConfig, serve_in_thread
from model_concurrency.hooks import controller_for
from model_concurrency.signals.prometheus_api import PrometheusSource
from model_concurrency.signals.vllm import MetricsError, parse_vllm_metrics
from prometheus_server import prometheus_binary, prometheus_server, wait_for


def test_prometheus_sums_two_emulator_replicas() -> None:
    prometheus_binary()  # skip (or fail in CI) before starting anything
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=32, time_scale=1.0)
    with serve_in_thread(config) as a, serve_in_thread(config) as b:
        for replica, n in ((a, 3), (b, 5)):
            inputs = [f"replica {replica.url} item {i}" for i in range(n)]
            httpx.post(
                f"{replica.base_url}/embeddings", json={"model": replica.model, "input": inputs}
            ).raise_for_status()
        b.set_capacity(engines=2)  # the second replica now reports engine "0" and "1": summed too
        direct = [parse_vllm_metrics(httpx.get(r.metrics_url).text, r.model) for r in (a, b)]
        assert [d.success_total for d in direct] == [3, 5]

        with prometheus_server([a.host_port, b.host_port]) as prom:
            source = PrometheusSource(prom, a.model)

            def both_scraped() -> bool:
                try:
                    snap = source.read()
                except MetricsError:
                    return False
                return snap.success_total == 8

            wait_for(both_scraped)
            snap = source.read()
            assert snap.success_total == 8
            assert snap.running == 0 and snap.waiting_capacity == 0
            assert snap.queue_time_count_total == 8
            # The KV pools of all three engines, so the token budget and the first ramp's jump work on a fleet too.
            assert snap.kv_num_blocks == sum(d.kv_num_blocks or 0 for d in direct) and snap.kv_num_blocks
            assert snap.kv_tokens == sum(d.kv_tokens or 0 for d in direct)

            register_model("fleet", base_url=a.base_url, prometheus_url=prom, served_model_name=a.model)
            controller = controller_for("fleet")
            assert controller is not None and isinstance(controller.source, PrometheusSource)
            assert controller.target() >= 1
            assert controller.core.last_ok is True
