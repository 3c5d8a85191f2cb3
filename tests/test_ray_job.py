"""One job, many Ray workers, one budget: ``FanOut(..., job=...)`` on a real local Ray.

The workers are real Ray actors (and a Ray Data pool); the coordinator is the real named actor they create; the
engine is the emulator on 127.0.0.1 and the pages are real loopback servers, one of them counting its scrapes. Items
that must stay in flight while the test looks at the leases wait on a loopback "gate" server that answers only when
the test opens it, so what the test reads does not depend on how fast the machine runs. A slow coordinator is the
real one with every lease call answered late (a test-only subclass registered under the job's name first).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import ray
import ray.data
from ray import cloudpickle

from model_concurrency import get_utilization
from model_concurrency.config import get_model
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.lease import Grant, LeaseConfigError
from model_concurrency.ray import NAMESPACE, FanOut, MapBatches, coordinator_name, fan_out_actor, fan_out_task
from model_concurrency.ray_coordinator import JobCoordinator, lease_config_for
from servers import Behaviour, EngineState, MetricsServer, metrics_server, vllm_page
from test_ray import local_ray

FLOOR = 4
POLL_S = 1.0  # a lease of 2 s: renewals (every 1 s) never miss one on a loaded machine
# The slow coordinator answers every lease call this late. Its job polls every SLOW_POLL_S (a lease of 4 s): with one
# call to the coordinator at a time, a grant can outlast its renewal only while the round trip is under half the lease.
DELAY_S = 1.0
SLOW_POLL_S = 2.0
VIEW = ("job", "grant", "job_target", "lease_lapsed", "last_poll", "floor")

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    with local_ray(POLL_S):
        yield


@pytest.fixture(scope="module")
def emulator() -> Iterator[RunningEmulator]:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", max_num_seqs=16, simulate_frontend=False)) as emu:
        yield emu


@pytest.fixture
def gate() -> Iterator[MetricsServer]:
    """Each GET waits until the test opens the gate (``open_gate``), then answers."""
    with metrics_server(Behaviour(body=b"ok", delay_s=120)) as server:
        yield server


def open_gate(server: MetricsServer) -> None:
    server.server.stop_event.set()  # every waiting request answers; new ones answer at once


def settings(poll_s: float = POLL_S, **env: str) -> dict[str, Any]:
    """A ``runtime_env`` for workers (and the coordinator the first of them creates) with these settings; the
    cluster's own are repeated, so the result does not depend on how Ray merges the two."""
    return {"env_vars": {"MODEL_CONCURRENCY_POLL_S": str(poll_s), "MODEL_CONCURRENCY_PROMETHEUS_URL": "", **env}}


@dataclass(frozen=True)
class Call:
    """One item: an embeddings call, or a GET that waits at the gate; returns the worker's view of its lease."""

    base_url: str
    gate_url: str | None = None

    def __call__(self, text: str) -> dict[str, Any]:
        if self.gate_url is not None:
            httpx.get(f"{self.gate_url}/{text.replace(' ', '-')}", timeout=180).raise_for_status()
        else:
            body = {"model": "BAAI/bge-m3", "input": text, "dimensions": 8}
            httpx.post(f"{self.base_url}/embeddings", json=body, timeout=30).raise_for_status()
        view = get_utilization("bge")
        return {"item": text, **{key: view[key] for key in VIEW}}


def models(emu: RunningEmulator, *, floor: int = FLOOR, metrics_url: str | None = None) -> dict[str, Any]:
    table = {"base_url": emu.base_url, "served_model_name": emu.model, "max_parallel_calls": floor}
    if metrics_url is not None:
        table["metrics_url"] = metrics_url
    return {"models": {"bge": table}}


def gated(emu: RunningEmulator, gate: MetricsServer, job: str) -> FanOut:
    """A fan-out of the job whose items wait at the gate until the test opens it."""
    return FanOut(Call(emu.base_url, gate.url), model="bge", config=models(emu), job=job)


def items(n: int, tag: str = "item") -> list[str]:
    return [f"{tag} {i}" for i in range(n)]


def coordinator(job: str) -> Any:
    return ray.get_actor(coordinator_name(job, "bge"), namespace=NAMESPACE)


