"""Many callers at once while targets change, and a fork after controllers exist.

* 16 threads and 4 event loops (each in its own thread) call ``resolve_capacity``/``aresolve_capacity``,
  ``map_concurrent_sync`` and ``map_concurrent`` on the same two models while a real metrics server's page
  changes under them (the policy takes the page's ``running`` as the target, so the targets in force are known).
  Invariants: no exception anywhere, every item accounted for, each model's peak concurrency never above the
  highest target in force, in-flight 0 and nobody waiting at the end.
* ``os.fork()`` with controllers, limiters, pools and a poll in flight in the parent: the child resolves capacity
  (starting at the floor) and runs a small ``map_concurrent_sync`` without deadlock, also when a parent thread
  held one of the package's module locks at the moment of the fork. A deadlocked child is killed and fails the test.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fault_servers import FaultServer, bounded, fault_server, held, page, wait_until
from model_concurrency import (
    aresolve_capacity,
    get_utilization,
    map_concurrent,
    map_concurrent_sync,
    register_model,
    resolve_capacity,
)
from model_concurrency.gate import limiter_for
from model_concurrency.hooks import controller_for
from model_concurrency.observation import Observation
from servers import EngineState, vllm_page

MODELS = {"a": "org/model-a", "b": "org/model-b"}
FLOOR = 2
# The pages cycle through these "running" values; the policy answers them as the target.
SCHEDULE = [(3, 9), (9, 2), (2, 6), (6, 3), (4, 4)]
HIGHEST = {"a": max(a for a, _ in SCHEDULE), "b": max(b for _, b in SCHEDULE)}


class FromPage:
    """Target = the engine's ``running`` gauge: the test decides every target in force through the page."""

    def next_target(self, target: float, obs: Observation) -> float:
        return obs.running


def schedule_page(step: int) -> bytes:
    a, b = SCHEDULE[step % len(SCHEDULE)]
    return vllm_page({MODELS["a"]: [EngineState(running=a)], MODELS["b"]: [EngineState(running=b)]})


