"""Fairness of the default policy's rules across seeds: the multi-client scenarios, each rule switched off in turn.

``model-concurrency ablate`` judges each rule on the generator's draws and one seed of each bundled scenario; this
runs the scenarios where clients share an engine (``multi-client``, ``multi-client-32``) on several seeds, so a
rule's effect on fairness shows beside the spread between seeds. Each variant is the policy as shipped (``base``),
one rule of its table switched off (``policies/rules.py``: the overrides ``ablate`` uses), or parameter overrides
(``decrease_factor=0.8``, several joined by ``+``). Per variant and scenario: Jain's index, the saturated share,
the p99 queue time and goodput against the oracle for every seed, then the median (and Jain's minimum).

    .venv/bin/python scripts/fairness_variants.py                                  # every rule, 5 seeds each
    .venv/bin/python scripts/fairness_variants.py --variants base,probe,decrease_factor=0.8 --seeds 3
    .venv/bin/python scripts/fairness_variants.py --scenarios multi-client --scale 0.1 --seeds 2 --variants base,probe

The variants are written as presets under ``--out`` (default: a temporary folder), for ``sim --policy``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from model_concurrency.lab.ablation import is_off, rules_for, write_variant
from model_concurrency.lab.compare import run_study
from model_concurrency.lab.scenario import load_scenario

FIGURES = ("jain_fairness", "saturated_fraction", "queue_time_p99_s", "goodput_ratio")


def overrides_of(variant: str, policy: str) -> dict[str, Any]:
    """``base``: none; a rule's name: the overrides that switch it off; ``k=v+k=v``: those parameters."""
    if variant == "base":
        return {}
    if "=" in variant:
        return tomllib.loads("\n".join(variant.split("+")))
    rules, _ = rules_for(policy, [variant])
    return dict(rules[0].off)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="multi-client,multi-client-32")
    parser.add_argument("--seeds", type=int, default=5, help="the scenario's own seed and the next N-1")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply durations by this (0-1]")
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--variants", default="all", help="base, rule names, k=v overrides; all: base + every rule")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="folder for the variants' presets")
    args = parser.parse_args(argv)

    rules, params = rules_for(args.policy)
    names = ["base", *(r.name for r in rules)] if args.variants == "all" else args.variants.split(",")
    out = args.out or Path(tempfile.mkdtemp(prefix="fairness-"))
    refs: dict[str, str] = {}
    table = {r.name: r for r in rules}
    for name in names:
        if name in table and is_off(table[name], params):
            print(f"{name}: already off in {args.policy}, skipped")
            continue
        label = f"without-{name}" if name in table else name.replace("=", "-").replace("+", "_")
        refs[name] = str(write_variant(out, args.policy, label, overrides_of(name, args.policy)))

    scenarios = []
    for scenario_name in args.scenarios.split(","):
        base = load_scenario(scenario_name)
        for seed in range(base.seed, base.seed + args.seeds):
            scenario = dataclasses.replace(base, name=f"{base.name}@{seed}", seed=seed)
            scenarios.append(scenario.scaled(args.scale) if args.scale < 1 else scenario)
    study = run_study(scenarios, list(refs.values()), jobs=args.jobs)
    by_ref = {ref: name for name, ref in refs.items()}

    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in study.rows:
        if "unscored" in row:
            print(f"{row['scenario']}: unscored ({row['unscored']})")
            continue
        scenario_name, seed = row["scenario"].rsplit("@", 1)
        variant = by_ref[row["policy"]]
        rows.setdefault((variant, scenario_name), []).append(row)
        print(f"{variant} {scenario_name} seed {seed}: " + ", ".join(f"{k} {row[k]:.3f}" for k in FIGURES), flush=True)

    print("\n| variant | scenario | Jain median | Jain min | saturated | p99 queue s | goodput ÷ oracle |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for (variant, scenario_name), group in rows.items():
        med = {k: statistics.median(r[k] for r in group) for k in FIGURES}
        worst = min(r["jain_fairness"] for r in group)
        print(
            f"| {variant} | {scenario_name} | {med['jain_fairness']:.3f} | {worst:.3f} | "
            f"{med['saturated_fraction']:.3f} | {med['queue_time_p99_s']:.3f} | {med['goodput_ratio']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
