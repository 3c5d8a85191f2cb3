"""``model-concurrency run`` as a new user meets it: a chat model, a config file, the off switch, a metrics URL that
never answers; and ``knobs`` on the export file. Through ``cli.main`` over real HTTP to an emulator on 127.0.0.1."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_concurrency.cli import main
from model_concurrency.decision import MEANINGS, NEVER_READ, OFF
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.export import FILE_EVERY_S


@pytest.fixture(scope="module")
def chat_emu() -> Iterator[RunningEmulator]:
    config = EmulatorConfig(preset="llama-8b-h100", max_num_seqs=16, time_scale=5.0, simulate_frontend=False)
    with serve_in_thread(config) as running:
        yield running


@pytest.fixture(scope="module")
def embed_emu() -> Iterator[RunningEmulator]:
    config = EmulatorConfig(preset="bge-m3", max_num_seqs=16, time_scale=0.05, simulate_frontend=False)
    with serve_in_thread(config) as running:
        yield running


@pytest.fixture
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0.2")


def closed_port_url() -> str:
    """A metrics URL on 127.0.0.1 where nothing listens: every poll is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["run", "--quiet", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def limited_by_line(out: str) -> str:
    found = re.search(r"^limited by: (.+); last decision: ", out, flags=re.MULTILINE)
    assert found is not None, out
    return found.group(1)


# -- --endpoint ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_run_drives_a_chat_model(
    endpoint: str, chat_emu: RunningEmulator, fast_polls: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "--model", "llama", "--base-url", chat_emu.base_url, "--endpoint", endpoint, "--items", "60",
        "--floor", "2", "--max-tokens", "4",
    )  # fmt: skip
    assert code == 0, err
    assert "60 items in" in out
    assert f"at {chat_emu.base_url}: {endpoint}, policy " in out
    assert f"served as {chat_emu.model}" in out


def test_run_help_names_each_endpoint_and_the_config_rule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--endpoint {embeddings,completions,chat}" in text
    for what in (
        "POST {base-url}/embeddings with input",
        "POST {base-url}/completions with prompt and max_tokens",
        "POST {base-url}/chat/completions with one user message and max_tokens",
        "(default: embeddings)",
    ):
        assert "".join(what.split()) in "".join(text.split()), what
    assert "--metrics-url" in text
    assert "MODEL_CONCURRENCY_CONFIG" in text and "when given, override its fields" in text


