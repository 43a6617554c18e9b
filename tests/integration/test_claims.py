"""The claim path of DESIGN.md section 4 against moto: put run, advance job, send with delay."""

from __future__ import annotations

from datetime import timedelta

import pytest

from duetime.config.deps import Deps
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.models import ContainerTask, Job, JobState, RunState, ScheduleSpec
from duetime.services import claims, jobs
from tests.conftest import T0
from tests.helpers import queue_counts


def _rate_job(deps: Deps, expression: str = "rate(5 minutes)", job_id: str = "job-rate") -> Job:
    request = CreateJobRequest(
        job_id=job_id,
        name="every five",
        schedule=ScheduleSpec(expression=expression),
        task=ContainerTask(command=["true"]),
    )
    return jobs.create_job(request, tenant="t1", deps=deps)


def test_submit_of_a_far_fire_leaves_it_for_the_tick(deps: Deps) -> None:
    # Given a rate(5 minutes) job created at T0 (first fire T0+5min, beyond the 75 s lookahead)
    job = _rate_job(deps)
    # Then nothing is claimed yet and the job waits in the due index
    assert job.next_fire_at == T0 + timedelta(minutes=5)
    assert deps.store.list_runs(job.job_id) == []


def test_tick_claims_a_due_run_and_sends_it_with_its_delay(deps: Deps, clock) -> None:
    # Given the job, and a clock 4m30s later: the first fire (T0+5m) is within the lookahead
    job = _rate_job(deps)
    clock.advance(270)
    # When the job's shard ticks
    result = claims.tick(job.shard, deps)
    # Then one PENDING run exists at the due time, the job moved to the next slot, a delayed message waits
    assert result.claimed == 1
    [run] = deps.store.list_runs(job.job_id)
    assert (run.state, run.due_at, run.attempt, run.fencing_token) == (
        RunState.PENDING,
        T0 + timedelta(minutes=5),
        1,
        0,
    )
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and stored.next_fire_at == T0 + timedelta(minutes=10)
    counts = queue_counts(deps.settings.queue_url("small"))
    assert counts["delayed"] == 1 and counts["visible"] == 0


def test_a_repeated_tick_claims_nothing_twice(deps: Deps, clock) -> None:
    job = _rate_job(deps)
    clock.advance(270)
    claims.tick(job.shard, deps)
    # When the same shard ticks again at the same instant (an overlapping tick)
    again = claims.tick(job.shard, deps)
    # Then it claims nothing (the next slot is beyond the lookahead) and there is still one run, one message
    assert again.claimed == 0
    assert len(deps.store.list_runs(job.job_id)) == 1
    assert sum(queue_counts(deps.settings.queue_url("small")).values()) == 1


def test_two_ticks_racing_on_one_snapshot_make_one_run_and_one_message(deps: Deps, clock) -> None:
    # Given two ticks that both read the job before either claimed it
    job = _rate_job(deps)
    clock.advance(270)
    snapshot = next(deps.store.query_due(job.shard, clock.now() + timedelta(seconds=75)))
    first = claims.claim(snapshot, deps)
    second = claims.claim(snapshot, deps)
    # Then the second finds the run and the advanced job: no run, no advance, no message of its own
    assert (first.created, first.advanced) == (True, True)
    assert (second.created, second.advanced) == (False, False)
    assert len(deps.store.list_runs(job.job_id)) == 1
    assert sum(queue_counts(deps.settings.queue_url("small")).values()) == 1


def test_a_tick_that_crashed_after_step_one_is_repaired_by_the_next(deps: Deps, clock) -> None:
    # Given a tick that wrote the run (step 1) and died before advancing the job (step 2) and sending
    job = _rate_job(deps)
    clock.advance(270)
    snapshot = deps.store.get_job(job.job_id)
    assert snapshot is not None
    deps.store.put_new_run(
        claims.new_run(snapshot, snapshot.next_fire_at, deps, trigger=claims.Trigger.SCHEDULE)
    )
    # When the next tick runs
    result = claims.tick(job.shard, deps)
    # Then it finds the run (no second one), advances the job and sends the wake-up
    assert (result.claimed, result.already_claimed) == (0, 1)
    assert len(deps.store.list_runs(job.job_id)) == 1
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and stored.next_fire_at == T0 + timedelta(minutes=10)
    assert queue_counts(deps.settings.queue_url("small"))["delayed"] == 1


