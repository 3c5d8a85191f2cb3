"""``model-concurrency sim``: run one scenario under one policy; print the summary, write a plot and JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sim", help="simulate a scenario (sims/*.toml) under a policy", description=__doc__)
    p.add_argument("scenario", help="scenario TOML file or bundled scenario name (model-concurrency list), e.g. ramp")
    p.add_argument(
        "--policy",
        default=None,
        help="built-in name, preset name, .toml path or module:Class (default: MODEL_CONCURRENCY_POLICY, "
        "else adaptive)",
    )
    p.add_argument("--plot", type=Path, help="write a PNG of target, in-flight, running and capacity-waiting")
    p.add_argument("--json", type=Path, help="write the summary (and scenario facts) as JSON")
    p.add_argument("--scale", type=float, default=1.0, help="shorten the run: multiply durations by this (0-1]")
    p.add_argument("--no-oracle", action="store_true", help="skip the oracle (faster; no ratios)")
    p.add_argument(
        "--serial",
        action="store_true",
        help="one process: a cold oracle run is simulated before the policy's, not beside it in a second process "
        "(also MODEL_CONCURRENCY_SERIAL=1; the results are the same)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from model_concurrency import config
    from model_concurrency.cli._output import print_table, progress_bar
    from model_concurrency.lab.experiment import run_scenario
    from model_concurrency.lab.plot import plot_run
    from model_concurrency.lab.scenario import load_scenario
    from model_concurrency.policies.registry import load_policy

    if args.policy is None:
        args.policy = config.setting(*config.POLICY)
    scenario = load_scenario(args.scenario).scaled(args.scale)
    load_policy(args.policy)  # fail fast, with the loader's message, before simulating anything
    with progress_bar(scenario.duration_s, f"{scenario.name} / {args.policy}", enabled=not args.quiet) as update:
        result = run_scenario(
            scenario,
            lambda: load_policy(args.policy),
            policy_name=args.policy,
            with_oracle=not args.no_oracle,
            progress=update,
            parallel=False if args.serial else None,
        )
    rows = [{"key": k, "value": v} for k, v in result.summary.items()]
    print_table(rows, ["key", "value"], title=f"{scenario.name} — policy {args.policy}")
    if args.plot:
        from model_concurrency.lab.plot import change_labels

        oracle = " against the oracle (dotted: the best fixed target of each phase, see the caption)"
        title = f"{scenario.name}: policy {args.policy}" + (oracle if result.oracle is not None else "")
        path = plot_run(result.trace, args.plot, oracle=result.oracle, title=title, changes=change_labels(scenario))
        print(f"plot: {path}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "scenario": scenario.name,
            "policy": args.policy,
            "duration_s": scenario.duration_s,
            "seed": scenario.seed,
            "summary": result.summary,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"summary: {args.json}")
    return 0
