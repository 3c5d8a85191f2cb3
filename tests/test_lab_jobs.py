"""Clients of one job in the lab (``[clients] job``): one runtime reads the engine, a lease book shares its target.

Each run goes through ``run_scenario``, what ``model-concurrency sim`` and ``compare`` call, on a bundled scenario
shortened with ``scaled``; every figure is in simulated time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from model_concurrency.cli import main
from model_concurrency.engine import Fleet
from model_concurrency.lab import run as lab_run
from model_concurrency.lab.client import SimClient
from model_concurrency.lab.experiment import RunResult, run_scenario
from model_concurrency.lab.job import SimJob, job_groups
from model_concurrency.lab.scenario import Scenario, load_scenario, scenario_from_dict
from model_concurrency.lease import Grant, LeaseBook
from model_concurrency.policies.registry import load_policy


def job_scenario(scale: float = 0.2, job: Any = "ingest") -> Scenario:
    scenario = load_scenario("multi-client-job").scaled(scale)
    return dataclasses.replace(scenario, clients=dataclasses.replace(scenario.clients, job=job))


def run(scenario: Scenario) -> RunResult:
    return run_scenario(scenario, lambda: load_policy("adaptive"), policy_name="adaptive", with_oracle=False)


@pytest.fixture
def built_jobs(monkeypatch: pytest.MonkeyPatch) -> list[SimJob]:
    """The jobs each run builds, as the runner builds them."""
    built: list[SimJob] = []
    jobs_for = lab_run.jobs_for

    def recording(*args: Any, **kwargs: Any) -> dict[int, SimJob]:
        by_client = jobs_for(*args, **kwargs)
        built.extend(job for job in dict.fromkeys(by_client.values()))
        return by_client

    monkeypatch.setattr(lab_run, "jobs_for", recording)
    return built


@pytest.fixture
def engine_reads(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The simulated instant of every read of the fleet's metrics page."""
    reads: list[float] = []
    snapshot = Fleet.snapshot

    def counted(self: Fleet) -> Any:
        reads.append(self.env.now)
        return snapshot(self)

    monkeypatch.setattr(Fleet, "snapshot", counted)
    return reads


def test_the_bundled_job_is_multi_client_run_as_one_job() -> None:
    job, independent = load_scenario("multi-client-job"), load_scenario("multi-client")
    assert job.clients.job == "ingest"
    assert job_groups(job.clients) == {"ingest": [0, 1, 2, 3]}
    assert dataclasses.replace(job, name=independent.name, description=independent.description) == dataclasses.replace(
        independent, clients=dataclasses.replace(independent.clients, job="ingest")
    )


def test_clients_of_one_job_share_its_target_fairly(built_jobs: list[SimJob]) -> None:
    result = run(job_scenario())
    assert len(built_jobs) == 1 and built_jobs[0].config.floor == 4 * 4  # the job's floor: its clients' summed
    assert result.summary["jain_fairness"] >= 0.98
    assert result.summary["goodput"] > 0


def test_the_engine_is_read_once_per_poll_of_the_job(built_jobs: list[SimJob], engine_reads: list[float]) -> None:
    run(job_scenario())
    (job,) = built_jobs
    assert job.polls > 10
    assert len(engine_reads) == job.scrapes == job.polls
    assert engine_reads == job.poll_times
    independent_reads = len(engine_reads)
    engine_reads.clear()
    run(load_scenario("multi-client").scaled(0.2))
    assert len(engine_reads) > 3 * independent_reads  # four clients, each reading the page at each of its polls


def test_jobs_named_per_client_and_an_independent_client(built_jobs: list[SimJob], engine_reads: list[float]) -> None:
    result = run(job_scenario(job=["a", "a", "b", ""]))
    assert [(job.name, job.config.floor) for job in built_jobs] == [("a", 8), ("b", 4)]
    independent = result.trace.clients[3].poll_times
    assert len(engine_reads) == sum(job.polls for job in built_jobs) + len(independent)
    assert all(c.completions[-1] > 0 for c in result.trace.clients)


