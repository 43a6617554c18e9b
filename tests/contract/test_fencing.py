"""Leases and fencing tokens: a worker that lost its run is told so, and nothing it sends is applied.

The lease rule (DESIGN.md section 5; ``services.sweeper`` and ``services.runs.expire_lease``): a lease is
expired at ``now`` when ``lease_expires_at <= now``. The sweeper picks the run up then
(``query_overdue``: ``watch_at <= now``, with ``watch_at = lease_expires_at``), decides it expired by the
same rule, and ends the attempt with ``AttemptEnd.with_fence(lease_expired_by=now)``, whose condition
``end_attempt`` applies: all three agree at the boundary, so a lease ending at T is expired at T.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from duetime.domain.errors import LeaseLostError
from duetime.domain.models import AttemptRecord, RunState
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import MS, attempt_end, make_job, put_run, start

LEASE_END = T0 + timedelta(seconds=30)


def _running(adapters: Adapters, job_id: str, **job_kw: object):
    job = make_job(job_id, **job_kw)  # type: ignore[arg-type]
    run = put_run(adapters.store, job, T0)
    return start(adapters.store, run, now=T0, lease_expires_at=LEASE_END)


# ---- the lease boundary ----------------------------------------------------------------------------------
def test_a_lease_is_not_expired_one_millisecond_before_lease_expires_at(adapters: Adapters) -> None:
    running = _running(adapters, "lease-before")
    now = LEASE_END - MS
    assert [r.due_at for r in adapters.store.query_overdue(running.shard, now)] == []
    end = attempt_end(running, RunState.FAILED, now=now, reason="worker_lost").with_fence(
        lease_expired_by=now
    )
    with pytest.raises(LeaseLostError):
        adapters.store.end_attempt(end)
    assert adapters.store.get_run(running.job_id, T0) == running


@pytest.mark.parametrize("after", [timedelta(0), MS], ids=["at-lease_expires_at", "1ms-after"])
def test_a_lease_is_expired_from_lease_expires_at_on(adapters: Adapters, after: timedelta) -> None:
    running = _running(adapters, "lease-expired")
    now = LEASE_END + after
    # the sweeper sees the run (it watches a RUNNING run at its lease's end) and its rule says: expired
    [seen] = adapters.store.query_overdue(running.shard, now)
    assert seen == running and seen.lease_expires_at is not None and seen.lease_expires_at <= now
    end = attempt_end(seen, RunState.FAILED, now=now, reason="worker_lost").with_fence(lease_expired_by=now)
    ended = adapters.store.end_attempt(end)
    # FAILED with attempts left: RETRY_WAIT, the stuck worker fenced off by the raised token
    assert (ended.state, ended.fencing_token, ended.attempt) == (RunState.RETRY_WAIT, 2, 1)
    assert ended.lease_expires_at is None and ended.lease_owner is None
    assert [(a.attempt, a.state, a.reason, a.fencing_token) for a in ended.attempts] == [
        (1, RunState.FAILED, "worker_lost", 1)
    ]
    # the stuck worker, still holding token 1, is fenced off: its finish and a rewatch under it fail
    with pytest.raises(LeaseLostError):
        adapters.store.end_attempt(attempt_end(running, RunState.SUCCEEDED, now=now + MS))
    assert adapters.store.rewatch_running(running.job_id, T0, fencing_token=1, watch_at=now + MS) is None
    assert adapters.store.get_run(running.job_id, T0) == ended


def test_a_lease_expiry_decided_on_a_stale_read_is_refused_once_the_worker_finished(
    adapters: Adapters,
) -> None:
    running = _running(adapters, "lease-finished")
    seen_by_sweeper = running  # read when the lease looked expired
    # the worker's finish is conditional on its token only: at its lease's end it still applies
    done = adapters.store.end_attempt(attempt_end(running, RunState.SUCCEEDED, now=LEASE_END))
    assert (done.state, done.fencing_token) == (RunState.SUCCEEDED, 1)
    # the sweeper's expiry, its lease condition met, is refused on the state and token it read
    end = attempt_end(seen_by_sweeper, RunState.FAILED, now=LEASE_END, reason="worker_lost").with_fence(
        lease_expired_by=LEASE_END
    )
    with pytest.raises(LeaseLostError):
        adapters.store.end_attempt(end)
    assert adapters.store.get_run(running.job_id, T0) == done


def test_rewatch_moves_a_running_runs_watch_time_under_its_token_only(adapters: Adapters) -> None:
    running = _running(adapters, "rewatch")
    later = LEASE_END + timedelta(seconds=45)
    # a stale token (the run was taken over) or a run no longer RUNNING: nothing moves
    assert adapters.store.rewatch_running(running.job_id, T0, fencing_token=0, watch_at=later) is None
    assert adapters.store.get_run(running.job_id, T0) == running
    moved = adapters.store.rewatch_running(running.job_id, T0, fencing_token=1, watch_at=later)
    assert moved is not None and moved.watch_at == later and moved.fencing_token == 1
    stored = adapters.store.get_run(running.job_id, T0)
    assert stored == moved and stored.lease_expires_at == running.lease_expires_at
    # the sweeper finds it again only once the new watch time has come
    assert running.job_id not in [
        r.job_id for r in adapters.store.query_overdue(running.shard, later - timedelta(seconds=1))
    ]
    assert running.job_id in [r.job_id for r in adapters.store.query_overdue(running.shard, later)]
    ended = adapters.store.end_attempt(attempt_end(stored, RunState.SUCCEEDED, now=later))
    assert (
        adapters.store.rewatch_running(running.job_id, T0, fencing_token=ended.fencing_token, watch_at=later)
        is None
    )


# ---- stale fencing tokens --------------------------------------------------------------------------------
def test_a_rewatch_under_a_stale_token_returns_none_and_changes_nothing(adapters: Adapters) -> None:
    running = _running(adapters, "stale-rewatch")
    for token in (0, 2):
        later = T0 + timedelta(minutes=5)
        assert adapters.store.rewatch_running(running.job_id, T0, fencing_token=token, watch_at=later) is None
    assert adapters.store.get_run(running.job_id, T0) == running


def test_an_end_under_a_stale_token_raises_lease_lost_and_changes_nothing(adapters: Adapters) -> None:
    running = _running(adapters, "stale-end")
    for token in (0, 2):
        end = attempt_end(running, RunState.SUCCEEDED, now=T0 + timedelta(seconds=5), token=token)
        with pytest.raises(LeaseLostError):
            adapters.store.end_attempt(end)
    assert adapters.store.get_run(running.job_id, T0) == running


def test_the_worker_of_an_earlier_attempt_is_fenced_off_by_the_next_start(adapters: Adapters) -> None:
    running = _running(adapters, "next-attempt", backoff_seconds=0.0)
    retrying = adapters.store.end_attempt(
        attempt_end(running, RunState.FAILED, now=T0 + timedelta(seconds=1))
    )
    assert (retrying.state, retrying.retry_at) == (RunState.RETRY_WAIT, T0 + timedelta(seconds=1))
    second = start(adapters.store, retrying, now=T0 + timedelta(seconds=2), attempt=2, owner="w2")
    assert (second.attempt, second.fencing_token, second.lease_owner) == (2, 2, "w2")
    # the first attempt's worker, still holding token 1
    assert (
        adapters.store.rewatch_running(
            running.job_id, T0, fencing_token=1, watch_at=T0 + timedelta(minutes=1)
        )
        is None
    )
    with pytest.raises(LeaseLostError):
        adapters.store.end_attempt(attempt_end(running, RunState.SUCCEEDED, now=T0 + timedelta(seconds=3)))
    assert adapters.store.get_run(running.job_id, T0) == second


def test_an_end_of_a_run_no_longer_running_raises_lease_lost(adapters: Adapters) -> None:
    running = _running(adapters, "ended-twice")
    done = adapters.store.end_attempt(attempt_end(running, RunState.SUCCEEDED, now=T0 + timedelta(seconds=1)))
    assert (done.state, done.fencing_token) == (RunState.SUCCEEDED, 1)  # the worker's own end keeps its token
    with pytest.raises(LeaseLostError):
        adapters.store.end_attempt(attempt_end(running, RunState.SUCCEEDED, now=T0 + timedelta(seconds=2)))
    assert (
        adapters.store.rewatch_running(
            running.job_id, T0, fencing_token=1, watch_at=T0 + timedelta(minutes=1)
        )
        is None
    )
    assert adapters.store.get_run(running.job_id, T0) == done


def test_after_a_cancel_the_old_tokens_rewatch_and_end_fail(adapters: Adapters) -> None:
    running = _running(adapters, "cancelled")
    now = T0 + timedelta(seconds=5)
    record = AttemptRecord(
        attempt=1, fencing_token=1, worker="w1", started_at=T0, finished_at=now, state=RunState.CANCELLED
    )
    cancelled = adapters.store.cancel(running, reason="cancelled by user", now=now, record=record)
    assert cancelled is not None
    assert (cancelled.state, cancelled.fencing_token, cancelled.error) == (
        RunState.CANCELLED,
        2,
        "cancelled by user",
    )
    assert (cancelled.finished_at, cancelled.lease_expires_at, cancelled.watch_at) == (now, None, None)
    assert cancelled.attempts == [record]
    assert (
        adapters.store.rewatch_running(
            running.job_id, T0, fencing_token=1, watch_at=now + timedelta(minutes=1)
        )
        is None
    )
    with pytest.raises(LeaseLostError):
        adapters.store.end_attempt(attempt_end(running, RunState.SUCCEEDED, now=now + MS))
    assert adapters.store.get_run(running.job_id, T0) == cancelled
