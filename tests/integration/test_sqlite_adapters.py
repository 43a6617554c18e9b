"""The embedded adapter set on real SQLite files: the store's transitions and queries, page tokens, the queue
(delay, visibility, receive counts, dead letters, fairness), file logs, and two processes on one file."""

from __future__ import annotations

import base64
import json
import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from duetime.adapters.sqlite import store as sqlite_store
from duetime.adapters.sqlite.db import SCHEMA_VERSION, Database, SchemaTooNewError
from duetime.adapters.sqlite.logs import FileLogs, chunk_key
from duetime.adapters.sqlite.queue import SqliteQueues
from duetime.adapters.sqlite.store import SqliteStore
from duetime.domain.clock import FixedClock
from duetime.domain.errors import (
    AlreadyClaimedError,
    ConflictError,
    JobExistsError,
    LeaseLostError,
    PageTokenError,
    StaleClaimError,
    StartRejectedError,
    ThrottledError,
)
from duetime.domain.lifecycle import AttemptEnd, build_run, decide_attempt_end, message_for
from duetime.domain.models import (
    AttemptRecord,
    ContainerTask,
    Job,
    JobState,
    OverlapPolicy,
    RetryPolicy,
    Run,
    RunMessage,
    RunState,
    ScheduleSpec,
    Trigger,
)
from duetime.domain.ports import QUEUE_MAX_RECEIVE_COUNT, LogStore, RunQueue, RunStart, Store

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
S = timedelta(seconds=1)
MS = timedelta(milliseconds=1)
GRACE = 60.0
LEASE = 30.0
R = TypeVar("R")


# ---- builders --------------------------------------------------------------------------------------------
def make_job(
    job_id: str,
    *,
    tenant: str = "t1",
    shard: int = 0,
    next_fire_at: datetime | None = None,
    created_at: datetime = T0,
    max_attempts: int = 3,
    overlap: OverlapPolicy | None = None,
    starting_deadline_seconds: int | None = None,
    name: str | None = None,
) -> Job:
    return Job(
        job_id=job_id,
        tenant=tenant,
        name=name or f"job {job_id}",
        schedule=ScheduleSpec(expression="rate(5 minutes)"),
        task=ContainerTask(command=["echo", "hello"]),
        timeout_seconds=300,
        retry=RetryPolicy(max_attempts=max_attempts, backoff_seconds=10.0, jitter="none"),
        overlap=overlap or OverlapPolicy(),
        starting_deadline_seconds=starting_deadline_seconds,
        state=JobState.ACTIVE,
        shard=shard,
        next_fire_at=next_fire_at,
        anchor=created_at,
        created_at=created_at,
        updated_at=created_at,
    )


def make_run(job: Job, due_at: datetime = T0, **update: Any) -> Run:
    run = build_run(job, due_at, now=due_at, watch_after_seconds=GRACE, trigger=Trigger.SCHEDULE)
    return run.model_copy(update=update) if update else run


def put_run(store: SqliteStore, job: Job, due_at: datetime = T0) -> Run:
    run = make_run(job, due_at)
    store.put_new_run(run)
    return run


def start(
    store: SqliteStore,
    run: Run,
    *,
    now: datetime = T0,
    attempt: int | None = None,
    owner: str = "w1",
    running_tenant: str | None = None,
) -> Run:
    lease = now + timedelta(seconds=LEASE)
    return store.start(
        run.job_id,
        run.due_at,
        attempt=attempt or run.attempt,
        owner=owner,
        lease_expires_at=lease,
        now=now,
        deadline_at=now + timedelta(seconds=run.timeout_seconds),
        watch_at=lease,
        running_tenant=running_tenant,
    )


def ending(run: Run, outcome: RunState, *, now: datetime, token: int | None = None) -> AttemptEnd:
    return decide_attempt_end(
        run,
        outcome=outcome,
        now=now,
        fencing_token=run.fencing_token if token is None else token,
        watch_after_seconds=GRACE,
        worker=run.lease_owner,
        exit_code=0 if outcome is RunState.SUCCEEDED else 1,
        error=None if outcome is RunState.SUCCEEDED else "boom",
    )


def race(n: int, attempt: Callable[[int], R], lost: type[Exception]) -> tuple[list[R], list[int]]:
    """``attempt(i)`` in ``n`` threads released together; (the winners' results, the losers)."""
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
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return won, losers


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "duetime.sqlite"


@pytest.fixture
def store(db_path: Path) -> SqliteStore:
    return SqliteStore(db_path)


def overdue(store: SqliteStore, until: datetime, shard: int = 0) -> list[tuple[str, datetime]]:
    return [(r.job_id, r.due_at) for r in store.query_overdue(shard, until)]


# ---- the file ----------------------------------------------------------------------------------------------
def test_a_new_file_gets_the_schema_in_wal_mode_and_reopening_changes_nothing(db_path: Path) -> None:
    first = Database(db_path)
    conn = first.connection()
    assert first.schema_version() == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    # no SQLite busy handler: Database waits for the write lock itself (in short steps)
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    key = conn.execute("SELECT value FROM meta WHERE key = 'page_token_key'").fetchone()[0]
    again = Database(db_path)
    assert again.schema_version() == SCHEMA_VERSION
    assert again.connection().execute("SELECT value FROM meta").fetchall() == [(key,)]
    first.close()
    again.close()


