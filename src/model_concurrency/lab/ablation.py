"""The ablation: what each rule of a policy costs to take away, judged on the generator's distribution.

A rule earns its place in a default only by what removing it costs on workloads it was not written for. For each
rule (a switch, or the group of parameters that serves one mechanism) :func:`run_ablation` writes a preset that
switches it off (``DIR/presets/NAME-without-RULE.toml``: the policy with the rule's ``off`` parameters, nothing
else changed), runs the policy as it is and every such variant on the generator's draws of each seed (and on the
bundled scenarios with ``bundled``), and compares each variant's figures with the full policy's:

* goodput median, p10 and min (each draw's goodput against its oracle's);
* the share of draws whose p99 queue time is within 2x the oracle's (``fuzz.queue_ok``);
* the share of multi-client draws whose Jain index is at least 0.9;
* the median share of the run the engine was saturated;
* the bundled scenarios at ``>= 0.97`` of their oracle's goodput.

A rule is **keep** when removing it costs more than :data:`TOLERANCE` on any seed (or on the bundled set), else
**drop**. A rule whose switch is already off in the policy under test is not run: removing it changes nothing, so
its row is the full policy's and its verdict is drop. With ``rounds`` > 1 the cheapest drop (the one whose removal
cost least, or gained most) is taken out of the base and the remaining rules are ablated again, since two rules
can each look free only while the other stays.

Each run is the comparison study's (``lab.compare.run_study``): the oracles are computed once per draw and cached
on disk, so every round after the first costs only the policies' own runs.
"""

from __future__ import annotations

import csv
import math
import statistics
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from model_concurrency.lab.compare import run_study
from model_concurrency.lab.fuzz import JAIN_GOOD, draw_columns, draw_dict, queue_ok
from model_concurrency.lab.scenario import Scenario, bundled_scenarios, load_scenario, scenario_from_dict
from model_concurrency.policies.rules import RULES, Rule, switch_rule

__all__ = [
    "BUNDLED_GOOD",
    "TOLERANCE",
    "AblationResult",
    "Figures",
    "ablation_line",
    "figures",
    "rules_for",
    "run_ablation",
    "verdict",
]

#: A bundled scenario counts as met at this share of its oracle's goodput.
BUNDLED_GOOD = 0.97
#: The bundled scenarios an ablation leaves out: the ``fleet-1000`` pair simulates a thousand clients (minutes a run).
BUNDLED_SKIP = frozenset({"fleet-1000", "fleet-1000-jobs"})


@dataclass(frozen=True, slots=True)
class Tolerance:
    """What removing a rule may cost on one seed before the rule counts as earning its place."""

    goodput: float = 0.005  # on the median or on p10
    share_points: float = 2.0  # on the p99 share or the Jain share, in percentage points
    bundled: int = 1  # scenarios that fall under BUNDLED_GOOD


TOLERANCE = Tolerance()


def _params_of(policy: Any) -> dict[str, Any]:
    from dataclasses import fields, is_dataclass

    if not is_dataclass(policy):
        return {}
    return {f.name: getattr(policy, f.name) for f in fields(policy) if f.init}


def rules_for(policy_ref: str, names: Sequence[str] | None = None) -> tuple[list[Rule], dict[str, Any]]:
    """The rules of the policy ``policy_ref`` resolves to (``names`` picks some), and its parameters as built.

    A rule that names a parameter the policy does not have is a ``ValueError`` (the table is out of date)."""
    from model_concurrency.policies.registry import load_policy

    policy = load_policy(policy_ref)
    params = _params_of(policy)
    table = RULES.get(type(policy).__name__)
    if table is None:
        table = tuple(switch_rule(k) for k, v in params.items() if v is True)
    for rule in table:
        missing = [k for k in (*rule.params, *rule.off) if k not in params]
        if missing:
            raise ValueError(f"rule {rule.name!r} names parameters {missing} that {policy_ref!r} does not have")
    if names is None:
        return list(table), params
    known = {r.name: r for r in table}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown rules {unknown} for {policy_ref!r}; its rules: {', '.join(known)}")
    return [known[n] for n in names], params


