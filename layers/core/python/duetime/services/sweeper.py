"""The sweeper: repairs what a lost message, a dead worker or a due retry left behind.

It reads only the watchdog GSI (non-terminal runs whose ``watch_at`` has passed), never scans, and every
action is a conditional update, so running it twice at once is safe:
- PENDING and held by its job's pause: while the job is paused, look again later; once it is not (a resume
  that missed the run), settle it as the resume does (:func:`duetime.services.runs.release_held`).
- PENDING past due + grace: the message was lost (or is late); re-send it ([S0] "the run row is the truth"),
  unless attempt 1 is past its starting deadline: then it is SKIPPED. A run is first looked at sooner
  (:attr:`~duetime.config.settings.Settings.first_watch_seconds`): still PENDING then, it is watched again
  at the end of its grace.
- RUNNING past its deadline (plus the worker's kill grace and one beat interval): the worker is stuck or cut
  off; the timeout-handler state machine fences the attempt and applies ``on_timeout`` (:mod:`timeouts`).
- RUNNING on a container worker (``session_id`` set): its lease is its worker session's
  (:func:`~duetime.domain.lifecycle.lease_held`; the sessions of a page of runs read in one batch). While it
  holds, nothing is written: the run stays overdue and is looked at again at the next sweep, so a long run
  costs a read per sweep, not a write per lease period. Once it does not (the worker died, was stopped past
  its session lease, or no longer lists the run), an expired session is first revoked (its worker's next
  renewal is refused and it kills its tasks), then the attempt fails with reason ``worker_lost``.
- RUNNING without a session (a Lambda task's, its lease sized to the function's timeout) with an expired
  lease: the attempt failed with reason ``worker_lost``; retry rules apply. Its lease still ahead (its
  watch time is a lower bound: a start leaves it): watched again at the sooner of the lease's end and the
  deadline.
- RETRY_WAIT whose wake-up did not start it: back to PENDING with attempt + 1, and a message is sent. (A
  failed attempt sends its retry's message itself, delayed by the backoff; the sweeper is the backstop one
  grace period later, and the only path for backoffs beyond SQS's 900 s delay limit.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from duetime.config.observability import logger
from duetime.domain.errors import LeaseLostError
from duetime.domain.lifecycle import delay_seconds, lease_held, message_for
from duetime.domain.models import JobState, Run, RunState, Session
from duetime.domain.notifications import RunSignal
from duetime.services.deps import Deps
from duetime.services.runs import (
    HOLD_RECHECK_SECONDS,
    expire_lease,
    handler_due_at,
    release_held,
    running_watch_at,
    skip,
)
from duetime.services.timeouts import start_handler


@dataclass
class SweepResult:
    """Counts from one sweep of one shard."""

    shard: int
    resent: int = 0
    leases_expired: int = 0
    retries_released: int = 0
    deadline_skipped: int = 0
    timeouts_handled: int = 0
    held_rechecked: int = 0
    #: RUNNING runs whose lease and deadline were still ahead: watched again at the sooner of the two
    rewatched: int = 0
    #: RUNNING runs held by their worker session: nothing written, looked at again at the next sweep
    held_by_session: int = 0
    #: expired worker sessions revoked (their runs then expired)
    sessions_revoked: int = 0
    skipped: int = 0
    #: ``late`` and ``overran`` events appended to the notifications outbox
    notified: int = 0


#: overdue runs handled per batch (their sessions read together)
SWEEP_BATCH = 100


def _batches(runs: Iterable[Run]) -> Iterator[list[Run]]:
    batch: list[Run] = []
    for run in runs:
        batch.append(run)
        if len(batch) == SWEEP_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _sessions_of(runs: list[Run], now: datetime, deps: Deps) -> dict[str, Session]:
    """The worker sessions of those ``runs`` whose own lease passed (one batch read)."""
    ids = [
        run.session_id
        for run in runs
        if run.state is RunState.RUNNING
        and run.session_id is not None
        and (run.lease_expires_at is None or run.lease_expires_at <= now)
    ]
    return deps.store.get_sessions(ids) if ids else {}


def sweep(shard: int, deps: Deps) -> SweepResult:
    """Sweep one shard's overdue runs. Safe to run concurrently with itself, ticks and workers."""
    now = deps.clock.now()
    result = SweepResult(shard=shard)
    for batch in _batches(deps.store.query_overdue(shard, now)):
        sessions = _sessions_of(batch, now, deps)
        for run in batch:
            _sweep_run(run, sessions, now, result, deps)
    return result


