"""What the examples share: a server to talk to, and the target's path printed as it changes."""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

# Poll the engine every half second unless the environment says otherwise: the default, 12 s, suits long jobs, and
# these last seconds. Knobs are read at each use, so setting one after the import below still counts.
os.environ.setdefault("MODEL_CONCURRENCY_POLL_S", "0.5")

from model_concurrency import get_utilization
from model_concurrency.decision import explain_limit

# The ceiling for the local emulator only: one emulator front-end process on a shared laptop CPU, not a GPU server.
# A server given with --url keeps the ceiling the environment gives (MODEL_MAX_CONCURRENCY, default 512).
EMULATOR_CEILING = "128"
ENVIRONMENT_NOTE = (
    "Environment: MODEL_CONCURRENCY_POLL_S=0.5 (poll every half second) unless already set. Without --url a local "
    f"emulator is started and MODEL_MAX_CONCURRENCY={EMULATOR_CEILING} is set unless already set (one emulator "
    "front end on a laptop CPU); with --url the environment's ceiling is left as it is."
)


class Server(NamedTuple):
    base_url: str
    served_name: str


def parse_args(
    description: str,
    argv: list[str] | None,
    *,
    with_map: bool = False,
    served_name: str = "BAAI/bge-m3",
    items: str = "how many texts to embed",
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, epilog=ENVIRONMENT_NOTE)
    parser.add_argument("--url", help="an OpenAI-compatible base URL (…/v1); default: start a local emulator")
    parser.add_argument("--served-name", default=served_name, help="the model name the server expects")
    parser.add_argument("--items", type=int, default=3000, help=items)
    parser.add_argument("--floor", type=int, default=4, help="the static capacity (the target's floor)")
    if with_map:
        parser.add_argument("--map", action="store_true", help="map_concurrent over an unwrapped client")
    args = parser.parse_args(argv)
    if args.items < 1 or args.floor < 1:
        parser.error("--items and --floor must be at least 1")
    if args.url is None:
        os.environ.setdefault("MODEL_MAX_CONCURRENCY", EMULATOR_CEILING)
    return args


@contextmanager
def server(args: argparse.Namespace, preset: str = "bge-m3") -> Iterator[Server]:
    """The URL given, else a local emulator of ``preset`` (engine and front end in child processes, stopped
    after)."""
    if args.url is not None:
        yield Server(args.url, args.served_name)
        return
    from model_concurrency.emulator import EmulatorConfig, serve_in_processes

    with serve_in_processes(EmulatorConfig(preset=preset, max_num_seqs=64)) as emu:
        yield Server(emu.base_url, emu.model)


def texts(count: int) -> list[str]:
    return [f"document {i}: " + "lorem ipsum " * (i % 20) for i in range(count)]


@contextmanager
def print_target_path(model: str, every_s: float = 0.05) -> Iterator[list[tuple[float, int]]]:
    """Print (and collect) each change of the model's target, with seconds since the start, while the block runs."""
    path: list[tuple[float, int]] = []
    done = threading.Event()
    start = time.monotonic()

    def sample() -> None:
        target = int(get_utilization(model)["current_target"])
        if not path or path[-1][1] != target:
            path.append((time.monotonic() - start, target))
            print(f"{path[-1][0]:7.2f}s  target {target}", flush=True)

    def watch() -> None:
        while not done.wait(every_s):
            sample()

    sample()  # where it starts, before the first call (a fast first poll can move it within milliseconds)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        done.set()
        thread.join()
        util = get_utilization(model)
        print(f"limited by: {explain_limit(util['limited_by'])}; ceiling {util['ceiling']}", flush=True)


def report(
    count: int, elapsed_s: float, path: list[tuple[float, int]], floor: int, done: str = "embedded {count} texts"
) -> dict[str, object]:
    peak = max((target for _, target in path), default=floor)
    print(f"{done.format(count=count)} in {elapsed_s:.1f}s; target peaked at {peak} (floor {floor})")
    return {"done": count, "path": path, "peak": peak}