def is_off(rule: Rule, params: dict[str, Any]) -> bool:
    """The rule is already switched off in ``params``: removing it changes nothing."""
    for key, value in rule.off.items():
        if key == "without":
            if not set(value) <= set(params.get("without") or ()):
                return False
        elif params.get(key) != value:
            return False
    return True


def combine(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Overrides that switch off both: ``without`` lists add up, any other key takes ``more``'s value."""
    out = {**base, **more}
    if "without" in base and "without" in more:
        out["without"] = sorted({*base["without"], *more["without"]})
    return out


@dataclass(frozen=True, slots=True)
class Figures:
    """One policy's figures on one set of draws (a seed), or on the bundled set (``bundled_ok`` only)."""

    median: float | None = None
    p10: float | None = None
    min: float | None = None
    p99_share: float | None = None  # percent of draws with p99 queue time <= 2x the oracle's
    jain_share: float | None = None  # percent of multi-client draws with Jain >= 0.9
    saturated: float | None = None  # median share of the run saturated, percent
    bundled_ok: int | None = None  # bundled scenarios at >= BUNDLED_GOOD of their oracle
    unscored: int = 0  # draws the lab could not score


def figures(rows: Sequence[dict[str, Any]]) -> Figures:
    """The distribution's figures of one policy's rows (``fuzz.csv``'s columns)."""
    scored = [r for r in rows if r.get("goodput_ratio") is not None]
    ratios = sorted(float(r["goodput_ratio"]) for r in scored)
    if not ratios:
        return Figures(unscored=len(rows))
    multi = [r for r in scored if int(r.get("clients", 1)) > 1]
    saturated = [float(r["saturated_fraction"]) for r in scored if r.get("saturated_fraction") is not None]
    return Figures(
        median=statistics.median(ratios),
        p10=float(np.percentile(ratios, 10)),
        min=ratios[0],
        p99_share=100.0 * sum(queue_ok(r) for r in scored) / len(scored),
        jain_share=100.0 * sum((r.get("jain_fairness") or 0.0) >= JAIN_GOOD for r in multi) / len(multi)
        if multi
        else None,
        saturated=100.0 * statistics.median(saturated) if saturated else None,
        unscored=len(rows) - len(scored),
    )


def bundled_figures(rows: Sequence[dict[str, Any]]) -> Figures:
    return Figures(bundled_ok=sum((r.get("goodput_ratio") or 0.0) >= BUNDLED_GOOD for r in rows))


def _drop(base: float | None, variant: float | None) -> float:
    """How much lower the variant's figure is (0 when either is missing)."""
    return 0.0 if base is None or variant is None else base - variant


def cost(base: Figures, variant: Figures, tol: Tolerance = TOLERANCE) -> float:
    """What removing the rule cost on one seed, in units of the tolerance (the largest over the figures; <= 1 is
    within it, negative is a gain on every figure)."""
    parts = [
        _drop(base.median, variant.median) / tol.goodput,
        _drop(base.p10, variant.p10) / tol.goodput,
        _drop(base.p99_share, variant.p99_share) / tol.share_points,
        _drop(base.jain_share, variant.jain_share) / tol.share_points,
    ]
    if base.bundled_ok is not None and variant.bundled_ok is not None:
        parts.append((base.bundled_ok - variant.bundled_ok) / tol.bundled)
    return max(parts)


def verdict(base: dict[str, Figures], variant: dict[str, Figures], tol: Tolerance = TOLERANCE) -> str:
    """``keep`` when removing the rule costs more than the tolerance on any seed or on the bundled set."""
    worst = max(cost(base[k], variant[k], tol) for k in base)
    return "keep" if worst > 1.0 + 1e-9 else "drop"


@dataclass(slots=True)
class AblationResult:
    policy: str
    rows: list[dict[str, Any]] = field(default_factory=list)  # ablation.csv's rows, every round
    rounds: list[list[str]] = field(default_factory=list)  # per round: the rules removed from its base
    written: list[Path] = field(default_factory=list)

    def last_round(self) -> list[dict[str, Any]]:
        last = max((r["round"] for r in self.rows), default=0)
        return [r for r in self.rows if r["round"] == last and r["rule"] != "(none)"]


def ablation_line(result: AblationResult) -> str:
    """``ablate: policy NAME, R rules, K keep, D drop`` (of the last round)."""
    rows = result.last_round()
    keep = sum(r["verdict"] == "keep" for r in rows)
    return f"ablate: policy {result.policy}, {len(rows)} rules, {keep} keep, {len(rows) - keep} drop"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def write_variant(folder: Path, policy_ref: str, label: str, overrides: dict[str, Any]) -> Path:
    """A preset that is ``policy_ref`` with ``overrides``: what ``sim --policy`` re-runs for one row. A preset file
    is inlined (its policy and parameters, then the overrides): a preset may not name another ``.toml``."""
    base = policy_ref
    if policy_ref.endswith(".toml"):
        from model_concurrency.policies.registry import load_preset

        preset = load_preset(policy_ref)
        base = preset.policy
        module, _, cls = base.partition(":")
        if cls and module.endswith(".py") and not Path(module).is_absolute():
            base = f"{(preset.path.parent / module).resolve()}:{cls}"
        overrides = combine(preset.params, overrides)
    name = f"{Path(policy_ref).stem}-{label}"
    lines = [f"name = {_toml_value(name)}", f"policy = {_toml_value(base)}"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in sorted(overrides.items())]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    tomllib.loads(path.read_text())  # what the loader will read
    return path


def _figure_columns(keys: Sequence[str]) -> list[str]:
    cols: list[str] = []
    for key in keys:
        for fig in ("median", "p10", "min", "p99_share", "jain_share", "saturated", "unscored"):
            cols += [f"{fig}@{key}", f"d_{fig}@{key}"]
    return cols


def _row(
    rnd: int, rule: Rule | None, status: str, figs: dict[str, Figures], base: dict[str, Figures]
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "round": rnd,
        "rule": rule.name if rule else "(none)",
        "params": " ".join(rule.params) if rule else "",
        "off": " ".join(f"{k}={_toml_value(v)}" for k, v in rule.off.items()) if rule else "",
        "verdict": status,
    }
    for key, f in figs.items():
        b = base[key]
        if key == "bundled":
            row["bundled_ok"], row["d_bundled_ok"] = f.bundled_ok, (f.bundled_ok or 0) - (b.bundled_ok or 0)
            continue
        for fig in ("median", "p10", "min", "p99_share", "jain_share", "saturated", "unscored"):
            value, ref = getattr(f, fig), getattr(b, fig)
            row[f"{fig}@{key}"] = value
            row[f"d_{fig}@{key}"] = None if value is None or ref is None else value - ref
    return row


def write_rows(rows: Sequence[dict[str, Any]], path: Path, keys: Sequence[str]) -> Path:
    columns = ["round", "rule", "params", "off", "verdict", "bundled_ok", "d_bundled_ok", *_figure_columns(keys)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: "" if row.get(c) is None else row.get(c) for c in columns})
    return path


