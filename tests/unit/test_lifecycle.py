"""The one attempt-end decision (``decide_attempt_end``) that finish, lease expiry and the timeout handler
share: where a run goes after each outcome, its backoff, its dead letter and its timeout outcome."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from duetime.domain.lifecycle import (
    MAX_FREE_INTERRUPTIONS,
    build_run,
    decide_attempt_end,
    delay_seconds,
    hold_seconds,
    message_for,
    timeout_triggered_run,
)
from duetime.domain.models import (
    AttemptRecord,
    ContainerTask,
    Job,
    JobState,
    OnTimeout,
    RetryPolicy,
    Run,
    RunState,
    ScheduleSpec,
    Trigger,
)

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
GRACE = 30.0
#: no jitter: the backoff is its ceiling, 10 s x 4^(n-1) capped at 900 s
NO_JITTER = RetryPolicy(max_attempts=3, backoff_seconds=10.0, backoff_multiplier=4.0, jitter="none")


def _job(**changes: object) -> Job:
    job = Job(
        job_id="report",
        tenant="acme",
        name="report",
        schedule=ScheduleSpec(expression="rate(5 minutes)"),
        task=ContainerTask(command=["true"]),
        timeout_seconds=60,
        retry=NO_JITTER,
        state=JobState.ACTIVE,
        shard=3,
        next_fire_at=T0,
        anchor=T0 - timedelta(days=1),
        created_at=T0 - timedelta(days=1),
        updated_at=T0 - timedelta(days=1),
    )
    return job.model_copy(update=changes)


def _running(
    job: Job, *, attempt: int = 1, history: list[AttemptRecord] | None = None, **changes: object
) -> Run:
    run = build_run(job, T0, now=T0, watch_after_seconds=GRACE, trigger=Trigger.SCHEDULE)
    return run.model_copy(
        update={
            "state": RunState.RUNNING,
            "attempt": attempt,
            "fencing_token": attempt,
            "lease_owner": "w1",
            "started_at": T0 + timedelta(seconds=1),
            "attempts": history or [],
            **changes,
        }
    )


def _ended(attempt: int, reason: str | None = None, state: RunState = RunState.FAILED) -> AttemptRecord:
    return AttemptRecord(attempt=attempt, fencing_token=attempt, state=state, reason=reason)


def _end(run: Run, outcome: RunState, **kw: object):  # type: ignore[no-untyped-def]
    return decide_attempt_end(
        run,
        outcome=outcome,
        now=T0 + timedelta(minutes=2),
        fencing_token=run.fencing_token,
        watch_after_seconds=GRACE,
        worker="w1",
        **kw,  # type: ignore[arg-type]
    )


NOW = T0 + timedelta(minutes=2)


def test_a_success_is_terminal_and_records_the_attempt() -> None:
    end = _end(_running(_job()), RunState.SUCCEEDED, exit_code=0, log_key="logs/k")
    assert (end.state, end.terminal, end.dead_lettered, end.retry_at, end.watch_at) == (
        RunState.SUCCEEDED,
        True,
        False,
        None,
        None,
    )
    assert (end.record.attempt, end.record.state, end.record.exit_code, end.record.worker) == (
        1,
        RunState.SUCCEEDED,
        0,
        "w1",
    )
    assert (end.expected_token, end.bump_token, end.lease_expired_by) == (1, False, None)


@pytest.mark.parametrize(("attempt", "backoff"), [(1, 10.0), (2, 40.0)])
def test_a_failure_with_attempts_left_waits_for_its_backoff(attempt: int, backoff: float) -> None:
    end = _end(_running(_job(), attempt=attempt), RunState.FAILED, exit_code=3, error="exit 3")
    assert end.state is RunState.RETRY_WAIT and not end.dead_lettered
    assert end.retry_at == NOW + timedelta(seconds=backoff)
    # the delayed message wakes it; the sweeper is the backstop one grace period later
    assert end.watch_at == end.retry_at + timedelta(seconds=GRACE)
    assert (end.exit_code, end.error, end.max_attempts) == (3, "exit 3", None)


def test_the_last_failure_ends_the_run_failed_and_dead_lettered() -> None:
    end = _end(_running(_job(), attempt=3), RunState.FAILED, exit_code=1)
    assert (end.state, end.dead_lettered, end.retry_at, end.tenant) == (RunState.FAILED, True, None, "acme")


def test_a_backoff_longer_than_a_message_delay_is_released_by_the_sweeper_at_its_time() -> None:
    slow = RetryPolicy(max_attempts=3, backoff_seconds=1200.0, max_backoff_seconds=3600.0, jitter="none")
    end = _end(_running(_job(retry=slow)), RunState.FAILED)
    assert end.retry_at == NOW + timedelta(seconds=1200) and end.watch_at == end.retry_at


@pytest.mark.parametrize(
    ("action", "state", "outcome", "dead"),
    [
        ("retry", RunState.RETRY_WAIT, "attempt 2 after a 10.0 s backoff", False),
        ("fail", RunState.TIMED_OUT, "failed, no retry", False),
        ("trigger", RunState.TIMED_OUT, "triggered job cleanup", False),
    ],
)
def test_a_timeout_follows_on_timeout(action: str, state: RunState, outcome: str, dead: bool) -> None:
    on_timeout = OnTimeout(action=action, job_id="cleanup" if action == "trigger" else None)
    end = _end(_running(_job(on_timeout=on_timeout)), RunState.TIMED_OUT, reason="timeout")
    assert (end.state, end.timeout_action, end.timeout_outcome, end.dead_lettered) == (
        state,
        action,
        outcome,
        dead,
    )


def test_a_timeout_under_retry_without_attempts_left_is_dead_lettered() -> None:
    end = _end(_running(_job(on_timeout=OnTimeout(action="retry")), attempt=3), RunState.TIMED_OUT)
    assert (end.state, end.dead_lettered, end.timeout_outcome) == (
        RunState.TIMED_OUT,
        True,
        "no attempts left: dead-lettered",
    )


def test_an_interrupted_attempt_goes_back_at_once_without_using_an_attempt() -> None:
    end = _end(_running(_job(), attempt=3), RunState.FAILED, reason="worker_stopped")
    assert (end.state, end.retry_at, end.max_attempts) == (RunState.RETRY_WAIT, NOW, 4)


def test_interruptions_past_the_free_ones_count_as_failures() -> None:
    history = [_ended(n, "worker_stopped") for n in range(1, MAX_FREE_INTERRUPTIONS + 1)]
    run = _running(
        _job(), attempt=MAX_FREE_INTERRUPTIONS + 1, history=history, max_attempts=3 + MAX_FREE_INTERRUPTIONS
    )
    end = _end(run, RunState.FAILED, reason="worker_stopped")
    # the sixth interruption is not given back: it is the first failure (10 s backoff, no extra attempt)
    assert (end.state, end.retry_at, end.max_attempts) == (
        RunState.RETRY_WAIT,
        NOW + timedelta(seconds=10),
        None,
    )


def test_the_backoff_counts_only_the_failures_of_the_current_budget() -> None:
    # a re-drive at attempt 4 started a fresh budget: attempt 4 failing is its first failure (10 s, not 640 s)
    history = [_ended(1), _ended(2), _ended(3)]
    run = _running(_job(), attempt=4, history=history, max_attempts=6, budget_from_attempt=4)
    end = _end(run, RunState.FAILED)
    assert end.retry_at == NOW + timedelta(seconds=10)


def test_lease_expiry_and_the_timeout_handler_fence_the_worker() -> None:
    run = _running(_job())
    expired = _end(run, RunState.FAILED, reason="worker_lost").with_fence(lease_expired_by=NOW)
    assert (expired.bump_token, expired.lease_expired_by, expired.expected_token) == (True, NOW, 1)
    handled = _end(run, RunState.TIMED_OUT).with_fence(execution="report-a1")
    assert (handled.bump_token, handled.lease_expired_by, handled.timeout_execution) == (
        True,
        None,
        "report-a1",
    )


def test_only_finish_states_end_an_attempt() -> None:
    with pytest.raises(ValueError, match="cannot end as"):
        _end(_running(_job()), RunState.CANCELLED)


def test_a_triggered_run_is_named_by_the_deadline_so_every_path_makes_the_same_one() -> None:
    deadline = T0 + timedelta(seconds=61, microseconds=123_456)
    timed_out = _running(_job(), deadline_at=deadline)
    target = _job(job_id="cleanup", name="cleanup")
    first = timeout_triggered_run(timed_out, target, now=NOW, watch_after_seconds=GRACE)
    again = timeout_triggered_run(
        timed_out, target, now=NOW + timedelta(minutes=5), watch_after_seconds=GRACE
    )
    assert first.due_at == again.due_at == T0 + timedelta(seconds=61, milliseconds=123)
    assert (first.trigger, first.triggered_by, first.job_id) == (
        Trigger.TIMEOUT_HANDLER,
        timed_out.run_id,
        "cleanup",
    )


def test_a_new_run_is_watched_from_its_grace_or_its_starting_deadline() -> None:
    run = build_run(
        _job(), T0, now=T0 - timedelta(seconds=5), watch_after_seconds=GRACE, trigger=Trigger.SCHEDULE
    )
    assert (run.state, run.attempt, run.watch_at, run.start_deadline_at) == (
        RunState.PENDING,
        1,
        T0 + timedelta(seconds=GRACE),
        None,
    )
    tight = build_run(
        _job(starting_deadline_seconds=10), T0, now=T0, watch_after_seconds=GRACE, trigger=Trigger.SCHEDULE
    )
    assert tight.watch_at == tight.start_deadline_at == T0 + timedelta(seconds=10)


def test_a_wake_up_delay_is_rounded_down_and_capped_at_the_queue_limit() -> None:
    # rounded down, the wake-up comes less than a second early and the consumer holds it until its time
    assert delay_seconds(T0 + timedelta(seconds=1.2), T0) == 1
    assert delay_seconds(T0 + timedelta(seconds=2.999), T0) == 2
    assert delay_seconds(T0 + timedelta(seconds=3), T0) == 3
    assert delay_seconds(T0 + timedelta(seconds=0.4), T0) == 0
    assert delay_seconds(T0 - timedelta(seconds=5), T0) == 0
    assert delay_seconds(T0 + timedelta(hours=1), T0) == 900
    message = message_for(_running(_job()), attempt=2)
    assert (message.attempt, message.tier, message.tenant) == (2, "small", "acme")
    # a first attempt may start at its due time, a retry at its retry_at
    assert (message.retry_at, message.ready_at) == (None, message.due_at)
    retry = message_for(_running(_job()), attempt=2, retry_at=T0 + timedelta(seconds=40))
    assert retry.ready_at == T0 + timedelta(seconds=40)
    assert hold_seconds(retry, T0 + timedelta(seconds=39.25)) == 0.75
    assert hold_seconds(retry, T0 + timedelta(seconds=41)) == 0
