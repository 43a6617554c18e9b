"""A tick of several processes (``tick_processes``) against moto's server running in this process.

The children are forked, so they cannot share an in-process mock (each would write its own copy): they reach
moto over HTTP, on a server thread of the test process, as a tick reaches DynamoDB and SQS.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.resources import ResourceNames, due_part
from duetime.config.deps import Deps, deps_from_settings
from duetime.domain.clock import FixedClock
from duetime.domain.models import Job, Run, run_id_for
from duetime.domain.timeutil import from_iso
from duetime.services.claims import tick
from tests.conftest import T0, make_settings
from tests.contract.factories import make_job
from tests.helpers import drain, moto_server_thread

#: due jobs of shard 0, all due now (their messages go out undelayed, so they can be counted)
JOBS = 40


@pytest.fixture
def moto_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's server (DynamoDB requests serialised, as the local stack runs it) on a thread of this process; its URL
    is every client's endpoint, with fake credentials only."""
    with moto_server_thread(monkeypatch) as (server, _):
        yield f"http://127.0.0.1:{server.effective_port}"


@pytest.fixture
def deps(moto_server: str) -> Deps:
    names = ResourceNames.for_prefix(f"procs{os.getpid()}")
    settings = make_settings(names, claim_batch_size=5, claim_concurrency=2, tick_processes=2)
    return deps_from_settings(settings, FixedClock(T0))


def _put_due_jobs(deps: Deps) -> list[Job]:
    jobs = [make_job(f"job-{i:02d}", shard=0, next_fire_at=T0) for i in range(JOBS)]
    for job in jobs:
        deps.store.put_new_job(job)
    # the split is by job: both halves of the shard hold some (so both processes must claim for all to be)
    assert {due_part(j.job_id) % 2 for j in jobs} == {0, 1}
    return jobs


def _runs(deps: Deps) -> Counter[str]:
    """How many run rows each job has."""
    items = aws.client("dynamodb").scan(TableName=deps.settings.runs_table)["Items"]
    return Counter(i["job_id"]["S"] for i in items)


def _messages(deps: Deps) -> Counter[str]:
    """How many messages each run has in the small tier's queue (received and deleted), by run id."""
    bodies = drain(deps.settings.queue_url("small"))
    return Counter(run_id_for(b["job_id"], from_iso(b["due_at"])) for b in bodies)


def _advanced(deps: Deps, jobs: list[Job]) -> bool:
    later = T0 + timedelta(minutes=5)
    return all((deps.store.get_job(j.job_id) or j).next_fire_at == later for j in jobs)


def test_a_tick_of_two_processes_claims_every_due_job_exactly_once(deps: Deps) -> None:
    # Given 40 due jobs of shard 0
    jobs = _put_due_jobs(deps)
    # When a tick of two processes claims the shard
    result = tick(0, deps)
    # Then every job has one run, one message and its next fire, and the counts came back from both
    assert (result.claimed, result.already_claimed, result.errors, result.busy) == (JOBS, 0, 0, False)
    assert _runs(deps) == Counter(j.job_id for j in jobs)
    messages = _messages(deps)
    assert sorted(messages) == sorted(result.run_ids) and set(messages.values()) == {1}
    assert _advanced(deps, jobs)
    # And the parent released the shard's lease: the next tick takes it and finds nothing due
    again = tick(0, deps)
    assert (again.busy, again.claimed, again.already_claimed) == (False, 0, 0)


class _DiesAfterWritingRuns:
    """The store of a child process that dies right after claim step 1 of the batch holding ``victim``
    (its runs written, the jobs not advanced, no message sent); ``hang`` instead sleeps there."""

    def __init__(self, store: Any, victim: str, parent: int, *, hang: bool = False) -> None:
        self._store, self._victim, self._parent, self._hang = store, victim, parent, hang

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def put_new_runs(self, runs: list[Run]) -> list[bool]:
        written = self._store.put_new_runs(runs)
        if os.getpid() != self._parent and any(r.job_id == self._victim for r in runs):
            if self._hang:
                time.sleep(60)
            os._exit(9)
        return written


@pytest.mark.parametrize("hang", [False, True], ids=["crashed", "hung"])
def test_a_child_lost_mid_tick_loses_no_run_and_the_next_tick_claims_the_rest_once(
    deps: Deps, hang: bool
) -> None:
    # Given 40 due jobs, and a tick whose child claiming job-07 dies (or hangs) after writing its batch's
    # runs
    jobs = _put_due_jobs(deps)
    faulty = Deps(
        settings=deps.settings.model_copy(update={"claim_concurrency": 1}),  # dies at a known step
        store=_DiesAfterWritingRuns(deps.store, "job-07", os.getpid(), hang=hang),  # type: ignore[arg-type]
        queues=deps.queues,
        logs=deps.logs,
        clock=deps.clock,
    )
    # When the tick runs (a hung child is killed when its time is up)
    first = tick(0, faulty, child_timeout_seconds=6)
    # Then the lost child is one error, and what the other child claimed stands
    assert first.errors == 1 and 0 < first.claimed < JOBS
    # When the next tick runs
    second = tick(0, deps)
    # Then it claims the rest, finding the runs the lost child wrote (already claimed) and sending them
    assert second.errors == 0 and second.already_claimed >= 1
    assert first.claimed + second.claimed + second.already_claimed <= JOBS
    # And every job has exactly one run row, one message per run and its next fire
    assert _runs(deps) == Counter(j.job_id for j in jobs)
    messages = _messages(deps)
    assert len(messages) == JOBS and set(messages.values()) == {1}
    assert _advanced(deps, jobs)


def test_a_child_that_cannot_be_forked_is_one_error_and_the_other_parts_are_claimed(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 40 due jobs, and a machine that runs out of processes at the second fork
    jobs = _put_due_jobs(deps)
    real_fork, forks = os.fork, []

    def fork() -> int:
        forks.append(1)
        if len(forks) == 2:
            raise OSError(11, "Resource temporarily unavailable")
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    # When the tick runs
    first = tick(0, deps)
    # Then the part left unforked is one error, the other part is claimed, and the next tick claims the rest
    assert first.errors == 1 and 0 < first.claimed < JOBS
    monkeypatch.setattr(os, "fork", real_fork)
    second = tick(0, deps)
    assert (second.errors, second.already_claimed, first.claimed + second.claimed) == (0, 0, JOBS)
    assert _runs(deps) == Counter(j.job_id for j in jobs)
    assert set(_messages(deps).values()) == {1} and _advanced(deps, jobs)