def draws(seed: int, n: int, scale: float) -> tuple[list[Scenario], dict[str, dict[str, Any]]]:
    """The generator's first ``n`` draws of ``seed`` and their parameters (for the multi-client split)."""
    data = [draw_dict(seed, i, scale) for i in range(n)]
    return [scenario_from_dict(d) for d in data], {d["name"]: draw_columns(d) for d in data}


def bundled_set(scale: float) -> list[Scenario]:
    return [
        load_scenario(p).scaled(scale) for name, p in sorted(bundled_scenarios().items()) if name not in BUNDLED_SKIP
    ]


def run_ablation(
    policy: str,
    *,
    seeds: Sequence[int],
    n: int,
    out: str | Path,
    rules: Sequence[str] | None = None,
    scale: float = 1.0,
    bundled: bool = False,
    rounds: int = 1,
    jobs: int | None = None,
    tol: Tolerance = TOLERANCE,
    progress: Callable[[str], None] | None = None,
) -> AblationResult:
    """Ablate ``policy``'s rules on ``n`` draws of each seed (and the bundled set): ``DIR/ablation.csv``."""
    if n < 1 or not seeds:
        raise ValueError("an ablation needs n >= 1 and at least one seed")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    out = Path(out)
    chosen, params = rules_for(policy, rules)
    sets: dict[str, tuple[list[Scenario], dict[str, dict[str, Any]]]] = {
        str(seed): draws(seed, n, scale) for seed in seeds
    }
    if bundled:
        sets["bundled"] = (bundled_set(scale), {})
    result = AblationResult(policy=policy)
    removed: dict[str, Any] = {}
    remaining = [r for r in chosen]
    for rnd in range(1, rounds + 1):
        base_ref = str(write_variant(out / "presets", policy, f"round{rnd}-base", removed))
        active = [r for r in remaining if not is_off(r, combine(params, removed))]
        refs = {
            r.name: str(write_variant(out / "presets", policy, f"round{rnd}-without-{r.name}", combine(removed, r.off)))
            for r in active
        }
        per_policy: dict[str, dict[str, Figures]] = {ref: {} for ref in (base_ref, *refs.values())}
        for key, (scenarios, cols) in sets.items():
            study = run_study(scenarios, list(per_policy), jobs=jobs, progress=progress)
            for ref in per_policy:
                mine = [{**r, **cols.get(r["scenario"], {})} for r in study.rows if r["policy"] == ref]
                per_policy[ref][key] = bundled_figures(mine) if key == "bundled" else figures(mine)
        base = per_policy[base_ref]
        result.rows.append(_row(rnd, None, "base", base, base))
        costs: dict[str, float] = {}
        for rule in remaining:
            if rule.name in refs:
                figs = per_policy[refs[rule.name]]
                status = verdict(base, figs, tol)
                costs[rule.name] = max(cost(base[k], figs[k], tol) for k in base)
            else:
                figs, status = base, "drop"
            result.rows.append(_row(rnd, rule, status, figs, base))
        result.rounds.append(sorted(removed))
        drops = [name for name, c in costs.items() if c <= 1.0 + 1e-9]
        if rnd == rounds or not drops:
            break
        cheapest = min(drops, key=lambda name: costs[name])
        rule = next(r for r in remaining if r.name == cheapest)
        removed = combine(removed, rule.off)
        remaining = [r for r in remaining if r.name != cheapest]
    keys = [k for k in sets if k != "bundled"]
    result.written.append(write_rows(result.rows, out / "ablation.csv", keys))
    result.written.append(write_table(result.rows, out / "ablation.md", keys))
    return result


