"""Chaos: ``map_concurrent`` over embeddings while the emulator is SIGKILLed and restarted on the same port.

What runs:

* the emulator (preset ``bge-m3``, ``--max-num-seqs``) as a subprocess in a session of its own, so a SIGKILL of
  that group (by the pid of the process started here) takes everything down at once, as a crashed vLLM would
  go: calls in flight see their connections reset, new ones are refused. ``--form single`` (the default) serves
  the app and its engine in one process (a restart costs one interpreter start, about 2 s here);
  ``--form processes`` runs ``model-concurrency emulate`` (engine and front-end processes, about 6 s here);
* one adaptive model registered on it, polled every ``--poll-s``;
* ``map_concurrent`` over ``--items`` embeddings through one ``httpx.AsyncClient``, with ``retries=`` (embeddings
  are idempotent) and ``return_exceptions=True``, so every item's outcome is counted;
* a chaos thread: when ``k / (kills + 1)`` of the items are done it SIGKILLs the emulator, waits ``--down-s`` and
  starts it again on the same port (``--kills`` times).

What it reports (JSON): items that succeeded, failed (by exception type) and lost (no outcome), calls in flight and
waiting after the run, outages opened, HTTP attempts, the target just before the first kill, and how many polls
after the last restart the target took to be back at >= 0.8x that level. Exit status 1 when a goal fails
(>= 99 % succeed, none lost, 0 in flight, the target back within 10 polls).

    python benchmarks/chaos.py [--items 6000] [--kills 4] [--down-s 2] [--retries 3] [--poll-s 0.5]
                               [--max-outage-s 0]   # the baseline: the outage rule off (with --retries 0: as before)

The suite runs a scaled-down copy (tests/test_chaos.py: 600 items, 3 kills of 1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

MODEL = "chaos"
SERVED = "BAAI/bge-m3"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The in-process app (engine in the server's own loop) in the foreground of one process.
_SINGLE = """
import sys
import uvicorn
from model_concurrency.emulator import EmulatorConfig, create_app
from model_concurrency.emulator.processes import KEEP_ALIVE_S
port, served, seqs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
config = EmulatorConfig(preset="bge-m3", served_model_name=served, max_num_seqs=seqs, simulate_frontend=False)
uvicorn.run(create_app(config), host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S)
"""


class Emulator:
    """The emulator as a subprocess group on a fixed port: started, SIGKILLed and restarted by pid."""

    def __init__(self, port: int, max_num_seqs: int, speed: float, form: str = "single") -> None:
        self.port, self.max_num_seqs, self.speed, self.form = port, max_num_seqs, speed, form
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> float:
        """Start and wait until /health answers; returns the seconds it took."""
        import model_concurrency

        started = time.monotonic()
        src = str(Path(model_concurrency.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
        if self.form == "single":
            command = [sys.executable, "-c", _SINGLE, str(self.port), SERVED, str(self.max_num_seqs)]
        else:
            entry = "import sys; from model_concurrency.cli import main; sys.exit(main(sys.argv[1:]))"
            command = [sys.executable, "-c", entry, "emulate", "--port", str(self.port), "--preset", "bge-m3"]
            command += ["--served-model-name", SERVED, "--max-num-seqs", str(self.max_num_seqs)]
            command += ["--no-frontend-cost", "--log-level", "warning"]
        self.proc = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the emulator exited with code {self.proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() - started > timeout_s:
                raise RuntimeError("the emulator did not answer /health")
            time.sleep(0.05)
        if self.speed != 1.0:
            httpx.post(f"{self.url}/admin/capacity", json={"speed": self.speed}, timeout=10).raise_for_status()
        return time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL the group this process started (the emulator and its engine and front-end children)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


# The goal: the target back to 0.8x its level before the kills within this many polls of the last restart.
RECOVERY_POLLS = 10


@dataclass
class Report:
    items: int
    kills: int
    down_s: float
    retries: int
    succeeded: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    inflight_after: int = -1
    waiting_after: int = -1
    outages_opened: int = 0
    http_attempts: int = 0
    target_before_kills: int = 0
    target_at_last_restart: int = 0
    polls_to_recover: int | None = None
    target_after_recovery: int = 0
    restart_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def success_rate(self) -> float:
        return self.succeeded / self.items if self.items else 0.0

    def goals(self) -> dict[str, bool]:
        return {
            ">= 99 % succeed": self.success_rate >= 0.99,
            "none lost": self.lost == 0,
            "0 in flight": self.inflight_after == 0 and self.waiting_after == 0,
            "target back within 10 polls": self.polls_to_recover is not None
            and self.polls_to_recover <= RECOVERY_POLLS,
        }


def run(
    items: int = 6000,
    kills: int = 4,
    down_s: float = 2.0,
    retries: int = 3,
    poll_s: float = 0.5,
    max_num_seqs: int = 64,
    speed: float = 0.05,
    form: str = "single",
) -> Report:
    """One chaos run (registers the model, starts and finally stops the emulator)."""
    os.environ.setdefault("MODEL_CONCURRENCY_POLL_S", str(poll_s))
    from model_concurrency import gate_stats, map_concurrent, register_model
    from model_concurrency.runtime import runtime_for

    report = Report(items=items, kills=kills, down_s=down_s, retries=retries)
    emulator = Emulator(free_port(), max_num_seqs, speed, form)
    emulator.start()
    done = [0]
    finished = threading.Event()
    judged = threading.Event()  # the recovery after the last restart was measured (or could not be)
    try:
        register_model(MODEL, base_url=f"{emulator.url}/v1", served_model_name=SERVED, max_parallel_calls=4)
        runtime = runtime_for(MODEL)

        def chaos() -> None:
            for k in range(1, kills + 1):
                while done[0] < items * k / (kills + 1) and not finished.is_set():
                    time.sleep(0.01)
                if finished.is_set():
                    return
                if k == 1:
                    report.target_before_kills = runtime.current()
                emulator.kill()
                time.sleep(down_s)
                report.restart_s.append(round(emulator.start(), 2))
            report.target_at_last_restart = runtime.current()
            polls_then = runtime.core.polls
            goal = 0.8 * report.target_before_kills
            try:
                while not finished.is_set() and runtime.core.polls - polls_then <= RECOVERY_POLLS:
                    if runtime.current() >= goal:
                        report.polls_to_recover = runtime.core.polls - polls_then
                        report.target_after_recovery = runtime.current()
                        return
                    time.sleep(0.005)
            finally:
                judged.set()

        def item_stream() -> Iterator[int]:
            """``items`` items, then more while the recovery after the last restart is still being judged (at most
            ``items`` more): a list that ran out first would leave the target nothing to recover with."""
            yield from range(items)
            for extra in range(items, 2 * items):
                if judged.is_set():
                    return
                report.items = extra + 1
                yield extra

        async def main() -> list[Any]:
            limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
            async with httpx.AsyncClient(base_url=f"{emulator.url}/v1", timeout=30, limits=limits) as client:

                async def embed(i: int) -> int:
                    response = await client.post("/embeddings", json={"model": SERVED, "input": f"text {i}"})
                    response.raise_for_status()
                    done[0] += 1
                    return len(response.json()["data"][0]["embedding"])

                return await map_concurrent(item_stream(), embed, model=MODEL, return_exceptions=True, retries=retries)

        thread = threading.Thread(target=chaos, name="chaos", daemon=True)
        started = time.monotonic()
        thread.start()
        try:
            results = asyncio.run(main())
        finally:
            finished.set()
            thread.join(120)
        report.wall_s = round(time.monotonic() - started, 2)
        report.lost = report.items - len(results)
        for result in results:
            if isinstance(result, BaseException):
                name = type(result).__name__
                report.failed[name] = report.failed.get(name, 0) + 1
            else:
                report.succeeded += 1
        report.inflight_after = runtime.limiter.inflight()
        report.waiting_after = runtime.limiter.waiting
        report.outages_opened = runtime.limiter.hold.outage.opened
        report.http_attempts = gate_stats(MODEL).calls
    finally:
        emulator.kill()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=6000)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--down-s", type=float, default=2.0)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--speed", type=float, default=0.05, help="engine speed (slower = longer calls)")
    parser.add_argument("--form", choices=("single", "processes"), default="single", help="how the emulator runs")
    parser.add_argument(
        "--max-outage-s", type=float, help="MODEL_CONCURRENCY_MAX_OUTAGE_S for this run (0: the rule off, the baseline)"
    )
    args = parser.parse_args()
    if args.max_outage_s is not None:
        os.environ["MODEL_CONCURRENCY_MAX_OUTAGE_S"] = str(args.max_outage_s)
    report = run(
        items=args.items,
        kills=args.kills,
        down_s=args.down_s,
        retries=args.retries,
        poll_s=args.poll_s,
        max_num_seqs=args.max_num_seqs,
        speed=args.speed,
        form=args.form,
    )
    goals = report.goals()
    print(json.dumps({**asdict(report), "success_rate": round(report.success_rate, 4), "goals": goals}, indent=2))
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
