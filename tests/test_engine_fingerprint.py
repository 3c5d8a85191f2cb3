"""A fingerprint of the engine model's traces: proof that a refactor changed no simulated number.

Short deterministic runs cover every path the engine has: the chat presets under Poisson load (chunked prefill,
decode aggregates), the embedding preset with its API-server cost, a KV-starved engine that preempts, a server
whose engine count, speed and health change mid-run with client aborts, and a two-replica fleet. Every request's
timestamps (as ``float.hex``, so nothing is rounded away), finish reason, preemptions and token counts, every
engine's step count and busy time, and each server's rendered ``/metrics`` page are hashed together.

**When the hash changes.** A change that only restructures code (splitting a module, inlining, renaming a local)
must leave it identical; if it does not, the change altered behaviour. A change *meant* to move the model's
numbers (a new step-time formula, new preset constants, a scheduling fix) updates ``EXPECTED`` deliberately, in
the same commit, and says so in the commit message. Print the current value with::

    .venv/bin/python tests/test_engine_fingerprint.py
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Generator
from typing import Any

import simpy

from model_concurrency.engine import Fleet, Request, Server, get_preset

EXPECTED = "2d491814cad1a698de5cbecbb80806c64d1166f31ab2a8017db6fc895c08bab5"


def _poisson(
    env: simpy.Environment,
    target: Any,
    rng: random.Random,
    rate: float,
    count: int,
    make: Callable[[random.Random], Request],
    log: list[Request],
) -> Generator[Any, Any, None]:
    for _ in range(count):
        yield env.timeout(rng.expovariate(rate))
        request = make(rng)
        log.append(request)
        target.submit(request)


def _chat(rng: random.Random) -> Request:
    return Request(rng.randint(20, 2000), rng.randint(1, 300))


def _record(requests: list[Request]) -> list[str]:
    def hexed(value: float | None) -> str:
        return "-" if value is None else float(value).hex()

    return [
        " ".join(
            (
                str(i),
                hexed(r.arrival_time),
                hexed(r.queued_time),
                hexed(r.first_scheduled_time),
                hexed(r.first_token_time),
                hexed(r.finish_time),
                str(r.finished_reason),
                str(r.num_preemptions),
                str(r.generated),
            )
        )
        for i, r in enumerate(requests)
    ]


def _server_record(server: Server) -> list[str]:
    lines = [f"{e.label} {e.steps} {e.busy_time.hex()} {e.tokens_scheduled}" for e in server.engines]
    if server.up:
        lines.append(server.render_metrics())
    return lines


def run_poisson(preset_name: str, rate: float, count: int, seed: int) -> list[str]:
    env = simpy.Environment()
    server = Server(env, get_preset(preset_name))
    rng = random.Random(seed)
    log: list[Request] = []
    embedding = server.preset.embedding

    def make(rng: random.Random) -> Request:
        if embedding:
            return Request(rng.randint(8, 3000), 0, embedding=True)
        return _chat(rng)

    env.process(_poisson(env, server, rng, rate, count, make, log))
    env.run()
    return [preset_name, *_record(log), *_server_record(server)]


def run_preempting(seed: int) -> list[str]:
    """A KV cache of 300 blocks under long answers: preemptions by recompute, re-admission from the head."""
    env = simpy.Environment()
    server = Server(env, get_preset("llama-8b-a100-80gb").replace(num_gpu_blocks=300, max_num_seqs=64))
    rng = random.Random(seed)
    log: list[Request] = []
    env.process(_poisson(env, server, rng, 20.0, 300, lambda r: Request(r.randint(50, 900), r.randint(100, 600)), log))
    env.run()
    assert sum(r.num_preemptions for r in log) > 0, "the scenario must preempt to fingerprint that path"
    return ["preempting", *_record(log), *_server_record(server)]


def run_changing_server(seed: int) -> list[str]:
    """Two engine cores, a third added, speed changed, aborts, a lost and restarted server."""
    env = simpy.Environment()
    server = Server(env, get_preset("llama-8b-h100-80gb").replace(num_gpu_blocks=2000), num_engines=2)
    rng = random.Random(seed)
    log: list[Request] = []
    env.process(_poisson(env, server, rng, 60.0, 900, _chat, log))

    def operator() -> Generator[Any, Any, None]:
        yield env.timeout(2.0)
        server.add_engine()
        yield env.timeout(2.0)
        server.set_capacity(speed=1.7, max_num_seqs=48)
        for request in log[-40::3]:
            server.abort(request)
        yield env.timeout(3.0)
        server.set_down()
        yield env.timeout(0.5)
        server.set_up()
        yield env.timeout(2.0)
        server.set_capacity(num_gpu_blocks=600)

    env.process(operator())
    env.run()
    return ["changing", *_record(log), *_server_record(server)]


def run_fleet(seed: int) -> list[str]:
    env = simpy.Environment()
    fleet = Fleet.of(env, get_preset("llama-8b-a100-80gb"), replicas=2, balancer="least_loaded")
    rng = random.Random(seed)
    log: list[Request] = []
    env.process(_poisson(env, fleet, rng, 12.0, 300, _chat, log))
    env.run()
    return ["fleet", *_record(log), *(line for s in fleet.replicas for line in _server_record(s))]


def fingerprint() -> str:
    digest = hashlib.sha256()
    runs = [
        run_poisson("llama-8b-a100-80gb", 8.0, 300, 1),
        run_poisson("llama-8b-a100-40gb", 4.0, 200, 7),
        run_poisson("llama-8b-h100-80gb", 30.0, 600, 2),
        run_poisson("bge-m3", 150.0, 800, 3),
        run_preempting(4),
        run_changing_server(5),
        run_fleet(6),
    ]
    for lines in runs:
        for line in lines:
            digest.update(line.encode())
            digest.update(b"\n")
    return digest.hexdigest()


def test_engine_traces_match_the_recorded_fingerprint() -> None:
    assert fingerprint() == EXPECTED


if __name__ == "__main__":
    print(fingerprint())
