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


def run(args: list[str], cwd: Path) -> str:
    env = dict(os.environ)
    # One emulator front-end on a shared CI core: a ceiling keeps the run short (the snippet sets no ceiling).
    env["MODEL_MAX_CONCURRENCY"] = "64"
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
