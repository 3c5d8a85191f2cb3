"""The docs a new user follows run as written: the Ray snippet of docs/your-vllm.md, pasted into a file and run
against the emulator, and a README that lists every document."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def snippet(doc: str, name: str) -> str:
    """The code block that follows ``<!-- snippet: NAME ... -->`` in ``docs/DOC``."""
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    match = re.search(rf"<!-- snippet: {name}\b[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert match is not None, f"docs/{doc} has no {name} snippet"
    return match.group(1)


def test_readme_lists_every_document() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`docs/([\w-]+\.md)`", readme.split("## Documents", 1)[1]))
    assert listed == {p.name for p in (ROOT / "docs").glob("*.md")}
    assert "Ray" in readme


@pytest.mark.slow
def test_the_ray_snippets_run_as_pasted(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from model_concurrency.emulator import EmulatorConfig, serve_in_thread

    script = tmp_path / "snippet.py"
    # The beginning (docs/your-vllm.md) and its continuation (docs/scale-out.md), as a reader pastes them.
    script.write_text(snippet("your-vllm.md", "ray") + snippet("scale-out.md", "ray-more"), encoding="utf-8")
    ray_tmp = tempfile.mkdtemp(prefix="mc-ray-")  # short: Ray's socket paths must fit in 107 bytes
    src = str(ROOT / "src")
    with serve_in_thread(EmulatorConfig(preset="bge-m3", time_scale=1.0)) as emu:
        env = {
            **os.environ,
            "VLLM_BASE_URL": emu.base_url,
            "VLLM_MODEL": emu.model,
            "RAY_TMPDIR": ray_tmp,
            "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
            "MODEL_CONCURRENCY_POLL_S": "0.5",
        }
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "200 items embedded\n200 rows embedded by Ray Data\n100 items embedded by actors" in done.stdout
