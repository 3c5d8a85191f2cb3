"""The presets and scenarios that ship with the package, found the same way in a checkout, an editable install
and a wheel.

``bundled/policies`` and ``bundled/sims`` are symlinks to the repository's top-level ``policies/`` and ``sims/``,
which stay the one place these files are edited. An editable install imports from ``src/`` and reads through the
links; building an sdist or a wheel copies the files the links point at, so an installed package carries real
copies. :func:`bundled_dir` goes through ``importlib.resources`` rather than ``__file__`` so the lookup does not
depend on where the package sits.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Literal

__all__ = ["bundled_dir"]


def bundled_dir(kind: Literal["policies", "sims"]) -> Path:
    """The folder of bundled policy presets or scenarios.

    A real directory (presets name sibling ``.py`` files by relative path, so a zip-only view would not do); the
    package is installed unpacked by every installer this project supports.
    """
    return Path(str(files(__package__) / kind))
