"""Run lifecycle: start, heartbeat, finish, retry and lease expiry (DESIGN.md section 5).

Every transition is one conditional update in :class:`~duetime.store.DynamoStore`:
- start: ``PENDING -> RUNNING`` if state = PENDING and attempt = expected; ``fencing_token += 1``.
- heartbeat: extends the lease only while state = RUNNING and the fencing token is the caller's.
- finish: to a terminal state (or RETRY_WAIT) only under the caller's fencing token; a stale finish is
  rejected, recorded in the run's ``events``, and never applied.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from duetime.deps import Deps
from duetime.errors import LeaseLostError
from duetime.models import AttemptRecord, Run, RunMessage, RunState
from duetime.observability import logger
from duetime.queue import delay_seconds
from duetime.resources import SQS_MAX_DELAY_SECONDS
from duetime.retries import backoff_delay
from duetime.store import Update, terminal_removals

#: outcomes a worker may report at finish
FINISH_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.TIMED_OUT})


def start(message: RunMessage, deps: Deps, *, owner: str) -> Run:
    """Take the lease of the run ``message`` points at: PENDING -> RUNNING, new fencing token.

    Args:
        message: the queue message (job id, due time, attempt).
        owner: the worker's id, recorded as ``lease_owner``.

    Returns:
        The run as now stored (RUNNING, ``fencing_token`` is the caller's token).

    Raises:
        StartRejectedError: the run is not PENDING at that attempt: a duplicate or stale message. Drop it.
    """
    now = deps.clock.now()
    lease_expires_at = now + timedelta(seconds=deps.settings.lease_seconds)
    return deps.store.start_run(
        message.job_id,
        message.due_at,
        attempt=message.attempt,
        owner=owner,
        lease_expires_at=lease_expires_at,
        now=now,
    )


def heartbeat(run: Run, deps: Deps, *, fencing_token: int) -> Run:
    """Extend the lease by ``lease_seconds`` from now.

    Raises:
        LeaseLostError: the caller no longer holds the run; it must stop the task at once.
    """
    lease_expires_at = deps.clock.now() + timedelta(seconds=deps.settings.lease_seconds)
    return deps.store.heartbeat(
        run.job_id, run.due_at, fencing_token=fencing_token, lease_expires_at=lease_expires_at
    )


def finish(
    run: Run,
    deps: Deps,
    *,
    fencing_token: int,
    outcome: RunState,
    exit_code: int | None = None,
    error: str | None = None,
    log_key: str | None = None,
    reason: str | None = None,
) -> Run:
    """Record the end of the current attempt under ``fencing_token``.

    A FAILED attempt with attempts left goes to RETRY_WAIT (the sweeper re-queues it after the backoff);
    without attempts left the run ends FAILED with ``dead_lettered`` set. SUCCEEDED and TIMED_OUT are
    terminal.

    Args:
        run: the run as the caller last saw it (its key and attempt are used).
        fencing_token: the token the caller got at start.
        outcome: SUCCEEDED, FAILED or TIMED_OUT.
        exit_code: the task's exit status (negative: killed by that signal number).
        error: a short human reason for a failure.
        log_key: S3 key of the attempt's log.
        reason: machine-readable cause recorded on the attempt (e.g. ``exit_code``, ``timeout``, ``worker_lost``).

    Returns:
        The run as now stored.

    Raises:
        ValueError: if ``outcome`` is not a finish state.
        LeaseLostError: the token is stale; nothing was applied and the rejection is recorded on the run.
    """
    if outcome not in FINISH_STATES:
        raise ValueError(f"cannot finish a run as {outcome}")
    now = deps.clock.now()
    upd = _attempt_end_update(
        run,
        deps,
        now=now,
        fencing_token=fencing_token,
        outcome=outcome,
        exit_code=exit_code,
        error=error,
        log_key=log_key,
        reason=reason,
        worker=run.lease_owner,
    )
    try:
        ended = deps.store.fenced_transition(run.job_id, run.due_at, fencing_token=fencing_token, update=upd)
    except LeaseLostError:
        deps.store.record_event(
            run.job_id,
            run.due_at,
            {
                "at": now,
                "kind": "stale_finish_rejected",
                "detail": {"fencing_token": fencing_token, "attempt": run.attempt, "outcome": outcome.value},
            },
        )
        logger.warning("stale finish rejected", extra={"run_id": run.run_id, "fencing_token": fencing_token})
        raise
    send_retry_wake_up(ended, deps)
    return ended


def send_retry_wake_up(run: Run, deps: Deps) -> None:
    """For a run now in RETRY_WAIT, send the next attempt's message delayed until its ``retry_at``.

    Only when that is within SQS's 900 s delay limit; longer backoffs are released by the sweeper at
    ``retry_at`` (their ``watch_at``). Either way the start is conditional, so both paths are safe together.
    """
    if run.state is not RunState.RETRY_WAIT or run.retry_at is None:
        return
    delay = delay_seconds(run.retry_at, deps.clock.now())
    if (run.retry_at - deps.clock.now()).total_seconds() <= SQS_MAX_DELAY_SECONDS:
        deps.queues.send(
            run.task.tier,
            RunMessage(job_id=run.job_id, due_at=run.due_at, attempt=run.attempt + 1),
            delay=delay,
        )


def _attempt_end_update(
    run: Run,
    deps: Deps,
    *,
    now: datetime,
    fencing_token: int,
    outcome: RunState,
    exit_code: int | None,
    error: str | None,
    log_key: str | None,
    reason: str | None,
    worker: str | None,
) -> Update:
    """The update that ends the current attempt (shared by finish and lease expiry)."""
    record = AttemptRecord(
        attempt=run.attempt,
        fencing_token=fencing_token,
        worker=worker,
        started_at=run.started_at,
        finished_at=now,
        state=outcome,
        exit_code=exit_code,
        reason=reason,
        log_key=log_key,
    )
    upd = Update()
    upd.appends["attempts"] = [record.model_dump(mode="python", exclude_none=True)]
    upd.sets.update(finished_at=now, exit_code=exit_code, error=error, log_key=log_key)
    for attr in ("exit_code", "error", "log_key"):
        if upd.sets[attr] is None:
            del upd.sets[attr]
            upd.removes.append(attr)
    if outcome is RunState.FAILED and run.attempt < run.max_attempts:
        delay = backoff_delay(run.retry, run.attempt)
        retry_at = now + timedelta(seconds=delay)
        # a delayed message wakes the retry up directly; the sweeper is the backstop one grace period later
        backstop = deps.settings.pending_grace_seconds if delay <= SQS_MAX_DELAY_SECONDS else 0.0
        upd.sets.update(
            state=RunState.RETRY_WAIT.value,
            retry_at=retry_at,
            watch_at=retry_at + timedelta(seconds=backstop),
        )
        upd.removes.extend(["lease_owner", "lease_expires_at"])
    else:
        upd.sets["state"] = outcome.value
        if outcome is RunState.FAILED:
            upd.sets["dead_lettered"] = True
        upd.removes.extend(terminal_removals())
    return upd


def expire_lease(run: Run, deps: Deps) -> Run:
    """The sweeper's verdict on a RUNNING run whose lease expired: the attempt failed, ``worker_lost``.

    The fencing token is bumped so a paused worker that wakes up is rejected. Retry rules then apply.

    Raises:
        LeaseLostError: the run changed meanwhile (heartbeat renewed it, or it finished): nothing applied.
    """
    now = deps.clock.now()
    upd = _attempt_end_update(
        run,
        deps,
        now=now,
        fencing_token=run.fencing_token,
        outcome=RunState.FAILED,
        exit_code=None,
        error="worker lost: lease expired without a heartbeat",
        log_key=None,
        reason="worker_lost",
        worker=run.lease_owner,
    )
    upd.adds["fencing_token"] = 1
    upd.extra_condition = f"{upd.name('lease_expires_at')} <= {upd.value('now', now)}"
    ended = deps.store.fenced_transition(run.job_id, run.due_at, fencing_token=run.fencing_token, update=upd)
    send_retry_wake_up(ended, deps)
    return ended
