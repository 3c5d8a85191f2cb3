"""The ``model-concurrency`` command: one subcommand module each, imported only when used.

Each module under ``model_concurrency.cli`` that defines ``register(subparsers)`` adds its subcommands; a
subcommand stores its handler as ``func`` and returns an exit code. Heavy dependencies (simpy, matplotlib,
rich, uvicorn) are imported inside handlers, so ``--help`` stays fast and light.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Subcommand modules, in the order they appear in --help. A module that is missing is skipped.
SUBCOMMAND_MODULES = ("sim", "compare", "live")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="model-concurrency",
        description="Size LLM and embedding fan-out to the live capacity of vLLM engines.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log the controller's decisions")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"model_concurrency.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"model_concurrency.cli.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError) as exc:
        print(f"model-concurrency: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
