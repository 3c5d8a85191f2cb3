"""Fairness variants of the adaptive policy measured in docs/scale-out.md: Jain, saturated share, p99 queue
time and goodput per seed, then the median. A measurement script, not a feature: each variant patches one rule
of ``Adaptive`` in this process only.

    .venv/bin/python scripts/fairness_variants.py SCENARIO SCALE SEEDS VARIANT...
    .venv/bin/python scripts/fairness_variants.py multi-client 1 61,62,63,64,65 base rate_alone
    MODEL_CONCURRENCY_POLL_JITTER=0 .venv/bin/python scripts/fairness_variants.py multi-client 1 61,62,63,64,65 base
    .venv/bin/python scripts/fairness_variants.py fleet-1000 0.25 1000 base fleet0.8_1

Variants: ``base`` (the policy as shipped), ``dfX`` (decrease_factor X), ``ssfX`` (sharing the engine, slow start
x X a poll), ``sdfX`` (sharing, cut to X), ``shared_hold`` (the first ramp's admitting hold on a shared engine too),
``rate_alone`` (the completion-rate exit of the first ramp only alone on the engine), ``fleetB_S`` (sharing an
engine running over full_step_running: cut to B x the served share, increase_step S before the fleet scaling).
"""

import dataclasses
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import model_concurrency.policies.adaptive as ad
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.lab.summary import summarize


def override_when_shared(values, big_fleet=False):
    """Patch ``Adaptive._requests`` to run with ``values`` set on polls that share the engine (and, with
    ``big_fleet``, an engine running over ``full_step_running``), restoring the parameters after each poll."""
    from model_concurrency.policies._common import own_share

    orig = ad.Adaptive._requests

    def _requests(self, target, obs):
        shared = obs.inflight > 0 and own_share(obs) < self.jump_share
        if not shared or (big_fleet and obs.running <= self.full_step_running):
            return orig(self, target, obs)
        keep = {name: getattr(self, name) for name in values}
        for name, value in values.items():
            setattr(self, name, value)
        try:
            return orig(self, target, obs)
        finally:
            for name, value in keep.items():
                setattr(self, name, value)

    ad.Adaptive._requests = _requests


def make(variant):
    if variant == "shared_hold":

        def admitting(self, obs):
            load = self.startup_load
            if not self.ramping or load is None or self.held:
                return False
            self.held = True
            self.startup_load = (float(obs.inflight), obs.running)
            grew = obs.inflight - load[0]
            return grew > 0 and obs.running - load[1] >= 0.5 * grew

        ad.Adaptive._admitting = admitting
    if variant.startswith("df"):
        import functools

        return functools.partial(ad.Adaptive, decrease_factor=float(variant[2:]))
    if variant == "rate_alone":
        from model_concurrency.policies._common import own_share

        def _startup(self, target, obs, rate):
            previous, self.startup_rate = self.startup_rate, rate
            load, self.startup_load = self.startup_load, (float(obs.inflight), obs.running)
            alone = own_share(obs) >= self.jump_share
            if (
                alone
                and previous is not None
                and rate is not None
                and previous > 0
                and rate < self.startup_exit * previous
            ):
                self.w_max, self.w_max_time, self.probes = target, obs.time, 0
                self.startup_rate = self.startup_load = None
                return target + self.increase_step
            if self.engine_full_exit and load is not None:
                grew = obs.inflight - load[0]
                if grew > 0 and obs.running - load[1] < 0.5 * grew:
                    before = max(target / self.slow_start_factor, target - grew + max(0.0, obs.running - load[1]))
                    self.w_max, self.w_max_time, self.probes = before, obs.time, 0
                    self.startup_rate = self.startup_load = None
                    return before + self.increase_step
            return max(target * self.slow_start_factor, target + self.increase_step)

        ad.Adaptive._startup = _startup
    if variant.startswith("fleet"):  # fleetB_S: on a shared engine running > full_step_running: cut B, step S
        b, st = (float(x) for x in variant[5:].split("_"))
        override_when_shared({"decrease_factor": b, "increase_step": st}, big_fleet=True)
    if variant.startswith("ssf"):  # shared-only slow start factor (monkeypatched)
        override_when_shared({"slow_start_factor": float(variant[3:])})
    if variant.startswith("sdf"):  # shared-only decrease factor (monkeypatched)
        override_when_shared({"decrease_factor": float(variant[3:])})
    return ad.Adaptive


def one(args):
    name, scale, seed, variant = args
    cls = make(variant)
    sc = load_scenario(Path("sims") / f"{name}.toml")
    sc = dataclasses.replace(sc, seed=seed)
    if scale < 1:
        sc = sc.scaled(scale)
    s = summarize(simulate(sc, policy_factory=cls))
    return seed, variant, s["jain_fairness"], s["saturated_fraction"], s["queue_time_p99_s"], s["goodput"]


if __name__ == "__main__":
    name, scale, seeds = sys.argv[1], float(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
    variants = sys.argv[4:]
    jobs = [(name, scale, s, v) for v in variants for s in seeds]
    with ProcessPoolExecutor(2) as ex:
        res = list(ex.map(one, jobs))
    for v in variants:
        rows = [r for r in res if r[1] == v]
        for r in rows:
            print(name, v, f"seed {r[0]} jain {r[2]:.3f} sat {r[3]:.3f} p99 {r[4]:.3f} goodput {r[5]:.1f}")
        jain = statistics.median(r[2] for r in rows)
        worst = min(r[2] for r in rows)
        sat = statistics.median(r[3] for r in rows)
        print(name, v, f"MEDIAN jain {jain:.3f} min {worst:.3f} sat {sat:.3f}", flush=True)
