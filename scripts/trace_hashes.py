"""Hash every array of the trace (and the oracle's trace) and the summary of a few scaled scenarios.

Speed work on the engine model and the lab must leave results unchanged bit for bit: run this before and after
(e.g. main's tree with ``PYTHONPATH=<main>/src``) and compare the lines. Each line: scenario, part, sha256 prefix.

    .venv/bin/python scripts/trace_hashes.py [--no-oracle] [name:scale ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from typing import Any

import numpy as np

from model_concurrency.lab.experiment import run_scenario
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.lab.trace import Trace
from model_concurrency.policies.registry import load_policy

DEFAULT = ["ramp:0.3", "multi-client:0.5", "heavy-tail:0.3", "replica-lost:0.3", "gpu-added:0.3", "fleet-1000:0.03"]


def trace_hash(trace: Trace) -> str:
    h = hashlib.sha256()
    for name in ("time", "running", "waiting_capacity", "kv_usage", "preemptions", "queue_times", "latencies"):
        h.update(np.ascontiguousarray(getattr(trace, name), dtype=float).tobytes())
    h.update(np.ascontiguousarray(trace.finish_times, dtype=float).tobytes())
    for client in trace.clients:
        for name in ("target", "inflight", "completions", "errors", "throttled", "poll_times", "poll_targets"):
            h.update(np.ascontiguousarray(getattr(client, name), dtype=float).tobytes())
    return h.hexdigest()[:16]


def summary_hash(summary: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(summary, sort_keys=True, default=str).encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", default=DEFAULT, help="name:scale pairs")
    parser.add_argument("--no-oracle", action="store_true")
    args = parser.parse_args(argv)
    for run in args.runs:
        name, scale = run.split(":")
        scenario = load_scenario(name).scaled(float(scale))
        result = run_scenario(scenario, lambda: load_policy("adaptive"), with_oracle=not args.no_oracle)
        print(f"{run} trace {trace_hash(result.trace)}", flush=True)
        if result.oracle is not None:
            print(f"{run} oracle {trace_hash(result.oracle)}", flush=True)
        print(f"{run} summary {summary_hash(result.summary)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
