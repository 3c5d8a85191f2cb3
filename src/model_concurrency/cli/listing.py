"""``model-concurrency list``: the scenarios and policies that can be named without a path; ``knobs``: every
environment knob, its default, the value the environment holds now and what it does (knobs.py).

What ``sim NAME --policy NAME`` and ``compare`` accept: the bundled scenarios (the repository's ``sims/``,
shipped in the package), the built-in policies, the presets (bundled ones and those on
``MODEL_CONCURRENCY_POLICY_PATH``) and policies other packages register as entry points. Needs no extra.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Sequence
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("list", help="show the scenarios and policies available by name", description=__doc__)
    p.set_defaults(func=run)
    k = subparsers.add_parser(
        "knobs", help="show every environment knob: default, current value, what it does", description=__doc__
    )
    k.set_defaults(func=run_knobs)


def _description(path: Any) -> str:
    try:
        value = tomllib.loads(path.read_text(encoding="utf-8")).get("description", "")
    except (OSError, tomllib.TOMLDecodeError) as exc:
        return f"(unreadable: {exc})"
    return str(value)


def policy_rows() -> list[tuple[str, str, str]]:
    """(name, kind, description) for every policy name ``--policy`` accepts."""
    from importlib.metadata import entry_points

    from model_concurrency.policies.registry import BUILTIN_POLICIES, ENTRY_POINT_GROUP, find_preset, policy_names

    rows = []
    plugins = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    for name in policy_names():
        preset = None if name in BUILTIN_POLICIES else find_preset(name)
        if preset is not None:
            rows.append((name, "preset", _description(preset)))
        elif name in BUILTIN_POLICIES:
            doc = (BUILTIN_POLICIES[name].__doc__ or "").strip().splitlines()
            rows.append((name, "built-in", doc[0] if doc else ""))
        elif name in plugins:
            rows.append((name, "entry point", ""))
    return rows


def _print(title: str, rows: Sequence[tuple[str, ...]]) -> None:
    print(title)
    width = max((len(r[0]) for r in rows), default=0)
    for name, *rest in rows:
        print(f"  {name.ljust(width)}  {' '.join(x for x in rest if x)}".rstrip())


def run(args: argparse.Namespace) -> int:
    from model_concurrency.lab.scenario import bundled_scenarios

    scenarios = [(name, _description(path)) for name, path in bundled_scenarios().items()]
    _print("scenarios (model-concurrency sim NAME):", scenarios)
    print()
    _print("policies (--policy NAME; default adaptive):", [(n, f"[{k}]".ljust(13), d) for n, k, d in policy_rows()])
    return 0


def knobs_text() -> str:
    """The knob table as ``model-concurrency knobs`` prints it (current values from the environment now)."""
    from model_concurrency.knobs import knob_rows

    header = ("knob", "default", "current", "what it does")
    rows = [header, *knob_rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2].ljust(widths[2])}  {r[3]}" for r in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def run_knobs(args: argparse.Namespace) -> int:
    print(knobs_text(), end="")
    return 0
