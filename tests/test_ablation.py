"""The ablation (lab/ablation.py, ``model-concurrency ablate``): figures, the verdict's tolerance, the variants.

The end-to-end test runs the command on two short draws; the verdict's arithmetic is tested on figures given
exactly, since what the policy scores on a draw is the generator's business (tests/test_fuzz.py).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from model_concurrency.cli import main
from model_concurrency.lab.ablation import (
    Figures,
    cost,
    figures,
    is_off,
    rules_for,
    verdict,
    write_variant,
)
from model_concurrency.policies.registry import load_policy
from model_concurrency.policies.rules import ADAPTIVE_RULES


def _row(ratio: float, p99: float, oracle_p99: float, jain: float, clients: int, sat: float) -> dict[str, object]:
    return {
        "goodput_ratio": ratio,
        "queue_time_p99_s": p99,
        "oracle_queue_time_p99_s": oracle_p99,
        "jain_fairness": jain,
        "clients": clients,
        "saturated_fraction": sat,
    }


def test_figures_of_a_set_of_draws() -> None:
    rows = [
        _row(1.0, 0.1, 0.1, 1.0, 1, 0.1),
        _row(0.9, 1.0, 0.1, 0.95, 2, 0.2),  # p99 10x the oracle's: a miss
        _row(0.95, 0.01, 0.0, 0.5, 4, 0.3),  # within the 0.05 s slack; Jain a miss
        {**_row(0.0, 0.0, 0.0, 1.0, 1, 0.0), "goodput_ratio": None},  # unscored
    ]
    f = figures(rows)
    assert f.median == 0.95 and f.min == 0.9
    assert f.p10 == pytest.approx(0.91)
    assert f.p99_share == pytest.approx(200 / 3)
    assert f.jain_share == 50.0
    assert f.saturated == pytest.approx(20.0)
    assert f.unscored == 1


def test_a_rule_is_kept_only_past_the_tolerance_on_some_seed() -> None:
    base = Figures(median=0.99, p10=0.95, min=0.5, p99_share=80.0, jain_share=80.0)
    within = Figures(median=0.986, p10=0.946, min=0.1, p99_share=78.5, jain_share=78.0)
    assert cost(base, within) == pytest.approx(1.0)  # the Jain share lost exactly the tolerance: still a drop
    assert verdict({"41": base, "43": base}, {"41": within, "43": within}) == "drop"
    worse_p10 = Figures(median=0.99, p10=0.944, min=0.5, p99_share=80.0, jain_share=80.0)
    assert verdict({"41": base, "43": base}, {"41": within, "43": worse_p10}) == "keep"
    fairer = Figures(median=0.99, p10=0.95, min=0.5, p99_share=80.0, jain_share=77.9)
    assert verdict({"41": base}, {"41": fairer}) == "keep"
    gains = Figures(median=1.0, p10=0.97, min=0.6, p99_share=90.0, jain_share=90.0)
    assert cost(base, gains) < 0
    bundled = {"bundled": Figures(bundled_ok=15)}
    assert verdict(bundled, {"bundled": Figures(bundled_ok=14)}) == "drop"
    assert verdict(bundled, {"bundled": Figures(bundled_ok=13)}) == "keep"


def test_every_rule_of_adaptive_names_its_parameters_and_switches_off_cleanly(tmp_path: Path) -> None:
    rules, params = rules_for("adaptive")
    assert [r.name for r in rules] == [r.name for r in ADAPTIVE_RULES]
    for rule in rules:
        path = write_variant(tmp_path, "adaptive", f"without-{rule.name}", rule.off)
        policy = load_policy(str(path))
        for key, value in rule.off.items():
            got = getattr(policy, key)
            if key == "without":
                assert got == tuple(value) and not policy.on(rule.name), rule.name
            else:
                assert got == value or (math.isinf(value) and math.isinf(got)), rule.name
        assert rule.off and set(rule.off) <= set(params)
    owned = [p for r in rules for p in r.params]
    assert len(owned) == len(set(owned)), "a parameter belongs to one rule"
    unowned = set(params) - set(owned) - {"without", "token_budget", "token_overcommit"}
    # The policy's own numbers, which no variant does without.
    assert unowned == {"slow_start_factor", "decrease_factor", "increase_step", "jump_share"}


def test_rules_already_off_are_known_and_a_variant_adds_to_what_is_off(tmp_path: Path) -> None:
    base = tmp_path / "base.toml"
    base.write_text('name = "base"\npolicy = "adaptive"\nwithout = ["probe"]\nnear_full = 0.0\n')
    rules, params = rules_for(str(base), ["probe", "app-limited", "kv-jump"])
    assert [is_off(r, params) for r in rules] == [True, True, False]
    variant = load_policy(str(write_variant(tmp_path / "v", str(base), "without-kv-jump", rules[2].off)))
    assert sorted(variant.without) == ["kv-jump", "probe"] and variant.near_full == 0.0
    with pytest.raises(ValueError, match="unknown rules \\['no-such'\\]"):
        rules_for("adaptive", ["no-such"])


def test_a_policy_without_a_table_is_ablated_by_its_switches() -> None:
    rules, params = rules_for("aimd")
    assert all(params[r.name] is True and r.off == {r.name: False} for r in rules)


def test_ablate_command_writes_one_row_per_rule_and_its_summary_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "base.toml"
    base.write_text('name = "base"\npolicy = "adaptive"\nwithout = ["admission-hold"]\n')
    out = tmp_path / "abl"
    args = ["--n", "2", "--seeds", "41", "--scale", "0.05", "--rules", "probe,admission-hold", "--jobs", "1", "--quiet"]
    code = main(["ablate", "--policy", str(base), *args, "--out", str(out)])
    assert code == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    with (out / "ablation.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["rule"] for r in rows] == ["(none)", "probe", "admission-hold"]
    keep = sum(r["verdict"] == "keep" for r in rows[1:])
    assert last == f"ablate: policy {base}, 2 rules, {keep} keep, {2 - keep} drop"
    hold = rows[2]
    assert hold["verdict"] == "drop" and hold["off"] == 'without=["admission-hold"]'
    assert all(hold[k] == rows[0][k] for k in rows[0] if "@41" in k)  # already off: the full policy's row
    assert (out / "presets" / "base-round1-without-probe.toml").exists()
    assert not (out / "presets" / "base-round1-without-admission-hold.toml").exists()
