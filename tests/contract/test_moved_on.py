"""Transitions of a run that moved on: ``None``, and the run is not touched."""

from __future__ import annotations

from datetime import timedelta

from duetime.domain.models import RunState
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import MS, attempt_end, make_job, put_run, start

LATER = T0 + timedelta(minutes=1)
#: a watch time no run here starts with (a fresh PENDING run is watched at due + 60 s = LATER)
AFTER = T0 + timedelta(minutes=2)


def _unchanged(adapters: Adapters, before) -> None:
    assert adapters.store.get_run(before.job_id, before.due_at) == before


# ---- skip_pending ----------------------------------------------------------------------------------------
def test_skip_pending_skips_a_pending_run_at_its_attempt(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("skip"), T0)
    skipped = adapters.store.skip_pending(run.job_id, T0, attempt=1, reason="missed", now=LATER)
    assert skipped is not None
    assert (skipped.state, skipped.error, skipped.finished_at, skipped.watch_at) == (
        RunState.SKIPPED,
        "missed",
        LATER,
        None,
    )
    assert adapters.store.skip_pending(run.job_id, T0, attempt=1, reason="missed", now=LATER) is None
    _unchanged(adapters, skipped)


def test_skip_pending_of_another_attempt_or_a_running_run_is_none(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("skip-moved"), T0)
    assert adapters.store.skip_pending(run.job_id, T0, attempt=2, reason="missed", now=LATER) is None
    _unchanged(adapters, run)
    running = start(adapters.store, run, now=T0)
    assert adapters.store.skip_pending(run.job_id, T0, attempt=1, reason="missed", now=LATER) is None
    _unchanged(adapters, running)


def test_skip_pending_of_an_absent_run_is_none(adapters: Adapters) -> None:
    assert adapters.store.skip_pending("absent", T0, attempt=1, reason="missed", now=LATER) is None
    assert adapters.store.get_run("absent", T0) is None


# ---- hold / release_held ---------------------------------------------------------------------------------
def test_hold_of_a_held_a_running_or_a_later_attempt_run_is_none(adapters: Adapters) -> None:
    job = make_job("hold-moved", backoff_seconds=0.0)
    run = put_run(adapters.store, job, T0)
    held = adapters.store.hold(run.job_id, T0, reason="paused", now=T0, recheck_at=LATER)
    assert held is not None and (held.held, held.watch_at) == ("paused", LATER)
    assert adapters.store.hold(run.job_id, T0, reason="paused", now=T0, recheck_at=LATER + MS) is None
    _unchanged(adapters, held)

    other = put_run(adapters.store, job, T0 + timedelta(minutes=5))
    running = start(adapters.store, other, now=T0)
    assert adapters.store.hold(other.job_id, other.due_at, reason="paused", now=T0, recheck_at=LATER) is None
    _unchanged(adapters, running)
    # a second attempt (PENDING after a released retry) is not a first attempt: not held
    waiting = adapters.store.end_attempt(attempt_end(running, RunState.FAILED, now=T0 + MS))
    pending2 = adapters.store.release_retry(
        other.job_id, other.due_at, attempt=1, now=T0 + MS, watch_at=LATER
    )
    assert waiting.state is RunState.RETRY_WAIT and pending2 is not None and pending2.attempt == 2
    assert adapters.store.hold(other.job_id, other.due_at, reason="paused", now=T0, recheck_at=LATER) is None
    _unchanged(adapters, pending2)


def test_release_held_of_a_stale_read_is_none(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("release-moved"), T0)
    held = adapters.store.hold(run.job_id, T0, reason="paused", now=T0, recheck_at=LATER)
    assert held is not None
    released = adapters.store.release_held(held, now=LATER, watch_at=LATER + timedelta(seconds=60))
    assert released is not None
    assert (released.held, released.watch_at, released.state) == (
        None,
        LATER + timedelta(seconds=60),
        RunState.PENDING,
    )
    # a second resume (or the sweeper) with the same read: the run is no longer held
    assert adapters.store.release_held(held, now=LATER, watch_at=LATER + timedelta(seconds=90)) is None
    _unchanged(adapters, released)


def test_release_held_of_a_run_that_was_skipped_meanwhile_is_none(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("release-skipped"), T0)
    held = adapters.store.hold(run.job_id, T0, reason="paused", now=T0, recheck_at=LATER)
    assert held is not None
    skipped = adapters.store.skip_pending(run.job_id, T0, attempt=1, reason="deleted", now=LATER)
    assert skipped is not None and skipped.held is None
    assert adapters.store.release_held(held, now=LATER, watch_at=LATER) is None
    _unchanged(adapters, skipped)


