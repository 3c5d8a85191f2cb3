"""The comparison study: the compare command's tables and grid, and the package's goals on scaled-down scenarios.

Goal tests assert behaviour with margins (who beats whom, by how much at least), not the exact figures of
docs/results.md, which come from the full-size scenarios.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from model_concurrency.cli import main
from model_concurrency.lab.compare import COLUMNS, markdown_table, run_study
from model_concurrency.lab.scenario import Scenario, load_scenario
from model_concurrency.lab.summary import SUMMARY_KEYS

SIMS = Path(__file__).resolve().parents[1] / "sims"


def test_compare_writes_markdown_csv_and_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "compare",
            str(SIMS / "ramp.toml"),
            str(SIMS / "gpu-added.toml"),
            "--policies",
            "aimd,static",
            "--scale",
            "0.1",
            "--jobs",
            "2",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert code == 0
    with (tmp_path / "compare.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == list(COLUMNS)
    assert set(SUMMARY_KEYS) <= set(rows[0])
    assert [(r["scenario"], r["policy"]) for r in rows] == [
        ("ramp", "aimd"),
        ("ramp", "static"),
        ("gpu-added", "aimd"),
        ("gpu-added", "static"),
    ]
    # The oracle is simulated once per scenario: both policies are judged against the same figures.
    assert rows[0]["oracle_goodput"] == rows[1]["oracle_goodput"] != ""
    assert float(rows[0]["goodput"]) > float(rows[1]["goodput"]) > 0  # AIMD ramps, static stays at the floor
    md = (tmp_path / "compare.md").read_text().splitlines()
    assert md[0].startswith("| scenario | policy | goodput |")
    assert len(md) == 2 + 4
    png = tmp_path / "compare.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().out


def test_compare_rejects_an_unknown_policy_before_simulating(tmp_path: Path) -> None:
    assert main(["compare", str(SIMS / "ramp.toml"), "--policies", "nope", "--out", str(tmp_path), "--quiet"]) == 2
    assert not (tmp_path / "compare.csv").exists()


def test_inline_and_parallel_studies_agree() -> None:
    scenarios = [load_scenario(SIMS / "ramp.toml").scaled(0.05)]
    serial = run_study(scenarios, ["aimd"], jobs=1)
    parallel = run_study(scenarios, ["aimd"], jobs=2)
    assert serial.rows == parallel.rows
    assert markdown_table(serial.rows).count("\n") == 3


@pytest.fixture(scope="module")
def study() -> object:
    """The goal-relevant scenarios at a scale that keeps their events (gpu-added's step at 40 % of the run)."""
    names = ["ramp", "gpu-added", "multi-client"]
    scenarios = [load_scenario(SIMS / f"{n}.toml").scaled(0.4) for n in names]
    return run_study(scenarios, ["seed-aimd", "aimd", "adaptive"], jobs=2)


@pytest.mark.slow
def test_adaptive_keeps_goodput_with_the_queue_near_the_oracles(study: object) -> None:
    for scenario in ("ramp", "gpu-added"):
        adaptive, aimd = study.row(scenario, "adaptive"), study.row(scenario, "aimd")  # type: ignore[attr-defined]
        assert adaptive["goodput_ratio"] >= 0.95
        assert adaptive["goodput_ratio"] >= aimd["goodput_ratio"] - 0.01
        # The growth guard (guard.py) runs beside every policy and stops aimd's overshoot too, so aimd stays below
        # the knee for most of the run (0.75-0.81 of the oracle's goodput at this scale) and its queue is no
        # yardstick: the oracle's is (the goal: p99 queue <= 2x the oracle's).
        assert adaptive["queue_time_p99_s"] <= 2 * adaptive["oracle_queue_time_p99_s"]
        assert adaptive["saturated_fraction"] <= 0.05


@pytest.mark.slow
def test_adaptive_uses_an_added_gpu_at_least_three_times_sooner_than_seed_aimd(study: object) -> None:
    adaptive = study.row("gpu-added", "adaptive")  # type: ignore[attr-defined]
    seed = study.row("gpu-added", "seed-aimd")  # type: ignore[attr-defined]
    assert adaptive["time_to_90pct_s"] is not None and seed["time_to_90pct_s"] is not None
    assert adaptive["time_to_90pct_s"] <= seed["time_to_90pct_s"] / 3


@pytest.mark.slow
def test_adaptive_shares_fairly_where_aimd_does_not(study: object) -> None:
    adaptive = study.row("multi-client", "adaptive")  # type: ignore[attr-defined]
    aimd = study.row("multi-client", "aimd")  # type: ignore[attr-defined]
    # At 0.4 scale the unequal start weighs more than in the full run: 0.75 is a margin, not the goal. The first
    # ramp's split depends on where each client's polls fall, and the per-poll jitter (on by default) moves them,
    # so this scenario's Jain varies from seed to seed (docs/scale-out.md, "Open limits").
    assert adaptive["jain_fairness"] >= 0.75, (adaptive["jain_fairness"], aimd["jain_fairness"])
    assert adaptive["goodput_ratio"] >= 0.95
    assert adaptive["jain_fairness"] > aimd["jain_fairness"] + 0.15


def test_a_scenario_the_lab_cannot_score_gets_rows_with_the_reason_and_the_study_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from model_concurrency.lab import compare as compare_module

    real = compare_module._oracle_task

    def oracle_task(scenario: Scenario) -> object:
        if scenario.name == "ramp":
            raise ValueError("no knee for this fleet")
        return real(scenario)

    monkeypatch.setattr(compare_module, "_oracle_task", oracle_task)
    out = tmp_path / "cmp"
    code = main(
        [
            "compare",
            "ramp",
            "gpu-added",
            "--policies",
            "static",
            "--scale",
            "0.05",
            "--jobs",
            "1",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert code == 1
    assert "not scored: ramp: no knee for this fleet" in capsys.readouterr().err
    with (out / "compare.csv").open() as fh:
        rows = {r["scenario"]: r for r in csv.DictReader(fh)}
    assert rows["ramp"]["unscored"] == "no knee for this fleet" and rows["ramp"]["goodput_ratio"] == ""
    assert rows["gpu-added"]["unscored"] == "" and float(rows["gpu-added"]["goodput_ratio"]) > 0
    assert (out / "compare.png").exists()
