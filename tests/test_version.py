"""The version a user sees (``model_concurrency.__version__``, the results page's header) is the one the package is
built with (pyproject.toml)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import model_concurrency


def test_the_package_version_is_the_projects() -> None:
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    assert model_concurrency.__version__ == project["version"]
