"""``watch --job PATH`` on a job that has finished: its export file keeps the last page, in-flight count and all,
so the table must say the file stopped being rewritten. A real ``run --export`` writes the file; the file's age is
set with ``os.utime``, never waited for."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_concurrency import export
from model_concurrency.cli import main
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=16, time_scale=0.05, simulate_frontend=False)
    with serve_in_thread(config) as running:
        yield running


@pytest.fixture
def finished_job(emu: RunningEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Path]:
    """The export file of a job that ran and ended (its writer stopped, as when the process exits)."""
    path = tmp_path / "job.prom"
    argv = ["run", "--model", "bge", "--base-url", emu.base_url, "--items", "50", "--quiet", "--export", str(path)]
    try:
        assert main(argv) == 0
    finally:
        export.stop(str(path))
    capsys.readouterr()
    yield path


def watch_once(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["watch", "--job", str(path), "--once"]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_an_export_file_left_behind_says_the_job_has_ended(
    finished_job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    then = time.time() - 600
    os.utime(finished_job, (then, then))
    out = watch_once(finished_job, capsys)
    assert "bge" in out  # the last figures are still shown
    found = re.search(r"export not updated for (\d+) s: the job has ended or stopped", out)
    assert found is not None and int(found.group(1)) >= 600, out
    assert f"(a running job rewrites it every {export.FILE_EVERY_S:g} s)" in out


def test_a_file_being_rewritten_reads_as_a_running_job(finished_job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.utime(finished_job)  # rewritten just now, as a running job's writer does every FILE_EVERY_S
    out = watch_once(finished_job, capsys)
    assert "bge" in out and "export not updated" not in out