def _sweep_run(
    run: Run, sessions: dict[str, Session], now: datetime, result: SweepResult, deps: Deps
) -> None:
    """:func:`sweep`'s decision for one overdue run (``sessions``: those of the batch's runs)."""
    try:
        if deps.notify is not None and _time_signal(run, now, deps):
            result.notified += 1
        if run.state is RunState.PENDING and run.held is not None:
            if _recheck_held(run, deps):
                result.held_rechecked += 1
            else:
                result.skipped += 1
        elif run.state is RunState.PENDING:
            if run.attempt == 1 and run.start_deadline_at is not None and now > run.start_deadline_at:
                skip(run, deps, reason="starting_deadline_exceeded")
                result.deadline_skipped += 1
            elif now < (resend_at := _resend_at(run, deps)):
                # its first look came before its pending grace ended: not lost yet, look again then (no
                # later than its `late` instant)
                step = now + timedelta(seconds=deps.settings.first_watch_seconds)
                if run.attempt == 1 and run.late_at is not None and run.late_at > now:
                    step = min(step, run.late_at)
                if _defer(run, min(resend_at, step), deps):
                    result.rewatched += 1
                else:
                    result.skipped += 1
            elif _resend(run, deps):
                result.resent += 1
            else:
                result.skipped += 1
        elif run.state is RunState.RUNNING:
            if run.deadline_at is not None and now >= handler_due_at(
                run.deadline_at, run.on_timeout.kill_grace_seconds, deps
            ):
                start_handler(run, deps)
                result.timeouts_handled += 1
            elif run.session_id is not None:
                session = sessions.get(run.session_id)
                if lease_held(run, session, now):
                    result.held_by_session += 1
                elif _end_session_lease(run, sessions, now, result, deps):
                    result.leases_expired += 1
                else:
                    result.skipped += 1
            elif run.lease_expires_at is not None and run.lease_expires_at <= now:
                expire_lease(run, deps)
                result.leases_expired += 1
                logger.warning("lease expired", extra={"run_id": run.run_id, "attempt": run.attempt})
            elif _rewatch(run, deps):
                result.rewatched += 1
            else:
                result.skipped += 1
        elif run.state is RunState.RETRY_WAIT:
            if _release_retry(run, deps):
                result.retries_released += 1
            else:
                result.skipped += 1
        else:
            result.skipped += 1
    except LeaseLostError:
        result.skipped += 1  # someone else moved the run on meanwhile: nothing to do


#: the run events that record a notification the sweeper found (so a run is signalled once per attempt)
LATE_EVENT, OVERRAN_EVENT = "late", "overran"


def _overrun_at(run: Run) -> datetime | None:
    if run.state is not RunState.RUNNING or run.expected_duration_seconds is None or run.started_at is None:
        return None
    return run.started_at + timedelta(seconds=run.expected_duration_seconds)


def _time_signal(run: Run, now: datetime, deps: Deps) -> bool:
    """Append a ``late`` (a first attempt still PENDING past ``late_at``; a pause's hold is not late) or
    ``overran`` (an attempt RUNNING past its expected duration) event to the notifications outbox, once:
    the run's history records it (a write the stream and the trigger ignore), so the next sweeps see it
    and append none again. True if one was appended."""
    assert deps.notify is not None
    if run.state is RunState.PENDING and run.attempt == 1 and run.held is None and run.late_at is not None:
        if now < run.late_at or any(e.kind == LATE_EVENT for e in run.events):
            return False
        kind, reason = (
            LATE_EVENT,
            f"not started {int((run.late_at - run.due_at).total_seconds())} s after its due time",
        )
    else:
        overrun_at = _overrun_at(run)
        if overrun_at is None or now < overrun_at:
            return False
        if any(e.kind == OVERRAN_EVENT and e.detail.get("attempt") == run.attempt for e in run.events):
            return False
        kind, reason = OVERRAN_EVENT, f"running longer than its expected {run.expected_duration_seconds} s"
    deps.notify.outbox.append_signals(
        [
            RunSignal(
                kind=kind,
                job_id=run.job_id,
                due_at=run.due_at,
                tenant=run.tenant,
                attempt=run.attempt,
                state=run.state.value,
                reason=reason,
                started_at=run.started_at if kind == OVERRAN_EVENT else None,
            )
        ]
    )
    # recorded after the append: a crash between the two appends it again at the next sweep (at least once;
    # the duplicate has the same event id), never loses it
    deps.store.record_event(
        run.job_id,
        run.due_at,
        {"at": now, "kind": kind, "detail": {"attempt": run.attempt, "reason": reason}},
    )
    logger.info("notification signalled", extra={"run_id": run.run_id, "kind": kind})
    return True


