"""``model-concurrency fuzz --as-job``: the generator's draws, each run with all its clients in one job.

The flag exists to set the coordinated rule (lab/job.py) beside independent clients draw for draw, so what it may
change is the job alone: the same draw from the same streams, ``clients.job`` set after drawing, and fuzz.csv
marking its rows. Without the flag fuzz.csv keeps its columns (docs/figures/report holds one such table).
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from model_concurrency.cli import main
from model_concurrency.lab import run as lab_run
from model_concurrency.lab.fuzz import FUZZ_COLUMNS, JOB_NAME, as_one_job, draw_dict, draw_scenario
from model_concurrency.lab.job import SimJob, job_groups
from model_concurrency.lab.scenario import load_scenario

# Seed 135's first draw: eleven clients with one of the cheapest oracles (see test_fuzz.py).
SEED, SCALE = 135, 0.03


def test_as_one_job_sets_the_job_and_nothing_else() -> None:
    for index in range(20):
        data = draw_dict(41, index, 0.25)
        joined = as_one_job(data)
        assert joined["clients"].pop("job") == JOB_NAME
        assert joined == data and "job" not in data["clients"]  # the draw itself is left as drawn


def test_as_job_runs_the_same_draw_with_all_its_clients_in_one_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[dict[int, SimJob]] = []  # per run the runner simulates: each client's job, by index
    jobs_for = lab_run.jobs_for

    def recording(*args: Any, **kwargs: Any) -> dict[int, SimJob]:
        by_client = jobs_for(*args, **kwargs)
        built.append(by_client)
        return by_client

    monkeypatch.setattr(lab_run, "jobs_for", recording)  # --jobs 1 runs in this process
    out = tmp_path / "fz"
    args = ["fuzz", "--n", "1", "--seed", str(SEED), "--scale", str(SCALE), "--jobs", "1", "--quiet"]
    assert main([*args, "--as-job", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("fuzz: policy adaptive, n 1, goodput median ")

    drawn = draw_scenario(SEED, 0, SCALE)
    assert drawn.clients.count > 1 and drawn.clients.job is None
    ran = load_scenario(out / "scenarios" / f"fuzz-{SEED}-0000.toml")
    assert ran == dataclasses.replace(drawn, clients=dataclasses.replace(drawn.clients, job=JOB_NAME))
    assert job_groups(ran.clients) == {JOB_NAME: list(range(drawn.clients.count))}
    # The policy's run built one job, every client its worker, with the clients' summed floor.
    (by_client,) = built
    assert sorted(by_client) == list(range(drawn.clients.count))
    (job,) = set(by_client.values())
    assert job.name == JOB_NAME and job.config.floor == drawn.clients.floor * drawn.clients.count
    assert job.polls > 0

    with (out / "fuzz.csv").open() as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert reader.fieldnames == [*FUZZ_COLUMNS, "job"]
    assert [(r["scenario"], r["policy"], r["job"]) for r in rows] == [(f"fuzz-{SEED}-0000", "adaptive", "True")]
    assert rows[0]["clients"] == str(drawn.clients.count)


def test_without_the_flag_the_table_has_its_usual_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fz"
    args = ["fuzz", "--n", "1", "--seed", str(SEED), "--scale", str(SCALE), "--jobs", "1", "--quiet"]
    assert main([*args, "--out", str(out)]) == 0
    capsys.readouterr()
    with (out / "fuzz.csv").open() as fh:
        assert csv.DictReader(fh).fieldnames == list(FUZZ_COLUMNS)
    assert load_scenario(out / "scenarios" / f"fuzz-{SEED}-0000.toml") == draw_scenario(SEED, 0, SCALE)
