"""Saturation as gateways count it, beside ours: the lab summary's key, ``get_utilization`` and ``watch``'s column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model_concurrency import get_utilization, register_model, resolve_capacity
from model_concurrency.cli import main
from model_concurrency.cli.live import gateway_cell, utilization_rows
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.lab.summary import SUMMARY_KEYS, summarize
from model_concurrency.lab.trace import ClientTrace, Trace, load_trace, save_trace
from model_concurrency.policies.registry import load_policy
from servers import Behaviour, EngineState, metrics_server, vllm_page

SIMS = Path(__file__).resolve().parents[1] / "sims"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"


def trace_with(scores: list[float]) -> Trace:
    n = len(scores)
    zeros = np.zeros(n)
    client = ClientTrace(target=zeros, inflight=zeros, completions=zeros, errors=zeros, throttled=zeros)
    return Trace(
        time=np.arange(float(n)),
        running=zeros,
        waiting_capacity=zeros,
        kv_usage=zeros,
        preemptions=zeros,
        clients=[client],
        queue_times=np.zeros(0),
        latencies=np.zeros(0),
        finish_times=np.zeros(0),
        duration_s=float(n),
        gateway_saturation=np.asarray(scores),
    )


def test_summary_key_exact(tmp_path: Path) -> None:
    trace = trace_with([0.5, 1.0, 1.2, 0.99])
    assert "saturated_gateway_fraction" in SUMMARY_KEYS
    assert summarize(trace)["saturated_gateway_fraction"] == 0.5
    save_trace(trace, tmp_path / "t")
    assert summarize(load_trace(tmp_path / "t"))["saturated_gateway_fraction"] == 0.5
    unsampled = trace_with([0.0, 0.0])
    unsampled.gateway_saturation = np.zeros(0)
    save_trace(unsampled, tmp_path / "u")  # an older trace without the series still loads
    assert summarize(load_trace(tmp_path / "u"))["saturated_gateway_fraction"] is None


def test_lab_run_reports_the_gateway_view_and_stale_metrics_count() -> None:
    """A metrics outage is stale metrics for the gateway: saturated for as long as it lasts, whatever ours says."""
    scenario = load_scenario(SIMS / "metrics-outage.toml").scaled(0.1)
    trace = simulate(scenario, policy_factory=lambda: load_policy("adaptive"))
    summary = summarize(trace)
    assert len(trace.gateway_saturation) == len(trace.time)
    down = [(e.at_s, e.action) for e in scenario.events if e.action in ("metrics_down", "metrics_up")]
    assert down, scenario.events
    starts = [t for t, action in down if action == "metrics_down"]
    ends = [t for t, action in down if action == "metrics_up"] or [scenario.duration_s]
    outage = (trace.time >= starts[0]) & (trace.time < ends[0])
    assert np.all(trace.gateway_saturation[outage] == 1.0)
    assert summary["saturated_gateway_fraction"] >= float(np.mean(outage)) - 1e-9


def test_get_utilization_and_watch_show_the_gateway_score(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    # engine 0: max(6/5, 0.2/0.8) = 1.2; engine 1: max(0, 0.4/0.8) = 0.5 -> mean 0.85, not saturated
    page = vllm_page({SERVED: [EngineState(running=9, waiting_capacity=6, kv=0.2), EngineState(running=4, kv=0.4)]})
    with metrics_server(Behaviour(body=page)) as server:
        register_model("llama", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=4)
        resolve_capacity("llama")
        util = get_utilization("llama")
        assert util["gateway_saturation"] == pytest.approx(0.85) and util["gateway_saturated"] is False
        assert util["saturated"] is True  # ours: capacity-waiting requests
        assert utilization_rows()[0]["gateway_saturation"] == "0.85"
        server.serve(b"", status=503)
        resolve_capacity("llama")
        util = get_utilization("llama")
        assert util["gateway_saturation"] is None and util["gateway_saturated"] is True  # stale counts
        assert utilization_rows()[0]["gateway_saturation"] == "stale sat"


def test_gateway_cell() -> None:
    assert gateway_cell(1.25, True) == "1.25 sat"
    assert gateway_cell(None, None) is None  # static: nothing measured
    assert gateway_cell(None, True) == "stale sat"


def test_watch_once_has_the_gateway_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = vllm_page({SERVED: [EngineState(running=2, kv=0.9)]})
    with metrics_server(Behaviour(body=page)) as server:
        config = tmp_path / "models.toml"
        config.write_text(f'[models.llama]\nbase_url = "{server.url}/v1"\nserved_model_name = "{SERVED}"\n')
        assert main(["watch", "--config", str(config), "--once"]) == 0
    out = capsys.readouterr().out
    assert "gateway" in out and "1.12 sat" in out  # 0.9 / 0.8
