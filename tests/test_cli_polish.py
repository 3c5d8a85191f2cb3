"""The command line as a first-time user meets it: help, ``list``, -v anywhere, progress off a terminal, tables
that show every header and name in full."""

from __future__ import annotations

import argparse
import json
import re
import socket
from pathlib import Path

import pytest

from model_concurrency.cli import build_parser, main
from model_concurrency.cli.compare import DEFAULT_POLICIES
from model_concurrency.cli.live import short_failure
from model_concurrency.lab.scenario import bundled_scenarios

REPO = Path(__file__).resolve().parents[1]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("argv", [["-v", "list"], ["list", "-v"], ["list", "--verbose"]])
def test_verbose_before_or_after_the_subcommand(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).verbose == 1


def test_verbose_defaults_off() -> None:
    assert build_parser().parse_args(["list"]).verbose == 0


def test_every_subcommand_has_a_description_and_every_option_a_help_text() -> None:
    for name, sub in subparsers(build_parser()).items():
        assert sub.description, f"{name} has no description"
        for action in sub._actions:
            if action.option_strings and action.help != argparse.SUPPRESS:
                assert action.help, f"{name} {action.option_strings} has no help text"


@pytest.mark.parametrize("option", ["--host", "--port", "--log-level"])
def test_emulate_options_are_explained(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["emulate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(re.escape(option) + r" \S+ [a-zA-Z]", out), out


def test_list_shows_bundled_scenarios_and_policies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    names = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    assert set(bundled_scenarios()) == {p.stem for p in (REPO / "sims").glob("*.toml")}
    assert set(bundled_scenarios()) <= names
    assert {"adaptive", "aimd", "hysteresis", "aimd-aggressive", "setpoint-queue-time"} <= names
    assert re.search(r"^  hysteresis +\[preset\] +\S", out, re.MULTILINE)
    assert re.search(r"^  adaptive +\[built-in\] +\S", out, re.MULTILINE)


def test_compare_defaults_include_the_default_policy() -> None:
    args = build_parser().parse_args(["compare", "ramp"])
    assert args.policies == DEFAULT_POLICIES
    assert args.policies.split(",")[0] == "adaptive"


def test_sim_by_name_prints_progress_lines_when_not_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the bundled scenario and preset, not files under the current directory
    out_json = tmp_path / "s.json"
    assert (
        main(["sim", "ramp", "--policy", "hysteresis", "--scale", "0.05", "--no-oracle", "--json", str(out_json)]) == 0
    )
    err = capsys.readouterr().err
    percents = [int(m) for m in re.findall(r"^ramp / hysteresis: [\d,]+/90 sim-s \((\d+) %\)$", err, re.MULTILINE)]
    assert percents == sorted(set(percents)) and percents[-1] == 100 and len(percents) >= 5, err
    assert json.loads(out_json.read_text())["policy"] == "hysteresis"


def test_sim_quiet_prints_no_progress(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "ramp", "--scale", "0.02", "--no-oracle", "--quiet"]) == 0
    assert "sim-s" not in capsys.readouterr().err


@pytest.mark.slow
def test_compare_table_shows_whole_headers_and_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["compare", "multi-client", "multi-client-32", "--policies", "static", "--scale", "0.02", "--jobs", "1"]
    assert main([*args, "--out", str(tmp_path), "--no-plot"]) == 0
    captured = capsys.readouterr()
    rows = [line for line in captured.out.splitlines() if "static" in line]
    assert [row.split()[1] for row in rows] == ["multi-client", "multi-client-32"]
    assert "…" not in captured.out
    for header in ("goodput_ratio", "time_to_90pct_s", "saturated_fraction", "jain_fairness"):
        assert header in captured.out
    # Off a terminal: a progress line per finished run (4 runs: 2 oracles, 2 pairs), on stderr.
    assert re.findall(r"^compare: (\d)/4 runs", captured.err, re.MULTILINE) == ["1", "2", "3", "4"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_watch_unreachable_model_fits_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "models.toml"
    config.write_text(f'[models.unreachable]\nbase_url = "http://127.0.0.1:{closed_port()}/v1"\n')
    assert main(["watch", "--config", str(config), "--once"]) == 0
    lines = capsys.readouterr().out.splitlines()
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == 1, "\n".join(lines)  # one model, one line: no cell wrapped
    assert "unreachable" in body[0] and "failed (ConnectError)" in body[0]
    header = next(line for line in lines if line.startswith("┃"))
    for title in ("target", "in-flight", "cap-waiting", "KV usage", "saturated", "metrics", "policy"):
        assert f" {title} " in header


@pytest.mark.parametrize(
    ("error", "cell"),
    [
        ("ScrapeError: ConnectError: All connection attempts failed", "failed (ConnectError)"),
        ("ScrapeError: HTTP 503 from http://x/metrics", "failed (ScrapeError)"),
        ("something odd happened here and there", "failed (something odd happened h)"),
        (None, "failed"),
    ],
)
def test_short_failure(error: str | None, cell: str) -> None:
    assert short_failure(error) == cell
