"""The controller's own state is exported through prometheus_client's default registry."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import POLL_WAIT_MAX_S, FakeClock
from model_concurrency import register_model
from model_concurrency.runtime import ModelRuntime
from servers import Behaviour, EngineState, metrics_server, vllm_page


def exported(model: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for sample in family.samples:
            if sample.name.startswith("model_concurrency_") and sample.labels.get("model") == model:
                key = sample.name + (f"[{sample.labels['outcome']}]" if "outcome" in sample.labels else "")
                out[key] = sample.value
    return out


def test_target_and_state_are_exported(clock: FakeClock) -> None:
    page = vllm_page({"served": [EngineState(running=5, waiting_capacity=2)]})
    with metrics_server(Behaviour(body=page)) as server:
        spec = register_model(
            "telemetry-model", base_url=f"{server.url}/v1", served_model_name="served", max_parallel_calls=6
        )
        controller = ModelRuntime(spec, clock=clock)
        for _ in range(3):  # three calls in flight through the model's own limiter
            assert controller.limiter.try_acquire()
        controller.target()
        metrics = exported("telemetry-model")
        assert metrics["model_concurrency_target"] == 6
        assert metrics["model_concurrency_floor"] == 6
        assert metrics["model_concurrency_ceiling"] == 512
        assert metrics["model_concurrency_inflight"] == 3
        assert metrics["model_concurrency_saturated"] == 1
        assert metrics["model_concurrency_metrics_ok"] == 1
        ok_before = metrics["model_concurrency_polls_total[ok]"]
        server.serve(b"garbage", status=500)
        clock.advance(POLL_WAIT_MAX_S)
        controller.target()
        metrics = exported("telemetry-model")
        assert metrics["model_concurrency_metrics_ok"] == 0
        assert metrics["model_concurrency_polls_total[failed]"] >= 1
        assert metrics["model_concurrency_polls_total[ok]"] == ok_before


def test_both_budgets_are_exported() -> None:
    from model_concurrency.policies.base import PolicyBase, Target
    from model_concurrency.signals.source import ClientOnlySource
    from model_concurrency.telemetry import snapshot

    class TwoBudgets(PolicyBase):
        def next_target(self, target: float, obs: object) -> float:
            return Target(9, 5000)

    runtime = ModelRuntime(None, name="telemetry-tokens", source=ClientOnlySource(), policy=TwoBudgets())
    runtime.target()
    assert runtime.limiter.try_acquire(1200) and runtime.limiter.try_acquire()
    runtime.core.next_poll_at = 0.0  # due again: publish after the calls started
    runtime.target()
    metrics = exported("telemetry-tokens")
    assert metrics["model_concurrency_target"] == 9
    assert metrics["model_concurrency_token_budget"] == 5000
    assert metrics["model_concurrency_inflight"] == 2
    assert metrics["model_concurrency_inflight_tokens"] == 1200
    assert snapshot(runtime)["token_budget"] == 5000 and snapshot(runtime)["inflight_tokens"] == 1200
