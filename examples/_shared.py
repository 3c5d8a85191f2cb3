"""What both embedding examples share: a server to talk to, and the target's path printed as it changes."""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

# Poll the engine every half second (the default, 12 s, suits long jobs; these last seconds), and cap the target
# for a demo on a laptop: one emulator front-end process on a shared CPU, not a GPU server.
os.environ.setdefault("MODEL_CONCURRENCY_POLL_S", "0.5")
os.environ.setdefault("MODEL_MAX_CONCURRENCY", "128")

from model_concurrency import get_utilization


class Server(NamedTuple):
    base_url: str
    served_name: str


def parse_args(description: str, argv: list[str] | None, *, with_map: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", help="an OpenAI-compatible base URL (…/v1); default: start a local emulator")
    parser.add_argument("--served-name", default="BAAI/bge-m3", help="the model name the server expects")
    parser.add_argument("--items", type=int, default=3000, help="how many texts to embed")
    parser.add_argument("--floor", type=int, default=4, help="the static capacity (the target's floor)")
    if with_map:
        parser.add_argument("--map", action="store_true", help="map_concurrent over an unwrapped client")
    args = parser.parse_args(argv)
    if args.items < 1 or args.floor < 1:
        parser.error("--items and --floor must be at least 1")
    return args


@contextmanager
def server(args: argparse.Namespace) -> Iterator[Server]:
    """The URL given, else a local emulator of bge-m3 (engine and front end in child processes, stopped after)."""
    if args.url is not None:
        yield Server(args.url, args.served_name)
        return
    from model_concurrency.emulator import EmulatorConfig, serve_in_processes

    with serve_in_processes(EmulatorConfig(preset="bge-m3", max_num_seqs=64)) as emu:
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
        print(f"limited by: {get_utilization(model)['limited_by'] or 'nothing (growing freely)'}", flush=True)


def report(count: int, elapsed_s: float, path: list[tuple[float, int]], floor: int) -> dict[str, object]:
    peak = max((target for _, target in path), default=floor)
    print(f"embedded {count} texts in {elapsed_s:.1f}s; target peaked at {peak} (floor {floor})")
    return {"embedded": count, "path": path, "peak": peak}