# -- --metrics-url and MODEL_CONCURRENCY_CONFIG ---------------------------------------------------------------------
def test_run_reads_the_metrics_url_given(
    embed_emu: RunningEmulator, fast_polls: None, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = embed_emu.base_url.removesuffix("/v1") + "/metrics"
    code, out, err = run_cli(
        capsys, "--model", "bge", "--base-url", embed_emu.base_url, "--metrics-url", metrics, "--items", "200",
        "--floor", "2",
    )  # fmt: skip
    assert code == 0, err
    assert f"metrics {metrics}" in out
    assert "never answered" not in out


def write_config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(body)
    return path


def test_run_uses_the_config_files_registration(
    embed_emu: RunningEmulator,
    fast_polls: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dead = closed_port_url()
    path = write_config(
        tmp_path,
        f'[models.cfg]\nbase_url = "{embed_emu.base_url}"\nserved_model_name = "{embed_emu.model}"\n'
        f'metrics_url = "{dead}"\nparallel_instances = 1\nmax_parallel_calls = 3\n',
    )
    monkeypatch.setenv("MODEL_CONCURRENCY_CONFIG", str(path))
    code, out, err = run_cli(capsys, "--model", "cfg", "--items", "20")
    assert code == 0, err
    assert f"registration of cfg: MODEL_CONCURRENCY_CONFIG={path}\n" in out
    assert f"metrics {dead}" in out  # the file's metrics_url, not one derived from the base URL
    assert "target: floor 3," in out  # the file's max_parallel_calls


def test_flags_given_override_the_config_file(
    embed_emu: RunningEmulator,
    fast_polls: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_config(tmp_path, f'[models.cfg]\nbase_url = "{embed_emu.base_url}"\nmax_parallel_calls = 3\n')
    monkeypatch.setenv("MODEL_CONCURRENCY_CONFIG", str(path))
    metrics = embed_emu.base_url.removesuffix("/v1") + "/metrics"
    code, out, err = run_cli(capsys, "--model", "cfg", "--items", "20", "--floor", "2", "--metrics-url", metrics)
    assert code == 0, err
    line = (
        f"registration of cfg: MODEL_CONCURRENCY_CONFIG={path}; overridden on the command line: --metrics-url, --floor"
    )
    assert line in out
    assert "target: floor 2," in out and f"metrics {metrics}" in out


def test_a_config_file_without_the_model_is_named(
    embed_emu: RunningEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, f'[models.other]\nbase_url = "{embed_emu.base_url}"\n')
    monkeypatch.setenv("MODEL_CONCURRENCY_CONFIG", str(path))
    code, out, err = run_cli(capsys, "--model", "bge", "--base-url", embed_emu.base_url, "--items", "5")
    assert code == 0, err
    assert f"registration of bge: the command line (MODEL_CONCURRENCY_CONFIG={path} does not register bge)" in out


def test_a_config_file_that_cannot_be_read_stops_the_run(
    embed_emu: RunningEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, "[models.cfg\n")
    monkeypatch.setenv("MODEL_CONCURRENCY_CONFIG", str(path))
    code, _, err = run_cli(capsys, "--model", "cfg", "--base-url", embed_emu.base_url, "--items", "5")
    assert code == 2
    assert f"model-concurrency: error: MODEL_CONCURRENCY_CONFIG={path}: not valid TOML" in err, err


def test_without_base_url_or_config_the_run_says_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--model", "bge", "--items", "5")
    assert code == 2
    assert "--base-url is required for model 'bge' (none given)" in err, err


# -- the off switch ---------------------------------------------------------------------------------------------------
def test_the_off_switch_is_what_holds_the_target(
    embed_emu: RunningEmulator, fast_polls: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KG_ADAPTIVE_CONCURRENCY", "false")
    code, out, err = run_cli(
        capsys, "--model", "bge", "--base-url", embed_emu.base_url, "--items", "100", "--floor", "2"
    )
    assert code == 0, err
    assert "target: floor 2, ceiling 512, max 2, final 2" in out
    assert limited_by_line(out) == f"{OFF} ({MEANINGS[OFF]})"
    assert "KG_ADAPTIVE_CONCURRENCY" in MEANINGS[OFF] and "growing freely" not in out


def test_the_off_switch_shows_in_get_utilization(monkeypatch: pytest.MonkeyPatch) -> None:
    from model_concurrency import get_utilization, register_model

    monkeypatch.setenv("KG_ADAPTIVE_CONCURRENCY", "false")
    register_model("off", base_url="http://127.0.0.1:9/v1", max_parallel_calls=2)
    assert get_utilization("off")["limited_by"] == OFF


# -- a metrics URL that never answered --------------------------------------------------------------------------------
def test_a_metrics_page_that_never_answered_is_said_so(
    embed_emu: RunningEmulator,
    fast_polls: None,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = closed_port_url()
    with caplog.at_level(logging.WARNING, logger="model_concurrency"):
        code, out, err = run_cli(
            capsys, "--model", "bge", "--base-url", embed_emu.base_url, "--metrics-url", dead, "--items", "300",
            "--floor", "2",
        )  # fmt: skip
    assert code == 0, err
    assert f"metrics: {dead} never answered (ScrapeError: ConnectError" in out, out
    assert "final 2" in out
    assert limited_by_line(out) == f"{NEVER_READ} ({MEANINGS[NEVER_READ]})"
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model bge: metrics poll failed")]
    assert warnings, caplog.text
    assert f"the metrics page {dead} has never answered, so the target stays at the floor until it does" in warnings[0]
    assert all("the target stays at the floor until it does" in line for line in warnings), warnings
    assert not any("last good target" in line for line in warnings)


def test_the_warning_names_the_metrics_url(
    embed_emu: RunningEmulator, fast_polls: None, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    dead = closed_port_url()
    with caplog.at_level(logging.WARNING, logger="model_concurrency"):
        code, _, _ = run_cli(
            capsys, "--model", "bge", "--base-url", embed_emu.base_url, "--metrics-url", dead, "--items", "100"
        )
    assert code == 0
    warnings = [r.getMessage() for r in caplog.records if "metrics poll failed" in r.getMessage()]
    assert warnings and all(dead in line for line in warnings), warnings


# -- knobs ------------------------------------------------------------------------------------------------------------
def test_knobs_gives_the_export_files_true_period(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["knobs"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"a file path (rewritten every {FILE_EVERY_S:g} s, between polls too)" in text
    assert "each poll" not in text
