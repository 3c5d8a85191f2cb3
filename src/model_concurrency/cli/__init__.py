"""The ``model-concurrency`` command: one subcommand module each, imported only when used.

Each module under ``model_concurrency.cli`` that defines ``register(subparsers)`` adds its subcommands; a
subcommand stores its handler as ``func`` and returns an exit code. Heavy dependencies (simpy, matplotlib,
rich, uvicorn) are imported inside handlers, so ``--help`` stays fast and light.

Every failure a user can cause (a bad file, a bad URL, a server that is down or answers an error, a missing
optional dependency) ends as one line on stderr, ``model-concurrency: error: ...``, and exit code 2, the way
argparse reports a bad option. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["configure_logging", "describe_error", "main"]

# Subcommand modules, in the order they appear in --help. A module that is missing is skipped.
SUBCOMMAND_MODULES = ("sim", "compare", "fuzz", "ablate", "report", "live", "listing")

# Optional dependencies, by import name: the extra that installs each, for the subcommands that need them.
_EXTRAS = {
    "numpy": "sim",
    "simpy": "sim",
    "matplotlib": "sim",
    "rich": "cli",
    "tqdm": "cli",
    "starlette": "emulator",
    "uvicorn": "emulator",
}
_VERBOSE_HELP = (
    "-v: log one line per controller decision (previous -> new target, the rule, the observation); -vv: also every "
    "HTTP request (also accepted after the subcommand)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="model-concurrency",
        description="Size LLM and embedding fan-out to the live capacity of vLLM engines.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help=_VERBOSE_HELP)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"model_concurrency.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"model_concurrency.cli.{name}":
                continue
            raise
        module.register(subparsers)
    for sub in subparsers.choices.values():
        # SUPPRESS: a -v given before the subcommand is not reset to False by the subcommand's own default.
        sub.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=_VERBOSE_HELP)
    return parser


def _http_error(exc: Exception) -> str | None:
    """One line for an httpx failure: what was asked of which URL, and what went wrong."""
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx is a core dependency
        return None
    if not isinstance(exc, httpx.HTTPError | httpx.InvalidURL):
        return None
    try:
        request: httpx.Request | None = (
            exc.request if isinstance(exc, httpx.RequestError | httpx.HTTPStatusError) else None
        )
    except RuntimeError:  # an exception built without its request
        request = None
    where = f"{request.method} {request.url}" if request is not None else "the request"
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        line = f"{where} answered HTTP {status} {exc.response.reason_phrase}".rstrip()
        if status == 404:
            line += " (is the base URL the OpenAI-compatible one, e.g. http://HOST:8000/v1?)"
        return line
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return f"bad URL: {exc} (expected http:// or https://, e.g. http://127.0.0.1:8000/v1)"
    if isinstance(exc, httpx.ConnectError):
        host = f"{request.url.host}:{request.url.port or ''}".rstrip(":") if request is not None else "the server"
        return f"cannot connect to {host} ({exc or 'connection failed'}): is the server running?"
    if isinstance(exc, httpx.TimeoutException):
        return f"{where} timed out ({type(exc).__name__})"
    return f"{where} failed: {type(exc).__name__}: {exc}"


def describe_error(exc: BaseException, command: str | None = None) -> str | None:
    """The one-line message for a failure the user can fix, or None for a bug (which keeps its traceback)."""
    if isinstance(exc, ModuleNotFoundError) and exc.name is not None:
        top = exc.name.partition(".")[0]
        if top in _EXTRAS:
            extra = "emulator" if command == "emulate" and _EXTRAS[top] == "sim" else _EXTRAS[top]
            what = f"`{command}`" if command else "this command"
            return f"{what} needs {top}, which is not installed: pip install 'model-concurrency[{extra}]'"
        return None
    if isinstance(exc, Exception) and (line := _http_error(exc)) is not None:
        return line
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    if isinstance(exc, ValueError):
        return str(exc)
    return None


def configure_logging(verbosity: int) -> None:
    """0: warnings only; 1 (``-v``): the package's decision lines too, and nothing of httpx's per-request lines;
    2 (``-vv``): every library's INFO, the per-request lines included."""
    logging.basicConfig(level=logging.INFO if verbosity >= 2 else logging.WARNING, format="%(levelname)s %(message)s")
    if verbosity >= 1:
        logging.getLogger("model_concurrency").setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`... | head`): nothing left to tell it. Point stdout at devnull so the
        # interpreter's final flush does not fail again, and exit as a process killed by SIGPIPE would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        message = describe_error(exc, args.command)
        if message is None:
            raise
        print(f"model-concurrency: error: {_one_line(message)}", file=sys.stderr)
        return 2
    return code


def _one_line(message: Any) -> str:
    return " ".join(str(message).split())


if __name__ == "__main__":
    raise SystemExit(main())
