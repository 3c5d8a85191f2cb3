"""One job, many Ray workers, one budget: ``FanOut(..., job=...)`` on a real local Ray.

The workers are real Ray actors (and a Ray Data pool); the coordinator is the real named actor they create; the
engine is the emulator on 127.0.0.1 and the pages are real loopback servers, one of them counting its scrapes. Items
that must stay in flight while the test looks at the leases wait on a loopback "gate" server that answers only when
the test opens it, so what the test reads does not depend on how fast the machine runs.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import ray
import ray.data
from ray import cloudpickle

from model_concurrency import get_utilization
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.lease import LeaseConfigError
from model_concurrency.ray import NAMESPACE, FanOut, MapBatches, coordinator_name, fan_out_actor
from model_concurrency.runtime import LeaseView, ModelRuntime
from servers import Behaviour, EngineState, MetricsServer, metrics_server, vllm_page
from test_ray import local_ray

FLOOR = 4
POLL_S = 1.0  # a lease of 2 s: renewals (every 1 s) never miss one on a loaded machine
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
    fan_out = FanOut(Call(emulator.base_url, gate.url), model="bge", config=models(emulator), job=job)
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
    # No worker runs more than it holds (a worker granted nothing still runs one call: its limiter's least).
    assert arrived <= sum(max(1, h) for h in held.values())
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
    fan_out = FanOut(Call(emulator.base_url, gate.url), model="bge", config=models(emulator), job=job)
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


def test_a_worker_with_another_floor_is_refused(ray_cluster: None, emulator: RunningEmulator) -> None:
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
    # Without a job the same worker runs as an independent client, as before.
    independent = actor_class.remote(FanOut(Call(emulator.base_url), model="bge", config=models(emulator)))
    alone = ray.get(independent.map.remote(items(5)), timeout=120)
    assert [r["job"] for r in alone] == [None] * 5
    end(job, [first, second, independent])


def test_a_lease_sets_the_workers_limits_and_its_published_state() -> None:
    """The worker's runtime under a grant (no Ray needed): the grant is the limit, a grant of no tokens still lets
    one weighted call through (the limiter's least budget), and the published state says whose lease it is."""
    runtime = ModelRuntime(None, name="leased")
    assert runtime.lease(LeaseView("j", 3, tokens=0, job_target=6)) == 3
    assert (runtime.limiter.limit, runtime.current_budget(), runtime.leased()) == (3, 1, True)
    state = runtime.state()
    assert (state.job, state.grant, state.job_target, state.lease_lapsed, state.current_target) == ("j", 3, 6, False, 3)
    runtime.lease(LeaseView("j", None, job_target=6), start=5)  # lapsed: the runtime decides alone again
    state = runtime.state()
    assert (runtime.leased(), state.grant, state.lease_lapsed, runtime.current_budget()) == (False, None, True, None)
