"""The package outside the checkout: a wheel in a fresh venv runs scenarios and presets by name.

``policies/`` and ``sims/`` at the top of the repository are the only copies; the package reaches them through
the symlinks ``src/model_concurrency/bundled/{policies,sims}``, and a build copies the files the links point at.
The wheel test builds the wheel (or takes the one ``.ci/run`` built, from ``MODEL_CONCURRENCY_WHEEL``), installs
it into a new venv in a temporary folder, first without extras (what works, and the one-line error for what
needs one), then with ``[sim]``, and runs the documented commands from that folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from model_concurrency.bundled import bundled_dir
from model_concurrency.lab.scenario import bundled_scenarios, find_scenario
from model_concurrency.policies.registry import find_preset

REPO = Path(__file__).resolve().parents[1]
WHEEL_ENV = "MODEL_CONCURRENCY_WHEEL"


@pytest.mark.parametrize("kind", ["policies", "sims"])
def test_bundled_folders_are_the_top_level_ones(kind: str) -> None:
    link = REPO / "src" / "model_concurrency" / "bundled" / kind
    assert link.is_symlink() and link.resolve() == (REPO / kind).resolve()
    assert bundled_dir(kind).resolve() == (REPO / kind).resolve()  # type: ignore[arg-type]


def test_scenarios_and_presets_resolve_by_name_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert find_scenario("ramp") == bundled_scenarios()["ramp"]
    assert find_scenario("ramp.toml") == bundled_scenarios()["ramp"]
    assert find_scenario("sims/ramp.toml") == bundled_scenarios()["ramp"]
    preset = find_preset("hysteresis")
    assert preset is not None and preset.resolve() == (REPO / "policies" / "hysteresis.toml").resolve()
    # A file of the same name in the working directory wins over the bundled scenario.
    (tmp_path / "ramp.toml").write_text('name = "mine"\n')
    assert find_scenario("ramp.toml") == Path("ramp.toml")


def _wheel(tmp_path: Path) -> Path:
    given = os.environ.get(WHEEL_ENV)
    if given:
        wheel = Path(given)
        assert wheel.is_file(), f"{WHEEL_ENV}={given} does not exist: .ci/run builds it before the tests"
        return wheel
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True,
        timeout=600,
    )
    (wheel,) = out.glob("model_concurrency-*.whl")
    return wheel


def _clean_env() -> dict[str, str]:
    """The user's environment minus anything that would point the fresh venv back at this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODEL_CONCURRENCY_", "PYTHON", "VIRTUAL_ENV"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_runs_scenarios_and_presets_by_name(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for kind in ("policies", "sims"):
        for file in (REPO / kind).glob("*.toml"):
            assert f"model_concurrency/bundled/{kind}/{file.name}" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)

    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    env = _clean_env()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=env)
    python, cli = venv / "bin" / "python", venv / "bin" / "model-concurrency"

    def run(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(a) for a in args], cwd=work, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        if check:
            assert proc.returncode == 0, f"{args}: {proc.stdout}\n{proc.stderr}"
        return proc

    # Core only: `list` works; `sim` names the extra it needs, in one line.
    run(python, "-m", "pip", "install", "-q", wheel)
    where = run(python, "-c", "import model_concurrency; print(model_concurrency.__file__)").stdout.strip()
    assert Path(where).is_relative_to(venv), where
    listed = run(cli, "list").stdout
    assert "ramp" in listed and "hysteresis" in listed and "setpoint-queue-time" in listed
    no_extra = run(cli, "sim", "ramp", check=False)
    assert no_extra.returncode == 2
    assert no_extra.stderr.strip().endswith("pip install 'model-concurrency[sim]'"), no_extra.stderr
    assert "Traceback" not in no_extra.stderr

    # With the extra: bundled scenarios and TOML-only presets, by name, from a folder with neither (hysteresis
    # names example_plugin.py next to it, which ships too).
    run(python, "-m", "pip", "install", "-q", f"{wheel}[sim]")
    sim = run(cli, "sim", "ramp", "--policy", "hysteresis", "--scale", "0.02", "--quiet", "--json", "ramp.json")
    assert json.loads((work / "ramp.json").read_text())["policy"] == "hysteresis"
    assert "ramp — policy hysteresis" in sim.stdout
    run(cli, "sim", "gpu-added.toml", "--policy", "aimd-aggressive", "--scale", "0.02", "--no-oracle", "--quiet")
