"""Catch-up, starting deadline, overlap policies and the shard lease, against moto with a fixed clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from duetime.config.deps import Deps
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.errors import StartRejectedError
from duetime.domain.models import (
    CatchUpPolicy,
    ContainerTask,
    OverlapPolicy,
    RunMessage,
    RunState,
    ScheduleSpec,
    Trigger,
)
from duetime.services import claims, jobs, runs
from duetime.services.sessions import WorkerSession
from duetime.services.sweeper import sweep
from tests.conftest import T0
from tests.helpers import drain


def _job(deps: Deps, *, every: str = "rate(5 minutes)", **kw):
    request = CreateJobRequest(
        name="p", schedule=ScheduleSpec(expression=every), task=ContainerTask(command=["true"]), **kw
    )
    return jobs.create_job(request, tenant="t1", deps=deps)


def _due_states(deps: Deps, job_id: str) -> list[tuple[int, str, str]]:
    """(minutes after T0, state, trigger) of every run, oldest first."""
    return [
        (int((r.due_at - T0).total_seconds() // 60), r.state.value, r.trigger.value)
        for r in reversed(deps.store.list_runs(job_id, limit=100))
    ]


# ---- catch-up ------------------------------------------------------------------------------------------
def test_catch_up_all_backfills_every_missed_slot_up_to_its_bound(deps: Deps, clock) -> None:
    # Given a 5-minute job whose ticks stopped for an hour, with catch-up `all` bounded to 4 runs
    job = _job(deps, catch_up=CatchUpPolicy(policy="all", max_runs=4))
    clock.advance(3600 + 90)  # every slot, the latest included, is more than the 60 s tolerance late
    # When the tick comes back
    result = claims.tick(job.shard, deps)
    # Then the 4 most recent missed slots run (3 as backfill, the latest as schedule) and 8 are skipped
    assert _due_states(deps, job.job_id) == [
        (45, "PENDING", "backfill"),
        (50, "PENDING", "backfill"),
        (55, "PENDING", "backfill"),
        (60, "PENDING", "schedule"),
    ]
    assert result.claimed == 4 and result.missed == 8
    stored = deps.store.get_job(job.job_id)
    assert (
        stored is not None and stored.next_fire_at == T0 + timedelta(minutes=65) and stored.missed_slots == 8
    )


def test_catch_up_none_skips_to_the_next_future_slot(deps: Deps, clock) -> None:
    job = _job(deps, catch_up=CatchUpPolicy(policy="none"))
    clock.advance(3600 + 90)
    result = claims.tick(job.shard, deps)
    assert deps.store.list_runs(job.job_id) == []
    assert result.missed == 12
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and stored.next_fire_at == T0 + timedelta(minutes=65)


def test_a_starting_deadline_drops_missed_slots_older_than_it(deps: Deps, clock) -> None:
    # Given catch-up `all` but a 12-minute starting deadline, after an hour of outage
    job = _job(deps, catch_up=CatchUpPolicy(policy="all"), starting_deadline_seconds=720)
    clock.advance(3600 + 30)
    claims.tick(job.shard, deps)
    # Then only slots within 12 minutes of now are run
    assert [m for m, _, _ in _due_states(deps, job.job_id)] == [50, 55, 60]


def test_a_run_not_started_by_its_deadline_is_skipped_by_the_worker(deps: Deps, clock) -> None:
    # Given a run-now job with a 30 s starting deadline whose message arrives 31 s late
    job = jobs.create_job(
        CreateJobRequest(name="d", task=ContainerTask(command=["true"]), starting_deadline_seconds=30),
        tenant="t1",
        deps=deps,
    )
    [run] = deps.store.list_runs(job.job_id)
    clock.advance(31)
    with pytest.raises(StartRejectedError):
        runs.start(RunMessage(job_id=job.job_id, due_at=run.due_at, attempt=1), deps, owner="w")
    [run] = deps.store.list_runs(job.job_id)
    assert (run.state, run.error) == (RunState.SKIPPED, "starting_deadline_exceeded")


def test_the_sweeper_skips_a_pending_run_past_its_deadline_instead_of_resending(deps: Deps, clock) -> None:
    job = jobs.create_job(
        CreateJobRequest(name="d", task=ContainerTask(command=["true"]), starting_deadline_seconds=30),
        tenant="t1",
        deps=deps,
    )
    drain(deps.settings.queue_url("small"))  # the message is lost
    clock.advance(31)
    result = sweep(job.shard, deps)
    assert (result.deadline_skipped, result.resent) == (1, 0)
    assert deps.store.list_runs(job.job_id)[0].state is RunState.SKIPPED


# ---- overlap -------------------------------------------------------------------------------------------
def _two_due_runs(deps: Deps, clock, policy: OverlapPolicy, session: WorkerSession | None = None):
    """A 1-minute job with ``policy``; its first run RUNNING (started under ``session``, held by it, if
    given), its second due and PENDING."""
    job = _job(deps, every="rate(1 minute)", overlap=policy)
    first = deps.store.list_runs(job.job_id)[0]
    clock.advance(60)
    running = runs.start(
        RunMessage(job_id=job.job_id, due_at=first.due_at, attempt=1, overlap=True),
        deps,
        owner="A",
        session_id=session.session_id if session is not None else None,
    )
    if session is not None:
        session.hold(running)
    claims.tick(job.shard, deps)
    second = deps.store.list_runs(job.job_id)[0]
    assert second.due_at == first.due_at + timedelta(minutes=1) and second.state is RunState.PENDING
    drain(deps.settings.queue_url("small"))
    return job, running, second


def test_overlap_skip_records_the_new_run_skipped(deps: Deps, clock) -> None:
    job, running, second = _two_due_runs(deps, clock, OverlapPolicy(policy="skip"))
    clock.advance(60)
    with pytest.raises(StartRejectedError):
        runs.start(runs.message_for(second), deps, owner="B")
    after = deps.store.get_run(job.job_id, second.due_at)
    assert after is not None and after.state is RunState.SKIPPED and "still active" in (after.error or "")


def test_overlap_allow_lets_runs_overlap(deps: Deps, clock) -> None:
    job, running, second = _two_due_runs(deps, clock, OverlapPolicy(policy="allow"))
    clock.advance(60)
    started = runs.start(runs.message_for(second), deps, owner="B")
    assert started.state is RunState.RUNNING


def test_overlap_buffer_one_waits_then_starts_when_the_active_run_ends(deps: Deps, clock) -> None:
    job, running, second = _two_due_runs(deps, clock, OverlapPolicy(policy="buffer_one"))
    clock.advance(60)
    # When the second run's worker tries to start it while the first runs: it waits, PENDING
    with pytest.raises(StartRejectedError):
        runs.start(runs.message_for(second), deps, owner="B")
    waiting = deps.store.get_run(job.job_id, second.due_at)
    assert waiting is not None and waiting.state is RunState.PENDING
    # And a third run due meanwhile is skipped: the buffer holds one
    claims.tick(job.shard, deps)
    third = deps.store.list_runs(job.job_id)[0]
    drain(deps.settings.queue_url("small"))
    with pytest.raises(StartRejectedError):
        runs.start(runs.message_for(third), deps, owner="C")
    assert deps.store.get_run(job.job_id, third.due_at).state is RunState.SKIPPED
    # When the first run finishes, the waiting one is woken at once and starts
    runs.finish(running, deps, fencing_token=running.fencing_token, outcome=RunState.SUCCEEDED, exit_code=0)
    [wake_up] = drain(deps.settings.queue_url("small"))
    assert wake_up["due_at"].startswith(second.due_at.strftime("%Y-%m-%dT%H:%M")) and wake_up["attempt"] == 1
    started = runs.start(runs.message_for(second), deps, owner="B")
    assert started.state is RunState.RUNNING


def test_overlap_cancel_previous_cancels_and_fences_the_active_run(deps: Deps, clock) -> None:
    session = WorkerSession(deps, "A", monotonic=lambda: clock.now().timestamp())
    job, running, second = _two_due_runs(deps, clock, OverlapPolicy(policy="cancel_previous"), session)
    clock.advance(60)
    started = runs.start(runs.message_for(second), deps, owner="B")
    assert started.state is RunState.RUNNING
    cancelled = deps.store.get_run(job.job_id, running.due_at)
    assert cancelled is not None and cancelled.state is RunState.CANCELLED
    assert cancelled.fencing_token == running.fencing_token + 1
    assert [(a.attempt, a.state, a.reason) for a in cancelled.attempts] == [
        (1, RunState.CANCELLED, "cancelled")
    ]
    # the cancelled run's worker is told through the fence: its session's next beat finds it cancelled
    session.beat()
    lost = session.lost(running.run_id)
    assert lost is not None and lost.cancelled is not None
    # and its finish is rejected
    with pytest.raises(runs.LeaseLostError):
        runs.finish(
            running, deps, fencing_token=running.fencing_token, outcome=RunState.SUCCEEDED, exit_code=0
        )
    stored = deps.store.get_run(job.job_id, running.due_at)
    assert stored is not None and stored.state is RunState.CANCELLED


def test_max_concurrency_two_lets_two_run_and_the_third_wait(deps: Deps, clock) -> None:
    job, running, second = _two_due_runs(deps, clock, OverlapPolicy(policy="allow", max_concurrency=2))
    clock.advance(60)
    runs.start(runs.message_for(second), deps, owner="B")
    claims.tick(job.shard, deps)
    third = deps.store.list_runs(job.job_id)[0]
    with pytest.raises(StartRejectedError):
        runs.start(runs.message_for(third), deps, owner="C")
    assert deps.store.get_run(job.job_id, third.due_at).state is RunState.PENDING


# ---- shard lease ---------------------------------------------------------------------------------------
def test_a_second_tick_on_a_leased_shard_does_nothing_until_the_lease_lapses(deps: Deps, clock) -> None:
    job = _job(deps)
    clock.advance(270)
    assert deps.store.acquire_shard_lease(job.shard, owner="other", now=clock.now(), lease_seconds=60)
    busy = claims.tick(job.shard, deps)
    assert busy.busy and busy.claimed == 0
    clock.advance(60)  # the other tick died; its lease lapses after one period
    taken = claims.tick(job.shard, deps)
    assert not taken.busy and taken.claimed == 1


def test_a_tick_with_nothing_due_takes_no_lease(deps: Deps, clock) -> None:
    # Given a job due in 5 minutes, beyond the lookahead, and the shard's lease held by another tick
    job = _job(deps)
    assert deps.store.acquire_shard_lease(job.shard, owner="other", now=clock.now(), lease_seconds=60)
    # When its shard ticks now
    idle = claims.tick(job.shard, deps, owner="idle")
    # Then the tick read the due index, found nothing due and stopped there: not busy (it never asked for
    # the lease), and the other tick still holds it
    assert (idle.claimed, idle.busy) == (0, False)
    assert not deps.store.acquire_shard_lease(job.shard, owner="third", now=clock.now(), lease_seconds=60)
    # and once the job is due, a tick sees it and finds the shard's lease held
    clock.advance(270)
    assert deps.store.acquire_shard_lease(job.shard, owner="other", now=clock.now(), lease_seconds=60)
    assert claims.tick(job.shard, deps, owner="late").busy


def test_a_sub_tick_rate_job_gets_every_slot_in_the_lookahead(deps: Deps, clock) -> None:
    # Given rate(20 seconds) with a 60 s tick and 15 s margin: the lookahead holds 3 slots
    job = _job(deps, every="rate(20 seconds)")
    assert [m for m in (r.due_at - T0 for r in deps.store.list_runs(job.job_id))] == [
        timedelta(seconds=60),
        timedelta(seconds=40),
        timedelta(seconds=20),
    ]
    clock.advance(60)
    claims.tick(job.shard, deps)
    dues = sorted((r.due_at - T0).total_seconds() for r in deps.store.list_runs(job.job_id, limit=50))
    assert dues == [20, 40, 60, 80, 100, 120]
    assert all(r.trigger is Trigger.SCHEDULE for r in deps.store.list_runs(job.job_id, limit=50))
