"""Every query, right after every transition of a run's life, through the ports only.

A run of an overlap-policy job goes PENDING -> RUNNING -> RETRY_WAIT -> RUNNING -> FAILED (dead-lettered)
-> re-driven PENDING -> RUNNING -> SUCCEEDED; after each step the watchdog (``query_overdue``: from when
the run is watched), the job's listing (``query_runs`` by state and ``active_only``), its active runs
(``query_active`` / ``query_active_after``), the tenant's dead letters and RUNNING count are checked.
Queries the port says "may lag writes by a moment" (``query_due``, ``query_active``) are polled briefly;
the others are asserted at once, as their ports promise no lag.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest

from duetime.domain.models import Job, JobState, OverlapPolicy, Run, RunState
from duetime.domain.ports import Store
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import MS, attempt_end, make_job, put_run, start

V = TypeVar("V")
FAR = datetime(2199, 1, 1, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)
#: how long a "may lag" query is given to show a write
LAG_SECONDS = 2.0


def eventually(read: Callable[[], V], expected: V) -> None:
    """``read()`` returns ``expected`` within LAG_SECONDS (at once on a store without lag)."""
    deadline = time.monotonic() + LAG_SECONDS
    while (got := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got == expected


def dues(runs: Iterable[Run]) -> list[datetime]:
    return [r.due_at for r in runs]


def stored(store: Store, job: Job, due: datetime) -> Run:
    """The run of ``job`` at ``due`` as stored now."""
    run = store.get_run(job.job_id, due)
    assert run is not None
    return run


def check(
    adapters: Adapters,
    job: Job,
    run: Run,
    *,
    watched_at: datetime | None,
    active: bool,
    dead_lettered: bool,
    running: int,
) -> None:
    """What every query says of ``run`` (as the transition returned it), the only run of ``job``."""
    store, due = adapters.store, run.due_at
    assert store.get_run(job.job_id, due) == run
    # the watchdog: not before watched_at, from watched_at on (only there), never once terminal
    if watched_at is None:
        assert list(store.query_overdue(job.shard, FAR)) == []
    else:
        assert run.watch_at == watched_at
        assert list(store.query_overdue(job.shard, watched_at - MS)) == []
        assert list(store.query_overdue(job.shard, watched_at)) == [run]
        assert list(store.query_overdue(job.shard, FAR)) == [run]
        assert list(store.query_overdue(job.shard + 1, FAR)) == []
    # the job's runs: by state, and active_only = not terminal
    assert store.query_runs(job.job_id, limit=10) == ([run], None)
    assert store.query_runs(job.job_id, limit=10, state=run.state.value) == ([run], None)
    for other in RunState:
        if other is not run.state:
            assert store.query_runs(job.job_id, limit=10, state=other.value) == ([], None)
    live = [run] if not run.state.terminal else []
    assert store.query_runs(job.job_id, limit=10, active_only=True) == (live, None)
    assert store.query_runs(job.job_id, limit=10, active_only=True, state=run.state.value) == (live, None)
    # the job's active runs (overlap policy, or held)
    expected = [due] if active else []
    eventually(lambda: store.query_active(job.job_id, before=FAR), expected)
    eventually(lambda: store.query_active_after(job.job_id, after=EPOCH, limit=5), expected)
    # the tenant's dead letters and RUNNING count
    assert store.query_dead_letters(job.tenant) == ([run] if dead_lettered else [], None)
    assert store.count_running(job.tenant) == running


def test_every_query_after_every_transition_of_a_retried_dead_lettered_redriven_run(
    adapters: Adapters,
) -> None:
    store = adapters.store
    job = make_job("life", tenant="t-life", shard=3, max_attempts=2, overlap=OverlapPolicy(policy="skip"))
    tenant = job.tenant

    # claimed: PENDING, watched one grace period after its due time
    pending = put_run(store, job, T0)
    check(adapters, job, pending, watched_at=T0 + 60 * S, active=True, dead_lettered=False, running=0)

    # attempt 1 starts (a RUNNING quota applies: running_tenant), watched at its lease's end
    first = start(store, pending, now=T0 + S, running_tenant=tenant)
    assert (first.state, first.attempt, first.fencing_token) == (RunState.RUNNING, 1, 1)
    check(adapters, job, first, watched_at=T0 + 31 * S, active=True, dead_lettered=False, running=1)

    # it fails: RETRY_WAIT, the retry due 10 s on, the sweeper's backstop a grace period later
    waiting = store.end_attempt(attempt_end(first, RunState.FAILED, now=T0 + 5 * S))
    assert (waiting.state, waiting.retry_at) == (RunState.RETRY_WAIT, T0 + 15 * S)
    check(adapters, job, waiting, watched_at=T0 + 75 * S, active=True, dead_lettered=False, running=0)

    # attempt 2 starts from the retry's message at retry_at
    second = start(store, waiting, now=T0 + 15 * S, attempt=2, running_tenant=tenant)
    assert (second.state, second.attempt, second.fencing_token) == (RunState.RUNNING, 2, 2)
    check(adapters, job, second, watched_at=T0 + 45 * S, active=True, dead_lettered=False, running=1)

    # it fails too, the last attempt: FAILED, dead-lettered, no longer watched nor active
    failed = store.end_attempt(attempt_end(second, RunState.FAILED, now=T0 + 20 * S))
    assert (failed.state, failed.dead_lettered, failed.dead_lettered_at) == (
        RunState.FAILED,
        True,
        T0 + 20 * S,
    )
    check(adapters, job, failed, watched_at=None, active=False, dead_lettered=True, running=0)

    # re-driven: PENDING at attempt 3 with a fresh budget, watched again, out of the dead letters
    redriven = store.redrive(failed, now=T0 + 60 * S, watch_at=T0 + 120 * S)
    assert redriven is not None
    assert (redriven.state, redriven.attempt, redriven.max_attempts) == (RunState.PENDING, 3, 4)
    check(adapters, job, redriven, watched_at=T0 + 120 * S, active=True, dead_lettered=False, running=0)

    # attempt 3 starts (its message names attempt 3) and succeeds
    third = start(store, redriven, now=T0 + 61 * S, running_tenant=tenant)
    assert (third.attempt, third.fencing_token) == (3, 3)
    check(adapters, job, third, watched_at=T0 + 91 * S, active=True, dead_lettered=False, running=1)
    done = store.end_attempt(attempt_end(third, RunState.SUCCEEDED, now=T0 + 62 * S))
    assert [(a.attempt, a.state) for a in done.attempts] == [
        (1, RunState.FAILED),
        (2, RunState.FAILED),
        (3, RunState.SUCCEEDED),
    ]
    check(adapters, job, done, watched_at=None, active=False, dead_lettered=False, running=0)


def test_a_retry_released_by_the_sweeper_is_pending_at_the_next_attempt_and_watched(
    adapters: Adapters,
) -> None:
    job = make_job("released", tenant="t-released", shard=2)
    running = start(adapters.store, put_run(adapters.store, job, T0), now=T0)
    waiting = adapters.store.end_attempt(attempt_end(running, RunState.FAILED, now=T0 + S))
    check(adapters, job, waiting, watched_at=T0 + 71 * S, active=False, dead_lettered=False, running=0)
    released = adapters.store.release_retry(job.job_id, T0, attempt=1, now=T0 + 71 * S, watch_at=T0 + 131 * S)
    assert released is not None and (released.state, released.attempt) == (RunState.PENDING, 2)
    check(adapters, job, released, watched_at=T0 + 131 * S, active=False, dead_lettered=False, running=0)


def test_a_run_counts_as_running_only_where_a_running_quota_set_running_tenant(adapters: Adapters) -> None:
    job = make_job("no-quota", tenant="t-no-quota")
    running = start(adapters.store, put_run(adapters.store, job, T0), now=T0)
    check(adapters, job, running, watched_at=T0 + 30 * S, active=False, dead_lettered=False, running=0)


def test_count_running_counts_the_tenants_running_runs_only(adapters: Adapters) -> None:
    store = adapters.store
    a, b = make_job("count-a", tenant="t-count"), make_job("count-b", tenant="t-count")
    other = make_job("count-other", tenant="t-count-other")
    for job in (a, b, other):
        for due in (T0, T0 + S):
            start(store, put_run(store, job, due), now=T0, running_tenant=job.tenant)
    put_run(store, a, T0 + 2 * S)  # PENDING: not counted
    assert (store.count_running("t-count"), store.count_running("t-count-other")) == (4, 2)
    running = store.get_run(a.job_id, T0)
    assert running is not None
    store.end_attempt(attempt_end(running, RunState.SUCCEEDED, now=T0 + S))
    cancelled = store.get_run(b.job_id, T0)
    assert cancelled is not None and store.cancel(cancelled, reason="user", now=T0 + S) is not None
    assert (store.count_running("t-count"), store.count_running("t-count-other")) == (2, 2)
    assert store.count_running("t-nobody") == 0


# ---- held runs ---------------------------------------------------------------------------------------------
def test_a_held_run_is_active_and_watched_at_its_recheck_until_released(adapters: Adapters) -> None:
    store = adapters.store
    job = make_job("held", tenant="t-held", shard=4)  # no overlap policy: active only while held
    pending = put_run(store, job, T0)
    check(adapters, job, pending, watched_at=T0 + 60 * S, active=False, dead_lettered=False, running=0)
    held = store.hold(job.job_id, T0, reason="paused", now=T0, recheck_at=T0 + 30 * S)
    assert held is not None and (held.state, held.held) == (RunState.PENDING, "paused")
    check(adapters, job, held, watched_at=T0 + 30 * S, active=True, dead_lettered=False, running=0)
    deferred = store.defer_pending(job.job_id, T0, attempt=1, held="paused", watch_at=T0 + 90 * S)
    assert deferred is not None
    check(adapters, job, deferred, watched_at=T0 + 90 * S, active=True, dead_lettered=False, running=0)
    released = store.release_held(held, now=T0 + 100 * S, watch_at=T0 + 160 * S)
    assert released is not None and released.held is None
    check(adapters, job, released, watched_at=T0 + 160 * S, active=False, dead_lettered=False, running=0)
    running = start(store, released, now=T0 + 101 * S)
    check(adapters, job, running, watched_at=T0 + 131 * S, active=False, dead_lettered=False, running=0)


def test_a_released_run_of_an_overlap_policy_job_stays_active(adapters: Adapters) -> None:
    store = adapters.store
    job = make_job("held-overlap", tenant="t-held-overlap", overlap=OverlapPolicy(policy="buffer_one"))
    held = store.hold(put_run(store, job, T0).job_id, T0, reason="paused", now=T0, recheck_at=T0 + 30 * S)
    assert held is not None
    check(adapters, job, held, watched_at=T0 + 30 * S, active=True, dead_lettered=False, running=0)
    released = store.release_held(held, now=T0 + S, watch_at=T0 + 61 * S)
    assert released is not None
    check(adapters, job, released, watched_at=T0 + 61 * S, active=True, dead_lettered=False, running=0)


def test_a_held_run_that_is_skipped_or_cancelled_leaves_every_query(adapters: Adapters) -> None:
    store = adapters.store
    job = make_job("held-ended", tenant="t-held-ended")
    held = store.hold(put_run(store, job, T0).job_id, T0, reason="paused", now=T0, recheck_at=T0 + 30 * S)
    assert held is not None
    skipped = store.skip_pending(job.job_id, T0, attempt=1, reason="deleted", now=T0 + S)
    assert skipped is not None and (skipped.state, skipped.held) == (RunState.SKIPPED, None)
    check(adapters, job, skipped, watched_at=None, active=False, dead_lettered=False, running=0)

    other = make_job("held-cancelled", tenant="t-held-cancelled")
    held = store.hold(put_run(store, other, T0).job_id, T0, reason="paused", now=T0, recheck_at=T0 + 30 * S)
    assert held is not None
    cancelled = store.cancel(held, reason="user", now=T0 + S)
    assert cancelled is not None and cancelled.held is None
    check(adapters, other, cancelled, watched_at=None, active=False, dead_lettered=False, running=0)


# ---- several runs: order and bounds ------------------------------------------------------------------------
def test_query_active_is_oldest_first_strictly_before_and_after_its_bounds(adapters: Adapters) -> None:
    store = adapters.store
    job = make_job("actives", overlap=OverlapPolicy(policy="allow", max_concurrency=5))
    minute = timedelta(minutes=1)
    for i in (2, 0, 1, 3):
        put_run(store, job, T0 + i * minute)
    put_run(store, make_job("actives-other", overlap=OverlapPolicy(policy="skip")), T0)
    eventually(lambda: store.query_active(job.job_id, before=T0 + 2 * minute), [T0, T0 + minute])
    eventually(lambda: store.query_active(job.job_id, before=T0), [])
    eventually(lambda: store.query_active_after(job.job_id, after=T0, limit=1), [T0 + minute])
    eventually(
        lambda: store.query_active_after(job.job_id, after=T0, limit=5), [T0 + i * minute for i in (1, 2, 3)]
    )
    eventually(lambda: store.query_active_after(job.job_id, after=T0 + 3 * minute), [])
    # the run due at T0 + 1 min ends: it is no longer active
    running = start(store, stored(store, job, T0 + minute), now=T0)
    store.end_attempt(attempt_end(running, RunState.SUCCEEDED, now=T0 + S))
    eventually(lambda: store.query_active_after(job.job_id, after=T0, limit=1), [T0 + 2 * minute])
    eventually(lambda: store.query_active(job.job_id, before=FAR), [T0 + i * minute for i in (0, 2, 3)])


def test_query_overdue_is_oldest_watch_first_within_its_shard(adapters: Adapters) -> None:
    store = adapters.store
    job = make_job("overdue", shard=6)
    minute = timedelta(minutes=1)
    # claimed ahead: each run watched one grace period after its own due time
    for i in (3, 1, 2, 0):
        put_run(store, job, T0 + i * minute, now=T0)
    put_run(store, make_job("overdue-other-shard", shard=7), T0)
    assert dues(store.query_overdue(6, T0 + 2 * minute + 60 * S)) == [T0, T0 + minute, T0 + 2 * minute]
    # a deferred run moves back in the order
    assert store.defer_pending(job.job_id, T0, attempt=1, watch_at=T0 + 10 * minute) is not None
    assert dues(store.query_overdue(6, FAR)) == [T0 + i * minute for i in (1, 2, 3, 0)]
    assert dues(store.query_overdue(7, FAR)) == [T0]


def test_query_runs_filters_by_due_time_state_and_activity(adapters: Adapters) -> None:
    store = adapters.store
    job = make_job("listing")
    minute = timedelta(minutes=1)
    for i in range(5):
        put_run(store, job, T0 + i * minute, now=T0)
    put_run(store, make_job("listing-other"), T0)
    start(store, stored(store, job, T0 + minute), now=T0)
    assert store.skip_pending(job.job_id, T0 + 2 * minute, attempt=1, reason="missed", now=T0) is not None

    def listed(**kw: object) -> list[datetime]:
        runs, token = store.query_runs(job.job_id, limit=10, **kw)  # type: ignore[arg-type]
        assert token is None
        return dues(runs)

    every = [T0 + i * minute for i in (4, 3, 2, 1, 0)]
    assert listed() == every
    assert listed(since=T0 + minute, until=T0 + 3 * minute) == every[1:4]  # both ends included
    assert listed(since=T0 + 3 * minute) == every[:2]
    assert listed(until=T0 + minute) == every[3:]
    assert listed(state="PENDING") == [T0 + 4 * minute, T0 + 3 * minute, T0]
    assert listed(state="RUNNING") == [T0 + minute]
    assert listed(state="SKIPPED") == [T0 + 2 * minute]
    assert listed(active_only=True) == [T0 + i * minute for i in (4, 3, 1, 0)]
    assert listed(active_only=True, state="SKIPPED") == []
    assert listed(active_only=True, until=T0 + 2 * minute) == [T0 + minute, T0]
    assert dues(store.list_runs(job.job_id, limit=2)) == every[:2]


def test_query_dead_letters_lists_the_tenants_most_recently_dead_lettered_first(adapters: Adapters) -> None:
    store = adapters.store
    job = make_job("dead", tenant="t-dead", max_attempts=1)
    other = make_job("dead-other", tenant="t-dead-other", max_attempts=1)
    ends = {T0: 30, T0 + S: 10, T0 + 2 * S: 20}  # due -> seconds after T0 when it dead-letters
    for due, after in ends.items():
        running = start(store, put_run(store, job, due), now=T0 + 5 * S)
        store.end_attempt(attempt_end(running, RunState.FAILED, now=T0 + after * S))
    running = start(store, put_run(store, other, T0), now=T0)
    store.end_attempt(attempt_end(running, RunState.FAILED, now=T0 + S))
    ok = start(store, put_run(store, job, T0 + 3 * S), now=T0)
    store.end_attempt(attempt_end(ok, RunState.SUCCEEDED, now=T0 + 40 * S))  # not a dead letter
    retried = start(
        store, put_run(store, make_job("dead-retried", tenant="t-dead", max_attempts=3), T0), now=T0
    )
    store.end_attempt(attempt_end(retried, RunState.FAILED, now=T0 + S))  # attempts left: not dead
    runs, token = store.query_dead_letters("t-dead")
    assert token is None
    assert [(r.job_id, r.due_at, r.dead_lettered_at) for r in runs] == [
        ("dead", T0, T0 + 30 * S),
        ("dead", T0 + 2 * S, T0 + 20 * S),
        ("dead", T0 + S, T0 + 10 * S),
    ]
    assert all(r.dead_lettered and r.state is RunState.FAILED for r in runs)
    assert dues(store.query_dead_letters("t-dead-other")[0]) == [T0]
    assert store.query_dead_letters("t-nobody") == ([], None)


# ---- jobs ------------------------------------------------------------------------------------------------
def test_list_jobs_is_the_tenants_newest_first_by_state_and_name_prefix(adapters: Adapters) -> None:
    store = adapters.store
    minute = timedelta(minutes=1)
    specs = [
        ("a1", "alpha one", JobState.ACTIVE),
        ("a2", "alpha two", JobState.PAUSED),
        ("b1", "beta one", JobState.ACTIVE),
        ("a3", "alpha three", JobState.DELETED),
        ("c1", "gamma", JobState.COMPLETED),
    ]
    for i, (job_id, name, state) in enumerate(specs):
        store.put_new_job(
            make_job(job_id, tenant="t-jobs", name=name, state=state, created_at=T0 + i * minute)
        )
    store.put_new_job(make_job("x1", tenant="t-jobs-other", name="alpha other", created_at=T0))

    def listed(**kw: object) -> list[str]:
        jobs, token = store.list_jobs("t-jobs", limit=10, **kw)  # type: ignore[arg-type]
        assert token is None
        assert all(j.tenant == "t-jobs" for j in jobs)
        return [j.job_id for j in jobs]

    assert listed() == ["c1", "b1", "a2", "a1"]  # newest first, DELETED left out
    assert listed(state="ACTIVE") == ["b1", "a1"]
    assert listed(state="PAUSED") == ["a2"]
    assert listed(state="COMPLETED") == ["c1"]
    assert listed(state="DELETED") == ["a3"]
    assert listed(name_prefix="alpha") == ["a2", "a1"]
    assert listed(name_prefix="alpha", state="DELETED") == ["a3"]
    assert listed(name_prefix="alpha", state="ACTIVE") == ["a1"]
    assert listed(name_prefix="zeta") == []
    assert [j.job_id for j in store.list_jobs("t-jobs-other", limit=10)[0]] == ["x1"]
    assert store.list_jobs("t-nobody", limit=10) == ([], None)
    # a change of state shows in the listing at once (the store reads the jobs themselves)
    a1 = store.get_job("a1")
    assert a1 is not None
    paused = a1.model_copy(update={"state": JobState.PAUSED, "version": 2, "updated_at": T0 + 9 * minute})
    store.replace_job(paused, expected_version=1, expected_next_fire_at=None)
    assert listed(state="PAUSED") == ["a2", "a1"]
    assert listed(state="ACTIVE") == ["b1"]
    assert store.list_jobs("t-jobs", limit=10)[0][-1] == paused


def test_query_due_follows_each_advance_oldest_first_within_its_shard(adapters: Adapters) -> None:
    store = adapters.store
    minute = timedelta(minutes=1)
    store.put_new_job(make_job("due-a", shard=5, next_fire_at=T0))
    store.put_new_job(make_job("due-b", shard=5, next_fire_at=T0 + minute))
    store.put_new_job(make_job("due-other", shard=8, next_fire_at=T0))
    store.put_new_job(make_job("due-none", shard=5, next_fire_at=None, state=JobState.COMPLETED))

    def due(until: datetime, shard: int = 5) -> Callable[[], list[str]]:
        return lambda: [j.job_id for j in store.query_due(shard, until)]

    eventually(due(T0 - MS), [])
    eventually(due(T0), ["due-a"])
    eventually(due(T0 + minute), ["due-a", "due-b"])
    eventually(due(FAR, shard=8), ["due-other"])
    store.advance("due-a", claimed=T0, next_fire_at=T0 + 2 * minute, now=T0)
    eventually(due(T0 + minute), ["due-b"])
    eventually(due(T0 + 2 * minute), ["due-b", "due-a"])
    [seen] = [j for j in store.query_due(5, T0 + 2 * minute) if j.job_id == "due-a"]
    assert seen.next_fire_at == T0 + 2 * minute
    store.advance("due-b", claimed=T0 + minute, next_fire_at=None, now=T0 + minute)
    eventually(due(FAR), ["due-a"])
    # a job whose next fire is removed by a replace (a pause) is no longer due either
    a = store.get_job("due-a")
    assert a is not None
    store.replace_job(
        a.model_copy(update={"state": JobState.PAUSED, "next_fire_at": None, "version": 2}),
        expected_version=1,
        expected_next_fire_at=T0 + 2 * minute,
    )
    eventually(due(FAR), [])


def test_query_due_parts_split_a_shards_due_jobs_disjoint_each_oldest_first(adapters: Adapters) -> None:
    # Given 12 due jobs of shard 2, due a second apart, and one of another shard
    store = adapters.store
    second = timedelta(seconds=1)
    ids = [f"part-{i:02d}" for i in range(12)]
    for i, job_id in enumerate(ids):
        store.put_new_job(make_job(job_id, shard=2, next_fire_at=T0 + i * second))
    store.put_new_job(make_job("part-other", shard=3, next_fire_at=T0))

    def parts(count: int) -> list[list[str]]:
        return [[j.job_id for j in store.query_due(2, FAR, part=p, parts=count)] for p in range(count)]

    eventually(lambda: [j.job_id for j in store.query_due(2, FAR)], ids)
    # Then for any number of parts, the parts are disjoint, each oldest first, and together the shard's jobs
    for count in (1, 2, 3, 4, 6):
        split = parts(count)
        assert sorted(job_id for part in split for job_id in part) == ids
        assert all(part == sorted(part) for part in split)
        # and a job's part is fixed: asked again, the same split
        assert parts(count) == split
    assert parts(2)[0] and parts(2)[1]
    # and read one job per request, every part still comes whole, oldest first
    for count in (1, 3):
        paged = [
            [j.job_id for j in store.query_due(2, FAR, part=p, parts=count, page_size=1)]
            for p in range(count)
        ]
        assert paged == parts(count)
    # And a part outside the range is refused
    for part, count in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError):
            list(store.query_due(2, FAR, part=part, parts=count))
