"""MODEL_CONCURRENCY_PROMETHEUS_URL: one setting moves plain processes from scraping engines to Prometheus."""

from __future__ import annotations

import pytest

from model_concurrency import register_model
from model_concurrency.hooks import controller_for
from model_concurrency.signals.prometheus_api import PrometheusSource
from model_concurrency.signals.source import VllmMetricsSource
from model_concurrency.signals.vllm import MetricsError
from prometheus_server import prometheus_server, wait_for
from servers import Behaviour, EngineState, metrics_server, vllm_page

SERVED = "meta-llama/Llama-3.1-8B-Instruct"
KNOB = "MODEL_CONCURRENCY_PROMETHEUS_URL"


def replica(running: float) -> bytes:
    return vllm_page({SERVED: [EngineState(running=running, waiting_capacity=1, kv=0.5)]})


def test_the_setting_routes_models_without_their_own_source_to_prometheus(monkeypatch: pytest.MonkeyPatch) -> None:
    with (
        metrics_server(Behaviour(body=replica(30))) as a,
        metrics_server(Behaviour(body=replica(12))) as b,
        prometheus_server([s.url.removeprefix("http://") for s in (a, b)]) as prom,
    ):
        fleet = PrometheusSource(prom, SERVED)

        def both_scraped() -> bool:
            try:
                return fleet.read().running == 42
            except MetricsError:
                return False

        wait_for(both_scraped)
        monkeypatch.setenv(KNOB, prom)
        # Only a base_url (behind a balancer, /metrics would reach one replica): the fleet from Prometheus.
        register_model("by-base", base_url=f"{a.url}/v1", served_model_name=SERVED)
        # An explicit metrics_url was chosen on purpose: kept.
        register_model("by-metrics", base_url=f"{a.url}/v1", metrics_url=f"{b.url}/metrics", served_model_name=SERVED)
        # Its own Prometheus wins over the fleet-wide one.
        own = "http://127.0.0.1:9/"
        register_model("own-prom", base_url=f"{a.url}/v1", prometheus_url=own, served_model_name=SERVED)

        by_base = controller_for("by-base")
        assert by_base is not None and isinstance(by_base.source, PrometheusSource)
        assert by_base.source.prometheus_url == prom
        by_base.target()
        assert by_base.core.last_ok is True
        assert by_base.core.last_observation is not None and by_base.core.last_observation.running == 42

        by_metrics = controller_for("by-metrics")
        assert by_metrics is not None and isinstance(by_metrics.source, VllmMetricsSource)
        by_metrics.target()
        assert by_metrics.core.last_observation is not None and by_metrics.core.last_observation.running == 12

        own_prom = controller_for("own-prom")
        assert own_prom is not None and isinstance(own_prom.source, PrometheusSource)
        assert own_prom.source.prometheus_url == own


def test_unset_or_empty_setting_scrapes_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    with metrics_server(Behaviour(body=replica(7))) as a:
        for value in (None, "", "  "):
            if value is None:
                monkeypatch.delenv(KNOB, raising=False)
            else:
                monkeypatch.setenv(KNOB, value)
            register_model("m", base_url=f"{a.url}/v1", served_model_name=SERVED)
            runtime = controller_for("m")
            assert runtime is not None and isinstance(runtime.source, VllmMetricsSource)
            runtime.target()
            assert runtime.core.last_observation is not None and runtime.core.last_observation.running == 7


def test_a_malformed_setting_is_warned_about_and_ignored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Like every knob: garbage falls back to the default (scrape the engine) with a warning naming it.
    with metrics_server(Behaviour(body=replica(5))) as a:
        monkeypatch.setenv(KNOB, "prometheus:9090")  # no scheme
        register_model("m", base_url=f"{a.url}/v1", served_model_name=SERVED)
        with caplog.at_level("WARNING", logger="model_concurrency"):
            runtime = controller_for("m")
        assert runtime is not None and isinstance(runtime.source, VllmMetricsSource)
        assert any(KNOB in r.getMessage() and "prometheus:9090" in r.getMessage() for r in caplog.records)
        runtime.target()
        assert runtime.core.last_observation is not None and runtime.core.last_observation.running == 5