def state_with(job: str, workers: int, unlike_pid: int | None = None) -> Callable[[], Any]:
    """A check for :func:`wait_for`: the job's coordinator state once it holds ``workers`` workers (and, given
    ``unlike_pid``, once it is another process than that one)."""

    def check() -> Any:
        state = ray.get(coordinator(job).state.remote(), timeout=30)
        return state if len(state["shares"]) == workers and state["pid"] != unlike_pid else None

    return check


def wait_for(check: Callable[[], Any], what: str, within_s: float = 90.0) -> Any:
    """Poll ``check`` until it returns something truthy; a bound on the wait, not an assertion about time."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            value = check()
        except (ValueError, ray.exceptions.RayError):  # the named actor does not exist (yet), or just died
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.1)


def job_state(job: str) -> dict[str, Any]:
    return ray.get(coordinator(job).state.remote(), timeout=30)  # type: ignore[no-any-return]


def state_when(job: str, ok: Callable[[dict[str, Any]], bool]) -> Callable[[], Any]:
    """A check for :func:`wait_for`: the job's coordinator state once ``ok`` holds of it."""
    return lambda: state if ok(state := job_state(job)) else None


def end(job: str, actors: list[Any]) -> None:
    for actor in actors:
        ray.kill(actor)
    with contextlib.suppress(ValueError):  # already gone
        ray.kill(coordinator(job))


def check_items(texts: list[str], results: list[dict[str, Any]], job: str) -> None:
    """Every item came back once, in its place, from a worker of the job that ran under a grant."""
    assert [r["item"] for r in results] == texts
    for r in results:
        assert r["job"] == job and r["floor"] == FLOOR
        if not r["lease_lapsed"]:
            assert r["grant"] is not None and r["grant"] <= r["job_target"]


def test_a_ray_data_job_is_polled_once_per_poll_by_its_coordinator(
    ray_cluster: None, emulator: RunningEmulator
) -> None:
    page = vllm_page({emulator.model: [EngineState(running=2)]})
    with metrics_server(Behaviour(body=page)) as engine_page:
        fan_out = FanOut(
            Call(emulator.base_url), model="bge", config=models(emulator, metrics_url=f"{engine_page.url}/metrics"),
            job="data",
        )  # fmt: skip
        texts = items(120)
        ds = ray.data.from_items([{"item": t} for t in texts]).map_batches(
            MapBatches,
            fn_constructor_args=(fan_out,),
            compute=ray.data.ActorPoolStrategy(size=2),
            num_cpus=0.25,
            batch_size=10,
        )
        rows = sorted(ds.take_all(), key=lambda row: texts.index(row["item"]))
        before = ray.get(coordinator("data").state.remote(), timeout=60)
        scraped = sum(1 for path, _ in engine_page.requests if path == "/metrics")
        after = ray.get(coordinator("data").state.remote(), timeout=60)
        end("data", [])
    check_items(texts, [row["result"] for row in rows], "data")
    # Only the coordinator read the page: one scrape per poll for the whole job, none by a worker.
    assert before["polls"] <= before["scrapes"] <= before["polls"] + 1  # one may be under way
    assert before["polls"] >= 1
    assert before["scrapes"] - 1 <= scraped <= after["scrapes"]  # a scrape may be under way as it is counted
    assert all(row["result"]["last_poll"] is None for row in rows)  # no worker ever polled on its own
    assert before["runtime"]["floor"] == FLOOR and before["config"].floor == FLOOR
    ledger = before["ledger"]
    assert ledger.granted == ledger.returned + ledger.expired + ledger.outstanding


