"""Two claimers of one slot, two starters of one attempt: exactly one wins, the other is told so."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import pytest

from duetime.domain.errors import AlreadyClaimedError, JobExistsError, StaleClaimError, StartRejectedError
from duetime.domain.models import JobState, RunState
from duetime.domain.ports import JobAdvance
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import MS, make_job, make_run, put_run, start

R = TypeVar("R")
RACERS = 8


def race(n: int, attempt: Callable[[int], R], lost: type[Exception]) -> tuple[list[R], list[int]]:
    """``attempt(i)`` in ``n`` real threads released at once; returns (the winners' results, the losers)."""
    barrier = threading.Barrier(n)
    won: list[R] = []
    losers: list[int] = []
    errors: list[BaseException] = []

    def go(i: int) -> None:
        barrier.wait()
        try:
            won.append(attempt(i))
        except lost:
            losers.append(i)
        except BaseException as exc:  # noqa: BLE001 - reported below, not swallowed
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return won, losers


# ---- claim step 1: the run row ---------------------------------------------------------------------------
def test_a_second_put_of_the_same_run_raises_already_claimed_and_keeps_the_first(adapters: Adapters) -> None:
    job = make_job("claimed")
    first = make_run(job, T0)
    adapters.store.put_new_run(first)
    with pytest.raises(AlreadyClaimedError):
        adapters.store.put_new_run(first.model_copy(update={"missed_slots": 7}))
    assert adapters.store.get_run(job.job_id, T0) == first


def test_runs_of_one_job_at_other_due_times_are_other_claims(adapters: Adapters) -> None:
    job = make_job("slots")
    put_run(adapters.store, job, T0)
    put_run(adapters.store, job, T0 + MS)  # one millisecond later: another slot
    assert [r.due_at for r in adapters.store.list_runs(job.job_id)] == [T0 + MS, T0]


def test_of_eight_racing_claimers_of_one_slot_exactly_one_puts_the_run(adapters: Adapters) -> None:
    job = make_job("raced-claim")
    runs = [make_run(job, T0, missed_slots=i) for i in range(RACERS)]
    won, lost = race(RACERS, lambda i: adapters.store.put_new_run(runs[i]) or i, AlreadyClaimedError)
    assert len(won) == 1 and len(lost) == RACERS - 1
    assert adapters.store.get_run(job.job_id, T0) == runs[won[0]]


def test_a_batch_put_inserts_the_new_runs_and_reports_the_existing_ones_in_order(adapters: Adapters) -> None:
    job = make_job("batch-claim")
    earlier = put_run(adapters.store, job, T0 + MS)  # an earlier, crashed claim inserted this one
    runs = [make_run(job, T0 + i * MS, missed_slots=i) for i in range(4)]
    assert adapters.store.put_new_runs(runs) == [True, False, True, True]
    assert adapters.store.get_run(job.job_id, T0 + MS) == earlier  # the stored run is kept
    assert [r.due_at for r in adapters.store.list_runs(job.job_id)] == [T0 + i * MS for i in (3, 2, 1, 0)]
    assert adapters.store.put_new_runs(runs) == [False] * 4
    assert adapters.store.put_new_runs([]) == []


def test_racing_batch_puts_of_the_same_runs_insert_each_run_exactly_once(adapters: Adapters) -> None:
    jobs = [make_job(f"batch-race-{i}") for i in range(5)]
    runs = [make_run(job, T0) for job in jobs]

    # half the claimers put them in one order, half in the other
    def claim(i: int) -> dict[str, bool]:
        batch = runs if i % 2 else runs[::-1]
        return dict(zip([r.run_id for r in batch], adapters.store.put_new_runs(batch), strict=True))

    won, lost = race(RACERS, claim, AlreadyClaimedError)
    assert (len(won), lost) == (RACERS, [])  # a batch never raises for a run that exists
    # every run inserted by exactly one of the eight claimers
    for run in runs:
        assert sum(flags[run.run_id] for flags in won) == 1, run.run_id
    assert all(adapters.store.get_run(r.job_id, T0) == r for r in runs)


# ---- claim step 2: the job's next fire -------------------------------------------------------------------
def test_a_batch_advance_applies_each_unless_its_claim_is_stale(adapters: Adapters) -> None:
    fresh, moved, done = (make_job(n, next_fire_at=T0) for n in ("adv-fresh", "adv-moved", "adv-done"))
    for job in (fresh, moved, done):
        adapters.store.put_new_job(job)
    adapters.store.advance(moved.job_id, claimed=T0, next_fire_at=T0 + timedelta(minutes=1), now=T0)
    later = T0 + timedelta(minutes=5)
    applied = adapters.store.advance_many(
        [
            JobAdvance(fresh.job_id, T0, later, missed=3),
            JobAdvance(moved.job_id, T0, later),  # another claimer moved it first
            JobAdvance(done.job_id, T0, None),
            JobAdvance("no-such-job", T0, later),
        ],
        now=T0 + MS,
    )
    assert applied == [True, False, True, False]
    a, b, c = (adapters.store.get_job(j.job_id) for j in (fresh, moved, done))
    assert a is not None and (a.next_fire_at, a.missed_slots, a.updated_at) == (later, 3, T0 + MS)
    assert b is not None and b.next_fire_at == T0 + timedelta(minutes=1)
    assert c is not None and (c.state, c.next_fire_at) == (JobState.COMPLETED, None)
    assert adapters.store.advance_many([], now=T0) == []


def test_advance_with_a_stale_claim_raises_and_leaves_the_job(adapters: Adapters) -> None:
    job = make_job("advance", next_fire_at=T0)
    adapters.store.put_new_job(job)
    adapters.store.advance(job.job_id, claimed=T0, next_fire_at=T0 + timedelta(minutes=5), now=T0, missed=2)
    after = adapters.store.get_job(job.job_id)
    assert after is not None
    assert (after.next_fire_at, after.missed_slots, after.updated_at) == (T0 + timedelta(minutes=5), 2, T0)
    # a second claimer that read next_fire_at = T0 is too late
    with pytest.raises(StaleClaimError):
        adapters.store.advance(
            job.job_id, claimed=T0, next_fire_at=T0 + timedelta(minutes=5), now=T0 + MS, missed=1
        )
    assert adapters.store.get_job(job.job_id) == after


def test_advance_to_no_next_fire_completes_the_job(adapters: Adapters) -> None:
    job = make_job("last-fire", next_fire_at=T0)
    adapters.store.put_new_job(job)
    adapters.store.advance(job.job_id, claimed=T0, next_fire_at=None, now=T0)
    done = adapters.store.get_job(job.job_id)
    assert done is not None and (done.state, done.next_fire_at) == (JobState.COMPLETED, None)
    with pytest.raises(StaleClaimError):
        adapters.store.advance(job.job_id, claimed=T0, next_fire_at=None, now=T0)


def test_of_eight_racing_advances_of_one_claim_exactly_one_wins(adapters: Adapters) -> None:
    job = make_job("raced-advance", next_fire_at=T0)
    adapters.store.put_new_job(job)

    def advance(i: int) -> int:
        adapters.store.advance(
            job.job_id, claimed=T0, next_fire_at=T0 + timedelta(minutes=5, milliseconds=i), now=T0, missed=1
        )
        return i

    won, lost = race(RACERS, advance, StaleClaimError)
    assert len(won) == 1 and len(lost) == RACERS - 1
    after = adapters.store.get_job(job.job_id)
    assert after is not None
    assert (after.next_fire_at, after.missed_slots) == (T0 + timedelta(minutes=5, milliseconds=won[0]), 1)


def test_a_second_put_of_the_same_job_raises_job_exists(adapters: Adapters) -> None:
    job = make_job("taken")
    adapters.store.put_new_job(job)
    with pytest.raises(JobExistsError):
        adapters.store.put_new_job(job.model_copy(update={"name": "another"}))
    assert adapters.store.get_job(job.job_id) == job


# ---- the start: PENDING -> RUNNING -----------------------------------------------------------------------
def test_two_starts_of_one_attempt_one_runs_with_token_1_the_other_is_rejected(adapters: Adapters) -> None:
    job = make_job("started")
    run = put_run(adapters.store, job, T0)
    running = start(adapters.store, run, now=T0, owner="w1")
    assert (running.state, running.attempt, running.fencing_token) == (RunState.RUNNING, 1, 1)
    assert (running.lease_owner, running.started_at) == ("w1", T0)
    assert running.lease_expires_at == T0 + timedelta(seconds=30)
    with pytest.raises(StartRejectedError):
        start(adapters.store, run, now=T0 + MS, owner="w2")
    assert adapters.store.get_run(job.job_id, T0) == running


def test_of_eight_racing_starts_of_one_attempt_exactly_one_wins(adapters: Adapters) -> None:
    job = make_job("raced-start")
    run = put_run(adapters.store, job, T0)
    won, lost = race(RACERS, lambda i: start(adapters.store, run, now=T0, owner=f"w{i}"), StartRejectedError)
    assert len(won) == 1 and len(lost) == RACERS - 1
    [winner] = won
    assert (winner.state, winner.fencing_token) == (RunState.RUNNING, 1)
    assert adapters.store.get_run(job.job_id, T0) == winner
    assert winner.lease_owner == f"w{next(i for i in range(RACERS) if i not in lost)}"


def test_a_start_at_another_attempt_than_the_pending_one_is_rejected(adapters: Adapters) -> None:
    job = make_job("wrong-attempt")
    run = put_run(adapters.store, job, T0)
    for attempt in (2, 3):
        with pytest.raises(StartRejectedError):
            start(adapters.store, run, now=T0, attempt=attempt)
    assert adapters.store.get_run(job.job_id, T0) == run


def test_a_first_attempt_starts_until_its_starting_deadline_and_not_after(adapters: Adapters) -> None:
    job = make_job("deadline", starting_deadline_seconds=30)
    late = put_run(adapters.store, job, T0)
    on_time = put_run(adapters.store, job, T0 + timedelta(minutes=5))
    assert late.start_deadline_at == T0 + timedelta(seconds=30)
    with pytest.raises(StartRejectedError):
        start(adapters.store, late, now=T0 + timedelta(seconds=30) + MS)
    assert adapters.store.get_run(job.job_id, T0) == late
    # exactly at the deadline it still starts
    deadline = on_time.start_deadline_at
    assert deadline is not None
    assert start(adapters.store, on_time, now=deadline).state is RunState.RUNNING


def test_a_held_run_does_not_start(adapters: Adapters) -> None:
    job = make_job("held-start")
    run = put_run(adapters.store, job, T0)
    held = adapters.store.hold(job.job_id, T0, reason="paused", now=T0, recheck_at=T0 + timedelta(minutes=1))
    assert held is not None and held.held == "paused"
    with pytest.raises(StartRejectedError):
        start(adapters.store, run, now=T0)
    assert adapters.store.get_run(job.job_id, T0) == held


def test_a_terminal_run_does_not_start(adapters: Adapters) -> None:
    job = make_job("skipped-start")
    run = put_run(adapters.store, job, T0)
    assert adapters.store.skip_pending(job.job_id, T0, attempt=1, reason="missed", now=T0) is not None
    with pytest.raises(StartRejectedError):
        start(adapters.store, run, now=T0)
    with pytest.raises(StartRejectedError):
        start(adapters.store, run, now=T0, attempt=2)


def test_a_start_of_a_run_that_does_not_exist_is_rejected(adapters: Adapters) -> None:
    run = make_run(make_job("nowhere"), T0)
    with pytest.raises(StartRejectedError):
        start(adapters.store, run, now=T0)
    assert adapters.store.get_run(run.job_id, T0) is None