def _signed(value: Any, digits: int) -> str:
    return "" if value is None or value == "" else f"{float(value):+.{digits}f}"


def write_table(rows: Sequence[dict[str, Any]], path: Path, keys: Sequence[str]) -> Path:
    """The last round as docs/policies.md shows it: per rule, how it is switched off, what removing it changes on
    each seed (goodput median and p10, the p99 and Jain shares in points; the base row gives the figures), the
    bundled count, and the verdict."""
    last = max((r["round"] for r in rows), default=0)
    head = ["rule", "switched off by"]
    for key in keys:
        head += [f"median {key}", f"p10 {key}", f"p99≤2× {key}", f"Jain≥0.9 {key}"]
    head += ["bundled ≥ 0.97", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for row in (r for r in rows if r["round"] == last):
        base = row["rule"] == "(none)"
        cells = [f"`{row['rule']}`" if not base else "the full policy", f"`{row['off']}`" if row["off"] else ""]
        for key in keys:
            for fig, digits in (("median", 3), ("p10", 3), ("p99_share", 0), ("jain_share", 0)):
                value = row.get(f"{fig}@{key}") if base else row.get(f"d_{fig}@{key}")
                cells.append(
                    f"{float(value):.{digits}f}" if base and value not in (None, "") else _signed(value, digits)
                )
        bundled = row.get("bundled_ok") if base else row.get("d_bundled_ok")
        cells.append("" if bundled in (None, "") else (str(bundled) if base else f"{int(bundled):+d}"))
        cells.append("" if base else row["verdict"])
        lines.append("| " + " | ".join(cells) + " |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
