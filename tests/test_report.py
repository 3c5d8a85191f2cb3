"""The generated results page: built from hand-made rows (exact tables, one glossary, a command before every
table, the word limit), the live checks' output read for missed goals, and one tiny end-to-end run of the command.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from model_concurrency.cli import main
from model_concurrency.cli.report import live_misses, read_rows
from model_concurrency.lab.compare import write_csv
from model_concurrency.lab.fuzz import FUZZ_COLUMNS
from model_concurrency.lab.report import FAMILIES, MAX_WORDS, Run, build_page
from model_concurrency.lab.scenario import bundled_scenarios

BUNDLED_COMMAND = "model-concurrency compare ramp gpu-added --policies adaptive,static --out w/bundled"
FUZZ_COMMAND = "model-concurrency fuzz --seed 41 --n 3 --policies adaptive,static --out w/fuzz"
RUN = Run(
    commit="abc1234 (dirty)",
    version="0.1.0",
    generated="2030-01-01 00:00 UTC",
    command="model-concurrency report --out docs/results.md",
    default_policy="adaptive",
    policies=("static", "adaptive"),  # the default is shown first whatever the order given
    bundled_command=BUNDLED_COMMAND,
    fuzz_command=FUZZ_COMMAND,
    live_skipped="--no-live",
)


def _bundled(scenario: str, policy: str, ratio: float, p99: float, oracle_p99: float) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "policy": policy,
        "goodput_ratio": ratio,
        "queue_time_p99_s": p99,
        "oracle_queue_time_p99_s": oracle_p99,
        "time_to_90pct_s": 16.0,
        "oracle_time_to_90pct_s": 13.0,
        "saturated_fraction": 0.06,
        "jain_fairness": 1.0,
    }


BUNDLED = [
    _bundled("ramp", "adaptive", 0.99, 1.0, 1.0),
    _bundled("ramp", "static", 0.5, 0.0, 1.0),
    _bundled("gpu-added", "adaptive", 0.95, 3.0, 1.0),
    _bundled("gpu-added", "static", 0.3, 0.2, 0.0),
]


def _draw(
    name: str, policy: str, ratio: float, p99: float, oracle: float, jain: float, clients: int, sat: float
) -> Any:
    return {
        "scenario": name,
        "policy": policy,
        "goodput_ratio": ratio,
        "queue_time_p99_s": p99,
        "oracle_queue_time_p99_s": oracle,
        "jain_fairness": jain,
        "clients": clients,
        "saturated_fraction": sat,
        "stated_limits": name == "d0",
    }


FUZZ = [
    _draw("d0", "adaptive", 1.0, 0.1, 0.1, 1.0, 1, 0.2),
    _draw("d1", "adaptive", 0.9, 5.0, 1.0, 0.5, 4, 0.4),
    _draw("d2", "adaptive", 0.98, 0.03, 0.0, 0.95, 2, 0.3),
    *(_draw(f"d{i}", "static", 0.5, 0.0, 0.1, 1.0, 1 + i, 0.0) for i in range(3)),
]


def _section(page: str, heading: str) -> str:
    start = page.index(heading + "\n")
    end = page.find("\n#", start + len(heading))
    return page[start : end if end >= 0 else len(page)]


def test_a_family_table_holds_each_policy_s_goodput_and_p99_with_misses_in_bold() -> None:
    page = build_page(RUN, BUNDLED, FUZZ)
    single = _section(page, "### Single engine")
    assert (
        "| scenario | `adaptive` (default) | `static` |\n"
        "| --- | --- | --- |\n"
        "| `ramp` | 0.990 (1.0×) | **0.500** (0.0×) |\n"
    ) in single
    assert "| `ramp` | 0.990 | 1.0 | 1.0 | 16.0 | 13.0 | 6 % | 1.000 |\n" in single
    capacity = _section(page, "### Capacity changes")
    # the oracle queued nothing and static did: an infinite ratio, over the slack, so a miss
    assert "| `gpu-added` | **0.950** (**3.0×**) | **0.300** (**∞**) |\n" in capacity
    assert "### Shared engines" not in page  # a family with no scenario in the run has no section
    assert (
        "| policy | ≥ 0.97 of the oracle | p99 ≤ 2× | saturated (median) |\n"
        "| --- | --- | --- | --- |\n"
        "| `adaptive` (default) | 1 of 2 | 1 of 2 | 6 % |\n"
        "| `static` | 0 of 2 | 1 of 2 | 6 % |\n"
    ) in page


def test_the_generator_table_is_ablation_s_figures_per_policy_and_split_by_stated_limits() -> None:
    page = build_page(RUN, BUNDLED, FUZZ)
    generator = _section(page, "## The generator")
    assert (
        "| policy | draws | goodput median | p10 | min | p99 ≤ 2× | Jain ≥ 0.9 | saturated (median) |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
        "| `adaptive` (default) | 3 | 0.980 | 0.916 | 0.900 | 67 % | 50 % | 30 % |\n"
        "| `static` | 3 | 0.500 | 0.500 | 0.500 | 100 % | 100 % | 0 % |\n"
        "| goal |  | ≥ 0.99 | ≥ 0.95 |  | ≥ 90 % | ≥ 90 % |  |\n"
    ) in generator
    assert (
        "| `adaptive` (default) | stated | 1 | 1.000 | 1.000 | 1.000 | 100 % | — | 20 % |\n"
        "| `adaptive` (default) | not stated | 2 | 0.940 | 0.908 | 0.900 | 50 % | 50 % | 35 % |\n"
        "| `static` | stated | 1 | 0.500 | 0.500 | 0.500 | 100 % | — | 0 % |\n"
        "| `static` | not stated | 2 | 0.500 | 0.500 | 0.500 | 100 % | 100 % | 0 % |\n"
    ) in generator
    # A fuzz.csv without the column: the figures, unsplit.
    untold = [{k: v for k, v in r.items() if k != "stated_limits"} for r in FUZZ]
    assert "| limits |" not in build_page(RUN, BUNDLED, untold)


def test_known_gaps_name_each_missed_goal_and_the_draws_that_miss_it() -> None:
    gaps = _section(build_page(RUN, BUNDLED, FUZZ), "## Known gaps")
    bullets = [line for line in gaps.splitlines() if line.startswith("* ")]
    assert bullets == [
        "* Generator, goodput median 0.980 (goal ≥ 0.99): 2 of 3 draws under 0.99; worst: `d1` 0.900, `d2` 0.980.",
        "* Generator, goodput p10 0.916 (goal ≥ 0.95): 1 of 3 draws under 0.95; worst: `d1` 0.900.",
        "* Generator, p99 queue within 2× the oracle's on 67 % of draws (goal ≥ 90 %): 1 of 3 draws over; worst "
        "(p99 against the oracle's): `d1` 5.0 s against 1.0 s.",
        "* Generator, Jain ≥ 0.9 on 50 % of multi-client draws (goal ≥ 90 %): 1 of 2 under 0.9; worst: `d1` 0.50 "
        "(4 clients).",
        "* Bundled `gpu-added` (Capacity changes): goodput 0.950 (goal ≥ 0.97), p99 3.0×.",
        "* Live checks not run (--no-live).",
    ]
    assert "| d1 | 0.9 | 5 | 1 | 0.5 |" in gaps  # the worst draws, as fuzz's worst.md has them


def test_the_glossary_comes_first_and_once_and_every_table_follows_its_command() -> None:
    page = build_page(RUN, BUNDLED, FUZZ)
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert headings == [
        "## Glossary",
        "## The bundled scenarios",
        "## The generator",
        "## Live checks",
        "## Known gaps",
    ]
    for term in ("Oracle", "Knee", "Goodput ratio", "p99 ×", "Jain", "Saturated", "Time to 90 %"):
        assert page.count(f"* **{term}**:") == 1, term
    assert "reaches 99% of the peak" in page  # lab/oracle.py's KNEE_FRACTION
    assert "`abc1234` (dirty), model-concurrency 0.1.0" in page
    commanded, tables = False, 0
    for line in page.splitlines():
        if line.startswith("#"):
            commanded = False  # a command counts only within its own section
        elif line.startswith(("model-concurrency ", "python ")):
            commanded = True
        elif line.startswith("| ") and not line.startswith("| ---"):
            assert commanded, line
            tables += 1
    assert tables > 10


def test_a_full_size_page_stays_under_the_word_limit() -> None:
    policies = ("adaptive", "aibrix", "llmd-aimd", "batch-gateway-aimd", "queue-time-aimd", "aimd", "static")
    run = dataclasses.replace(
        RUN,
        policies=policies,
        live_command="python benchmarks/conformance.py --quick",
        live_output="ramp (poll 12 s, knee 240, 8 s to run both):\n" * 11,
        live_status=0,
        live_misses=("Live `ramp`: missed.",),
    )
    names = [name for family in FAMILIES for name in family.scenarios if name != "fleet-1000"]
    bundled = [_bundled(s, p, 0.9, 9.0, 1.0) for s in names for p in policies]
    fuzz = [_draw(f"fuzz-41-{i:04d}", p, 0.5, 9.0, 1.0, 0.5, 3, 0.5) for i in range(200) for p in policies]
    words = len(build_page(run, bundled, fuzz).split())
    assert 3000 < words < MAX_WORDS


def test_the_live_checks_output_is_read_for_the_goals_it_misses() -> None:
    output = (
        "ramp (poll 12 s, knee 240, 8 s to run both):\n"
        "  knee  live settles at 1.01x the knee (goal 0.85-1.3), saturated 7.8% (goal <= 20%): met\n"
        "gpu-added (poll 12 s, knee 492, 19 s to run both):\n"
        "  knee  live settles at 1.40x the knee (goal 0.85-1.3), saturated 3.3% (goal <= 20%): MISSED\n"
        "conformance: max goodput-ratio gap 0.060, max t90 gap inf polls\n"
    )
    assert live_misses(output, 0) == (
        "Live `gpu-added`: live settles at 1.40x the knee (goal 0.85-1.3), saturated 3.3% (goal <= 20%): MISSED.",
        "Live, lab-to-live gap in goodput ratio 0.060 (goal ≤ 0.05).",
        "Live, lab-to-live gap in time to 90 % inf polls (goal ≤ 2).",
    )
    assert live_misses("conformance: max goodput-ratio gap 0.000, max t90 gap 0.08 polls\n", 0) == ()
    assert live_misses("", 1) == ("Live checks failed (exit status 1); their output is above.",)


def test_rows_read_back_from_the_csv_are_the_rows_written(tmp_path: Path) -> None:
    rows = [{**FUZZ[1], "unscored": None, "preset": "bge-m3", "events": "-"}]
    path = write_csv(rows, tmp_path / "fuzz.csv", FUZZ_COLUMNS)
    back = read_rows(path)
    assert back[0]["scenario"] == "d1" and back[0]["preset"] == "bge-m3" and back[0]["events"] == "-"
    assert back[0]["goodput_ratio"] == 0.9 and back[0]["clients"] == 4.0 and back[0]["stated_limits"] is False
    assert back[0]["unscored"] is None and back[0]["goodput"] is None
    assert read_rows(tmp_path / "absent.csv") == []


def test_the_command_runs_the_studies_and_rebuilds_the_same_page_from_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work, out = tmp_path / "work", tmp_path / "results.md"
    # Seed 135's first draws have cheap oracles (lab.fuzz.sweep_cost); tests/test_fuzz.py uses them too.
    args = ["--n", "3", "--seed", "135", "--scale", "0.05", "--scenarios", "ramp,gpu-added", "--no-live"]
    code = main(
        ["report", "--out", str(out), "--work", str(work), *args, "--policies", "adaptive,static", "--jobs", "1"]
    )
    assert code == 0
    page = out.read_text()
    bundled = (
        f"model-concurrency compare ramp gpu-added --policies adaptive,static --scale 0.05 --jobs 1 --quiet --no-plot "
        f"--out {work / 'bundled'}"
    )
    fuzz = (
        f"model-concurrency fuzz --seed 135 --n 3 --policies adaptive,static --scale 0.05 --jobs 1 --quiet "
        f"--out {work / 'fuzz'}"
    )
    assert page.count(f"\n{bundled}\n") == 4  # the bundled set, its two families, the known gaps
    assert page.count(f"\n{fuzz}\n") == 3  # the generator, its split by stated limits, the known gaps
    assert [(r["scenario"], r["policy"]) for r in read_rows(work / "bundled" / "compare.csv")] == [
        ("ramp", "adaptive"),
        ("ramp", "static"),
        ("gpu-added", "adaptive"),
        ("gpu-added", "static"),
    ]
    assert len(read_rows(work / "fuzz" / "fuzz.csv")) == 6
    assert "### Single engine" in page and "### Capacity changes" in page
    assert "* Live checks not run (--no-live)." in page
    record = json.loads((work / "run.json").read_text())
    assert record["policies"] == ["adaptive", "static"] and record["live_output"] is None
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"wrote {out} (")
    again = tmp_path / "again.md"
    assert main(["report", "--out", str(again), "--from", str(work)]) == 0
    assert again.read_text() == page


def test_every_bundled_scenario_has_a_family() -> None:
    # A scenario left out of the families lands under "Other scenarios", away from the workloads it is compared with.
    in_families = {name for family in FAMILIES for name in family.scenarios}
    assert set(bundled_scenarios()) - in_families == set()
    assert in_families - set(bundled_scenarios()) == set()
