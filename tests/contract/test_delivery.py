"""At-least-once delivery: a message delivered twice starts its attempt once; a retry's message starts the
next attempt once its ``retry_at`` has passed, and only once."""

from __future__ import annotations

from datetime import timedelta

import pytest

from duetime.domain.errors import StartRejectedError
from duetime.domain.lifecycle import message_for
from duetime.domain.models import RunMessage, RunState
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import MS, attempt_end, make_job, put_run, start


def _start_from(adapters: Adapters, message: RunMessage, *, now, owner: str = "w1"):
    return adapters.store.start(
        message.job_id,
        message.due_at,
        attempt=message.attempt,
        owner=owner,
        lease_expires_at=now + timedelta(seconds=30),
        now=now,
    )


def test_the_same_message_delivered_twice_starts_once(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("dup"), T0)
    message = message_for(run)
    started = _start_from(adapters, message, now=T0, owner="w1")
    assert (started.state, started.fencing_token, started.lease_owner) == (RunState.RUNNING, 1, "w1")
    with pytest.raises(StartRejectedError):
        _start_from(adapters, message, now=T0 + timedelta(seconds=1), owner="w2")
    assert adapters.store.get_run(run.job_id, T0) == started


def _retry_wait(adapters: Adapters, job_id: str):
    """A run whose first attempt failed at T0 + 1 s: RETRY_WAIT, its retry due 10 s later."""
    run = put_run(adapters.store, make_job(job_id, backoff_seconds=10.0), T0)
    running = start(adapters.store, run, now=T0)
    waiting = adapters.store.end_attempt(attempt_end(running, RunState.FAILED, now=T0 + timedelta(seconds=1)))
    assert (waiting.state, waiting.attempt) == (RunState.RETRY_WAIT, 1)
    assert waiting.retry_at == T0 + timedelta(seconds=11)
    return waiting


def test_a_retry_starts_at_attempt_plus_one_only_once_retry_at_has_passed(adapters: Adapters) -> None:
    waiting = _retry_wait(adapters, "retry-start")
    retry_at = waiting.retry_at
    assert retry_at is not None
    message = message_for(waiting, attempt=2)
    # too early: the message is dropped, the run waits
    with pytest.raises(StartRejectedError):
        _start_from(adapters, message, now=retry_at - MS)
    assert adapters.store.get_run(waiting.job_id, T0) == waiting
    # at retry_at it starts, attempt 2 under a new token
    second = _start_from(adapters, message, now=retry_at, owner="w2")
    assert (second.state, second.attempt, second.fencing_token) == (RunState.RUNNING, 2, 2)
    assert (second.retry_at, second.finished_at, second.exit_code, second.error) == (None, None, None, None)
    assert [a.attempt for a in second.attempts] == [1]
    # a duplicate of the retry's message, or a late first-attempt message, is dropped
    with pytest.raises(StartRejectedError):
        _start_from(adapters, message, now=retry_at + MS, owner="w3")
    with pytest.raises(StartRejectedError):
        _start_from(adapters, message_for(waiting, attempt=1), now=retry_at + MS, owner="w3")
    assert adapters.store.get_run(waiting.job_id, T0) == second


def test_a_retry_wait_run_does_not_start_at_its_own_attempt_or_two_ahead(adapters: Adapters) -> None:
    waiting = _retry_wait(adapters, "retry-wrong")
    late = T0 + timedelta(minutes=5)
    for attempt in (1, 3):
        with pytest.raises(StartRejectedError):
            _start_from(adapters, message_for(waiting, attempt=attempt), now=late)
    assert adapters.store.get_run(waiting.job_id, T0) == waiting


def test_a_retry_released_by_the_sweeper_starts_once_from_its_message(adapters: Adapters) -> None:
    waiting = _retry_wait(adapters, "retry-released")
    now = T0 + timedelta(minutes=2)
    released = adapters.store.release_retry(
        waiting.job_id, T0, attempt=1, now=now, watch_at=now + timedelta(seconds=60)
    )
    assert released is not None
    assert (released.state, released.attempt, released.retry_at) == (RunState.PENDING, 2, None)
    # the delayed message the failed attempt sent and the sweeper's own: both name attempt 2
    message = message_for(waiting, attempt=2)
    started = _start_from(adapters, message, now=now + MS)
    assert (started.attempt, started.fencing_token) == (2, 2)
    with pytest.raises(StartRejectedError):
        _start_from(adapters, message, now=now + 2 * MS)
