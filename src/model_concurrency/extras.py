"""Optional dependencies, imported where used, with the extra that installs each named in the error.

A module that needs an extra (``integrations.openai``, ``ray``) imports it through :func:`require`, so a user
without it reads which ``pip install`` fixes it instead of a bare ``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NoReturn

__all__ = ["MissingExtra", "raise_missing", "require"]


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def raise_missing(exc: ModuleNotFoundError, module: str, extra: str, needed_by: str) -> NoReturn:
    """Re-raise ``exc`` as :class:`MissingExtra` when it is ``module`` that is missing (else unchanged: something
    the module itself imports is missing, and its own traceback says more)."""
    if exc.name is None or module.split(".")[0] != exc.name.split(".")[0]:
        raise exc
    raise MissingExtra(
        f"{needed_by} needs {module}, which is not installed: pip install 'model-concurrency[{extra}]'",
        name=exc.name,
    ) from exc


def require(module: str, extra: str, needed_by: str) -> ModuleType:
    """``import module``, or :class:`MissingExtra` saying ``pip install 'model-concurrency[extra]'``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise_missing(exc, module, extra, needed_by)