def test_workers_share_the_target_and_a_killed_workers_permits_come_back(
    ray_cluster: None, emulator: RunningEmulator, gate: MetricsServer
) -> None:
    job = "shares"
    fan_out = gated(emulator, gate, job)
    actor_class = fan_out_actor(num_cpus=0.25)
    actors = [actor_class.remote(fan_out) for _ in range(2)]
    chunks = [items(30, "a"), items(30, "b")]
    refs = [actor.map.remote(chunk) for actor, chunk in zip(actors, chunks, strict=True)]
    state = wait_for(state_with(job, 2), "both workers hold a lease")
    arrived = len(gate.requests)  # calls started so far: none finishes while the gate is shut
    state = ray.get(coordinator(job).state.remote(), timeout=30)
    shares, held = state["shares"], state["held"]
    # Equal demand (30 items each, all waiting): equal shares, the whole target split.
    assert sum(shares.values()) == min(state["target"], 60)
    assert max(shares.values()) - min(shares.values()) <= 1
    # No worker runs more than it holds (one granted nothing runs nothing).
    assert arrived <= sum(held.values())
    assert state["inflight"] == sum(held.values())

    # The worker that holds the most permits runs that many calls once its limiter has started them (calls wait at
    # the gate, so holdings stand still); the other runs fewer.
    def started() -> list[int] | None:
        counts = [sum(1 for path, _ in gate.requests if path.startswith(f"/{tag}-")) for tag in "ab"]
        return counts if max(counts) == max(held.values()) else None

    counts = wait_for(started, "the larger holder runs its calls")
    heavy = counts.index(max(counts))
    ray.kill(actors.pop(heavy))  # its calls die with it; its grant comes back only at its lease's deadline
    state = wait_for(state_with(job, 1), "the killed worker's lease expired")
    ledger = state["ledger"]
    assert ledger.expired == max(held.values()) >= 1
    assert ledger.granted == ledger.returned + ledger.expired + ledger.outstanding
    open_gate(gate)
    results = ray.get(refs[1 - heavy], timeout=120)
    end(job, actors)
    check_items(chunks[1 - heavy], results, job)


def test_a_killed_coordinator_is_replaced_and_every_item_comes_back(
    ray_cluster: None, emulator: RunningEmulator, gate: MetricsServer
) -> None:
    job = "phoenix"
    fan_out = gated(emulator, gate, job)
    actor_class = fan_out_actor(num_cpus=0.25)
    actors = [actor_class.remote(fan_out) for _ in range(2)]
    chunks = [items(25, "a"), items(25, "b")]
    refs = [actor.map.remote(chunk) for actor, chunk in zip(actors, chunks, strict=True)]
    first = wait_for(state_with(job, 2), "both workers hold a lease")
    ray.kill(coordinator(job))
    # The next worker to ask creates a new coordinator; both rejoin it with the calls they have in flight.
    second = wait_for(state_with(job, 2, unlike_pid=first["pid"]), "a new coordinator with both workers")
    assert second["ledger"].granted >= 2  # the rejoining workers' calls in flight are counted at once
    open_gate(gate)
    results = ray.get(refs, timeout=120)
    end(job, actors)
    for chunk, result in zip(chunks, results, strict=True):
        check_items(chunk, result, job)


def test_a_worker_with_another_floor_or_ceiling_is_refused(ray_cluster: None, emulator: RunningEmulator) -> None:
    job = "refuse"
    actor_class = fan_out_actor(num_cpus=0.25)
    first = actor_class.remote(FanOut(Call(emulator.base_url), model="bge", config=models(emulator), job=job))
    check_items(items(10), ray.get(first.map.remote(items(10)), timeout=120), job)
    other = FanOut(Call(emulator.base_url), model="bge", config=models(emulator, floor=FLOOR + 2), job=job)
    second = actor_class.remote(other)
    with pytest.raises(LeaseConfigError) as refused:
        ray.get(second.map.remote(items(10)), timeout=120)
    message = str(refused.value)
    assert f"floor={FLOOR}," in message and f"floor={FLOOR + 2}," in message
    assert "'refuse'" in message and "'bge'" in message
    # The ceiling is each node's setting: a worker whose environment states another is refused the same way.
    ceiling = job_state(job)["config"].ceiling
    third = fan_out_actor(num_cpus=0.25, runtime_env=settings(MODEL_MAX_CONCURRENCY=str(ceiling + 1))).remote(
        FanOut(Call(emulator.base_url), model="bge", config=models(emulator), job=job)
    )
    with pytest.raises(LeaseConfigError) as refused:
        ray.get(third.map.remote(items(10)), timeout=120)
    assert f"ceiling={ceiling}," in str(refused.value) and f"ceiling={ceiling + 1}," in str(refused.value)
    # Without a job the same worker runs as an independent client, as before.
    independent = actor_class.remote(FanOut(Call(emulator.base_url), model="bge", config=models(emulator)))
    alone = ray.get(independent.map.remote(items(5)), timeout=120)
    assert [r["job"] for r in alone] == [None] * 5
    end(job, [first, second, third, independent])