# ---- defer_pending ---------------------------------------------------------------------------------------
def test_defer_pending_moves_the_watch_only_under_its_conditions(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("defer"), T0)
    assert run.watch_at == T0 + timedelta(seconds=60)
    store = adapters.store
    assert store.defer_pending(run.job_id, T0, attempt=2, watch_at=AFTER) is None
    assert store.defer_pending(run.job_id, T0, attempt=1, watch_at=AFTER, held="paused") is None
    assert store.defer_pending(run.job_id, T0, attempt=1, watch_at=AFTER, seen_watch_at=T0) is None
    _unchanged(adapters, run)
    moved = store.defer_pending(run.job_id, T0, attempt=1, watch_at=AFTER, seen_watch_at=run.watch_at)
    assert moved is not None and moved.watch_at == AFTER
    # of two sweepers that saw the same watch time, the second one is too late
    assert (
        store.defer_pending(run.job_id, T0, attempt=1, watch_at=AFTER + MS, seen_watch_at=run.watch_at)
        is None
    )
    _unchanged(adapters, moved)
    # a held run is deferred with its hold named
    held = store.hold(run.job_id, T0, reason="paused", now=T0, recheck_at=AFTER)
    assert held is not None
    assert store.defer_pending(run.job_id, T0, attempt=1, watch_at=AFTER + MS) is None
    deferred = store.defer_pending(run.job_id, T0, attempt=1, watch_at=AFTER + MS, held="paused")
    assert deferred is not None and (deferred.watch_at, deferred.held) == (AFTER + MS, "paused")


def test_defer_pending_of_a_running_run_is_none(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("defer-running"), T0)
    running = start(adapters.store, run, now=T0)
    assert adapters.store.defer_pending(run.job_id, T0, attempt=1, watch_at=LATER) is None
    _unchanged(adapters, running)


# ---- release_retry ---------------------------------------------------------------------------------------
def test_release_retry_of_another_attempt_or_state_is_none(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("retry-moved"), T0)
    assert adapters.store.release_retry(run.job_id, T0, attempt=1, now=LATER, watch_at=LATER) is None
    _unchanged(adapters, run)
    running = start(adapters.store, run, now=T0)
    waiting = adapters.store.end_attempt(attempt_end(running, RunState.FAILED, now=T0 + MS))
    assert adapters.store.release_retry(run.job_id, T0, attempt=2, now=LATER, watch_at=LATER) is None
    _unchanged(adapters, waiting)
    released = adapters.store.release_retry(run.job_id, T0, attempt=1, now=LATER, watch_at=LATER)
    assert released is not None and (released.state, released.attempt) == (RunState.PENDING, 2)
    assert adapters.store.release_retry(run.job_id, T0, attempt=1, now=LATER, watch_at=LATER) is None
    _unchanged(adapters, released)


# ---- cancel ----------------------------------------------------------------------------------------------
def test_cancel_of_a_stale_read_is_none(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("cancel-moved"), T0)
    running = start(adapters.store, run, now=T0)
    # read PENDING, but it started meanwhile
    assert adapters.store.cancel(run, reason="user", now=LATER) is None
    _unchanged(adapters, running)
    # read RUNNING under token 1, but it ended meanwhile
    done = adapters.store.end_attempt(attempt_end(running, RunState.SUCCEEDED, now=T0 + MS))
    assert adapters.store.cancel(running, reason="user", now=LATER) is None
    _unchanged(adapters, done)


def test_cancel_of_a_pending_run_raises_its_token_and_a_second_cancel_is_none(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("cancel-pending"), T0)
    cancelled = adapters.store.cancel(run, reason="user", now=LATER)
    assert cancelled is not None
    assert (cancelled.state, cancelled.fencing_token, cancelled.error, cancelled.watch_at) == (
        RunState.CANCELLED,
        1,
        "user",
        None,
    )
    assert cancelled.attempts == []
    assert adapters.store.cancel(run, reason="user", now=LATER) is None
    _unchanged(adapters, cancelled)


# ---- redrive ---------------------------------------------------------------------------------------------
def _dead_lettered(adapters: Adapters, job_id: str):
    run = put_run(adapters.store, make_job(job_id, max_attempts=1), T0)
    running = start(adapters.store, run, now=T0)
    failed = adapters.store.end_attempt(attempt_end(running, RunState.FAILED, now=T0 + MS))
    assert (failed.state, failed.dead_lettered) == (RunState.FAILED, True)
    return failed


def test_redrive_of_a_stale_read_is_none(adapters: Adapters) -> None:
    failed = _dead_lettered(adapters, "redrive-moved")
    redriven = adapters.store.redrive(failed, now=LATER, watch_at=LATER + timedelta(seconds=60))
    assert redriven is not None
    assert (redriven.state, redriven.attempt, redriven.max_attempts, redriven.dead_lettered) == (
        RunState.PENDING,
        2,
        2,
        False,
    )
    assert (redriven.budget_from_attempt, redriven.watch_at) == (2, LATER + timedelta(seconds=60))
    assert (redriven.finished_at, redriven.error, redriven.exit_code, redriven.dead_lettered_at) == (
        None,
    ) * 4
    # a second re-drive of the same read (a double click): the run moved on
    assert adapters.store.redrive(failed, now=LATER, watch_at=LATER) is None
    _unchanged(adapters, redriven)


def test_redrive_of_a_read_at_another_attempt_is_none(adapters: Adapters) -> None:
    failed = _dead_lettered(adapters, "redrive-attempt")
    stale = failed.model_copy(update={"attempt": 2})
    assert adapters.store.redrive(stale, now=LATER, watch_at=LATER) is None
    _unchanged(adapters, failed)
