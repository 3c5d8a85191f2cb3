"""``model-concurrency ablate``: what each rule of a policy costs to take away, on the generator's distribution.

Runs the policy as it is and once with each rule switched off, on the first N draws of every seed (and the bundled
scenarios with --bundled); writes DIR/ablation.csv (one row per rule and round: its parameters, how it is switched
off, each figure and its change against the full policy, the verdict) and DIR/presets/*.toml (every variant, for
``sim --policy``). A rule is keep when removing it costs more than 0.005 of goodput median or p10, 2 points of the
p99 share or the Jain share on any seed, or one bundled scenario; else drop. The last line:
``ablate: policy NAME, R rules, K keep, D drop``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ablate", help="switch each rule of a policy off in turn and judge the cost", description=__doc__
    )
    p.add_argument("--policy", default="adaptive", help="the policy to ablate (default adaptive)")
    p.add_argument("--rules", default="all", help="comma-separated rule names, or all (default)")
    p.add_argument("--seeds", default="41,43", help="comma-separated generator seeds (default 41,43)")
    p.add_argument("--n", type=int, default=200, help="draws per seed (default 200)")
    p.add_argument("--scale", type=float, default=1.0, help="shorten every run: multiply durations by this (0-1]")
    p.add_argument("--bundled", action="store_true", help="also run the bundled scenarios (fleet-1000 excepted)")
    p.add_argument("--rounds", type=int, default=1, help="remove the cheapest drop and ablate again, this often")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: the number of CPUs)")
    p.add_argument("--out", type=Path, default=Path("out/ablate"), help="folder for the table and the presets")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds:
        raise ValueError("--seeds names no seed")
    return seeds


def run(args: argparse.Namespace) -> int:
    from model_concurrency.cli._output import run_counter
    from model_concurrency.lab.ablation import BUNDLED_SKIP, ablation_line, rules_for, run_ablation
    from model_concurrency.lab.scenario import bundled_scenarios

    seeds = _seeds(args.seeds)
    if args.jobs is not None and args.jobs < 1:
        raise ValueError("--jobs must be >= 1")
    if not 0 < args.scale <= 1:
        raise ValueError("--scale must be in (0, 1]")
    names = None if args.rules.strip() == "all" else [r.strip() for r in args.rules.split(",") if r.strip()]
    chosen, _ = rules_for(args.policy, names)
    bundled = len(set(bundled_scenarios()) - set(BUNDLED_SKIP)) if args.bundled else 0
    per_round = (len(chosen) + 1) * (len(seeds) * args.n + bundled)
    with run_counter(per_round * args.rounds, "ablate", enabled=not args.quiet) as progress:
        result = run_ablation(
            args.policy,
            seeds=seeds,
            n=args.n,
            out=args.out,
            rules=names,
            scale=args.scale,
            bundled=args.bundled,
            rounds=args.rounds,
            jobs=args.jobs or os.cpu_count(),
            progress=progress,
        )
    for path in result.written:
        print(f"wrote {path}")
    for row in result.last_round():
        print(f"{row['rule']:>22}  {row['verdict']:<4}  off: {row['off']}")
    print(ablation_line(result))
    return 0