def test_run_now_job_is_claimed_by_the_submit_and_completes_the_job(deps: Deps) -> None:
    # Given a job with no schedule
    request = CreateJobRequest(name="now", task=ContainerTask(command=["echo", "hi"]))
    job = jobs.create_job(request, tenant="t1", deps=deps)
    # Then its single run is PENDING at T0, the job left the due index as COMPLETED, and the message is visible
    [run] = deps.store.list_runs(job.job_id)
    assert (run.state, run.due_at) == (RunState.PENDING, T0)
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and (stored.state, stored.next_fire_at) == (JobState.COMPLETED, None)
    assert queue_counts(deps.settings.queue_url("small"))["visible"] == 1
    assert list(deps.store.query_due(job.shard, T0 + timedelta(days=1))) == []


def test_a_one_off_due_within_the_lookahead_is_stored_claimed_and_never_enters_the_due_index(
    deps: Deps,
) -> None:
    # Given an at(...) job due 20 s from now (within the 75 s lookahead), and a counter of due-index writes
    request = CreateJobRequest(
        job_id="soon",
        name="soon",
        schedule=ScheduleSpec(expression="at(2026-11-29T12:00:20)", timezone="UTC"),
        task=ContainerTask(command=["true"]),
    )
    job = jobs.create_job(request, tenant="t1", deps=deps)
    # Then it is stored COMPLETED with its one run PENDING at its due time
    assert (job.state, job.next_fire_at) == (JobState.COMPLETED, None)
    [run] = deps.store.list_runs("soon")
    assert (run.state, run.due_at, run.job_created_at) == (RunState.PENDING, T0 + timedelta(seconds=20), T0)
    assert list(deps.store.query_due(job.shard, T0 + timedelta(days=1))) == []
    assert queue_counts(deps.settings.queue_url("small"))["delayed"] == 1


def test_a_submit_whose_job_id_is_taken_leaves_no_run_that_could_start(deps: Deps, clock) -> None:
    from duetime.domain.errors import JobExistsError
    from duetime.domain.lifecycle import message_for

    # Given a job "taken", and a second run-now submit of the same id a moment later
    first = jobs.create_job(
        CreateJobRequest(job_id="taken", name="a", task=ContainerTask(command=["true"])),
        tenant="t1",
        deps=deps,
    )
    [original] = deps.store.list_runs("taken")
    clock.advance(1)
    with pytest.raises(JobExistsError):  # a taken job id is refused
        jobs.create_job(
            CreateJobRequest(job_id="taken", name="b", task=ContainerTask(command=["false"])),
            tenant="t1",
            deps=deps,
        )
    # Then the job is the first one, untouched: the refused submit wrote no run under its id
    assert deps.store.get_job("taken") == first
    assert deps.store.list_runs("taken") == [original]
    assert original.state is RunState.PENDING
    assert message_for(original).job_created_at == first.created_at


