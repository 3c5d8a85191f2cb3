"""The conformance machinery at a tiny scale: both sides run the scenario and give finite figures.

No figure is compared with a goal here (that is the benchmark's job, benchmarks/conformance.py); these tests
check that the live side really ran the production stack on virtual time and that the report is well formed.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from model_concurrency.lab.conformance import compare, run_lab, run_live, summary_line
from model_concurrency.lab.run import poll_jitter_rng
from model_concurrency.lab.scenario import scenario_from_dict
from model_concurrency.lab.virtual_loop import VirtualTimeLoop

TINY: dict[str, Any] = {
    "name": "tiny-gpu-added",
    "seed": 5,
    "duration_s": 60,
    "fleet": {"preset": "llama-8b-h100", "engines": 1, "engine": {"max_num_seqs": 16}},
    "workload": {"prompt_tokens": 128, "output_tokens": 32, "prompt_sigma": 0.5, "output_sigma": 0.5},
    "clients": {"count": 1, "floor": 4, "ceiling": 64, "poll_s": 3},
    "events": [{"at_s": 30, "action": "add_engines", "count": 1}],
}

TINY_EMBEDDING: dict[str, Any] = {
    **TINY,
    "name": "tiny-embedding",
    "fleet": {"preset": "bge-m3", "engines": 1, "engine": {"max_num_seqs": 16}},
    "workload": {"prompt_tokens": 128, "output_tokens": 0, "prompt_sigma": 0.5, "embedding": True},
}


@pytest.fixture
def oracle_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_CACHE", str(tmp_path))


def test_both_sides_run_and_report_finite_figures(oracle_cache: None) -> None:
    scenario = scenario_from_dict(TINY)
    result = compare(scenario)
    assert result.scenario == "tiny-gpu-added" and result.poll_s == 3 and result.knee >= 1
    for side in (result.lab, result.live):
        assert 0 < side.goodput_ratio < 2 and math.isfinite(side.goodput_ratio)
        assert 0 <= side.saturated_fraction <= 1
        assert side.settled_target >= 4  # left the floor, or stayed on it: never below
        # at least one poll per interval (more while the first ramp polls fast): the live poll thread ran on the
        # virtual clock
        assert side.polls >= scenario.duration_s / scenario.clients.poll_s - 1
    # The schedule code is shared, but while the first ramp polls fast, how many fast polls there are follows the
    # policy's answers, and those follow what each side's engine showed at an instant (HTTP timing moves an
    # admission by a step: 203 against 193 running seen on ramp). So within the conformance goal of 2 polls
    # (docs/live.md, "Conformance"); the regular grid alone is checked exactly below.
    assert abs(result.lab.polls - result.live.polls) <= 2
    assert math.isfinite(result.goodput_gap) and result.goodput_gap >= 0
    line = summary_line([result])
    assert re.fullmatch(r"conformance: max goodput-ratio gap \d+\.\d{3}, max t90 gap (\d+\.\d{2}|inf) polls", line)


def test_live_side_goes_through_http_and_the_limiter(oracle_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_RAMP_POLL_DIVISOR", "1")  # the regular grid only, to check it exactly
    scenario = scenario_from_dict(TINY)
    trace = run_live(scenario)
    client = trace.clients[0]
    assert trace.total_completions > 0
    assert len(trace.finish_times) == trace.total_completions  # every completion was an HTTP 200
    assert client.errors[-1] == 0
    assert max(client.target) > 4  # the production controller raised the limit from the floor
    assert max(client.inflight) <= max(client.target)
    # On schedule, in virtual seconds: each wait 3 s × (1 ± 0.1 × u), u from the stream the lab's client 0 draws
    # from, so the live poller and the lab poll at the same instants, poll for poll.
    stream = poll_jitter_rng(scenario, 0)
    expected = [0.0]
    for _ in range(4):
        expected.append(expected[-1] + 3.0 * (1 + 0.1 * (2 * stream.random() - 1)))
    assert list(client.poll_times[:5]) == pytest.approx(expected, abs=1e-9)
    lab = run_lab(scenario).clients[0].poll_times
    n = min(len(lab), len(client.poll_times))
    assert n >= 15 and list(client.poll_times[:n]) == pytest.approx(list(lab[:n]), abs=1e-9)


def test_an_embedding_model_is_sent_its_own_api(oracle_cache: None) -> None:
    # The emulator refuses completions on a pooling model with a 400, as vLLM does: every item that completes
    # here went through /v1/embeddings.
    scenario = scenario_from_dict(TINY_EMBEDDING)
    trace = run_live(scenario)
    assert trace.total_completions > 0
    assert len(trace.finish_times) == trace.total_completions
    assert trace.clients[0].errors[-1] == 0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"workload": {**TINY["workload"], "embedding": True}}, "an embedding workload on a generative model"),
        (
            {"workload": {**TINY_EMBEDDING["workload"], "embedding": False, "output_tokens": 32}},
            "a generative workload on an embedding model",
        ),
        ({"background": {"fraction_of_capacity": 0.5}}, "background traffic"),
        ({"events": [{"at_s": 30, "action": "remove_engines", "count": 1}]}, "events other than add_engines"),
    ],
)
def test_live_side_rejects_what_it_cannot_run(change: dict[str, object], named: str) -> None:
    base = TINY_EMBEDDING if "embedding model" in named else TINY
    with pytest.raises(ValueError, match=named):
        run_live(scenario_from_dict({**base, **change}))


def test_virtual_clock_jumps_and_stops_at_a_barrier() -> None:
    loop = VirtualTimeLoop()
    released = threading.Event()
    seen: list[float] = []

    def barrier() -> float | None:
        return None if released.is_set() else 5.0

    def thread_work() -> None:
        while loop.time() < 5.0:
            released.wait(0.001)
        seen.append(loop.time())  # the clock waits here for this thread, however slow it is
        released.set()

    async def main() -> float:
        worker = threading.Thread(target=thread_work)
        worker.start()
        await asyncio.sleep(3600)
        worker.join()
        return loop.time()

    loop.add_barrier(barrier)
    try:
        assert loop.run_until_complete(main()) == 3600.0
    finally:
        loop.close()
    assert seen == [5.0]
