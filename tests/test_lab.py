"""The scenario lab: scenarios load, runs are reproducible, the production objects drive the simulated client,
and the oracle and summary follow their definitions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from model_concurrency import AIMD, ControllerCore
from model_concurrency.cli import main
from model_concurrency.gate.limiter import LimiterCore
from model_concurrency.lab.client import SimClient
from model_concurrency.lab.experiment import run_scenario
from model_concurrency.lab.oracle import Oracle, Sweep
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario, scenario_from_dict
from model_concurrency.lab.summary import SUMMARY_KEYS, jain_index
from model_concurrency.lab.world import Phase, phases, preset_for
from model_concurrency.policies.registry import load_policy
from model_concurrency.runtime import ModelRuntime

SIMS = Path(__file__).resolve().parents[1] / "sims"
REQUIRED = {"ramp", "gpu-added", "replica-lost", "noisy-neighbor", "metrics-outage", "multi-client", "long-prompts"}


def small(name: str, scale: float = 0.2) -> object:
    return load_scenario(SIMS / f"{name}.toml").scaled(scale)


def test_every_required_scenario_exists_and_loads() -> None:
    names = {load_scenario(p).name for p in SIMS.glob("*.toml")}
    assert names >= REQUIRED
    for path in SIMS.glob("*.toml"):
        assert load_scenario(path).seed != 0, f"{path.name} must fix its seed"


def test_unknown_keys_are_named() -> None:
    with pytest.raises(ValueError, match="colour"):
        scenario_from_dict({"name": "x", "clients": {"colour": 1}})
    with pytest.raises(ValueError, match="unknown event action"):
        scenario_from_dict({"name": "x", "events": [{"at_s": 1, "action": "explode"}]})


def test_scaling_moves_events() -> None:
    sc = load_scenario(SIMS / "gpu-added.toml")
    half = sc.scaled(0.5)
    assert half.duration_s == sc.duration_s / 2
    assert half.events[0].at_s == sc.events[0].at_s / 2


def test_phases_follow_events() -> None:
    assert phases(load_scenario(SIMS / "gpu-added.toml")) == [(0.0, Phase((1,))), (600.0, Phase((4,)))]
    assert phases(load_scenario(SIMS / "replica-lost.toml")) == [(0.0, Phase((1, 1))), (600.0, Phase((1,)))]
    noisy = phases(load_scenario(SIMS / "noisy-neighbor.toml"))
    assert [p.background_fraction for _, p in noisy] == [None, 0.7, None]


def test_runs_are_reproducible() -> None:
    sc = small("ramp", 0.1)
    a = simulate(sc, policy_factory=AIMD)  # type: ignore[arg-type]
    b = simulate(sc, policy_factory=AIMD)  # type: ignore[arg-type]
    assert np.array_equal(a.clients[0].completions, b.clients[0].completions)
    assert np.array_equal(a.running, b.running)


def test_the_production_policy_controller_and_limiter_drive_the_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    """No sim-only copies: the simulated client is built from the live path's classes."""
    built: list[SimClient] = []
    original = SimClient.__init__

    def spy(self: SimClient, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        built.append(self)

    monkeypatch.setattr(SimClient, "__init__", spy)
    trace = simulate(small("ramp", 0.1), policy_factory=AIMD)  # type: ignore[arg-type]
    (client,) = built
    assert type(client.core) is ControllerCore
    assert type(client.core.policy) is AIMD
    assert type(client.limiter) is LimiterCore
    # The client is a production runtime on the SimPy clock: its core, recorder and limiter are the runtime's, and
    # every poll of the run went through the runtime's poll path (poll_with).
    assert type(client.runtime) is ModelRuntime
    assert client.runtime.core is client.core and client.runtime.calls is client.calls
    assert client.runtime.limits is client.limits and client.limits.core is client.limiter
    assert client.core.polls == len(client.poll_targets)
    assert client.runtime.current() == client.limiter.limit
    # The ramp really happened through AIMD: from the floor of 4, +max(1, 25 %) a poll (4, 5, 6.25, 7.8, 9.8).
    # The first poll runs as the fan-out starts, before any item (as production's does): nothing in flight, hold.
    assert list(client.poll_targets[:5]) == [4, 5, 6, 7, 9]
    assert np.all(trace.clients[0].inflight <= trace.clients[0].target)


def test_the_lab_runtime_judges_health_and_publishes_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica restarts mid-run: the client's runtime counts the counters that went back (its health is judged
    by the production watch), but a simulated client exports nothing and logs no health line."""
    built: list[SimClient] = []
    original = SimClient.__init__

    def spy(self: SimClient, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        built.append(self)

    def no_publish(*args: object, **kwargs: object) -> None:
        raise AssertionError("a simulated client published its state")

    monkeypatch.setattr(SimClient, "__init__", spy)
    monkeypatch.setattr("model_concurrency.telemetry.publish", no_publish)
    with caplog.at_level("INFO", logger="model_concurrency"):
        simulate(small("replica-lost", 0.2), policy_factory=lambda: load_policy("adaptive"))  # type: ignore[arg-type]
    assert sum(client.runtime.health.counter_resets for client in built) >= 1
    assert not [r for r in caplog.records if "counters went backwards" in r.getMessage()]


def test_multi_client_gets_independent_policies() -> None:
    sc = small("multi-client", 0.1)
    made: list[AIMD] = []

    def factory() -> AIMD:
        made.append(AIMD())
        return made[-1]

    trace = simulate(sc, policy_factory=factory)  # type: ignore[arg-type]
    assert len(made) == 4 and len({id(p) for p in made}) == 4
    assert len(trace.clients) == 4


def outage_polls(handover: bool) -> tuple[dict[float, float], float, list[float], int]:
    sc = load_scenario(SIMS / "metrics-outage.toml").scaled(0.5)  # /metrics down from 300 to 360 s
    sc = dataclasses.replace(sc, clients=dataclasses.replace(sc.clients, outage_handover=handover))
    trace = simulate(sc, policy_factory=AIMD)  # type: ignore[arg-type]
    client = trace.clients[0]
    polls = dict(zip(client.poll_times.tolist(), client.poll_targets.tolist(), strict=True))
    down, up = (e.at_s for e in sc.events)
    before = [t for t in polls if t < down][-1]
    return polls, before, [t for t in polls if down <= t < up], sc.clients.floor


def test_metrics_outage_hands_over_to_the_guard_after_the_grace() -> None:
    polls, before, outage, floor = outage_polls(handover=True)
    # The engine is fine and the client's calls say so: the last good target holds through the whole outage.
    assert len(outage) > 3 and polls[before] > floor
    assert [polls[t] for t in outage] == [polls[before]] * len(outage)


def test_metrics_outage_without_the_hand_over_holds_then_drops_to_floor() -> None:
    polls, before, outage, floor = outage_polls(handover=False)
    # Three failed polls hold the last good target; the fourth drops to the floor; recovery ramps again.
    assert [polls[t] for t in outage[:3]] == [polls[before]] * 3
    assert outage[3:] and all(polls[t] == floor for t in outage[3:])
    assert max(polls[t] for t in polls if t > outage[-1] + 12) > floor


def test_sweep_knee_definition() -> None:
    sweep = Sweep((1, 2, 4, 8, 16), (1.0, 2.0, 3.5, 3.97, 4.0))
    assert sweep.peak == 4.0
    assert sweep.knee == 8  # 3.97 >= 0.99 x 4.0; 3.5 is not


def test_jain_index() -> None:
    assert jain_index([1, 1, 1, 1]) == 1.0
    assert jain_index([1, 0, 0, 0]) == 0.25
    assert jain_index([]) == 1.0


def test_oracle_knee_is_near_the_engine_limit() -> None:
    sc = load_scenario(SIMS / "ramp.toml")
    ((t, knee),) = Oracle(sc).knees()
    # 256 sequences fit at once; the knee (99 % of peak) lies below that and well above a quarter of it.
    assert t == 0.0 and 64 < knee <= 256


def test_run_summary_has_every_key_and_sane_values() -> None:
    sc = small("ramp", 0.3)
    result = run_scenario(sc, AIMD, policy_name="aimd")  # type: ignore[arg-type]
    assert set(SUMMARY_KEYS) <= set(result.summary)
    s = result.summary
    assert 0.5 < s["goodput_ratio"] < 1.05
    assert 0 <= s["saturated_fraction"] <= 1
    assert s["jain_fairness"] == 1.0
    assert s["queue_time_p99_s"] >= s["queue_time_p50_s"] >= 0


def test_static_policy_stays_at_floor() -> None:
    trace = simulate(small("ramp", 0.1), policy_factory=lambda: load_policy("static"))
    assert np.all(trace.clients[0].target == 4)


def test_cli_sim_writes_plot_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot, out = tmp_path / "r.png", tmp_path / "r.json"
    code = main(["sim", str(SIMS / "ramp.toml"), "--scale", "0.1", "--plot", str(plot), "--json", str(out), "--quiet"])
    assert code == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out.read_text())
    assert data["scenario"] == "ramp" and set(SUMMARY_KEYS) <= set(data["summary"])
    assert "goodput_ratio" in capsys.readouterr().out


def test_cli_sim_rejects_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", str(SIMS / "ramp.toml"), "--policy", "nope", "--quiet"]) == 2
    assert "unknown policy" in capsys.readouterr().err


def test_items_budget_finishes_every_item() -> None:
    sc = dataclasses.replace(
        small("replica-lost", 0.2), clients=dataclasses.replace(small("replica-lost").clients, items=2000)
    )  # type: ignore[attr-defined]
    trace = simulate(sc, policy_factory=AIMD)  # type: ignore[arg-type]
    assert trace.total_completions == 2000


def test_fleet_frontend_overrides_the_presets_api_server_cost() -> None:
    sc = load_scenario(SIMS / "front-end-bound.toml")
    assert preset_for(sc).frontend.fixed_ms == 6.0 and preset_for(sc).frontend.workers == 1
    with pytest.raises(ValueError, match=r"\[fleet.frontend\] has unknown keys \['cpus'\]"):
        scenario_from_dict({"name": "x", "fleet": {"preset": "bge-m3", "frontend": {"cpus": 2}}})
    with pytest.raises(ValueError, match=r"fleet\.frontend\.workers"):
        scenario_from_dict({"name": "x", "fleet": {"preset": "bge-m3", "frontend": {"workers": "two"}}})
    with pytest.raises(ValueError, match=r"\[fleet.frontend\] workers must be >= 1"):
        scenario_from_dict({"name": "x", "fleet": {"preset": "bge-m3", "frontend": {"workers": 0}}})


def test_growth_guard_stops_growth_a_front_end_limit_makes_useless() -> None:
    """adaptive sees an engine that never queues; only the guard, from the client's own calls, stops it."""
    sc = small("front-end-bound", 0.3)
    runs = {}
    for guard in (True, False):
        scenario = dataclasses.replace(sc, clients=dataclasses.replace(sc.clients, guard=guard))
        runs[guard] = simulate(scenario, policy_factory=lambda: load_policy("adaptive"))
    on, off = runs[True], runs[False]
    assert off.clients[0].poll_targets.max() == sc.clients.ceiling  # without it: the ceiling
    assert on.clients[0].poll_targets.max() < sc.clients.ceiling / 4
    completions = [r.clients[0].completions[-1] for r in (on, off)]
    assert completions[0] >= 0.97 * completions[1]  # the same goodput...
    assert np.percentile(on.latencies, 99) < np.percentile(off.latencies, 99) / 4  # ...at a fraction of the latency
