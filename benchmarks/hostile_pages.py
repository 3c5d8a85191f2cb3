"""The wedged request: map_concurrent at 0.05-s polls, with and without PageHold.

A loopback ``/metrics`` page whose engine runs what the client sends (``running`` = the gate's in-flight) and
finishes it every poll (queue-time counts show nobody waiting). Once the target reaches ``--start`` the page adds
one request waiting for capacity that never gets in (``waiting_by_reason{capacity}`` stuck at 1), for
``--seconds``. Printed: the target when the wedge appeared, its minimum and its final value, for the run with the
hold (the default) and the run without it (``page_hold.enabled = False``).

    PYTHONPATH=src:tests python benchmarks/hostile_pages.py [--start 512] [--seconds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from model_concurrency import map_concurrent, register_model
from model_concurrency.runtime import reset_runtimes, runtime_for
from servers import Behaviour, EngineState, metrics_server, vllm_page

SERVED = "meta-llama/Llama-3.1-8B-Instruct"


def run(start: int, seconds: float, hold: bool) -> tuple[int, int, int, int]:
    """(target when the wedge appeared, min, final, polls during the wedge)."""
    reset_runtimes()
    with metrics_server() as server:
        register_model("m", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=4)
        runtime = runtime_for("m")
        runtime.core.page_hold.enabled = hold
        state = {"wedged": 0, "done": 0.0}

        def page() -> bytes:
            running = runtime.inflight()
            state["done"] += running
            engine = EngineState(
                running=running, waiting_capacity=state["wedged"], kv=0.05, success=state["done"],
                queue_count=state["done"],
            )  # fmt: skip
            return vllm_page({SERVED: [engine]})

        server.behaviour = Behaviour(render=page)
        seen: list[int] = []
        began = [0.0, 0]

        async def items():  # type: ignore[no-untyped-def]
            i = 0
            while True:
                if not state["wedged"] and runtime.current() >= start:
                    state["wedged"], began[0], began[1] = 1, time.monotonic(), runtime.core.polls
                    seen.append(runtime.current())
                if state["wedged"]:
                    seen.append(runtime.current())
                    if time.monotonic() - began[0] >= seconds:
                        return
                yield i
                i += 1

        async def call(i: int) -> int:
            await asyncio.sleep(0.05)
            return i

        asyncio.run(map_concurrent(items(), call, model="m"))
        return seen[0], min(seen), seen[-1], runtime.core.polls - int(began[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=7.0)
    args = parser.parse_args()
    os.environ["MODEL_CONCURRENCY_POLL_S"] = "0.05"
    os.environ["MODEL_MAX_CONCURRENCY"] = str(2 * args.start)
    for hold in (False, True):
        first, low, final, polls = run(args.start, args.seconds, hold)
        label = "with PageHold   " if hold else "without PageHold"
        print(f"{label}: wedge at target {first}; over {polls} polls min {low}, final {final}")


if __name__ == "__main__":
    main()