def test_a_refused_submit_of_another_tenants_id_takes_no_slot_of_that_job(deps: Deps, clock) -> None:
    from duetime.domain.errors import JobExistsError

    # Given alice's every-minute job (its 12:01 slot claimed at its submit), and 50 s later bob submitting a
    # one-off of the same id due at alice's next slot, 12:02, within the lookahead (the kind of submit that
    # is stored already claimed)
    alice = jobs.create_job(
        CreateJobRequest(
            job_id="shared-id",
            name="alice",
            task=ContainerTask(command=["true"]),
            schedule=ScheduleSpec(expression="* * * * *", timezone="UTC"),
        ),
        tenant="alice",
        deps=deps,
    )
    claimed_at_submit = deps.store.list_runs("shared-id")
    assert [r.due_at for r in claimed_at_submit] == [T0 + timedelta(minutes=1)]
    clock.advance(50)
    slot = T0 + timedelta(minutes=2)
    with pytest.raises(JobExistsError):  # a taken job id is refused
        jobs.create_job(
            CreateJobRequest(
                job_id="shared-id",
                name="bob",
                task=ContainerTask(command=["false"]),
                schedule=ScheduleSpec(expression=f"at({slot:%Y-%m-%dT%H:%M:%S})", timezone="UTC"),
            ),
            tenant="bob",
            deps=deps,
        )
    # Then no run was written under alice's id, and her 12:02 slot is claimed by her tick, as hers
    assert deps.store.list_runs("shared-id") == claimed_at_submit
    claims.tick(alice.shard, deps)
    run = deps.store.get_run("shared-id", slot)
    assert run is not None
    assert (run.tenant, run.state, run.job_created_at) == ("alice", RunState.PENDING, alice.created_at)


def test_a_stack_down_for_many_slots_runs_the_latest_once_and_counts_the_missed(deps: Deps, clock) -> None:
    # Given a rate(5 minutes) job whose ticks stopped for an hour after creation
    job = _rate_job(deps)
    clock.advance(3600 + 90)  # the latest slot too is more than the 60 s tolerance late
    # When the tick comes back
    result = claims.tick(job.shard, deps)
    # Then one run is claimed: the most recent slot (T0+60m), with the 11 skipped slots counted
    assert result.claimed == 1
    [run] = deps.store.list_runs(job.job_id)
    assert run.due_at == T0 + timedelta(minutes=60)
    assert run.missed_slots == 11
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and stored.next_fire_at == T0 + timedelta(minutes=65)


def _count_advances(monkeypatch, deps: Deps) -> list[int]:  # type: ignore[no-untyped-def]
    """The number of job advances of each ``advance_many`` call of ``deps.store``."""
    calls: list[int] = []
    real = deps.store.advance_many

    def counting(advances, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(advances))
        return real(advances, **kwargs)

    monkeypatch.setattr(deps.store, "advance_many", counting)
    return calls


def test_every_slot_within_the_lookahead_is_one_claim_and_one_advance_of_the_job(
    deps: Deps, clock, monkeypatch
) -> None:
    # Given a rate(10 seconds) job, submitted at T0 (lookahead 75 s: 60 s tick + 15 s margin)
    advances = _count_advances(monkeypatch, deps)
    job = _rate_job(deps, "rate(10 seconds)", job_id="job-ten")
    # Then the submit claimed its seven slots T0+10s..T0+70s with one advance of the job, to T0+80s
    runs = deps.store.list_runs(job.job_id)
    assert sorted(r.due_at for r in runs) == [T0 + timedelta(seconds=10 * i) for i in range(1, 8)]
    assert all(r.state is RunState.PENDING and r.missed_slots == 0 for r in runs)
    assert advances == [1]
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and stored.next_fire_at == T0 + timedelta(seconds=80)
    assert queue_counts(deps.settings.queue_url("small"))["delayed"] == 7
    # When its shard ticks a minute later (lookahead to T0+135s)
    clock.advance(60)
    result = claims.tick(job.shard, deps)
    # Then that tick claims the six next slots, T0+80s..T0+130s, again with one advance
    assert result.claimed == 6
    assert advances == [1, 1]
    assert len(deps.store.list_runs(job.job_id)) == 13
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and stored.next_fire_at == T0 + timedelta(seconds=140)


