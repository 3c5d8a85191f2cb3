"""The examples and the README's "Using it" snippet run as a user runs them: a fresh interpreter, a real emulator
in child processes, real HTTP over loopback. Small sizes; the target must leave the floor in each."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run(args: list[str], cwd: Path, ceiling: str | None = "64") -> str:
    env = dict(os.environ)
    # One emulator front-end on a shared CI core: a ceiling keeps the run short (the snippet sets no ceiling).
    env.pop("MODEL_MAX_CONCURRENCY", None)
    if ceiling is not None:
        env["MODEL_MAX_CONCURRENCY"] = ceiling
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def targets(stdout: str) -> list[int]:
    return [int(m) for m in re.findall(r"^\s*[\d.]+s\s+target (\d+)$", stdout, flags=re.MULTILINE)]


@pytest.mark.parametrize("example", ["embed_httpx.py", "embed_openai.py", "embed_openai.py --map"])
def test_example_leaves_the_floor(example: str, tmp_path: Path) -> None:
    name, *flags = example.split()
    out = run([str(ROOT / "examples" / name), "--items", "400", "--floor", "2", *flags], cwd=tmp_path)
    assert "embedded 400 texts" in out
    path = targets(out)
    assert path[0] == 2 and max(path) > 2, out


def test_chat_example_leaves_the_floor(tmp_path: Path) -> None:
    out = run([str(ROOT / "examples" / "chat_httpx.py"), "--items", "200", "--floor", "2"], cwd=tmp_path)
    assert "completed 200 chats" in out
    path = targets(out)
    assert path[0] == 2 and max(path) > 2, out


def test_an_example_given_a_url_keeps_the_environments_ceiling(tmp_path: Path) -> None:
    """With --url the server is the user's: the emulator's demo ceiling is not imposed on it."""
    from model_concurrency.emulator import EmulatorConfig, serve_in_thread

    config = EmulatorConfig(preset="bge-m3", max_num_seqs=16, time_scale=0.05, simulate_frontend=False)
    with serve_in_thread(config) as emu:
        argv = [str(ROOT / "examples" / "embed_httpx.py"), "--url", emu.base_url, "--served-name", emu.model]
        unset = run([*argv, "--items", "50"], cwd=tmp_path, ceiling=None)
        given = run([*argv, "--items", "50"], cwd=tmp_path, ceiling="200")
    assert "embedded 50 texts" in unset and "; ceiling 512\n" in unset, unset  # the knob's default
    assert "; ceiling 200\n" in given, given


def test_the_examples_help_says_what_they_set(tmp_path: Path) -> None:
    for name in ("embed_httpx.py", "embed_openai.py", "chat_httpx.py"):
        text = " ".join(run([str(ROOT / "examples" / name), "--help"], cwd=tmp_path).split())
        assert "MODEL_MAX_CONCURRENCY=128 is set unless already set" in text, name
        assert "with --url the environment's ceiling is left as it is" in text, name


def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Using it", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert match is not None, "no python block under 'Using it'"
    return match.group(1)


def test_readme_snippet_runs_as_pasted(tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(readme_snippet())
    out = run([str(script)], cwd=tmp_path)
    found = re.search(r"^2000 vectors; target now (\d+) \(floor 4\)$", out, flags=re.MULTILINE)
    assert found is not None, out
    assert int(found.group(1)) > 4
