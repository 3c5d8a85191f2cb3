"""``model-concurrency run``, ``watch`` and ``emulate`` through ``cli.main`` against an in-process emulator."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_concurrency.cli import main
from model_concurrency.cli.live import compress_path, synthetic_inputs
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=16, time_scale=0.05, simulate_frontend=False)
    with serve_in_thread(config) as running:
        yield running


def test_run_prints_throughput_and_target_path(
    emu: RunningEmulator, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0.2")
    code = main(["run", "--model", "bge-m3", "--base-url", emu.base_url, "--items", "300", "--floor", "2", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "served as BAAI/bge-m3" in out  # found through GET /v1/models
    assert "300 items in" in out and "items/s" in out
    assert re.search(r"target path \(s: target\): 0\.\d: 2, ", out), out
    assert "policy " in out  # whichever default policy is configured


def test_watch_once_shows_registered_models(
    emu: RunningEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "models.toml"
    config.write_text(
        f'[models.embedder]\nbase_url = "{emu.base_url}"\nserved_model_name = "{emu.model}"\nmax_parallel_calls = 3\n'
        '[models.broken]\nbase_url = "http://127.0.0.1:9/v1"\n'
    )
    assert main(["watch", "--config", str(config), "--once"]) == 0
    out = capsys.readouterr().out
    assert "embedder" in out and "broken" in out
    assert "ok" in out and "failed" in out
    assert "static" not in out  # both have a metrics URL: adaptive controllers, not the static path


def test_watch_without_models_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--once"]) == 2
    assert "no registered models" in capsys.readouterr().err


def test_emulate_rejects_unknown_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["emulate", "--preset", "no-such-gpu", "--port", "0"]) == 2
    assert "unknown engine preset" in capsys.readouterr().err


def test_helpers() -> None:
    inputs = synthetic_inputs(3, 16)
    assert inputs[0].startswith("item 0") and all(len(s) == 16 for s in inputs)
    samples = [(0.0, 4), (0.1, 4), (0.2, 5), (0.3, 5), (0.4, 6)]
    assert compress_path(samples) == [(0.0, 4), (0.2, 5), (0.4, 6)]
    many = [(float(i), i) for i in range(100)]
    thinned = compress_path(many, limit=10)
    assert len(thinned) == 10 and thinned[0] == (0.0, 0) and thinned[-1] == (99.0, 99)


@pytest.mark.parametrize("flag", ["-v", "-vv"])
def test_run_verbose_logs_decisions_and_only_vv_logs_requests(emu: RunningEmulator, flag: str) -> None:
    """``-v``: one line per decision (previous -> new target, the rule, the figures), no per-request lines."""
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "MODEL_CONCURRENCY_POLL_S": "0.2", "PYTHONPATH": src}
    argv = [flag, "run", "--model", "bge-m3", "--base-url", emu.base_url, "--items", "200", "--floor", "2", "--quiet"]
    cli = "import sys; from model_concurrency.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", cli, *argv], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    decisions = re.findall(r"^INFO model bge-m3: target (\d+) -> (\d+): .+ \(.+\)$", done.stderr, flags=re.MULTILINE)
    assert decisions and decisions[0][0] == "2", done.stderr
    requests = [line for line in done.stderr.splitlines() if "HTTP Request" in line]
    assert (len(requests) > 200) if flag == "-vv" else requests == []
    assert re.search(r"^limited by: .+; last decision: \d+ -> \d+: ", done.stdout, flags=re.MULTILINE), done.stdout