def test_a_claim_after_an_outage_counts_the_missed_on_the_latest_late_slot_not_on_the_ones_ahead(
    deps: Deps, clock
) -> None:
    # Given a rate(1 minute) job whose ticks stopped for an hour after its submit claimed T0+1m
    job = _rate_job(deps, "rate(1 minute)", job_id="job-minute")
    clock.advance(3600 + 90)
    # When the tick comes back (lookahead to T0+61.5m+75s)
    claims.tick(job.shard, deps)
    # Then the latest late slot (T0+61m) carries the skipped count and the slot ahead (T0+62m) none
    runs = {r.due_at: r for r in deps.store.list_runs(job.job_id)}
    late, ahead = runs[T0 + timedelta(minutes=61)], runs[T0 + timedelta(minutes=62)]
    assert late.missed_slots > 0 and ahead.missed_slots == 0
    assert T0 + timedelta(minutes=63) not in runs


def test_a_tick_claims_many_jobs_at_once_each_exactly_once_and_isolates_a_failing_one(
    deps: Deps, clock, monkeypatch
) -> None:
    # Given 60 rate jobs (both shards), all due within the lookahead, and a tick 8 claims wide
    assert deps.settings.claim_concurrency == 8
    made = [_rate_job(deps, job_id=f"job-{i:02d}") for i in range(60)]
    clock.advance(270)
    # and one job whose claim fails (an unexpected error in its own claim: its whole batch fails)
    real_claim = claims.claim_batch
    threads: set[str] = set()

    def claim_batch(jobs: list[Job], deps: Deps, **kw):  # type: ignore[no-untyped-def]
        import threading

        threads.add(threading.current_thread().name)
        if any(job.job_id == "job-13" for job in jobs):
            raise RuntimeError("boom")
        return real_claim(jobs, deps, **kw)

    monkeypatch.setattr(claims, "claim_batch", claim_batch)
    # When every shard ticks
    results = [claims.tick(shard, deps) for shard in range(deps.settings.shard_count)]
    # Then every other job has exactly one PENDING run at its first fire and one message, claimed on
    # several threads; the failing job is counted and left due for the next tick
    assert sum(r.claimed for r in results) == 59 and sum(r.errors for r in results) == 1
    assert len(threads) > 1 and all(t.startswith("claim-") for t in threads)
    for job in made:
        runs = deps.store.list_runs(job.job_id)
        if job.job_id == "job-13":
            assert runs == [] and deps.store.get_job(job.job_id).next_fire_at == T0 + timedelta(minutes=5)
        else:
            assert [(r.state, r.due_at) for r in runs] == [(RunState.PENDING, T0 + timedelta(minutes=5))]
    assert queue_counts(deps.settings.queue_url("small"))["delayed"] == 59
    # And the next tick, the fault gone, claims only the one left
    monkeypatch.setattr(claims, "claim_batch", real_claim)
    again = [claims.tick(shard, deps) for shard in range(deps.settings.shard_count)]
    assert sum(r.claimed for r in again) == 1 and sum(r.already_claimed for r in again) == 0


def _sqlite_burst(tmp_path, count: int = 12, *, prefix: str = "f", due_now: bool = True):  # type: ignore[no-untyped-def]
    """Embedded deps (one shard, claims in batches of 250, a 15 s lookahead) with ``count`` one-off jobs
    ``<prefix>-000``... of tenant t1 due 30 s after T0; with ``due_now`` the clock is moved 20 s on, so
    they are within the next tick's lookahead."""
    from duetime.config.deps import sqlite_deps
    from duetime.config.settings import Settings
    from duetime.domain.clock import FixedClock

    settings = Settings(
        state_dir=str(tmp_path),
        shard_count=1,
        claim_concurrency=1,
        claim_batch_size=250,
        tick_period_seconds=10,
        tick_margin_seconds=5,
        tenant_submits_per_minute=max(600, count),
    )
    deps = sqlite_deps(settings, FixedClock(T0))
    due = T0 + timedelta(seconds=30)
    for i in range(count):
        request = CreateJobRequest(
            job_id=f"{prefix}-{i:03d}",
            name=f"{prefix} {i}",
            schedule=ScheduleSpec(expression=f"at({due:%Y-%m-%dT%H:%M:%S})"),
            task=ContainerTask(command=["true"]),
        )
        jobs.create_job(request, tenant="t1", deps=deps)
    if due_now:
        deps.clock.advance(20)  # type: ignore[attr-defined]
    return deps