def _hold_write_lock(path: Path, seconds: float, held: threading.Event) -> None:
    """Another connection (as another process would) takes the write lock for ``seconds``."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    held.set()
    time.sleep(seconds)
    other.execute("COMMIT")
    other.close()


def test_a_writer_waits_for_another_connections_write_lock_then_commits(db_path: Path) -> None:
    db = Database(db_path)
    held = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(db_path, 0.4, held))
    holder.start()
    held.wait(5)
    started = time.monotonic()
    with db.transaction() as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('waited', 'yes')")
    waited = time.monotonic() - started
    holder.join()
    # it got the lock soon after the other let go (short retries, not SQLite's sleeps of up to 100 ms)
    assert 0.3 <= waited < 0.4 + 0.1
    assert db.read("SELECT value FROM meta WHERE key = 'waited'") == [("yes",)]
    db.close()


def test_a_write_lock_held_past_the_busy_timeout_is_a_throttled_error_and_writes_nothing(
    db_path: Path,
) -> None:
    db = Database(db_path, busy_timeout_ms=200)
    held = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(db_path, 0.8, held))
    holder.start()
    held.wait(5)
    started = time.monotonic()
    with pytest.raises(ThrottledError, match="write lock stayed taken"), db.transaction() as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('lost', 'no')")
    assert 0.2 <= time.monotonic() - started < 0.5
    holder.join()
    assert db.read("SELECT value FROM meta WHERE key = 'lost'") == []
    db.close()


def test_threads_of_one_process_take_turns_on_the_write_lock(db_path: Path) -> None:
    db = Database(db_path)
    db.read("SELECT 1")

    def add(i: int) -> None:
        for j in range(50):
            with db.transaction() as conn:
                (n,) = conn.execute("SELECT COUNT(*) FROM meta").fetchone()
                conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (f"k{i}.{j}", str(n)))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 400 read-then-write transactions, none lost, each saw every earlier one (counts 1..400, once each)
    counts = sorted(int(v) for (v,) in db.read("SELECT value FROM meta WHERE key LIKE 'k%'"))
    assert counts == list(range(1, 401))
    db.close()


def test_a_file_from_a_newer_schema_is_refused(db_path: Path) -> None:
    Database(db_path).close()
    raw = sqlite3.connect(db_path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(SchemaTooNewError):
        Database(db_path)


def test_each_thread_has_its_own_connection_and_a_new_thread_takes_over_an_ended_ones(db_path: Path) -> None:
    db = Database(db_path)
    mine = db.connection()
    seen: list[sqlite3.Connection] = []
    thread = threading.Thread(target=lambda: seen.append(db.connection()))
    thread.start()
    thread.join()
    assert seen and seen[0] is not mine and db.connection() is mine
    # two threads alive at once get two connections, one of them the ended thread's (no new one opened)
    both: list[sqlite3.Connection] = []
    barrier = threading.Barrier(2)

    def use() -> None:
        both.append(db.connection())
        barrier.wait()  # both alive here

    threads = [threading.Thread(target=use) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(c) for c in both}) == 2 and any(c is seen[0] for c in both)
    assert all(c is not mine for c in both)
    db.close()


def test_a_transaction_rolls_back_on_an_error(db_path: Path) -> None:
    db = Database(db_path)
    with pytest.raises(RuntimeError), db.transaction() as conn:
        conn.execute("INSERT INTO tenant_counters (tenant, active_jobs) VALUES ('t', 1)")
        raise RuntimeError("abort")
    assert db.read("SELECT * FROM tenant_counters") == []


# ---- claims ------------------------------------------------------------------------------------------------
def test_of_eight_threads_putting_one_run_exactly_one_wins(db_path: Path) -> None:
    job = make_job("raced")
    stores = [SqliteStore(db_path) for _ in range(8)]  # separate store objects on one file
    runs = [make_run(job, T0, missed_slots=i) for i in range(8)]

    def put(i: int) -> int:
        stores[i].put_new_run(runs[i])
        return i

    won, lost = race(8, put, AlreadyClaimedError)
    assert len(won) == 1 and len(lost) == 7
    assert stores[0].get_run(job.job_id, T0) == runs[won[0]]


def test_of_eight_threads_starting_one_attempt_exactly_one_runs(store: SqliteStore) -> None:
    run = put_run(store, make_job("raced-start"))
    won, lost = race(8, lambda i: start(store, run, owner=f"w{i}"), StartRejectedError)
    assert len(won) == 1 and len(lost) == 7
    assert (won[0].state, won[0].fencing_token) == (RunState.RUNNING, 1)
    assert store.get_run(run.job_id, T0) == won[0]


def test_of_eight_threads_advancing_one_claim_exactly_one_wins(store: SqliteStore) -> None:
    job = make_job("raced-advance", next_fire_at=T0)
    store.put_new_job(job)

    def advance(i: int) -> int:
        store.advance(job.job_id, claimed=T0, next_fire_at=T0 + timedelta(minutes=5, milliseconds=i), now=T0)
        return i

    won, lost = race(8, advance, StaleClaimError)
    assert len(won) == 1 and len(lost) == 7
    after = store.get_job(job.job_id)
    assert after is not None and after.next_fire_at == T0 + timedelta(minutes=5, milliseconds=won[0])


def _put_many(path: str, runs: list[str], barrier: Any, results: Any, who: int) -> None:
    """One process of the two-process race: put each run when both processes are at the barrier."""
    local = SqliteStore(path)
    won = []
    for body in runs:
        run = Run.model_validate_json(body)
        barrier.wait()
        try:
            local.put_new_run(run)
            won.append(run.due_at.isoformat())
        except AlreadyClaimedError:
            pass
    results.put((who, won))


def test_two_processes_racing_to_put_50_runs_each_win_each_run_exactly_once(db_path: Path) -> None:
    store = SqliteStore(db_path)  # the schema exists before the processes start
    job = make_job("two-processes")
    runs = [make_run(job, T0 + i * S) for i in range(50)]
    bodies = [r.model_dump_json() for r in runs]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_put_many, args=(str(db_path), bodies, barrier, results, who)) for who in (0, 1)
    ]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    wins = got[0] + got[1]
    assert sorted(wins) == sorted(r.due_at.isoformat() for r in runs)  # every run once, by one of them
    assert set(got[0]).isdisjoint(got[1])
    assert len(store.list_runs(job.job_id, limit=100)) == 50


# ---- the lifecycle, with every query after every transition ------------------------------------------------
def test_start_rewatch_and_end_under_stale_tokens_change_nothing(store: SqliteStore) -> None:
    running = start(store, put_run(store, make_job("fenced")))
    for token in (0, 2):
        assert (
            store.rewatch_running("fenced", T0, fencing_token=token, watch_at=T0 + timedelta(minutes=5))
            is None
        )
        with pytest.raises(LeaseLostError):
            store.end_attempt(ending(running, RunState.SUCCEEDED, now=T0 + S, token=token))
    assert store.get_run("fenced", T0) == running
    moved = store.rewatch_running("fenced", T0, fencing_token=1, watch_at=T0 + timedelta(minutes=1))
    assert moved is not None
    assert (moved.lease_expires_at, moved.watch_at) == (running.lease_expires_at, T0 + timedelta(minutes=1))
    # the sweeper's expiry before the lease's end (30 s from the start) is refused
    early_expiry = ending(running, RunState.FAILED, now=T0 + 30 * S - MS).with_fence(
        lease_expired_by=T0 + 30 * S - MS
    )
    with pytest.raises(LeaseLostError):
        store.end_attempt(early_expiry)
    assert store.get_run("fenced", T0) == moved
    done = store.end_attempt(ending(moved, RunState.SUCCEEDED, now=T0 + 40 * S))
    assert (done.state, done.fencing_token, done.watch_at, done.lease_owner) == (
        RunState.SUCCEEDED,
        1,
        None,
        None,
    )
    assert store.rewatch_running("fenced", T0, fencing_token=1, watch_at=T0 + timedelta(minutes=2)) is None
    with pytest.raises(StartRejectedError):
        start(store, running, now=T0 + timedelta(minutes=1))


def test_a_retried_dead_lettered_and_redriven_run_is_in_the_right_listings_after_each_step(
    store: SqliteStore,
) -> None:
    job = make_job("journey", max_attempts=2, overlap=OverlapPolicy(policy="skip"))
    run = put_run(store, job)
    far = T0 + timedelta(days=1)

    def listings() -> tuple[Any, ...]:
        return (
            overdue(store, far),
            store.query_active("journey", before=far),
            store.count_running("t1"),
            [r.due_at for r in store.query_dead_letters("t1")[0]],
            [r.due_at for r in store.query_runs("journey", limit=5, active_only=True)[0]],
        )

    assert listings() == ([("journey", T0)], [T0], 0, [], [T0])
    running = start(store, run, running_tenant="t1")
    assert listings() == ([("journey", T0)], [T0], 1, [], [T0])
    assert overdue(store, T0 + 29 * S) == [] and overdue(store, T0 + 30 * S) == [("journey", T0)]
    waiting = store.end_attempt(ending(running, RunState.FAILED, now=T0 + S))
    assert (waiting.state, waiting.retry_at, waiting.lease_owner) == (RunState.RETRY_WAIT, T0 + 11 * S, None)
    assert listings() == ([("journey", T0)], [T0], 0, [], [T0])
    # a retry starts from RETRY_WAIT at attempt + 1 once retry_at has passed, not before
    with pytest.raises(StartRejectedError):
        start(store, waiting, now=T0 + 11 * S - MS, attempt=2)
    second = start(store, waiting, now=T0 + 11 * S, attempt=2, running_tenant="t1")
    assert (second.attempt, second.fencing_token, second.retry_at, second.error) == (2, 2, None, None)
    failed = store.end_attempt(ending(second, RunState.FAILED, now=T0 + 12 * S))
    assert (failed.state, failed.dead_lettered, failed.dead_lettered_at) == (
        RunState.FAILED,
        True,
        T0 + 12 * S,
    )
    assert listings() == ([], [], 0, [T0], [])
    redriven = store.redrive(failed, now=T0 + 20 * S, watch_at=T0 + 80 * S)
    assert redriven is not None
    assert (redriven.state, redriven.attempt, redriven.max_attempts, redriven.dead_lettered) == (
        RunState.PENDING,
        3,
        4,
        False,
    )
    assert (redriven.trigger, redriven.budget_from_attempt, redriven.dead_lettered_at) == (
        Trigger.RETRY,
        3,
        None,
    )
    assert listings() == ([("journey", T0)], [T0], 0, [], [T0])
    assert store.redrive(failed, now=T0 + 20 * S, watch_at=T0 + 80 * S) is None  # a double click
    assert [e.kind for e in redriven.events] == ["redriven"]


def test_hold_and_release_move_a_run_into_and_out_of_the_active_runs(store: SqliteStore) -> None:
    run = put_run(store, make_job("held"))  # no overlap policy: active only while held
    assert store.query_active("held", before=T0 + S) == []
    held = store.hold("held", T0, reason="paused", now=T0, recheck_at=T0 + 90 * S)
    assert held is not None and (held.held, held.watch_at) == ("paused", T0 + 90 * S)
    assert store.hold("held", T0, reason="paused", now=T0, recheck_at=T0 + 99 * S) is None
    assert store.query_active("held", before=T0 + S) == [T0]
    assert store.query_active_after("held", after=T0 - S) == [T0]
    with pytest.raises(StartRejectedError):
        start(store, run)
    assert store.defer_pending("held", T0, attempt=1, watch_at=T0 + 95 * S) is None  # its hold not named
    deferred = store.defer_pending("held", T0, attempt=1, watch_at=T0 + 95 * S, held="paused")
    assert deferred is not None and deferred.watch_at == T0 + 95 * S
    released = store.release_held(deferred, now=T0 + 100 * S, watch_at=T0 + 160 * S)
    assert released is not None and (released.held, released.watch_at) == (None, T0 + 160 * S)
    assert [e.kind for e in released.events] == ["held", "released"]
    assert store.release_held(deferred, now=T0 + 100 * S, watch_at=T0 + 170 * S) is None
    assert store.query_active("held", before=T0 + S) == []
    assert overdue(store, T0 + 160 * S) == [("held", T0)]
    assert start(store, released, now=T0 + 101 * S).state is RunState.RUNNING


def test_skip_cancel_release_retry_and_record_event_of_moved_on_runs_are_none(store: SqliteStore) -> None:
    job = make_job("moved")
    run = put_run(store, job)
    assert store.skip_pending("moved", T0, attempt=2, reason="missed", now=T0) is None
    assert store.release_retry("moved", T0, attempt=1, now=T0, watch_at=T0) is None
    running = start(store, run)
    assert store.cancel(run, reason="user", now=T0 + S) is None  # read PENDING: it started meanwhile
    record = AttemptRecord(attempt=1, fencing_token=1, worker="w1", state=RunState.CANCELLED)
    cancelled = store.cancel(running, reason="user", now=T0 + S, record=record)
    assert cancelled is not None and (cancelled.state, cancelled.fencing_token) == (RunState.CANCELLED, 2)
    assert cancelled.attempts == [record] and overdue(store, T0 + timedelta(days=1)) == []
    store.record_event("moved", T0, {"at": T0 + 2 * S, "kind": "stale_finish", "detail": {"token": 1}})
    store.record_event("absent", T0, {"at": T0, "kind": "x", "detail": {}})
    after = store.get_run("moved", T0)
    assert after is not None and [e.kind for e in after.events] == ["cancelled", "stale_finish"]
    assert store.get_run("absent", T0) is None


def test_a_retry_starts_from_its_own_wake_up_past_the_starting_deadline(store: SqliteStore) -> None:
    """The starting deadline binds attempt 1 only: a retry's delayed wake-up starts it straight from
    RETRY_WAIT however late (DynamoStore had checked the stored attempt, 1, and refused it)."""
    job = make_job("deadline-retry", starting_deadline_seconds=5)
    late = put_run(store, make_job("deadline-late", starting_deadline_seconds=5))
    with pytest.raises(StartRejectedError):
        start(store, late, now=T0 + 6 * S)
    running = start(store, put_run(store, job))
    waiting = store.end_attempt(ending(running, RunState.FAILED, now=T0 + S))
    assert start(store, waiting, now=T0 + 20 * S, attempt=2).attempt == 2


# ---- jobs, counters, leases --------------------------------------------------------------------------------
def test_jobs_put_replace_advance_and_due(store: SqliteStore) -> None:
    job = make_job("job", next_fire_at=T0, shard=3)
    store.put_new_job(job)
    with pytest.raises(JobExistsError):
        store.put_new_job(job)
    assert [j.job_id for j in store.query_due(3, T0)] == ["job"]
    assert list(store.query_due(3, T0 - MS)) == [] and list(store.query_due(0, T0)) == []
    store.advance("job", claimed=T0, next_fire_at=T0 + 300 * S, now=T0, missed=2)
    with pytest.raises(StaleClaimError):
        store.advance("job", claimed=T0, next_fire_at=T0 + 300 * S, now=T0)
    with pytest.raises(StaleClaimError):
        store.advance("absent", claimed=T0, next_fire_at=None, now=T0)
    moved = store.get_job("job")
    assert moved is not None and (moved.next_fire_at, moved.missed_slots) == (T0 + 300 * S, 2)
    assert list(store.query_due(3, T0 + 299 * S)) == []
    renamed = moved.model_copy(update={"name": "renamed", "version": 2})
    with pytest.raises(ConflictError):
        store.replace_job(renamed, expected_version=1, expected_next_fire_at=T0)
    with pytest.raises(ConflictError):
        store.replace_job(renamed, expected_version=2, expected_next_fire_at=T0 + 300 * S)
    store.replace_job(renamed, expected_version=1, expected_next_fire_at=T0 + 300 * S)
    store.advance("job", claimed=T0 + 300 * S, next_fire_at=None, now=T0 + 300 * S)
    done = store.get_job("job")
    assert done is not None and (done.name, done.state, done.next_fire_at) == (
        "renamed",
        JobState.COMPLETED,
        None,
    )
    assert list(store.query_due(3, T0 + timedelta(days=9))) == []
    store.add_missed_slots("job", 3)
    store.add_missed_slots("absent", 3)
    assert store.get_jobs(["job", "absent", "job"])["job"].missed_slots == 5


def test_query_due_and_query_overdue_page_through_more_than_a_page(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "PAGE_SIZE", 4)
    job = make_job("overdue")
    for i in range(10):
        store.put_new_job(make_job(f"j{i:02d}", next_fire_at=T0 + (i // 2) * MS))  # ties: by job id
        put_run(store, job, T0 + i * S)
    due = [j.job_id for j in store.query_due(0, T0 + timedelta(days=1))]
    assert due == [f"j{i:02d}" for i in range(10)]
    assert [d for _, d in overdue(store, T0 + timedelta(days=1))] == [T0 + i * S for i in range(10)]


def test_counters_and_shard_leases(store: SqliteStore) -> None:
    assert store.add_active_jobs("t", 1, limit=2) and store.add_active_jobs("t", 1, limit=2)
    assert not store.add_active_jobs("t", 1, limit=2)
    assert store.add_active_jobs("t", -1) and store.add_active_jobs("t", 1, limit=2)
    assert store.active_jobs("t") == 2
    minute = T0
    assert [store.count_submit("t", minute, limit=2) for _ in range(3)] == [True, True, False]
    assert store.count_submit("u", minute, limit=2) and store.count_submit("t", minute + 60 * S, limit=2)
    assert store.acquire_shard_lease(1, owner="a", now=T0, lease_seconds=10)
    assert not store.acquire_shard_lease(1, owner="b", now=T0 + 9 * S, lease_seconds=10)
    assert store.acquire_shard_lease(1, owner="a", now=T0 + 9 * S, lease_seconds=10)  # renewed
    store.release_shard_lease(1, owner="b", now=T0 + 10 * S)  # not b's: no-op
    assert not store.acquire_shard_lease(1, owner="b", now=T0 + 18 * S, lease_seconds=10)
    store.release_shard_lease(1, owner="a", now=T0 + 18 * S)
    assert store.acquire_shard_lease(1, owner="b", now=T0 + 18 * S, lease_seconds=10)


# ---- page tokens -------------------------------------------------------------------------------------------
def test_paging_returns_each_item_once_and_refuses_forged_and_foreign_tokens(
    store: SqliteStore, tmp_path: Path
) -> None:
    for i in range(25):
        store.put_new_job(make_job(f"a{i:02d}", tenant="a", created_at=T0 + i * S))
        store.put_new_job(make_job(f"b{i:02d}", tenant="b", created_at=T0 + i * S))
    seen, token, tokens = [], None, []
    while True:
        jobs, token = store.list_jobs("a", limit=10, page_token=token)
        seen += [j.job_id for j in jobs]
        if token is None:
            break
        tokens.append(token)
    assert seen == [f"a{i:02d}" for i in reversed(range(25))] and len(tokens) == 2
    [prefixed], _ = store.list_jobs("a", limit=10, name_prefix="job a07")
    assert prefixed.job_id == "a07"
    job = make_job("paged")
    for i in range(3):
        put_run(store, job, T0 + i * S)
    runs, run_token = store.query_runs("paged", limit=2)
    assert run_token is not None and [r.due_at for r in runs] == [T0 + 2 * S, T0 + S]
    good = tokens[0]
    body, _, sig = good.partition(".")
    decoded = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    forged_body = base64.urlsafe_b64encode(json.dumps({**decoded, "s": "b"}).encode()).decode().rstrip("=")
    other_file = SqliteStore(tmp_path / "other.sqlite")
    other_file.put_new_job(make_job("x1", tenant="a"))
    other_file.put_new_job(make_job("x2", tenant="a", created_at=T0 + S))
    _, other_token = other_file.list_jobs("a", limit=1)
    assert other_token is not None
    cases: list[tuple[str, Callable[[str], object]]] = [
        (good, lambda t: store.list_jobs("b", limit=10, page_token=t)),  # another tenant's listing
        (good, lambda t: store.query_dead_letters("a", page_token=t)),  # another kind of listing
        (run_token, lambda t: store.query_runs("other-job", limit=2, page_token=t)),  # another job
        (f"{forged_body}.{sig}", lambda t: store.list_jobs("b", limit=10, page_token=t)),  # edited
        ("not-a-token", lambda t: store.list_jobs("a", limit=10, page_token=t)),
        ("%%%.***", lambda t: store.list_jobs("a", limit=10, page_token=t)),
        ("é", lambda t: store.list_jobs("a", limit=10, page_token=t)),
        (other_token, lambda t: store.list_jobs("a", limit=10, page_token=t)),  # another file's
    ]
    for bad, call in cases:
        with pytest.raises(PageTokenError):
            call(bad)
    assert [r.due_at for r in store.query_runs("paged", limit=2, page_token=run_token)[0]] == [T0]


def test_dead_letters_are_listed_most_recent_first_across_pages(store: SqliteStore) -> None:
    job = make_job("dl", tenant="d", max_attempts=1)
    for i in range(5):
        running = start(store, put_run(store, job, T0 + i * S))
        store.end_attempt(ending(running, RunState.FAILED, now=T0 + (100 - i) * S))  # older runs died later
    first, token = store.query_dead_letters("d", limit=3)
    rest, end = store.query_dead_letters("d", limit=3, page_token=token)
    assert [r.due_at for r in first + rest] == [T0 + i * S for i in range(5)] and end is None
    assert store.query_dead_letters("other")[0] == []


# ---- the queue ---------------------------------------------------------------------------------------------
def msg(job_id: str = "q", *, tenant: str | None = "t1", attempt: int = 1) -> RunMessage:
    return RunMessage(job_id=job_id, due_at=T0, attempt=attempt, tenant=tenant, tier="small")


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def queues(db_path: Path, clock: FixedClock) -> SqliteQueues:
    return SqliteQueues(db_path, clock=clock)


def test_a_delayed_message_shows_after_its_delay_and_a_long_poll_on_a_fixed_clock_returns_at_once(
    queues: SqliteQueues, clock: FixedClock
) -> None:
    queues.send("small", msg(), delay=30)
    began = time.monotonic()
    assert queues.receive("small", wait_seconds=20) == []
    assert time.monotonic() - began < 1  # the clock does not move: waiting would show nothing
    assert queues.counts("small")["delayed"] == 1
    clock.advance(29.999)
    assert queues.receive("small", wait_seconds=0) == []
    clock.advance(0.001)
    [got] = queues.receive("small", wait_seconds=0)
    assert (got.message, got.receive_count) == (msg(), 1)
    assert queues.receive("large", wait_seconds=0) == []
    queues.delete("small", got.receipt_handle)
    queues.send("small", msg("far"), delay=10_000)  # clamped to 900 s
    clock.advance(900)
    assert [g.message.job_id for g in queues.receive("small", wait_seconds=0) if g.message] == ["far"]
    with pytest.raises(KeyError):
        queues.send("no-such-tier", msg())


def test_visibility_receive_counts_stale_handles_and_the_dead_letters(
    queues: SqliteQueues, clock: FixedClock
) -> None:
    queues.send("small", msg())
    handles = []
    for n in range(1, QUEUE_MAX_RECEIVE_COUNT + 1):
        [got] = queues.receive("small", wait_seconds=0, visibility_seconds=10)
        assert got.receive_count == n
        handles.append(got.receipt_handle)
        assert queues.receive("small", wait_seconds=0) == []  # hidden
        clock.advance(10)
    assert len(set(handles)) == QUEUE_MAX_RECEIVE_COUNT
    queues.delete("small", handles[0])  # stale: ignored
    queues.extend_visibility("small", handles[0], 100)
    # the receive after the tenth delivery moves it to the dead letters instead
    assert queues.receive("small", wait_seconds=0) == []
    assert queues.counts("small") == {"visible": 0, "delayed": 0, "in_flight": 0, "dead": 1}
    assert [RunMessage.model_validate_json(b) for b in queues.dead_letters("small")] == [msg()]


def test_extend_keeps_a_delivery_hidden_and_delete_removes_it(
    queues: SqliteQueues, clock: FixedClock
) -> None:
    queues.send("small", msg())
    [got] = queues.receive("small", wait_seconds=0, visibility_seconds=10)
    clock.advance(9)
    queues.extend_visibility("small", got.receipt_handle, 30)
    clock.advance(29)
    assert queues.receive("small", wait_seconds=0) == []
    clock.advance(1)
    [again] = queues.receive("small", wait_seconds=0, visibility_seconds=10)
    queues.extend_visibility("small", got.receipt_handle, 300)  # the old handle: nothing
    queues.delete("small", got.receipt_handle)
    clock.advance(10)
    queues.extend_visibility("small", again.receipt_handle, 300)  # lapsed: no longer in flight
    [third] = queues.receive("small", wait_seconds=0, visibility_seconds=10)
    queues.delete("small", third.receipt_handle)
    clock.advance(100)
    assert queues.receive("small", wait_seconds=0) == [] and queues.counts("small")["dead"] == 0


def test_receives_are_round_robin_across_tenants(queues: SqliteQueues) -> None:
    for i in range(6):
        queues.send("small", msg(f"noisy{i}", tenant="noisy"))
    queues.send("small", msg("quiet0", tenant="quiet"))
    queues.send("small", msg("quiet1", tenant="quiet"))
    queues.send("small", msg("none0", tenant=None))
    one_by_one = [
        got.message.job_id for _ in range(5) for got in queues.receive("small", wait_seconds=0) if got.message
    ]
    assert one_by_one == ["none0", "noisy0", "quiet0", "noisy1", "quiet1"]
    queues.send("small", msg("quiet2", tenant="quiet"))  # quiet was served last: it waits its turn...
    batch = [g.message.job_id for g in queues.receive("small", max_messages=10, wait_seconds=0) if g.message]
    assert batch == ["noisy2", "quiet2", "noisy3", "noisy4", "noisy5"]  # ...then alternates with noisy


def test_one_receive_takes_several_messages_and_concurrent_receivers_never_share_one(db_path: Path) -> None:
    sender = SqliteQueues(db_path)
    for i in range(60):
        sender.send("small", msg(f"m{i}", tenant=f"t{i % 3}"))
    got: list[str] = []
    lock = threading.Lock()

    def drain() -> None:
        mine = SqliteQueues(db_path)
        while batch := mine.receive("small", max_messages=10, wait_seconds=0, visibility_seconds=60):
            with lock:
                got.extend(g.message.job_id for g in batch if g.message)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(f"m{i}" for i in range(60))


def test_a_long_poll_on_the_wall_clock_gets_a_message_sent_meanwhile(db_path: Path) -> None:
    queues = SqliteQueues(db_path)
    timer = threading.Timer(0.3, lambda: SqliteQueues(db_path).send("small", msg("late")))
    began = time.monotonic()
    timer.start()
    got = queues.receive("small", wait_seconds=5)
    timer.join()
    assert [g.message.job_id for g in got if g.message] == ["late"]
    assert 0.25 <= time.monotonic() - began < 3
    began = time.monotonic()
    assert queues.receive("small", wait_seconds=1) == []
    assert time.monotonic() - began >= 0.95


def test_a_body_that_is_not_a_run_message_is_delivered_with_message_none(queues: SqliteQueues) -> None:
    queues.send_raw("small", "not json")
    [got] = queues.receive("small", wait_seconds=0)
    assert (got.message, got.body, got.receive_count) == (None, "not json", 1)


# ---- logs --------------------------------------------------------------------------------------------------
def test_logs_chunks_final_and_deletes(tmp_path: Path) -> None:
    logs = FileLogs(tmp_path / "logs")
    key = "logs/job/job.1/attempt-1.log"
    assert logs.get(key) is None and logs.get_final(key) is None
    for seq in range(12):
        logs.put_chunk(key, seq, f"{seq};".encode())
    assert (tmp_path / "logs" / chunk_key(key, 11)).is_file()
    assert logs.get(key) == "".join(f"{i};" for i in range(12)).encode()  # numeric order past 10
    assert logs.get_final(key) is None and logs.get_final(chunk_key(key, 3)) == b"3;"
    logs.put(key, b"final")
    assert logs.get(key) == b"final"
    logs.delete_chunks(key, 5)
    assert logs.get_final(chunk_key(key, 4)) is None and logs.get_final(chunk_key(key, 5)) == b"5;"
    logs.delete_chunks(key)
    assert not (tmp_path / "logs" / f"{key}.live").exists() and logs.get(key) == b"final"
    logs.delete_chunks("logs/none/none.1/attempt-1.log")
    logs.put(key, b"again")  # replaced whole
    assert logs.get(key) == b"again"
    assert [p.name for p in (tmp_path / "logs" / "logs/job/job.1").iterdir()] == ["attempt-1.log"]


@pytest.mark.parametrize(
    "key", ["../escape.log", "logs/../../x", "/etc/passwd", "logs//x", "logs/./x", "", "a\\b"]
)
def test_a_log_key_outside_the_directory_is_refused(tmp_path: Path, key: str) -> None:
    logs = FileLogs(tmp_path / "logs")
    with pytest.raises(ValueError):
        logs.put(key, b"x")
    with pytest.raises(ValueError):
        logs.get(key)
    assert not (tmp_path / "escape.log").exists()


def test_the_adapters_satisfy_the_ports(tmp_path: Path) -> None:
    store: Store = SqliteStore(tmp_path / "p.sqlite")
    queues: RunQueue = SqliteQueues(tmp_path / "p.sqlite")
    logs: LogStore = FileLogs(tmp_path / "logs")
    run = make_run(make_job("ports"))
    store.put_new_run(run)
    queues.send("small", message_for(run))
    [got] = queues.receive("small", wait_seconds=0)
    assert got.message == message_for(run)
    logs.put("logs/ports/x/attempt-1.log", b"ok")


# ---- batched transitions: decided before the write lock, written only if unchanged -----------------------
def _between_read_and_write(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], None]
) -> None:
    """Make ``meanwhile`` happen (through another store on the same file) right after the batch's rows
    were read, before its transaction takes the write lock."""
    real = store.db.read

    def read(sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        rows = real(sql, params)
        if "FROM keys JOIN runs" in sql:
            meanwhile()
        return rows

    monkeypatch.setattr(store.db, "read", read)


def test_a_batch_of_transitions_looks_its_runs_up_by_key_not_by_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a file with 300 runs, and the batched start of 3 of them
    store = SqliteStore(tmp_path / "s.sqlite")
    runs = [put_run(store, make_job(f"scan-{i:03d}")) for i in range(300)]
    reads: list[tuple[str, Any]] = []
    real = store.db.read

    def read(sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        reads.append((sql, params))
        return real(sql, params)

    monkeypatch.setattr(store.db, "read", read)
    lease = T0 + timedelta(seconds=LEASE)
    outcomes = store.start_many([RunStart(r.job_id, T0, 1, "w", lease, T0, watch_at=lease) for r in runs[:3]])
    assert all(isinstance(o, Run) and o.state is RunState.RUNNING for o in outcomes)
    # Then its read of the rows searches the primary key for each (a row-value IN scans the whole table)
    [(sql, params)] = [(q, p) for q, p in reads if "FROM runs" in q or "JOIN runs" in q]
    plan = [str(row[3]) for row in real(f"EXPLAIN QUERY PLAN {sql}", params)]
    assert any(step.startswith("SEARCH runs USING PRIMARY KEY") for step in plan), plan
    assert not any(step.startswith("SCAN runs") for step in plan), plan


def test_a_run_started_by_another_process_after_the_batch_read_it_is_not_started_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, other = SqliteStore(tmp_path / "s.sqlite"), SqliteStore(tmp_path / "s.sqlite")
    run = put_run(store, make_job("cas-start"))
    _between_read_and_write(store, monkeypatch, lambda: start(other, run, owner="other"))
    lease = T0 + timedelta(seconds=LEASE)
    [outcome] = store.start_many([RunStart(run.job_id, T0, 1, "mine", lease, T0, watch_at=lease)])
    # the snapshot said PENDING; the row changed before the write: decided again on the latest row
    assert isinstance(outcome, StartRejectedError)
    stored = store.get_run(run.job_id, T0)
    assert stored is not None and (stored.lease_owner, stored.fencing_token) == ("other", 1)


def test_an_end_after_a_write_that_came_between_read_and_write_keeps_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, other = SqliteStore(tmp_path / "s.sqlite"), SqliteStore(tmp_path / "s.sqlite")
    running = start(store, put_run(store, make_job("cas-end")))
    event = {"at": T0 + S, "kind": "note", "detail": {"by": "other"}}
    rewatched = T0 + timedelta(seconds=2 * LEASE)

    def meanwhile() -> None:
        # a token-conditional transition and an unconditional append, both from another process
        assert other.rewatch_running(running.job_id, T0, fencing_token=1, watch_at=rewatched) is not None
        other.record_event(running.job_id, T0, event)

    _between_read_and_write(store, monkeypatch, meanwhile)
    [ended] = store.end_attempts([ending(running, RunState.SUCCEEDED, now=T0 + timedelta(seconds=5))])
    assert not isinstance(ended, Exception) and ended.state is RunState.SUCCEEDED
    # applied over the latest row, not the snapshot: the other process's event is kept
    assert [(e.kind, e.detail) for e in ended.events] == [("note", {"by": "other"})]
    assert store.get_run(running.job_id, T0) == ended
    # a lease-expiry end decided on a row the worker finished meanwhile is refused; the finish stands
    monkeypatch.undo()
    racing = start(store, put_run(store, make_job("cas-expiry")))
    _between_read_and_write(
        store,
        monkeypatch,
        lambda: other.end_attempt(ending(racing, RunState.SUCCEEDED, now=T0 + timedelta(seconds=LEASE))),
    )
    expiry = ending(racing, RunState.FAILED, now=T0 + timedelta(seconds=LEASE)).with_fence(
        lease_expired_by=T0 + timedelta(seconds=LEASE)
    )
    [refused] = store.end_attempts([expiry])
    assert isinstance(refused, LeaseLostError)
    stored = store.get_run(racing.job_id, T0)
    assert stored is not None and (stored.state, stored.fencing_token) == (RunState.SUCCEEDED, 1)
    assert [a.state for a in stored.attempts] == [RunState.SUCCEEDED]


def test_a_row_that_does_not_read_as_a_run_fails_only_its_own_item_of_a_batch(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.sqlite")
    good = [put_run(store, make_job(f"ok-{i}")) for i in range(2)]
    bad = put_run(store, make_job("unreadable"))
    with store.db.transaction() as conn:  # a row a buggy writer left: startable, but its tenant is no text
        conn.execute(
            "UPDATE runs SET doc = json_set(doc, '$.tenant', json('{\"x\": 1}')) WHERE job_id = ?",
            (bad.job_id,),
        )
    lease = T0 + timedelta(seconds=LEASE)
    outcomes = store.start_many(
        [RunStart(r.job_id, T0, 1, "w1", lease, T0, watch_at=lease) for r in (good[0], bad, good[1])]
    )
    assert isinstance(outcomes[1], Exception) and not isinstance(outcomes[1], StartRejectedError)
    for run, outcome in ((good[0], outcomes[0]), (good[1], outcomes[2])):
        assert not isinstance(outcome, Exception) and outcome.state is RunState.RUNNING
        assert store.get_run(run.job_id, T0) == outcome
