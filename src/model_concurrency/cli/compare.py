"""``model-concurrency compare``: every scenario × policy pair in parallel; a Markdown and CSV table, a plot grid."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_study_arguments", "register", "study_policies", "unscored_status"]

# The default policy first, then the alternatives it was chosen over.
DEFAULT_POLICIES = "adaptive,aimd,seed-aimd,aimd-slowstart,capacity"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare", help="run scenarios × policies side by side, with the oracle", description=__doc__
    )
    p.add_argument(
        "scenarios",
        nargs="+",
        help="scenario TOML files or bundled scenario names (model-concurrency list), e.g. sims/*.toml or ramp",
    )
    add_study_arguments(p, DEFAULT_POLICIES)
    p.add_argument("--out", type=Path, default=Path("out/compare"), help="folder for the table and plots")
    p.add_argument("--no-plot", action="store_true", help="skip the grid of plots")
    p.add_argument("--dpi", type=int, default=80, help="resolution of the plot grid (default 80)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table on stdout")
    p.set_defaults(func=run)


def add_study_arguments(p: argparse.ArgumentParser, default_policies: str) -> None:
    """The options every study of scenarios × policies takes (``compare``, ``fuzz``)."""
    p.add_argument(
        "--policies",
        default=default_policies,
        help=f"comma-separated policy names, presets, .toml paths or module:Class (default {default_policies})",
    )
    p.add_argument("--scale", type=float, default=1.0, help="shorten every run: multiply durations by this (0-1]")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: the number of CPUs)")


def study_policies(args: argparse.Namespace) -> list[str]:
    """The policies a study names, after checking the options :func:`add_study_arguments` added."""
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise ValueError("--policies names no policy")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError("--jobs must be >= 1")
    if not 0 < args.scale <= 1:
        raise ValueError("--scale must be in (0, 1]")
    return policies


def run(args: argparse.Namespace) -> int:
    from model_concurrency.cli._output import print_table, run_counter
    from model_concurrency.lab.compare import COLUMNS, run_study, write_csv, write_grid, write_markdown
    from model_concurrency.lab.scenario import load_scenario

    policies = study_policies(args)
    scenarios = [load_scenario(path).scaled(args.scale) for path in args.scenarios]
    total = len(scenarios) * (len(policies) + 1)  # each scenario's oracle, then its pairs
    with run_counter(total, "compare", enabled=not args.quiet) as progress:
        study = run_study(scenarios, policies, jobs=args.jobs or os.cpu_count(), progress=progress)
    out: Path = args.out
    written = [write_markdown(study.rows, out / "compare.md"), write_csv(study.rows, out / "compare.csv")]
    if not args.no_plot:
        written.append(write_grid(study, out / "compare.png", dpi=args.dpi))
    if not args.quiet:
        hidden = {"oracle_goodput", "oracle_queue_time_p99_s", "latency_p99_s"} | (
            set() if study.unscored else {"unscored"}
        )
        shown = [c for c in COLUMNS if c not in hidden]
        print_table(study.rows, shown, title="policy comparison")
    for path in written:
        print(f"wrote {path}")
    return unscored_status(study.unscored)


def unscored_status(unscored: dict[str, str]) -> int:
    """Exit status 1 when scenarios could not be scored (each named on stderr with its reason), else 0."""
    for name, why in sorted(unscored.items()):
        print(f"model-concurrency: not scored: {name}: {why}", file=sys.stderr)
    return 1 if unscored else 0