def _end_session_lease(
    run: Run, sessions: dict[str, Session], now: datetime, result: SweepResult, deps: Deps
) -> bool:
    """A RUNNING run its worker session no longer holds: revoke the session first if it expired or was never
    written (its worker had to renew it by now), so its worker's next renewal is refused and it stops every
    task it runs; then expire the run's lease (``worker_lost``). False if the session was renewed meanwhile
    (looked at again at the next sweep). ``sessions`` is updated, so the session's other runs in the batch
    do not revoke it again."""
    session_id = run.session_id
    assert session_id is not None
    session = sessions.get(session_id)
    if session is None or (session.revoked_at is None and not session.alive(now)):
        if not deps.store.revoke_session(session_id, now=now):
            return False
        # a session never written: its worker is the run's lease owner (the session's owner when it is)
        owner = session.owner if session is not None else (run.lease_owner or "")
        sessions[session_id] = Session(session_id, owner, now, revoked_at=now)
        result.sessions_revoked += 1
        logger.warning(
            "worker session expired: revoked",
            extra={"session_id": session_id, "owner": owner, "written": session is not None},
        )
    expire_lease(run, deps)
    logger.warning(
        "lease expired",
        extra={"run_id": run.run_id, "attempt": run.attempt, "session_id": run.session_id},
    )
    return True


def _resend_at(run: Run, deps: Deps) -> datetime:
    """When a PENDING run counts as lost (its message re-sent): a first attempt one pending grace after
    its due time, or after its claim if that came later (until then the sweeper's looks, at most
    ``first_watch_seconds`` apart, only watch it again); any other (a retry released by the sweeper, a
    run released by a resume or a redrive, one already re-sent) when its watch time comes, which every
    such write sets ``first_watch_seconds`` on: a run still not started is re-sent at each look."""
    if run.attempt == 1:
        return max(run.due_at, run.created_at) + timedelta(seconds=deps.settings.pending_grace_seconds)
    return run.watch_at or run.due_at


def _defer(run: Run, watch_at: datetime, deps: Deps) -> bool:
    """Watch a PENDING run again at ``watch_at`` (only the sweeper that saw its watch time moves it)."""
    return (
        deps.store.defer_pending(
            run.job_id, run.due_at, attempt=run.attempt, seen_watch_at=run.watch_at, watch_at=watch_at
        )
        is not None
    )


def _rewatch(run: Run, deps: Deps) -> bool:
    """A RUNNING run whose watch time came while its lease and deadline are still ahead (a start after its
    due time leaves the claim's watch time, before its lease's end): watch it again at the sooner of the
    two. False if it moved on."""
    assert run.lease_expires_at is not None
    watch_at = running_watch_at(
        run.lease_expires_at, run.deadline_at, run.on_timeout.kill_grace_seconds, deps
    )
    overrun_at = _overrun_at(run)
    if overrun_at is not None and overrun_at > deps.clock.now():
        watch_at = min(watch_at, overrun_at)
    return (
        deps.store.rewatch_running(run.job_id, run.due_at, fencing_token=run.fencing_token, watch_at=watch_at)
        is not None
    )


def _recheck_held(run: Run, deps: Deps) -> bool:
    """A run held by its job's pause: still paused, look again later; otherwise settle the job's held runs
    as the resume would have (the backstop for a resume that missed one, or a crash mid-resume)."""
    job = deps.store.get_job(run.job_id)
    if job is not None and job.state is JobState.PAUSED:
        return (
            deps.store.defer_pending(
                run.job_id,
                run.due_at,
                attempt=run.attempt,
                held=run.held,
                watch_at=deps.clock.now() + timedelta(seconds=HOLD_RECHECK_SECONDS),
            )
            is not None
        )
    release_held(run.job_id, job, deps)
    return True


def _resend(run: Run, deps: Deps) -> bool:
    """Re-send a PENDING run's message and push its watch time out by one grace period (only the sweeper
    that moved the watch time sends). Returns False if the run moved on meanwhile."""
    now = deps.clock.now()
    if not _defer(run, now + timedelta(seconds=deps.settings.first_watch_seconds), deps):
        return False
    deps.queues.send(run.task.tier, message_for(run), delay=delay_seconds(run.due_at, now))
    logger.info("pending run re-sent", extra={"run_id": run.run_id, "attempt": run.attempt})
    return True


def _release_retry(run: Run, deps: Deps) -> bool:
    """RETRY_WAIT -> PENDING with attempt + 1, then send its message. False if the run moved on."""
    now = deps.clock.now()
    released = deps.store.release_retry(
        run.job_id,
        run.due_at,
        attempt=run.attempt,
        now=now,
        watch_at=now + timedelta(seconds=deps.settings.first_watch_seconds),
    )
    if released is None:
        return False
    deps.queues.send(run.task.tier, message_for(run, attempt=run.attempt + 1))
    logger.info("retry released", extra={"run_id": run.run_id, "attempt": run.attempt + 1})
    return True
