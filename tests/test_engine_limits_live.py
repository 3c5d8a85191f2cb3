"""The engines' limits through real HTTP: SGLang's /v1/loads beside its page, and what get_utilization shows."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from conftest import POLL_WAIT_MAX_S, FakeClock
from model_concurrency import get_utilization, register_model
from model_concurrency.runtime import ModelRuntime
from model_concurrency.signals.scrape import ScrapeLimits
from model_concurrency.signals.source import VllmMetricsSource
from servers import Behaviour, EngineState, SglangScheduler, metrics_server, sglang_page, vllm_page

QWEN = "Qwen/Qwen2.5-7B-Instruct"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
FAST = ScrapeLimits(timeout_s=1.0, deadline_s=2.0)


def loads_body(*ranks: tuple[int, int]) -> bytes:
    """A /v1/loads answer with one (max_running_requests, max_total_num_tokens) per dp rank."""
    loads = [
        {"dp_rank": i, "num_running_reqs": 1, "num_waiting_reqs": 0, "num_used_tokens": 10,
         "max_total_num_tokens": tokens, "max_running_requests": seqs, "token_usage": 0.001}
        for i, (seqs, tokens) in enumerate(ranks)
    ]  # fmt: skip
    body = {"timestamp": "2026-01-01T00:00:00", "version": "0.5.9", "accelerator": "cuda", "num_accelerators": 2}
    return json.dumps({**body, "loads": loads}).encode()


def source_for(url: str) -> VllmMetricsSource:
    return VllmMetricsSource(metrics_url=f"{url}/metrics", served_model_name=QWEN, limits=FAST)


def paths(server: object) -> list[str]:
    return [path for path, _ in server.requests]  # type: ignore[attr-defined]


def test_an_sglang_page_gets_its_limits_from_v1_loads() -> None:
    page = sglang_page({QWEN: [SglangScheduler(max_tokens=150_000), SglangScheduler(max_tokens=150_000)]})
    with metrics_server(Behaviour(body=page, loads=lambda: loads_body((48, 150_000), (48, 150_000)))) as server:
        source = source_for(server.url)
        snapshot = source.read()
        assert snapshot.limits is not None
        assert snapshot.limits.as_dict() == {
            "max_num_seqs": 96,
            "max_num_batched_tokens": None,
            "kv_cache_tokens": 300_000,
            "kv_cache_max_concurrency": None,
            "source": {"max_num_seqs": "sglang /v1/loads", "kv_cache_tokens": "sglang /v1/loads"},
        }
        again = asyncio.run(source.aread())
        assert again.limits == snapshot.limits
        assert paths(server) == ["/metrics", "/v1/loads", "/metrics", "/v1/loads"]
        assert server.requests[1][1]["Accept"] == "application/json"


def test_a_404_is_asked_once_and_the_page_pool_stands() -> None:
    with metrics_server(Behaviour(body=sglang_page({QWEN: [SglangScheduler(max_tokens=80_000)]}))) as server:
        source = source_for(server.url)
        limits = [source.read().limits for _ in range(3)]
        assert paths(server) == ["/metrics", "/v1/loads", "/metrics", "/metrics"]
        assert source.loads is not None and source.loads.missing
        assert all(lim is not None and lim.as_dict()["kv_cache_tokens"] == 80_000 for lim in limits)
        assert limits[0] is not None and limits[0].source == {"kv_cache_tokens": "sglang /metrics"}


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"not json at all", "not JSON"),
        (b'{"loads": [{"dp_rank": 0, "max_running_requests": NaN}]}', "NaN in the JSON"),
        (b'{"loads": [' + b'{"dp_rank": 0}, ' * 30_000 + b"{}]}", "larger than 262144 bytes"),
    ],
)
def test_a_bad_answer_leaves_the_limits_unknown_and_the_poll_good(
    answer: bytes, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    page = sglang_page({QWEN: [SglangScheduler(running=5, max_tokens=80_000)]})
    with metrics_server(Behaviour(body=page, loads=lambda: answer)) as server:
        source = source_for(server.url)
        with caplog.at_level(logging.DEBUG, logger="model_concurrency"):
            first, second = source.read(), source.read()
        assert (first.running, second.running) == (5, 5)
        assert first.limits is not None and first.limits.source == {"kv_cache_tokens": "sglang /metrics"}
        assert source.loads is not None and error in (source.loads.last_error or "")
        assert paths(server).count("/v1/loads") == 2  # not a 404: asked again at the next poll
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "/v1/loads unreadable" in warnings[0].getMessage()


def test_a_vllm_page_asks_nothing_beside_it() -> None:
    with metrics_server(Behaviour(body=vllm_page({LLAMA: [EngineState(running=2)]}))) as server:
        source = VllmMetricsSource(metrics_url=f"{server.url}/metrics", served_model_name=LLAMA, limits=FAST)
        snapshot = source.read()
        assert paths(server) == ["/metrics"]
        # The test page's cache_config_info: 4096 blocks of 16 tokens, no kv_cache_size_tokens label.
        assert snapshot.limits is not None and snapshot.limits.kv_cache_tokens == 65_536


def test_get_utilization_shows_stated_and_page_limits(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    running = [10]
    render = lambda: sglang_page({QWEN: [SglangScheduler(running=running[0], max_tokens=150_000)]})  # noqa: E731
    with metrics_server(Behaviour(render=render, loads=lambda: loads_body((48, 150_000)))) as server:
        spec = register_model(
            "qwen", base_url=f"{server.url}/v1", served_model_name=QWEN, parallel_instances=2,
            max_num_seqs=8, max_num_batched_tokens=2048,
        )  # fmt: skip
        runtime = ModelRuntime(spec, clock=clock)
        # Before any poll: what the operator stated.
        assert runtime.state().limits == {
            "max_num_seqs": 16,
            "max_num_batched_tokens": 2048,
            "kv_cache_tokens": None,
            "kv_cache_max_concurrency": None,
            "source": {"max_num_seqs": "stated", "max_num_batched_tokens": "stated"},
        }
        clock.advance(POLL_WAIT_MAX_S)
        runtime.target()
        assert runtime.core.last_observation is not None
        obs_limits = runtime.core.last_observation.limits
        assert obs_limits is not None and (obs_limits.max_num_seqs, obs_limits.kv_cache_tokens) == (16, 150_000)
        assert runtime.state().limits == {
            "max_num_seqs": 16,
            "max_num_batched_tokens": 2048,
            "kv_cache_tokens": 150_000,
            "kv_cache_max_concurrency": None,
            "source": {
                "max_num_seqs": "stated",
                "max_num_batched_tokens": "stated",
                "kv_cache_tokens": "sglang /v1/loads",
            },
        }
        # The engine runs more than the stated 16: the stated figure is wrong, warned once and ignored from now on.
        running[0] = 20
        with caplog.at_level(logging.WARNING, logger="model_concurrency"):
            for _ in range(3):
                clock.advance(POLL_WAIT_MAX_S)
                runtime.target()
        lines = [r.getMessage() for r in caplog.records if "stated max_num_seqs" in r.getMessage()]
        assert len(lines) == 1 and "qwen" in lines[0] and "8 per engine (16 in all" in lines[0] and "20" in lines[0]
        shown = runtime.state().limits
        assert shown is not None and shown["max_num_seqs"] == 48
        assert shown["source"]["max_num_seqs"] == "sglang /v1/loads"


def test_get_utilization_of_a_registered_model_has_the_limits_key() -> None:
    with metrics_server(Behaviour(body=vllm_page({LLAMA: [EngineState(running=1)]}))) as server:
        register_model("llama", base_url=f"{server.url}/v1", served_model_name=LLAMA, max_num_seqs=256)
        util = get_utilization("llama")
        assert util["limits"] == {
            "max_num_seqs": 256,
            "max_num_batched_tokens": None,
            "kv_cache_tokens": None,
            "kv_cache_max_concurrency": None,
            "source": {"max_num_seqs": "stated"},
        }