def test_a_tick_on_sqlite_claims_a_burst_in_batches_of_one_transaction_per_step(
    tmp_path, monkeypatch
) -> None:
    # Given 600 one-off jobs due at one instant in the embedded store, claimed in batches of 250
    from duetime.adapters.sqlite import db as sqlite_db

    deps = _sqlite_burst(tmp_path, 600, prefix="burst", due_now=False)
    commits = 0
    real = sqlite_db.Database.transaction

    def counted(self):  # type: ignore[no-untyped-def]
        nonlocal commits
        commits += 1
        return real(self)

    monkeypatch.setattr(sqlite_db.Database, "transaction", counted)
    # When the shard ticks once the due time is within its lookahead (15 s)
    assert deps.store.list_runs("burst-000") == []
    deps.clock.advance(20)  # type: ignore[attr-defined]
    result = claims.tick(0, deps)
    # Then every job has one PENDING run and one message, the jobs are COMPLETED
    assert (result.claimed, result.already_claimed, result.errors) == (600, 0, 0)
    assert all(len(deps.store.list_runs(f"burst-{i:03d}")) == 1 for i in range(0, 600, 37))
    assert deps.queues.counts("small")["delayed"] == 600  # type: ignore[attr-defined]
    assert {deps.store.get_job(f"burst-{i:03d}").state for i in (0, 299, 599)} == {JobState.COMPLETED}  # type: ignore[union-attr]
    # in 3 batches of at most 4 transactions each (runs, advances, the tenant's counter, the messages),
    # plus the shard lease taken and released: not 4 per job
    assert commits <= 3 * 4 + 2
    # And a second tick finds nothing due
    assert claims.tick(0, deps).claimed == 0


def _fail_once(monkeypatch, obj, name: str) -> list[int]:  # type: ignore[no-untyped-def]
    """``obj.name`` raises a throttling error on its first call only; returns the call counter."""
    from duetime.domain.errors import ThrottledError

    real = getattr(obj, name)
    calls = [0]

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 1:
            raise ThrottledError("simulated: the write lock stayed taken")
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, flaky)
    return calls


def test_a_batch_send_that_fails_is_sent_message_by_message(tmp_path, monkeypatch) -> None:
    # Given a burst whose batch send is refused once (the jobs are already advanced by then)
    deps = _sqlite_burst(tmp_path)
    calls = _fail_once(monkeypatch, deps.queues, "send_batch")
    # When the shard ticks
    result = claims.tick(0, deps)
    # Then every run still gets its message (one by one: the embedded queue's send is a batch of one),
    # nothing is counted as an error
    assert calls[0] == 1 + 12
    assert (result.claimed, result.errors) == (12, 0)
    assert deps.queues.counts("small")["delayed"] == 12  # type: ignore[attr-defined]


def test_a_tenant_counter_that_fails_once_is_updated_job_by_job_and_the_messages_still_go(
    tmp_path, monkeypatch
) -> None:
    deps = _sqlite_burst(tmp_path)
    _fail_once(monkeypatch, deps.store, "add_active_jobs")
    result = claims.tick(0, deps)
    assert (result.claimed, result.errors) == (12, 0)
    assert deps.queues.counts("small")["delayed"] == 12  # type: ignore[attr-defined]


def test_a_batch_whose_runs_cannot_be_written_is_claimed_again_job_by_job(tmp_path, monkeypatch) -> None:
    # Given the runs' write (one transaction) refused once: nothing of the batch was applied
    deps = _sqlite_burst(tmp_path)
    _fail_once(monkeypatch, deps.store, "put_new_runs")
    result = claims.tick(0, deps)
    # Then the jobs are claimed one by one instead, each once
    assert (result.claimed, result.errors) == (12, 0)
    assert deps.queues.counts("small")["delayed"] == 12  # type: ignore[attr-defined]
    assert all(len(deps.store.list_runs(f"f-{i:03d}")) == 1 for i in range(12))


