"""One table of knobs: the CLI prints it, docs/operations.md carries it generated, every knob is
read through ``setting()``, and a harness passes values as overrides instead of editing ``os.environ``."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from model_concurrency import config, knobs
from model_concurrency.cli import main
from model_concurrency.knobs import KNOBS, knobs_markdown, overrides, setting

ROOT = Path(__file__).resolve().parent.parent


def test_operations_doc_carries_the_generated_table() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- knobs:begin[^>]*-->\n(.*?)<!-- knobs:end -->", doc, re.S)
    assert match is not None, "docs/operations.md lost its knobs markers"
    assert match.group(1) == knobs_markdown(), "regenerate: model_concurrency.knobs.knobs_markdown()"


def test_readme_links_to_the_table_instead_of_copying_it() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/operations.md#knobs" in readme
    assert "| `MODEL_CONCURRENCY_POLL_JITTER` |" not in readme


def test_cli_prints_every_knob_with_its_default_and_current_value(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "64")
    assert main(["knobs"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert set(lines) == {k.name for k in KNOBS}
    assert lines["MODEL_MAX_CONCURRENCY"][1:3] == ["512", "64"]
    assert lines["MODEL_CONCURRENCY_POLL_S"][1:3] == ["12", "—"]
    assert lines["KG_ADAPTIVE_CONCURRENCY"][1] == "on"


def test_every_knob_constant_is_in_the_table() -> None:
    pairs = {value for name, value in vars(config).items() if name.isupper() and isinstance(value, tuple)}
    table = {k.pair for k in KNOBS}
    assert {p for p in pairs if len(p) == 2 and isinstance(p[0], str) and p[0].isupper()} <= table


def test_nothing_in_src_reads_the_environment_but_setting() -> None:
    """``grep -rn environ src``: only knobs.py touches os.environ (docstrings aside)."""
    offenders = []
    for path in (ROOT / "src" / "model_concurrency").rglob("*.py"):
        if path.name == "knobs.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"os\.environ|os\.getenv", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


def test_overrides_win_for_every_thread_and_leave_os_environ_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "3")
    seen: list[float] = []
    with overrides({"MODEL_CONCURRENCY_POLL_S": "0.5"}):
        thread = threading.Thread(target=lambda: seen.append(setting(*knobs.POLL_S)))
        thread.start()
        thread.join()
        with overrides({"MODEL_CONCURRENCY_POLL_S": "0.25"}):
            assert setting(*config.POLL_S) == 0.25
        assert setting(*config.POLL_S) == 0.5
        assert os.environ["MODEL_CONCURRENCY_POLL_S"] == "3"
    assert seen == [0.5]
    assert setting(*config.POLL_S) == 3.0


def test_an_override_is_validated_like_the_environment() -> None:
    with overrides({"MODEL_MAX_CONCURRENCY": "-1"}):
        assert setting(*config.MAX_CONCURRENCY) == 512