def test_tasks_of_one_job_share_one_coordinator_and_leave_it_when_done(
    ray_cluster: None, emulator: RunningEmulator, gate: MetricsServer
) -> None:
    job = "tasks"
    fan_out = gated(emulator, gate, job)
    task = fan_out_task(num_cpus=0.25)
    chunks = [items(10, "a"), items(10, "b")]
    refs = [task.remote(fan_out, chunk) for chunk in chunks]
    # Both tasks run at once (their calls wait at the gate), each in its own process: two workers of one coordinator.
    wait_for(state_with(job, 2), "both tasks hold a lease from the job's coordinator")
    open_gate(gate)
    results = ray.get(refs, timeout=120)
    # A task's process outlives the task: its session leaves once idle, handing everything back (nothing expires).
    state = wait_for(state_when(job, lambda s: not s["shares"]), "both workers left the job")
    end(job, [])
    for chunk, result in zip(chunks, results, strict=True):
        check_items(chunk, result, job)
    assert all(r["last_poll"] is None for result in results for r in result)  # only the coordinator polled
    ledger = state["ledger"]
    assert ledger.expired == ledger.outstanding == 0 and ledger.granted == ledger.returned >= 2


def test_a_worker_granted_nothing_starts_nothing_until_it_has_a_share(
    ray_cluster: None, emulator: RunningEmulator, gate: MetricsServer
) -> None:
    """The job's target is 4 (its floor and ceiling). The first worker holds all 4 with its calls at the gate; the
    second is granted 0, its share still held by the first: it must start nothing, not the one call its limiter's
    least would let through, and must still finish once the first hands permits back."""
    job = "starved"
    fan_out = gated(emulator, gate, job)
    actor_class = fan_out_actor(num_cpus=0.25, runtime_env=settings(MODEL_MAX_CONCURRENCY=str(FLOOR)))
    first = actor_class.remote(fan_out)
    refs = [first.map.remote(items(8, "a"))]
    wait_for(lambda: len(gate.requests) == FLOOR, "the first worker runs the whole target")
    second = actor_class.remote(fan_out)
    refs.append(second.map.remote(items(8, "b")))
    state = wait_for(state_with(job, 2), "the second worker holds a lease")
    assert sorted(state["shares"].values()) == [2, 2] and sorted(state["held"].values()) == [0, FLOOR]
    polls = state["polls"]
    wait_for(state_when(job, lambda s: s["polls"] >= polls + 2), "two more polls")  # time for a call to reach the gate
    assert len(gate.requests) == FLOOR  # the job stays at its target
    open_gate(gate)
    results = ray.get(refs, timeout=120)
    ledger = job_state(job)["ledger"]
    end(job, [first, second])
    for tag, result in zip("ab", results, strict=True):
        check_items(items(8, tag), result, job)
    assert ledger.granted == ledger.returned + ledger.expired + ledger.outstanding


class SlowCoordinator(JobCoordinator):
    """The real coordinator, built as a job's first worker builds it, answering every lease call DELAY_S late (a
    loaded or distant coordinator); it counts the renewals it answered, per worker."""

    def __init__(self, job: str, fan_out: FanOut) -> None:
        fan_out.configure()
        spec = get_model(fan_out.model)
        assert spec is not None
        super().__init__(job, fan_out, lease_config_for(spec))
        self.renewed: Counter[str] = Counter()
        self.counting = threading.Lock()

    def request(self, *args: Any, **kwargs: Any) -> Grant:
        time.sleep(DELAY_S)
        return super().request(*args, **kwargs)

    def renew(self, worker: str, *args: Any, **kwargs: Any) -> Grant:
        time.sleep(DELAY_S)
        grant = super().renew(worker, *args, **kwargs)
        with self.counting:
            self.renewed[worker] += 1
        return grant

    def leave(self, *args: Any, **kwargs: Any) -> int:
        time.sleep(DELAY_S)
        return super().leave(*args, **kwargs)

    def renewals(self) -> dict[str, int]:
        with self.counting:
            return dict(self.renewed)


