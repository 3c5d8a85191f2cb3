"""The scenario generator (lab/fuzz.py, ``model-concurrency fuzz``) and the items an engine cannot take.

The property test runs a small fixed sample of draws at reduced scale through the same ``simulate`` the fuzzer
uses: no crash, no item lost (each item drawn is completed, refused for good, or still held), every client's
target within its [floor, ceiling].
"""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path

import httpx
import pytest

from model_concurrency.cli import main
from model_concurrency.emulator import EmulatorConfig, serve_in_thread
from model_concurrency.lab.client import SimClient
from model_concurrency.lab.fuzz import (
    CLIENTS,
    ENGINES,
    FLOOR,
    MAX_NUM_SEQS,
    POLL_S,
    REPLICAS,
    draw_dict,
    draw_scenario,
    fuzz_line,
    queue_ok,
    scenario_toml,
)
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario, scenario_from_dict
from model_concurrency.policies.registry import load_policy

# Draws of seed 0 that cover the embedding preset, another tenant and a replica flap (0), a heavy tail and a metrics
# outage (1), engines added (11) and removed (20), a rate limit (10).
SAMPLE = (0, 1, 2, 10, 11, 20)
SCALE = 0.05


def test_a_seed_draws_the_same_scenarios_and_another_seed_others() -> None:
    assert [scenario_toml(draw_dict(7, i, 0.5)) for i in range(5)] == [
        scenario_toml(draw_dict(7, i, 0.5)) for i in range(5)
    ]
    assert draw_dict(7, 0) != draw_dict(8, 0)
    assert draw_dict(7, 0) != draw_dict(7, 1)


def test_every_draw_is_a_scenario_file_sim_loads_back_unchanged(tmp_path: Path) -> None:
    for i in range(40):
        data = draw_dict(3, i, 0.25)
        path = tmp_path / f"{data['name']}.toml"
        path.write_text(scenario_toml(data))
        assert {"events": [], **tomllib.loads(path.read_text())} == data
        assert load_scenario(path) == scenario_from_dict(data) == draw_scenario(3, i, 0.25)


def test_draws_stay_in_the_issue_ranges() -> None:
    draws = [draw_dict(11, i) for i in range(200)]
    presets = {d["fleet"]["preset"] for d in draws}
    assert presets == {"llama-8b-h100-80gb", "llama-8b-a100-80gb", "llama-8b-a100-40gb", "bge-m3"}
    for d in draws:
        fleet, w, c = d["fleet"], d["workload"], d["clients"]
        assert ENGINES[0] <= fleet["engines"] <= ENGINES[1] and REPLICAS[0] <= fleet["replicas"] <= REPLICAS[1]
        assert MAX_NUM_SEQS[0] <= fleet["engine"]["max_num_seqs"] <= MAX_NUM_SEQS[1]
        assert 32 <= w["prompt_tokens"] <= 4000 and 0 <= w["output_tokens"] <= 1000
        assert w["prompt_sigma"] <= 1.2 and w["output_sigma"] <= 1.2
        assert w["embedding"] == (fleet["preset"] == "bge-m3") == (w["output_tokens"] == 0)
        assert CLIENTS[0] <= c["count"] <= CLIENTS[1] and FLOOR[0] <= c["floor"] <= FLOOR[1]
        assert c["ceiling"] >= c["floor"] and POLL_S[0] <= c["poll_s"] <= POLL_S[1]
    actions = {e["action"] for d in draws for e in d["events"]}
    assert actions == {
        "add_engines",
        "remove_engines",
        "replica_down",
        "replica_up",
        "background",
        "metrics_down",
        "metrics_up",
    }
    assert any("rate_limit" in d for d in draws) and any(d["workload"].get("long_fraction") for d in draws)
    assert any(d["clients"]["count"] > 1 for d in draws)


@pytest.mark.parametrize("index", SAMPLE)
def test_a_drawn_run_loses_no_item_and_keeps_targets_in_bounds(index: int) -> None:
    scenario = draw_scenario(0, index, SCALE)
    clients: list[SimClient] = []
    # Another tenant at a fixed 10 items/s per share of capacity: the property is about the clients' ledger and
    # bounds, not the tenant's size, and the oracle's sweeps would make this test minutes long.
    trace = simulate(
        scenario,
        policy_factory=lambda: load_policy("adaptive"),
        resolve_fraction=lambda phase, fraction: 10.0 * fraction,
        inspect=clients.extend,
    )
    floor, ceiling = scenario.clients.floor, scenario.clients.ceiling
    assert len(clients) == scenario.clients.count
    for client, series in zip(clients, trace.clients, strict=True):
        assert client.unaccounted() == 0
        assert client.started > 0
        assert floor <= series.target.min() and series.target.max() <= ceiling
        assert all(floor <= t <= ceiling for t in series.poll_targets)


def _too_long_scenario() -> dict[str, object]:
    # bge-m3 has no chunked prefill and a batch of 8,192 tokens: a mean of 4,000 with sigma 1.2 puts about one
    # prompt in nine beyond it.
    return {
        "name": "too-long",
        "seed": 3,
        "duration_s": 60.0,
        "fleet": {"preset": "bge-m3"},
        "workload": {"prompt_tokens": 4000, "output_tokens": 0, "prompt_sigma": 1.2, "embedding": True},
        "clients": {"count": 2, "floor": 4},
    }


