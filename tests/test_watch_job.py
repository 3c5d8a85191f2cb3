"""``watch --job`` shows a running job's own state.

A real job: ``map_concurrent`` of embedding calls against the emulator, in a thread, publishing its metrics with
``MODEL_CONCURRENCY_EXPORT`` (a file, then an HTTP port). ``watch --job`` reads that page (prometheus_client's
parser) and its table, rendered by the CLI's own function with no terminal, shows the job's target, not a
controller of its own. ``watch`` without a job says in its header that it shows this process's controllers.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from model_concurrency import export, map_concurrent, register_model
from model_concurrency.cli.job import job_page, job_rows, job_url, render_job_table
from model_concurrency.cli.live import render_table
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.runtime import runtime_for

MODEL, FLOOR = "job-embed", 4


def text_of(table: object) -> str:
    console = Console(record=True, width=220)
    console.print(table)
    return console.export_text()


@pytest.fixture
def emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningEmulator]:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0.05")
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "64")
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=32, time_scale=1.0, simulate_frontend=False)
    with serve_in_thread(config) as emu:
        register_model(MODEL, base_url=emu.base_url, served_model_name=emu.model, max_parallel_calls=FLOOR)
        yield emu
    export.stop()


def run_job(emu: RunningEmulator, stop: threading.Event) -> threading.Thread:
    """The job: embed until told to stop, through the gate."""

    async def items():  # type: ignore[no-untyped-def]
        i = 0
        while not stop.is_set():
            yield i
            i += 1

    async def main() -> None:
        async with httpx.AsyncClient(base_url=emu.base_url, timeout=30) as client:

            async def embed(i: int) -> None:
                (await client.post("/embeddings", json={"model": emu.model, "input": f"t {i}"})).raise_for_status()

            await map_concurrent(items(), embed, model=MODEL)

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    return thread


def settle(model: str) -> None:
    """Wait (bounded) until the model's runtime stopped polling: the job's last decision is in."""
    runtime = runtime_for(model)
    for _ in range(500):
        if runtime.scheduled_poll_at() is None:
            return
        threading.Event().wait(0.02)


def watch_until_grown(where: str, stop: threading.Event) -> dict[str, object]:
    """What ``watch --job`` reads, until the job's target left the floor (or a bounded number of reads)."""
    runtime = runtime_for(MODEL)
    for _ in range(400):
        try:
            rows = {row["model"]: row for row in job_rows(job_page(where))}
        except (ValueError, httpx.ConnectError):  # the job has not published yet (its first poll starts it)
            rows = {}
        row = rows.get(MODEL)
        if row is not None and int(row["target"]) > FLOOR and runtime.core.polls >= 3:  # type: ignore[call-overload]
            return row
        stop.wait(0.05)
    raise AssertionError(f"the job's target never showed above the floor; last rows {rows}")


@pytest.mark.parametrize("kind", ["file", "port"])
def test_watch_job_shows_the_jobs_own_target(
    kind: str, emulator: RunningEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "file":
        where = str(tmp_path / "job.prom")
    else:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            where = f"127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("MODEL_CONCURRENCY_EXPORT", where)
    stop = threading.Event()
    job = run_job(emulator, stop)
    try:
        row = watch_until_grown(where, stop)
    finally:
        stop.set()
        job.join(30)
    assert not job.is_alive()
    runtime = runtime_for(MODEL)
    assert row["floor"] == FLOOR and row["ceiling"] == 64
    assert row["metrics_ok"] == "ok"
    # The page follows the job's runtime: once the job is over (its poller gone) it holds the job's last target.
    settle(MODEL)
    if kind == "file":
        export.write_page(Path(where))  # the writer's next round, now
    final = {r["model"]: r for r in job_rows(job_page(where))}[MODEL]
    assert final["target"] == runtime.core.target
    shown = text_of(render_job_table([row], where))
    assert "the job's own state" in shown and MODEL in shown and str(row["target"]) in shown


def test_job_addresses() -> None:
    assert job_url("127.0.0.1:9464") == "http://127.0.0.1:9464/metrics"
    assert job_url("http://h:1/metrics") == "http://h:1/metrics"
    assert job_url("/tmp/job.prom") is None
    with pytest.raises(ValueError, match="cannot read"):
        job_page("/nonexistent/job.prom")


def test_limited_by_is_the_reason_whose_gauge_is_one() -> None:
    page = (
        "# TYPE model_concurrency_target gauge\n"
        'model_concurrency_target{model="m"} 12.0\n'
        "# TYPE model_concurrency_limited_by gauge\n"
        'model_concurrency_limited_by{model="m",reason="ceiling"} 0.0\n'
        'model_concurrency_limited_by{model="m",reason="saturation"} 1.0\n'
    )
    (row,) = job_rows(page)
    assert row == {"model": "m", "target": 12, "limited_by": "saturation"}


def test_watch_without_a_job_says_whose_controllers_it_shows() -> None:
    assert "this process's own controllers, not a running job's" in text_of(render_table([]))


def test_run_export_publishes_for_watch_job(
    emulator: RunningEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run --export PATH``: the CLI's own job publishes, and ``watch --job PATH --once`` shows its target."""
    from model_concurrency.cli import main

    where = str(tmp_path / "run.prom")
    args = ["run", "--model", "cli-job", "--base-url", emulator.base_url, "--items", "40", "--quiet"]
    assert main([*args, "--export", where]) == 0
    assert f"watch --job {where}" in capsys.readouterr().out
    settle("cli-job")
    export.write_page(Path(where))
    assert main(["watch", "--job", where, "--once"]) == 0
    shown = capsys.readouterr().out
    assert "the job's own state" in shown and "cli-job" in shown
    (row,) = [r for r in job_rows(job_page(where)) if r["model"] == "cli-job"]
    assert row["target"] == runtime_for("cli-job").core.target