class PerModel:
    """Concurrency of the calls as fn sees it, per model, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = dict.fromkeys(MODELS, 0)
        self.peak = dict.fromkeys(MODELS, 0)
        self.calls = 0

    def enter(self, model: str) -> None:
        with self.lock:
            self.now[model] += 1
            self.calls += 1
            self.peak[model] = max(self.peak[model], self.now[model])

    def leave(self, model: str) -> None:
        with self.lock:
            self.now[model] -= 1


@pytest.fixture
def changing_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultServer]:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0.02")
    monkeypatch.setenv("MODEL_CONCURRENCY_TIMEOUT_S", "1")
    monkeypatch.setenv("MODEL_CONCURRENCY_THREAD_IDLE_S", "0.05")
    with fault_server(page(schedule_page(0))) as server:
        for name, served in MODELS.items():
            register_model(
                name, base_url=f"{server.url}/v1", served_model_name=served, max_parallel_calls=FLOOR, policy=FromPage()
            )
        yield server


def test_sixteen_threads_and_four_loops_while_targets_change(changing_server: FaultServer) -> None:
    gauge = PerModel()
    errors: list[BaseException] = []
    seen_targets: dict[str, set[int]] = {name: set() for name in MODELS}
    stop = threading.Event()
    items_done = [0]
    done_lock = threading.Lock()

    def record(model: str, target: int) -> None:
        assert FLOOR <= target <= HIGHEST[model], (model, target)
        with done_lock:
            seen_targets[model].add(target)

    def sync_fn(model: str) -> Callable[[int], int]:
        def call(x: int) -> int:
            gauge.enter(model)
            try:
                threading.Event().wait(0.0005)
                return x * x
            finally:
                gauge.leave(model)

        return call

    def async_fn(model: str) -> Callable[[int], Any]:
        async def call(x: int) -> int:
            gauge.enter(model)
            try:
                await asyncio.sleep(0.0005)
                return x * x
            finally:
                gauge.leave(model)

        return call

    def accounted(out: list[Any], n: int) -> None:
        assert out == [x * x for x in range(n)]
        with done_lock:
            items_done[0] += n

    def thread_caller(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            while not stop.is_set():
                model = rnd.choice(list(MODELS))
                action = rnd.randrange(3)
                if action == 0:
                    record(model, resolve_capacity(model))
                else:
                    n = rnd.randrange(1, 40)
                    accounted(map_concurrent_sync(range(n), sync_fn(model), model=model), n)
        except BaseException as exc:
            errors.append(exc)

    async def loop_task(rnd: random.Random) -> None:
        while not stop.is_set():
            model = rnd.choice(list(MODELS))
            action = rnd.randrange(4)
            if action == 0:
                record(model, await aresolve_capacity(model))
            elif action == 1:
                record(model, resolve_capacity(model))  # sync hook on a loop thread: a background poll
            else:
                n = rnd.randrange(1, 40)
                fn = async_fn(model) if action == 2 else sync_fn(model)
                accounted(await map_concurrent(range(n), fn, model=model), n)

    def loop_caller(seed: int) -> None:
        async def main() -> None:
            await asyncio.gather(*(loop_task(random.Random(seed * 100 + i)) for i in range(4)))

        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread_caller, args=(i,), daemon=True) for i in range(16)]
    threads += [threading.Thread(target=loop_caller, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    # The engine's state changes under the callers: every page of the schedule, several times.
    for step in range(1, 4 * len(SCHEDULE) + 1):
        changing_server.respond(page(schedule_page(step)))
        assert not stop.wait(0.15)
    stop.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a caller is stuck"
    assert errors == [], errors[:3]
    assert items_done[0] > 0 and gauge.calls == items_done[0]  # every item ran exactly once, none extra
    for name in MODELS:
        assert gauge.peak[name] <= HIGHEST[name], (name, gauge.peak[name])
        limiter = limiter_for(name, FLOOR)
        assert wait_until(lambda lim=limiter: lim.inflight() == 0), limiter  # type: ignore[misc]
        assert limiter.waiting == 0
        assert len(seen_targets[name]) >= 3, seen_targets  # the targets really changed during the run
        assert get_utilization(name)["metrics_ok"] is True


# -- fork -----------------------------------------------------------------------------------------------------------
CHILD_OK = 0


def child_work(model: str) -> int:
    """Runs in the child; returns an exit code (0 = all good). Never returns into pytest."""
    from model_concurrency import runtime as runtime_module

    if runtime_module._runtimes:
        return 10  # inherited the parent's controllers
    c = controller_for(model)
    if c is None or c.peek() != FLOOR or c._polling:
        return 11  # a fresh controller at the floor, no inherited poll in flight
    target = resolve_capacity(model)
    if not FLOOR <= target <= HIGHEST[model]:
        return 12
    if map_concurrent_sync(range(20), lambda x: x + 1, model=model) != list(range(1, 21)):
        return 13
    if asyncio.run(map_concurrent(range(5), lambda x: x * 2, model=model)) != [0, 2, 4, 6, 8]:
        return 14
    if limiter_for(model, FLOOR).inflight() != 0:
        return 15
    get_utilization(model)
    return CHILD_OK


def fork_and_check(work: Callable[[], int], limit_s: float = 20.0) -> int:
    """Fork; the child runs ``work`` and exits with its code. A child still running after ``limit_s`` is killed."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 99
        try:
            code = work()
        except BaseException:
            code = 98
        finally:
            os._exit(code)
    deadline = time.monotonic() + limit_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child was still running after {limit_s}s: deadlocked")
        time.sleep(0.02)