def test_beside_other_processes_each_job_first_polls_at_its_own_phase(built_jobs: list[SimJob]) -> None:
    """Coordinators are separate processes: beside another job or an independent client, a job's first poll comes
    at a moment of its first poll interval, as an independent client's does; a job alone polls at once."""
    scenario = job_scenario(job=["a", "a", "b", "b"])
    run(scenario)
    firsts = [job.poll_times[0] for job in built_jobs]
    assert len(firsts) == 2 and all(0 < t < scenario.clients.poll_s for t in firsts)
    assert firsts[0] != firsts[1]
    built_jobs.clear()
    run(job_scenario(job=["a", "a", "a", ""]))
    assert 0 < built_jobs[0].poll_times[0] < scenario.clients.poll_s  # beside an independent client
    built_jobs.clear()
    run(job_scenario())
    assert built_jobs[0].poll_times[0] == 0.0


def test_grants_stay_within_the_target_plus_what_drains(monkeypatch: pytest.MonkeyPatch) -> None:
    """After every request or renewal the permits out (the sum of what the workers hold) are at most the target,
    or what was out before the call when that was more: a cut drains as calls end, and no grant adds to it."""
    checked: list[tuple[int, int]] = []

    def checking(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(book: LeaseBook, *args: Any, **kwargs: Any) -> Any:
            before = book.inflight() + kwargs.get("inflight", 0)  # calls a (re)joining worker already runs
            grant = method(book, *args, **kwargs)
            assert book.inflight() <= max(book.target, before)
            checked.append((book.inflight(), book.target))
            return grant

        return call

    monkeypatch.setattr(LeaseBook, "request", checking(LeaseBook.request))
    monkeypatch.setattr(LeaseBook, "renew", checking(LeaseBook.renew))
    books: list[LeaseBook] = []
    set_target = LeaseBook.set_target

    def noting(book: LeaseBook, *args: Any, **kwargs: Any) -> None:
        books.append(book)
        set_target(book, *args, **kwargs)

    monkeypatch.setattr(LeaseBook, "set_target", noting)
    run(job_scenario())
    assert len(checked) > 100
    assert max(target for _, target in checked) > 4 * 4  # the job grew past its floor
    book = books[-1]
    ledger = book.ledger()
    assert ledger.granted == ledger.returned + ledger.expired + ledger.outstanding
    assert ledger.expired == 0  # every worker renewed in time


@dataclasses.dataclass
class BookLog:
    """What a job's lease book was told at each poll, and what each renewal granted."""

    polls: list[tuple[float, int, set[str], float | None]]  # when, the target, the workers held, decide_in
    grants: list[tuple[float, str, int]]  # when, to whom, the job's target it named


@pytest.fixture
def book_log(monkeypatch: pytest.MonkeyPatch) -> BookLog:
    log = BookLog([], [])
    set_target, renew = LeaseBook.set_target, LeaseBook.renew

    def noting(book: LeaseBook, *args: Any, **kwargs: Any) -> None:
        set_target(book, *args, **kwargs)
        log.polls.append((kwargs["now"], book.target, set(book.shares()), kwargs.get("decide_in")))

    def renewing(book: LeaseBook, *args: Any, **kwargs: Any) -> Grant:
        grant = renew(book, *args, **kwargs)
        log.grants.append((kwargs["now"], grant.worker, grant.job_target))
        return grant

    monkeypatch.setattr(LeaseBook, "set_target", noting)
    monkeypatch.setattr(LeaseBook, "renew", renewing)
    return log


def test_a_new_target_reaches_every_worker_within_a_renewal_interval(book_log: BookLog) -> None:
    """Within one renewal interval (half the lease, one poll interval here) after a poll that changed the target,
    every worker of the job renews, so its next grant names that target (or a later poll's)."""
    scenario = job_scenario()
    run(scenario)
    polls = book_log.polls
    interval = scenario.clients.poll_s  # the lease is two polls, a renewal interval one
    changed = [poll for poll, before in zip(polls[1:], polls[:-1], strict=True) if poll[1] != before[1]]
    changed = [poll for poll in changed if poll[0] + interval <= scenario.duration_s]  # an interval left to run
    assert len(changed) > 5
    for at, target, workers, _ in changed:
        told = {w for when, w, _ in book_log.grants if at <= when <= at + interval + 1e-9}
        assert told == workers, (at, target)


def test_a_first_ramp_step_reaches_every_worker_before_the_jobs_next_poll(book_log: BookLog) -> None:
    """While the job's runtime polls sooner than a renewal interval (its first ramp), each worker renews just after
    each poll, so the step a ramp poll took is in every worker's hands before the next poll judges it: the job
    leaves its floor at its first ramp poll, as one client would."""
    scenario = job_scenario()
    run(scenario)
    ramp = [(at, target, gap) for at, target, _, gap in book_log.polls if gap is not None]
    assert len(ramp) >= 2 and ramp[0][0] < scenario.clients.poll_s  # the job's first ramp polls fast
    assert len(ramp) < len(book_log.polls) / 2  # and only it: the regular polls leave the renewals on their interval
    assert all(gap < scenario.clients.poll_s / 2 for _, _, gap in ramp)
    workers = {w for _, w, _ in book_log.grants}
    assert len(workers) == scenario.clients.count
    for at, target, gap in ramp:
        told = {w for when, w, named in book_log.grants if at <= when <= at + gap and named == target}
        assert told == workers, (at, target)
    assert ramp[1][1] > 4 * scenario.clients.count  # the step left the floor


def test_a_worker_granted_no_permit_starts_no_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grant of 0 (the target is split among others, or still held by workers whose share fell) closes the
    worker's admission, as ray_job.py's does: none of its calls starts until a later grant opens it."""
    last: dict[str, int] = {}
    zero_grants: list[str] = []
    started_closed: list[str] = []
    granted, submit = SimJob._granted, SimClient._submit

    def noting(job: SimJob, client: SimClient, grant: Grant) -> None:
        last[client.name] = grant.permits
        if grant.permits == 0:
            zero_grants.append(client.name)
        granted(job, client, grant)

    def submitting(client: SimClient, request: Any) -> None:
        if last.get(client.name) == 0:
            started_closed.append(client.name)
        submit(client, request)

    monkeypatch.setattr(SimJob, "_granted", noting)
    monkeypatch.setattr(SimClient, "_submit", submitting)
    result = run(job_scenario())
    assert zero_grants  # the run holds the case
    assert started_closed == []
    assert result.summary["goodput"] > 0  # and the workers went on once their grants opened


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        (3, "clients.job = 3: must be a name"),
        ("", 'clients.job = "": must be a name'),
        (True, "clients.job = true: must be a name"),
        (["a", "b"], "clients.job has 2 entries: one per client (count = 4)"),
        (["a", "a", 1, "b"], 'clients.job = ["a", "a", 1, "b"]: must be a name'),
    ],
)
def test_a_bad_job_is_refused_naming_the_key(job: object, expected: str) -> None:
    with pytest.raises(ValueError) as error:
        scenario_from_dict({"name": "x", "clients": {"count": 4, "job": job}})
    assert expected in str(error.value)


def test_the_command_line_refuses_a_bad_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\n[clients]\ncount = 2\njob = ["a"]\n')
    assert main(["sim", str(path), "--no-oracle", "--quiet"]) == 2
    assert "clients.job has 1 entries" in capsys.readouterr().err


def test_fleet_1000_jobs_is_fleet_1000_in_a_hundred_jobs_of_ten(
    built_jobs: list[SimJob], engine_reads: list[float]
) -> None:
    jobs, fleet = load_scenario("fleet-1000-jobs"), load_scenario("fleet-1000")
    assert list(job_groups(jobs.clients).values()) == [list(range(k, k + 10)) for k in range(0, 1000, 10)]
    independent = dataclasses.replace(jobs.clients, job=None)
    assert dataclasses.replace(jobs, name=fleet.name, description=fleet.description, clients=independent) == fleet
    # A few simulated seconds of all 1,000 clients: a hundred jobs read the fleet, not a thousand clients.
    trace = lab_run.simulate(dataclasses.replace(jobs, duration_s=4.0), policy_factory=lambda: load_policy("adaptive"))
    assert len(trace.clients) == 1000 and trace.running[-1] > 0
    assert len(built_jobs) == 100 and {job.config.floor for job in built_jobs} == {40}
    assert len(engine_reads) == sum(job.polls for job in built_jobs) < 1000