def test_on_dynamodb_a_write_that_fails_part_way_stops_only_its_own_job(
    deps: Deps, clock, monkeypatch
) -> None:
    # Given 10 jobs due on one shard, and one job's advance (an UpdateItem of the jobs table) throttled
    from botocore.exceptions import ClientError

    from duetime.adapters.aws import clients as aws

    made = [_rate_job(deps, job_id=f"part-{i:02d}") for i in range(30)]
    shard = made[0].shard
    mine = [j for j in made if j.shard == shard]
    victim = mine[len(mine) // 2].job_id
    clock.advance(270)
    ddb = aws.client("dynamodb")
    real = ddb.update_item

    def update_item(**kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("TableName") == deps.settings.jobs_table and victim in str(kwargs.get("Key")):
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException"}}, "UpdateItem")
        return real(**kwargs)

    monkeypatch.setattr(ddb, "update_item", update_item)
    # When the shard ticks
    result = claims.tick(shard, deps)
    # Then every other job is claimed, advanced and sent; the victim has its run but is counted an error,
    assert (result.claimed, result.errors) == (len(mine), 1)
    for job in mine:
        stored = deps.store.get_job(job.job_id)
        assert stored is not None
        moved = stored.next_fire_at == T0 + timedelta(minutes=10)
        assert moved is (job.job_id != victim), job.job_id
    # and its message went anyway (it may have been advanced: a duplicate wake-up is harmless)
    assert queue_counts(deps.settings.queue_url("small"))["delayed"] == len(mine)
    # And the next tick, the fault gone, advances it without a second run
    monkeypatch.setattr(ddb, "update_item", real)
    again = claims.tick(shard, deps)
    assert (again.claimed, again.already_claimed, again.errors) == (0, 1, 0)
    stored = deps.store.get_job(victim)
    assert stored is not None and stored.next_fire_at == T0 + timedelta(minutes=10)
    assert len(deps.store.list_runs(victim)) == 1


def test_the_runs_of_a_submit_that_failed_before_its_job_was_stored_never_start(
    deps: Deps, clock, monkeypatch
) -> None:
    from duetime.domain.lifecycle import message_for
    from duetime.services import runs
    from duetime.services.runs import NotStartedError

    # Given a run-now submit whose job put fails after its run was written (the request fails: no 201)
    request = CreateJobRequest(job_id="crashed", name="a", task=ContainerTask(command=["true"]))
    real_put = deps.store.put_new_job

    def fault(job: Job) -> None:
        raise RuntimeError("the store went away")

    monkeypatch.setattr(deps.store, "put_new_job", fault)
    try:
        jobs.create_job(request, tenant="t1", deps=deps)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the failed put was not reported")
    [orphan] = deps.store.list_runs("crashed")
    assert deps.store.get_job("crashed") is None
    # When the client submits again with the same id a second later
    monkeypatch.setattr(deps.store, "put_new_job", real_put)
    clock.advance(1)
    job = jobs.create_job(request, tenant="t1", deps=deps)
    assert job.created_at == T0 + timedelta(seconds=1)
    # Then the orphan's start skips it (its job is not the one it was claimed for); the new run starts
    try:
        runs.start(message_for(orphan), deps, owner="w1")
    except NotStartedError as exc:
        assert "deleted" in str(exc)
    else:
        raise AssertionError("an orphaned run started")
    skipped = deps.store.get_run("crashed", T0)
    assert skipped is not None and (skipped.state, skipped.error) == (RunState.SKIPPED, "deleted")
    mine = deps.store.get_run("crashed", T0 + timedelta(seconds=1))
    assert mine is not None and runs.start(message_for(mine), deps, owner="w1").state is RunState.RUNNING
