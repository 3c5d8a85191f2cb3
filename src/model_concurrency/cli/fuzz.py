"""``model-concurrency fuzz``: draw N scenarios nobody tuned a policy to, run every policy on each, judge the spread.

Writes DIR/fuzz.csv (one row per draw × policy), DIR/scenarios/*.toml (each draw, re-run with ``sim``) and
DIR/worst.md (the default policy's worst draws); prints that table, then one line per policy, the default's last:
``fuzz: policy NAME, n N, goodput median M p10 P min X, p99<=2x F%, jain>=0.9 J% of multi-client``.

``--as-job`` runs the same draws with each draw's clients as one job's workers (one runtime leases its target to
them, lab/job.py), to set the coordinated rule beside independent clients draw for draw; fuzz.csv then has a
``job`` column.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from model_concurrency.cli.compare import add_study_arguments, study_policies, unscored_status

__all__ = ["register"]

DEFAULT_POLICIES = "adaptive"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fuzz", help="draw random scenarios and judge policies on the distribution", description=__doc__
    )
    p.add_argument("--n", type=int, required=True, help="how many scenarios to draw")
    p.add_argument("--seed", type=int, default=0, help="the draw's seed (the same seed draws the same scenarios)")
    add_study_arguments(p, DEFAULT_POLICIES)
    p.add_argument("--out", type=Path, default=Path("out/fuzz"), help="folder for the table and the scenarios")
    p.add_argument(
        "--as-job",
        action="store_true",
        help="run each draw with all its clients in one job (the same draws; fuzz.csv gets a job column)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from model_concurrency import config
    from model_concurrency.cli._output import run_counter
    from model_concurrency.lab.fuzz import run_fuzz, worst_table

    policies = study_policies(args)
    if args.n < 1:
        raise ValueError("--n must be >= 1")
    default = str(config.setting(*config.POLICY))
    with run_counter(args.n * (len(policies) + 1), "fuzz", enabled=not args.quiet) as progress:
        result = run_fuzz(
            args.n,
            args.seed,
            policies,
            out=args.out,
            scale=args.scale,
            jobs=args.jobs or os.cpu_count(),
            default_policy=default,
            progress=progress,
            as_job=args.as_job,
        )
    judged = default if default in policies else policies[0]
    for path in result.written:
        print(f"wrote {path}")
    print(f"\nworst draws for {judged} (of the oracle's goodput):\n")
    print(worst_table(result, judged), end="")
    print()
    for line in result.lines:
        print(line)
    return unscored_status(result.unscored)