def test_fork_after_controllers_exist_with_a_poll_in_flight(changing_server: FaultServer) -> None:
    # The parent has controllers, limiters, a pool of idle threads, and a poll stuck on a server in a thread.
    assert FLOOR <= resolve_capacity("a") <= HIGHEST["a"]
    assert map_concurrent_sync(range(10), lambda x: x, model="a") == list(range(10))
    release = threading.Event()
    with fault_server(held(release, page(schedule_page(0)))) as stuck:
        c = controller_for("b")
        assert c is not None
        c.source.metrics_url = f"{stuck.url}/metrics"  # type: ignore[union-attr]
        poller = threading.Thread(target=c.target, daemon=True)
        poller.start()
        assert wait_until(lambda: len(stuck.requests) == 1) and c._polling
        code_a = fork_and_check(lambda: child_work("a"))
        code_b = fork_and_check(lambda: child_work("b"))  # the model whose poll is in flight in the parent
        release.set()
        poller.join(10)
    assert (code_a, code_b) == (CHILD_OK, CHILD_OK)
    # The parent is unaffected.
    assert bounded(lambda: map_concurrent_sync(range(10), lambda x: x, model="a")) == list(range(10))


def _module_lock(name: str) -> Any:
    """The lock object to hold in the parent at the moment of the fork."""
    from model_concurrency import config
    from model_concurrency import runtime as runtime_module
    from model_concurrency.gate import pool, stats

    locks: dict[str, Callable[[], Any]] = {
        "runtime._registry_lock": lambda: runtime_module._registry_lock,
        "pool._pools_lock": lambda: pool._pools_lock,
        "config._lock": lambda: config._lock,
        "stats._lock": lambda: stats._lock,
        "a controller's _lock": lambda: controller_for("a")._lock,  # type: ignore[union-attr]
        "a limiter's _lock": lambda: limiter_for("a", FLOOR)._lock,
    }
    return locks[name]()


LOCKS = [
    "runtime._registry_lock",
    "pool._pools_lock",
    "config._lock",
    "stats._lock",
    "a controller's _lock",
    "a limiter's _lock",
]


@pytest.mark.parametrize("lock_name", LOCKS)
def test_fork_while_a_parent_thread_holds_a_module_lock(lock_name: str, changing_server: FaultServer) -> None:
    assert FLOOR <= resolve_capacity("a") <= HIGHEST["a"]
    assert map_concurrent_sync(range(10), lambda x: x, model="a") == list(range(10))
    lock = _module_lock(lock_name)
    holding, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            let_go.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert holding.wait(10)
    try:
        code = fork_and_check(lambda: child_work("a"))
    finally:
        let_go.set()
        holder.join(10)
    assert code == CHILD_OK


def test_a_forked_child_gets_fresh_module_locks_and_none_of_the_parents_exports_or_pools(
    changing_server: FaultServer, tmp_path: Any
) -> None:
    # What each module's after-fork rule (model_concurrency._fork) promises, read in the child.
    from model_concurrency import config, export
    from model_concurrency import runtime as runtime_module
    from model_concurrency.gate import pool, stats

    assert map_concurrent_sync(range(10), lambda x: x, model="a") == list(range(10))  # a controller and a pool
    where = export.start(str(tmp_path / "page.prom"))
    modules = (config, export, runtime_module, pool, stats)
    names = ("_lock", "_lock", "_registry_lock", "_pools_lock", "_lock")
    parent_locks = [getattr(module, name) for module, name in zip(modules, names, strict=True)]
    assert runtime_module._runtimes and pool._pools and export.started() == {where}

    def child() -> int:
        if export.started() or export._stops:
            return 20
        if runtime_module._runtimes or runtime_module._installed or pool._pools:
            return 21
        fresh = [getattr(module, name) for module, name in zip(modules, names, strict=True)]
        if any(new is old or type(new) is not type(old) for new, old in zip(fresh, parent_locks, strict=True)):
            return 22
        return CHILD_OK

    try:
        assert fork_and_check(child) == CHILD_OK
    finally:
        export.stop(where)
    assert export.started() == set() and runtime_module._runtimes  # the parent keeps its own