def test_a_slow_coordinator_costs_throughput_never_an_item_or_a_permit(
    ray_cluster: None, emulator: RunningEmulator, gate: MetricsServer
) -> None:
    job = "slow"
    env = settings(SLOW_POLL_S)
    fan_out = gated(emulator, gate, job)
    # Registered under the job's name before any worker asks: the workers find it as they would their own.
    named = {"name": coordinator_name(job, "bge"), "namespace": NAMESPACE, "lifetime": "detached"}
    slow = ray.remote(SlowCoordinator).options(**named, num_cpus=0, max_concurrency=16, runtime_env=env)
    slow = slow.remote(job, fan_out)
    ray.get(slow.__ray_ready__.remote(), timeout=120)
    actor_class = fan_out_actor(num_cpus=0.25, runtime_env=env)
    actors = [actor_class.remote(fan_out) for _ in range(2)]
    chunks = [items(12, "a"), items(12, "b")]
    refs = [actor.map.remote(chunk) for actor, chunk in zip(actors, chunks, strict=True)]

    def renewed() -> dict[str, int] | None:
        counts: dict[str, int] = ray.get(slow.renewals.remote(), timeout=30)
        return counts if len(counts) == 2 and min(counts.values()) >= 3 else None

    wait_for(renewed, "each worker renewed three times while its calls waited at the gate")
    open_gate(gate)
    results = ray.get(refs, timeout=120)
    # Their items done, the workers hand everything back at their next renewals.
    state = wait_for(state_when(job, lambda s: s["inflight"] == 0), "every permit handed back")
    end(job, actors)
    for chunk, result in zip(chunks, results, strict=True):
        check_items(chunk, result, job)
    # No worker ran on its own: no grant lapsed while a renewal's answer was on its way.
    assert not any(r["lease_lapsed"] or r["last_poll"] is not None for result in results for r in result)
    ledger = state["ledger"]
    assert ledger.expired == ledger.outstanding == 0 and ledger.granted == ledger.returned >= 2


def test_a_new_coordinator_goes_on_from_the_calls_its_workers_rejoin_with(emulator: RunningEmulator) -> None:
    """The actor's class built in this process (no Ray: the workers' calls made by hand). Workers that rejoin within
    a lease of its start bring the calls they ran alone and the job target their last grant named: the job's target
    is their sum at once, not the floor, and no more than the largest target named; a join with nothing in flight,
    a rejoin that names no target, or one later on leaves the target to the polls."""
    fan_out = FanOut(Call(emulator.base_url), model="bge", config=models(emulator), job="resumed")
    fan_out.configure()
    spec = get_model("bge")
    assert spec is not None
    coordinator = JobCoordinator("resumed", fan_out, lease_config_for(spec))
    wait_for(lambda: coordinator.polls >= 1, "the coordinator's first poll")
    coordinator._stop.set()  # no poll after this one: only the rejoins move the target
    try:
        assert coordinator.state()["target"] == FLOOR
        a = coordinator.request("a", 50, inflight=20, config=None, last_target=36)
        assert coordinator.state()["target"] == 20 and a.held == 20
        coordinator.request("b", 50, inflight=12, config=None, last_target=30)
        assert coordinator.state()["target"] == 32
        coordinator.request("e", 50, inflight=10, config=None, last_target=30)  # 42 run alone; the job ran 36
        assert coordinator.state()["target"] == 36
        coordinator.runtime.resume_from(10)  # as if a poll had cut the job to 10 under the 42 still out
        with coordinator._lock:
            coordinator.book.set_target(10, now=coordinator.clock())
        coordinator.request("c", 50, config=None, last_target=36)  # a first join: nothing run alone
        coordinator.request("f", 50, inflight=5, config=None)  # a worker that never had a grant
        assert coordinator.state()["target"] == 10
        coordinator.started_at -= 2 * coordinator.lease_s  # later on, a lapsed worker's rejoin is the polls' to judge
        coordinator.request("d", 50, inflight=40, config=None, last_target=36)
        assert coordinator.state()["target"] == 10
    finally:
        coordinator._stop.set()