def test_an_item_the_engine_cannot_take_fails_and_the_run_goes_on() -> None:
    scenario = scenario_from_dict(_too_long_scenario())
    clients: list[SimClient] = []
    trace = simulate(scenario, policy_factory=lambda: load_policy("aimd"), inspect=clients.extend)
    for client in clients:
        assert client.rejected > 0 and client.completed > 10 * client.rejected / 9
        assert client.unaccounted() == 0
        assert client.errors >= client.rejected
    assert trace.total_completions > 0
    assert trace.clients[0].errors[-1] > 0  # a refused call is a failed call in the trace


def test_the_emulator_answers_400_and_keeps_nothing_in_flight() -> None:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", time_scale=1.0)) as emu:
        too_long = httpx.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": "x" * 40_000})
        assert too_long.status_code == 400
        assert "max_num_batched_tokens" in too_long.json()["error"]["message"]
        assert emu.capacity()["inflight"] == 0  # the refused request was never counted as accepted
        ok = httpx.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": "fits"}, timeout=20)
        assert ok.status_code == 200
        assert emu.capacity()["inflight"] == 0 and emu.capacity()["completed"] == 1


def _row(policy: str, ratio: float, queue: float, oracle_queue: float, jain: float, clients: int) -> dict[str, object]:
    return {
        "policy": policy,
        "goodput_ratio": ratio,
        "queue_time_p99_s": queue,
        "oracle_queue_time_p99_s": oracle_queue,
        "jain_fairness": jain,
        "clients": clients,
    }


def test_the_summary_line_counts_exactly() -> None:
    rows = [
        _row("p", 1.0, 1.0, 1.0, 1.0, 1),
        _row("p", 0.9, 3.0, 1.0, 0.5, 2),  # queue 3 > 2 x 1: fails; jain fails
        _row("p", 0.8, 0.04, 0.0, 0.95, 3),  # within the 0.05 s slack
        _row("p", 0.7, 2.0, 1.0, 1.0, 1),
        _row("q", 0.1, 9.0, 1.0, 0.1, 2),
    ]
    assert queue_ok(rows[2]) and not queue_ok(rows[1])
    assert fuzz_line(rows, "p") == (
        "fuzz: policy p, n 4, goodput median 0.850 p10 0.730 min 0.700, p99<=2x 75%, jain>=0.9 50% of multi-client"
    )


def test_the_cli_writes_the_table_the_scenarios_and_ends_with_the_default_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fz"
    # Seed 135's first two draws have the cheapest oracles of the first 300 seeds (lab.fuzz.sweep_cost).
    args = ["--n", "2", "--seed", "135", "--scale", "0.03", "--jobs", "1", "--quiet"]
    code = main(["fuzz", *args, "--policies", "adaptive,batch-gateway-aimd", "--out", str(out)])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith("fuzz: policy batch-gateway-aimd, n 2, goodput median ")
    assert lines[-1].startswith("fuzz: policy adaptive, n 2, goodput median ")
    with (out / "fuzz.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["scenario"], r["policy"]) for r in rows] == [
        ("fuzz-135-0000", "adaptive"),
        ("fuzz-135-0000", "batch-gateway-aimd"),
        ("fuzz-135-0001", "adaptive"),
        ("fuzz-135-0001", "batch-gateway-aimd"),
    ]
    assert {"goodput_ratio", "preset", "clients", "events", "stated_limits"} <= set(rows[0])
    told = {r["scenario"]: r["stated_limits"] == "True" for r in rows}
    assert told == {
        f"fuzz-135-000{i}": draw_dict(135, i).get("clients", {}).get("stated_limits", False) for i in (0, 1)
    }
    split = [line for line in lines if "(limits " in line]
    assert len(split) == 2 * len(set(told.values())), split  # each policy, on the draws told and on the others
    assert sorted(p.name for p in (out / "scenarios").iterdir()) == ["fuzz-135-0000.toml", "fuzz-135-0001.toml"]
    assert load_scenario(out / "scenarios" / "fuzz-135-0001.toml") == draw_scenario(135, 1, 0.03)
    assert (out / "worst.md").read_text().startswith("| scenario | goodput_ratio |")


def test_no_draw_removes_engines_and_flaps_a_replica() -> None:
    # A restarted replica returns with every engine it had: a removal is never drawn beside a flap.
    for i in range(300):
        actions = {e["action"] for e in draw_dict(5, i)["events"]}
        assert not {"remove_engines", "replica_down"} <= actions


def test_about_half_the_draws_state_the_engines_limits_and_the_rest_of_each_draw_does_not_depend_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from model_concurrency.lab import fuzz

    told = [bool(draw_dict(41, i)["clients"].get("stated_limits")) for i in range(200)]
    assert 80 <= sum(told) <= 120
    monkeypatch.setattr(fuzz, "P_STATED", 1.0)
    always = [draw_dict(41, i) for i in range(20)]
    monkeypatch.setattr(fuzz, "P_STATED", 0.0)
    never = [draw_dict(41, i) for i in range(20)]
    for a, b in zip(always, never, strict=True):
        assert a["clients"].pop("stated_limits") is True and "stated_limits" not in b["clients"]
        assert a == b  # drawn from a stream of its own: the flag changes nothing else


def test_some_draws_grow_a_fleet_while_a_replica_is_down() -> None:
    from model_concurrency.lab.world import phases

    unequal = [i for i in range(200) if any(len(set(p.engines)) > 1 for _, p in phases(draw_scenario(43, i, 0.05)))]
    assert unequal, "the generator draws fleets of unequal replicas"
