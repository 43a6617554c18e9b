"""Run lifecycle: start, finish, retry and lease expiry (DESIGN.md section 5).

Every transition is one conditional write through the run store port (:class:`duetime.domain.ports.RunStore`):
- start: ``PENDING -> RUNNING`` if state = PENDING and attempt = expected; ``fencing_token += 1``.
- finish: to a terminal state (or RETRY_WAIT) only under the caller's fencing token; a stale finish is
  rejected, recorded in the run's ``events``, and never applied.

While a run is RUNNING its worker writes nothing to its row: its worker's session
(:mod:`duetime.services.sessions`) holds it once its own lease (from its start) has passed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from aws_lambda_powertools.metrics import MetricUnit

from duetime.config.observability import emit_metric, emit_metric_values, logger
from duetime.domain import admission
from duetime.domain.admission import (
    SLOT_TRIGGERS,
    Verdict,
    admit,
    keeps_missed,
    obsolete_slot,
    schedule_of,
    select_slots,
)
from duetime.domain.errors import AlreadyClaimedError, LeaseLostError, StartRejectedError
from duetime.domain.lifecycle import (
    FINISH_STATES,
    INTERRUPTED_REASON,
    MAX_FREE_INTERRUPTIONS,
    MAX_MESSAGE_DELAY_SECONDS,
    AttemptEnd,
    decide_attempt_end,
    delay_seconds,
    message_for,
    timeout_triggered_run,
)
from duetime.domain.logs import log_key
from duetime.domain.models import AttemptRecord, Job, JobState, Run, RunMessage, RunState
from duetime.domain.ports import RunStart
from duetime.services.deps import Deps

__all__ = ["FINISH_STATES", "INTERRUPTED_REASON", "MAX_FREE_INTERRUPTIONS"]


#: how long a run whose tenant is at its RUNNING quota waits before its start is tried again, seconds
TENANT_BUSY_RETRY_SECONDS = 5
#: how often the sweeper looks at a run held by a pause (the backstop if a resume missed it), seconds
HOLD_RECHECK_SECONDS = 300
#: the latest due time a query for a job's held runs covers (all of them)
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)


class NotStartedError(StartRejectedError):
    """The run was deliberately not started: SKIPPED (overlap, starting deadline) or left waiting."""


def start(
    message: RunMessage,
    deps: Deps,
    *,
    owner: str,
    lease_seconds: float | None = None,
    session_id: str | None = None,
) -> Run:
    """Take the lease of the run ``message`` points at: PENDING -> RUNNING, new fencing token.

    For a job with an overlap policy (``message.overlap``), the job's earlier active runs are looked up
    first (active-runs GSI) and the policy applied: the run may be SKIPPED, left waiting (PENDING; a
    predecessor's end or the sweeper wakes it), or start after CANCELLING its predecessors. An attempt 1
    past its starting deadline is SKIPPED. (:func:`start_many` of one message.)

    Args:
        message: the queue message (job id, due time, attempt).
        owner: the worker's id, recorded as ``lease_owner``.
        lease_seconds: the run's own lease from the start (default ``settings.lease_seconds``); the
            dispatcher sizes a Lambda run's lease to the function's timeout, as nothing renews it.
        session_id: the worker session whose renewals hold the lease past that (a container worker's).

    Returns:
        The run as now stored (RUNNING, ``fencing_token`` is the caller's token).

    Raises:
        StartRejectedError: the run is not PENDING at that attempt (a duplicate, stale or early message), or
            (``NotStartedError``) the policy kept it from starting. Either way: drop the message.
    """
    [started] = start_many([message], deps, owner=owner, lease_seconds=lease_seconds, session_id=session_id)
    if isinstance(started, Exception):
        raise started
    return started


def start_many(
    messages: Sequence[RunMessage],
    deps: Deps,
    *,
    owner: str,
    lease_seconds: float | None = None,
    session_id: str | None = None,
) -> list[Run | Exception]:
    """:func:`start` of each of ``messages`` (a worker's poll), with one read of their jobs and one
    conditional write of each (one transaction on the embedded store: :meth:`RunStore.start_many`).

    Returns:
        For each message, in order: the run as now stored (RUNNING under the caller's new token), or the
        error its own ``start`` would raise (StartRejectedError / NotStartedError: drop the message), or a
        fault of the store or the queue (the message comes back after its visibility timeout).
    """
    return start_and_finish(
        messages, (), deps, owner=owner, lease_seconds=lease_seconds, session_id=session_id
    )[0]


def start_and_finish(
    messages: Sequence[RunMessage],
    finishes: Sequence[Finish],
    deps: Deps,
    *,
    owner: str,
    lease_seconds: float | None = None,
    session_id: str | None = None,
    takes_retry: Callable[[Run], bool] | None = None,
) -> tuple[list[Run | Exception], list[Run | Exception]]:
    """A worker session's writes of one moment: :func:`start_many` of ``messages`` and
    :func:`finish_many` of ``finishes``, their conditional writes applied together (one transaction, one
    commit on the embedded store: :meth:`RunStore.start_and_end`; on DynamoDB one request each). The
    starts record ``session_id``, the worker session whose renewals then hold their leases (None: each
    run's own lease of ``lease_seconds`` is all it has).

    ``takes_retry`` is asked about each end recorded as RETRY_WAIT: True means the caller wakes the next
    attempt itself (a worker that holds a short backoff and starts the retry from the same delivery), so
    no wake-up message is sent for it; the sweeper's backstop (the run's watch time, ``retry_at`` plus
    ``first_watch_seconds``) still covers a caller that dies meanwhile.

    Returns:
        (the starts' outcomes, the finishes' outcomes), each as :func:`start_many` and :func:`finish_many`
        give them.
    """
    now = deps.clock.now()
    started, planned_starts = _plan_starts(
        messages, deps, now, owner=owner, lease_seconds=lease_seconds, session_id=session_id
    )
    ended, planned_ends = _plan_ends(finishes, deps, now)
    starts = [item for _, item in planned_starts]
    ends = [end for _, end in planned_ends]
    start_outcomes: list[Run | Exception]
    end_outcomes: list[Run | Exception]
    try:
        if starts and ends:
            start_outcomes, end_outcomes = deps.store.start_and_end(starts, ends)
        else:
            start_outcomes = deps.store.start_many(starts) if starts else []
            end_outcomes = deps.store.end_attempts(ends) if ends else []
    except Exception as exc:  # noqa: BLE001 - none was applied: each planned write's outcome is this fault
        start_outcomes, end_outcomes = [exc] * len(starts), [exc] * len(ends)
    _after_ends(finishes, planned_ends, end_outcomes, ended, deps, now, takes_retry)
    _after_starts(messages, planned_starts, start_outcomes, started, deps, now)
    return _filled(started), _filled(ended)


def _filled(results: list[Run | Exception | None]) -> list[Run | Exception]:
    return [r if r is not None else RuntimeError("no outcome") for r in results]


def _plan_starts(
    messages: Sequence[RunMessage],
    deps: Deps,
    now: datetime,
    *,
    owner: str,
    lease_seconds: float | None,
    session_id: str | None = None,
) -> tuple[list[Run | Exception | None], list[tuple[int, RunStart]]]:
    """The checks before the starts' writes (admission against the jobs, read at once; overlap; the
    tenant's RUNNING quota): the outcomes decided already (None: to be written) and the writes planned."""
    results: list[Run | Exception | None] = [None] * len(messages)
    firsts = [m.job_id for m in messages if m.attempt == 1]
    jobs: dict[str, Job] = {}
    jobs_fault: Exception | None = None
    try:
        jobs = deps.store.get_jobs(firsts) if firsts else {}
    except Exception as exc:  # noqa: BLE001 - every first attempt's outcome is this fault
        jobs_fault = exc
    limit = deps.settings.tenant_max_running
    lease = timedelta(seconds=lease_seconds or deps.settings.lease_seconds)
    planned: list[tuple[int, RunStart]] = []
    #: starts of this batch planned so far per tenant (they count against its RUNNING quota too)
    planned_by_tenant: dict[str, int] = {}
    #: each tenant's RUNNING count, read once per batch (the batch's own starts are added above)
    running: dict[str, int] = {}

    def _running(tenant: str) -> int:
        if tenant not in running:
            running[tenant] = deps.store.count_running(tenant)
        return running[tenant]

    for i, message in enumerate(messages):
        try:
            if message.attempt == 1:
                if jobs_fault is not None:
                    raise jobs_fault
                _admit(message, deps, now, jobs.get(message.job_id))
            if message.overlap:
                _apply_overlap(message, deps)
            if (
                limit is not None
                and message.tenant
                and message.tier
                and _running(message.tenant) + planned_by_tenant.get(message.tenant, 0) >= limit
            ):
                # the tenant is at its concurrency quota: look again shortly (the run stays PENDING, watched)
                deps.queues.send(message.tier, message, delay=TENANT_BUSY_RETRY_SECONDS)
                raise NotStartedError(
                    f"tenant {message.tenant!r} has {limit} runs RUNNING, its quota; run {message.run_id} waits"
                )
        except Exception as exc:  # noqa: BLE001 - this message's outcome; the others go on
            results[i] = exc
            continue
        lease_expires_at = now + lease
        deadline_at = (
            now + timedelta(seconds=message.timeout_seconds) if message.timeout_seconds is not None else None
        )
        watch_at = _start_watch_at(message, now, lease_expires_at, deadline_at, deps)
        if message.tenant:
            planned_by_tenant[message.tenant] = planned_by_tenant.get(message.tenant, 0) + 1
        planned.append(
            (
                i,
                RunStart(
                    message.job_id,
                    message.due_at,
                    message.attempt,
                    owner,
                    lease_expires_at,
                    now,
                    deadline_at=deadline_at,
                    watch_at=watch_at,
                    running_tenant=message.tenant if limit is not None else None,
                    session_id=session_id,
                ),
            )
        )
    return results, planned


def _start_watch_at(
    message: RunMessage, now: datetime, lease_expires_at: datetime, deadline_at: datetime | None, deps: Deps
) -> datetime | None:
    """The watch time a start sets: None (it stays, the lazy rule of :meth:`RunStore.rewatch_running`),
    unless the attempt's timeout handler is due before ``now + first_watch_seconds``: then the handler's due
    time (never later than the lease's end).

    This relies on the invariant every write of a run waiting to start keeps: it is watched at most
    ``first_watch_seconds`` after the moment it could start (its due time or a retry's, or the write:
    the claim, a retry's end, the sweeper's first look and re-send, a resume, a redrive, an overlap wait).
    So the watch time a start finds is at most ``now + first_watch_seconds``, which is never after the
    lease's end (``first_watch_seconds <= lease_seconds``): a worker that dies early in the run is found
    at its lease's end (plus one sweep), and its timeout handler on time. A job's
    ``expected_duration_seconds`` sooner than that moves it too (its ``overran`` notification)."""
    overrun_at = (
        now + timedelta(seconds=message.expected_duration_seconds)
        if message.expected_duration_seconds is not None
        else None
    )
    if deadline_at is None and overrun_at is None:
        return None
    watch_at = (
        running_watch_at(lease_expires_at, deadline_at, message.kill_grace_seconds, deps)
        if deadline_at is not None
        else lease_expires_at
    )
    if overrun_at is not None:  # notifications: the sweeper finds it overran at once
        watch_at = min(watch_at, overrun_at)
    # the lease's end is never before now + first_watch_seconds: only a handler (or overrun) due sooner moves it
    return watch_at if watch_at < now + timedelta(seconds=deps.settings.first_watch_seconds) else None


def _after_starts(
    messages: Sequence[RunMessage],
    planned: list[tuple[int, RunStart]],
    outcomes: list[Run | Exception],
    results: list[Run | Exception | None],
    deps: Deps,
    now: datetime,
) -> None:
    lags: list[float] = []
    for (i, _), outcome in zip(planned, outcomes, strict=True):
        if isinstance(outcome, StartRejectedError):
            outcome = _rejected(messages[i], deps, now, outcome)
        elif isinstance(outcome, Run) and outcome.attempt == 1 and outcome.started_at is not None:
            # schedule lag, the "on time" promise: start minus due time of a run's first attempt (DESIGN.md 10)
            lags.append((outcome.started_at - outcome.due_at).total_seconds())
        results[i] = outcome
    try:
        emit_metric_values("ScheduleLag", lags, MetricUnit.Seconds)  # one EMF line for the batch
    except Exception as exc:  # noqa: BLE001 - a metric's failure never undoes the starts
        logger.warning("schedule lag metric not emitted", extra={"error": str(exc)})


def _rejected(message: RunMessage, deps: Deps, now: datetime, rejection: StartRejectedError) -> Exception:
    """A refused start: an attempt 1 still PENDING past its starting deadline is SKIPPED (NotStartedError);
    anything else keeps ``rejection`` (a duplicate, stale or early message)."""
    try:
        run = deps.store.get_run(message.job_id, message.due_at)
        if (
            run is not None
            and run.state is RunState.PENDING
            and run.attempt == 1 == message.attempt
            and run.start_deadline_at is not None
            and now > run.start_deadline_at
        ):
            skip(run, deps, reason="starting_deadline_exceeded")
            return NotStartedError(f"run {run.run_id} missed its starting deadline")
    except Exception as exc:  # noqa: BLE001 - the message's outcome is this fault
        return exc
    return rejection


def _admit(message: RunMessage, deps: Deps, now: datetime, job: Job | None) -> None:
    """Re-check a first attempt against its job as it is now (``job``, just read; None: deleted):
    :func:`duetime.domain.admission.admit`.

    Raises:
        NotStartedError: the run was SKIPPED (deleted, schedule_changed, missed) or held (paused).
    """
    trigger = message.trigger
    if trigger is None:  # a message sent before triggers travelled with it: the row knows
        row = deps.store.get_run(message.job_id, message.due_at)
        if row is None or row.state is not RunState.PENDING:
            return  # the conditional start rejects it
        trigger = row.trigger
    verdict = admit(
        job=job,
        due_at=message.due_at,
        trigger=trigger,
        attempt=message.attempt,
        now=now,
        schedule=schedule_of(job) if job is not None else None,
        job_created_at=message.job_created_at,
    )
    if verdict.verdict is Verdict.SKIP and verdict.reason == admission.MISSED and job is not None:
        # a second look before dropping a missed slot: newer slots that already ran, ended or were skipped
        # (it waited behind an overlap, or its wake-up was lost while they ran on time) do not compete
        horizon = now - timedelta(seconds=job.catch_up.tolerance_seconds)
        newer, _ = deps.store.query_runs(
            message.job_id, limit=1000, since=message.due_at + timedelta(milliseconds=1), until=horizon
        )
        settled = frozenset(r.due_at for r in newer if r.state is not RunState.PENDING or r.attempts)
        if keeps_missed(message.due_at, now, job.catch_up, schedule_of(job), settled):
            return
    if verdict.verdict is Verdict.START:
        return
    if verdict.verdict is Verdict.HOLD:
        hold(message.job_id, message.due_at, deps)
        raise NotStartedError(f"run {message.run_id} held: its job is paused")
    reason = verdict.reason or "skipped"
    skipped = skip_pending(message.job_id, message.due_at, deps, attempt=1, reason=reason)
    if skipped is not None and reason == admission.MISSED:
        deps.store.add_missed_slots(message.job_id, 1)
    raise NotStartedError(f"run {message.run_id} skipped: {reason}")


def hold(job_id: str, due_at: datetime, deps: Deps) -> Run | None:
    """PENDING (attempt 1) -> held: the run of a paused job waits, out of the queue, for the resume.

    It joins the job's active-runs index (so the resume finds it) and is watched again after
    HOLD_RECHECK_SECONDS (the sweeper's backstop). Returns None if the run moved on meanwhile.
    """
    now = deps.clock.now()
    held = deps.store.hold(
        job_id,
        due_at,
        reason=admission.PAUSED,
        now=now,
        recheck_at=now + timedelta(seconds=HOLD_RECHECK_SECONDS),
    )
    if held is None:
        return None
    logger.info("run held: job paused", extra={"run_id": held.run_id})
    return held


def held_runs(job_id: str, deps: Deps) -> list[Run]:
    """The job's runs held by a pause, oldest first (read strongly consistent after the index query)."""
    found = []
    for due_at in deps.store.query_active(job_id, before=_FAR_FUTURE):
        run = deps.store.get_run(job_id, due_at)
        if run is not None and run.state is RunState.PENDING and run.held is not None:
            found.append(run)
    return found


def release_held(
    job_id: str, job: Job | None, deps: Deps, *, known: Sequence[datetime] = ()
) -> tuple[int, int]:
    """Settle the runs a pause held, once the job is no longer PAUSED.

    Deleted job: all end SKIPPED (``deleted``). Otherwise the ones that are no longer slots of the job's
    schedule end SKIPPED (``schedule_changed``), and the catch-up policy picks among the rest
    (:func:`duetime.domain.admission.select_slots`, whatever their lateness): the kept ones go back to the queue
    at once, the others end SKIPPED (``paused``) and count in the job's ``missed_slots``. Every step is
    conditional, so a resume and the sweeper may both run it.

    Args:
        known: due times of runs the caller held itself (read by key: the active-runs index may not show
            them yet).

    Returns:
        (released, skipped) counts. Nothing happens while the job is still PAUSED.
    """
    if job is not None and job.state is JobState.PAUSED:
        return 0, 0
    # the index lags its table: the runs the caller just held are read by key
    found = {r.due_at: r for r in held_runs(job_id, deps)}
    for due_at in known:
        if due_at not in found:
            row = deps.store.get_run(job_id, due_at)
            if row is not None and row.state is RunState.PENDING and row.held is not None:
                found[due_at] = row
    held = [found[d] for d in sorted(found)]
    if not held:
        return 0, 0
    skipped = 0
    if job is None or job.state is JobState.DELETED:
        for run in held:
            skipped += skip(run, deps, reason=admission.DELETED) is not None
        return 0, skipped
    schedule = schedule_of(job)
    slots = []
    for run in held:
        if run.trigger in SLOT_TRIGGERS and obsolete_slot(job, run.due_at, schedule):
            skipped += skip(run, deps, reason=admission.SCHEDULE_CHANGED) is not None
        else:
            slots.append(run)
    kept, dropped = select_slots([r.due_at for r in slots], job.catch_up)
    by_due = {r.due_at: r for r in slots}
    dropped_count = 0
    for due_at in dropped:
        dropped_count += skip(by_due[due_at], deps, reason=admission.PAUSED) is not None
    if dropped_count:
        deps.store.add_missed_slots(job_id, dropped_count)
    released = 0
    now = deps.clock.now()
    for due_at in kept:
        released_run = deps.store.release_held(
            by_due[due_at], now=now, watch_at=now + timedelta(seconds=deps.settings.first_watch_seconds)
        )
        if released_run is None:
            continue
        deps.queues.send(released_run.task.tier, message_for(released_run))
        released += 1
    return released, skipped + dropped_count


def settle_claimed_ahead(job: Job | None, job_id: str, deps: Deps, *, since: datetime) -> int:
    """End at once the job's PENDING first attempts due from ``since`` on that would not start anyway.

    The start re-checks every run (:func:`_admit`); this applies the same verdict ahead of time to the
    runs a tick claimed inside its look-ahead, so that a DELETE or a schedule change shows at once
    (``deleted``, ``schedule_changed``). Returns how many runs were SKIPPED.
    """
    schedule = schedule_of(job) if job is not None else None
    skipped = 0
    for run in all_runs(job_id, deps, state=RunState.PENDING, since=since):
        if run.attempt != 1 or run.held is not None:
            continue
        verdict = admit(
            job=job,
            due_at=run.due_at,
            trigger=run.trigger,
            attempt=1,
            now=run.due_at,
            schedule=schedule,
            job_created_at=run.job_created_at,
        )
        if verdict.verdict is Verdict.SKIP and verdict.reason in (
            admission.DELETED,
            admission.SCHEDULE_CHANGED,
        ):
            skipped += skip(run, deps, reason=verdict.reason) is not None
    return skipped


def all_runs(
    job_id: str,
    deps: Deps,
    *,
    state: RunState | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    active_only: bool = False,
) -> Iterator[Run]:
    """Every run of the job due in ``[since, until]`` (of ``state``; ``active_only``: not terminal), newest
    due time first, read page by page (100 runs a page)."""
    token: str | None = None
    while True:
        page, token = deps.store.query_runs(
            job_id,
            limit=100,
            page_token=token,
            state=state.value if state is not None else None,
            since=since,
            until=until,
            active_only=active_only,
        )
        yield from page
        if token is None:
            return


def _apply_overlap(message: RunMessage, deps: Deps) -> None:
    """Enforce the job's overlap policy before starting; raises NotStartedError when it must not start."""
    run = deps.store.get_run(message.job_id, message.due_at)
    if run is None or run.state not in (RunState.PENDING, RunState.RETRY_WAIT) or not run.overlap.enforced:
        return  # the conditional start decides
    earlier = deps.store.query_active(run.job_id, before=run.due_at)
    if earlier and run.trigger not in SLOT_TRIGGERS:
        # runs a pause holds are not active predecessors of a manual run (a paused job's manual runs run)
        rows = [deps.store.get_run(run.job_id, d) for d in earlier]
        earlier = [r.due_at for r in rows if r is not None and r.held is None and not r.state.terminal]
    if len(earlier) < run.overlap.limit:
        return
    policy = run.overlap.policy
    if policy == "skip":
        skip(run, deps, reason="overlap: an earlier run of the job is still active")
        raise NotStartedError(f"run {run.run_id} skipped (overlap policy skip)")
    if policy == "cancel_previous":
        for due_at in earlier:
            cancel(run.job_id, due_at, deps, reason=f"cancelled by overlap policy: run {run.run_id} started")
        return
    if policy == "buffer_one":
        others = [deps.store.get_run(run.job_id, d) for d in earlier]
        if any(o is not None and o.state is RunState.PENDING for o in others):
            skip(run, deps, reason="overlap: one run is already waiting (buffer_one)")
            raise NotStartedError(f"run {run.run_id} skipped (buffer_one: buffer full)")
    _wait(run, deps)
    raise NotStartedError(f"run {run.run_id} waits for {len(earlier)} earlier active run(s)")


def _wait(run: Run, deps: Deps) -> None:
    """Leave a run PENDING behind its active predecessors; the sweeper re-checks it after one grace period."""
    if run.state is not RunState.PENDING:
        return
    deps.store.defer_pending(
        run.job_id,
        run.due_at,
        attempt=run.attempt,
        held=run.held,
        watch_at=deps.clock.now() + timedelta(seconds=deps.settings.first_watch_seconds),
    )


def skip(run: Run, deps: Deps, *, reason: str) -> Run | None:
    """PENDING -> SKIPPED (terminal) with ``reason`` as its error; None if the run moved on meanwhile."""
    return skip_pending(run.job_id, run.due_at, deps, attempt=run.attempt, reason=reason)


def skip_pending(job_id: str, due_at: datetime, deps: Deps, *, attempt: int, reason: str) -> Run | None:
    """The run ``(job_id, due_at)``, PENDING at ``attempt`` -> SKIPPED with ``reason`` as its error.

    Returns the run as stored, or None if it was not PENDING at that attempt (it moved on meanwhile).
    """
    skipped = deps.store.skip_pending(job_id, due_at, attempt=attempt, reason=reason, now=deps.clock.now())
    if skipped is None:
        return None
    logger.info("run skipped", extra={"run_id": skipped.run_id, "reason": reason})
    after_terminal(skipped, deps)
    return skipped


def cancel(job_id: str, due_at: datetime, deps: Deps, *, reason: str) -> Run | None:
    """Any non-terminal state -> CANCELLED, fencing token bumped so a running worker's session finds it at
    its next beat and kills the task. A RUNNING attempt is recorded in ``attempts`` (reason ``cancelled``,
    with the log key its worker uploads to). Returns None if the run was already terminal (or absent)."""
    for _ in range(3):  # re-read if the run moves on between the read and the conditional write
        run = deps.store.get_run(job_id, due_at)
        if run is None or run.state.terminal:
            return None
        now = deps.clock.now()
        record = None
        if run.state is RunState.RUNNING:
            record = AttemptRecord(
                attempt=run.attempt,
                fencing_token=run.fencing_token,
                worker=run.lease_owner,
                started_at=run.started_at,
                finished_at=now,
                state=RunState.CANCELLED,
                reason="cancelled",
                log_key=log_key(run.job_id, run.run_id, run.attempt),
            )
        cancelled = deps.store.cancel(run, reason=reason, now=now, record=record)
        if cancelled is None:
            continue
        logger.info("run cancelled", extra={"run_id": cancelled.run_id, "reason": reason})
        after_terminal(cancelled, deps)
        return cancelled
    return None


def after_terminal(run: Run, deps: Deps) -> None:
    """Once a run of an overlap-policy job ends, wake the job's next waiting run at once."""
    if not run.state.terminal or not run.overlap.enforced:
        return
    for due_at in deps.store.query_active_after(run.job_id, after=run.due_at, limit=1):
        waiting = deps.store.get_run(run.job_id, due_at)
        if waiting is not None and waiting.state is RunState.PENDING:
            deps.queues.send(waiting.task.tier, message_for(waiting))


def handler_due_at(deadline_at: datetime, kill_grace_seconds: float, deps: Deps) -> datetime:
    """When the sweeper steps in for an attempt past its deadline: the worker gets its kill grace plus one
    beat interval (``heartbeat_seconds``) to enforce the timeout itself first."""
    return deadline_at + timedelta(seconds=kill_grace_seconds + deps.settings.heartbeat_seconds)


def running_watch_at(
    lease_expires_at: datetime, deadline_at: datetime | None, kill_grace_seconds: float, deps: Deps
) -> datetime:
    """When the sweeper must next look at a RUNNING run (UTC): the sooner of its lease's end and, with a
    deadline, its timeout handler's due time (:func:`handler_due_at`)."""
    if deadline_at is None:
        return lease_expires_at
    return min(lease_expires_at, handler_due_at(deadline_at, kill_grace_seconds, deps))


@dataclass(frozen=True)
class Finish:
    """The end of a run's current attempt as its executor saw it (:func:`finish`'s arguments)."""

    run: Run
    fencing_token: int
    outcome: RunState
    exit_code: int | None = None
    error: str | None = None
    log_key: str | None = None
    reason: str | None = None
    result_json: str | None = None
    result_truncated: bool = False
    #: bytes of the attempt's final log (0: empty, none was stored); None: not known
    log_bytes: int | None = None
    #: the log pack holding that log, and where it starts in it (several attempts' logs in one object)
    log_pack: str | None = None
    log_offset: int | None = None
    #: when the attempt ended (UTC; the task's exit as its executor saw it); None: when it is recorded
    ended_at: datetime | None = None


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
    result_json: str | None = None,
    result_truncated: bool = False,
) -> Run:
    """Record the end of the current attempt under ``fencing_token`` (:func:`finish_many` of one).

    A FAILED attempt with attempts left goes to RETRY_WAIT (its wake-up is sent delayed by the backoff);
    without attempts left the run ends FAILED with ``dead_lettered`` set. A TIMED_OUT attempt follows the
    job's ``on_timeout`` action: ``retry`` like a failure, ``fail`` terminal, ``trigger`` terminal plus a run
    of the named job. SUCCEEDED is terminal.

    Args:
        run: the run as the caller last saw it (its key and attempt are used).
        fencing_token: the token the caller got at start.
        outcome: SUCCEEDED, FAILED or TIMED_OUT.
        exit_code: the task's exit status (negative: killed by that signal number).
        error: a short human reason for a failure.
        log_key: S3 key of the attempt's log.
        reason: machine-readable cause recorded on the attempt (e.g. ``exit_code``, ``timeout``, ``worker_lost``).
        result_json: a Lambda function's response as JSON text (at most MAX_RESULT_BYTES), kept as ``result``.
        result_truncated: the response was too large to keep; it is only in the attempt's log.

    Returns:
        The run as now stored.

    Raises:
        ValueError: if ``outcome`` is not a finish state.
        LeaseLostError: the token is stale; nothing was applied and the rejection is recorded on the run.
    """
    [ended] = finish_many(
        [
            Finish(
                run,
                fencing_token,
                outcome,
                exit_code=exit_code,
                error=error,
                log_key=log_key,
                reason=reason,
                result_json=result_json,
                result_truncated=result_truncated,
            )
        ],
        deps,
    )
    if isinstance(ended, Exception):
        raise ended
    return ended


def finish_many(finishes: Sequence[Finish], deps: Deps) -> list[Run | Exception]:
    """:func:`finish` of each of ``finishes`` (a worker's tasks that ended together): one conditional write
    of each (one transaction on the embedded store: :meth:`RunStore.end_attempts`), then what follows each
    end (:func:`after_attempt_end`: a retry's wake-up, a timeout's triggered run; a failure there is logged
    and left to the sweeper, the end stands).

    Returns:
        For each, in order: the run as now stored, or the error its own ``finish`` would raise (ValueError,
        LeaseLostError: recorded on the run, nothing applied), or a fault of the store (unknown whether it
        was applied: the sweeper settles the run once its lease expires).
    """
    return start_and_finish((), finishes, deps, owner="")[1]


def _plan_ends(
    finishes: Sequence[Finish], deps: Deps, now: datetime
) -> tuple[list[Run | Exception | None], list[tuple[int, AttemptEnd]]]:
    """How each attempt ends (:func:`decide_attempt_end`): the outcomes decided already (None: to be
    written) and the writes planned."""
    results: list[Run | Exception | None] = [None] * len(finishes)
    planned: list[tuple[int, AttemptEnd]] = []
    for i, item in enumerate(finishes):
        if item.outcome not in FINISH_STATES:
            results[i] = ValueError(f"cannot finish a run as {item.outcome}")
            continue
        end = replace(
            decide_attempt_end(
                item.run,
                outcome=item.outcome,
                now=item.ended_at or now,
                fencing_token=item.fencing_token,
                watch_after_seconds=deps.settings.first_watch_seconds,
                worker=item.run.lease_owner,
                exit_code=item.exit_code,
                error=item.error,
                log_key=item.log_key,
                reason=item.reason,
                log_bytes=item.log_bytes,
                log_pack=item.log_pack,
                log_offset=item.log_offset,
            ),
            result_json=item.result_json,
            result_truncated=item.result_truncated,
        )
        planned.append((i, end))
    return results, planned


def _after_ends(
    finishes: Sequence[Finish],
    planned: list[tuple[int, AttemptEnd]],
    outcomes: list[Run | Exception],
    results: list[Run | Exception | None],
    deps: Deps,
    now: datetime,
    takes_retry: Callable[[Run], bool] | None = None,
) -> None:
    for (i, _), outcome in zip(planned, outcomes, strict=True):
        item = finishes[i]
        if isinstance(outcome, LeaseLostError):
            _record_stale_finish(item, deps, now)
        elif isinstance(outcome, Run):
            try:
                taken = (
                    takes_retry is not None
                    and outcome.state is RunState.RETRY_WAIT
                    and outcome.retry_at is not None
                    and takes_retry(outcome)
                )
                after_attempt_end(outcome, deps, wake_up=not taken)
            except Exception:  # noqa: BLE001 - the end stands; the sweeper sends what did not go out
                logger.exception("after the attempt's end", extra={"run_id": outcome.run_id})
        results[i] = outcome


def _record_stale_finish(item: Finish, deps: Deps, now: datetime) -> None:
    run = item.run
    try:
        deps.store.record_event(
            run.job_id,
            run.due_at,
            {
                "at": now,
                "kind": "stale_finish_rejected",
                "detail": {
                    "fencing_token": item.fencing_token,
                    "attempt": run.attempt,
                    "outcome": item.outcome.value,
                },
            },
        )
    except Exception:  # noqa: BLE001 - the rejection stands; only its record is missing
        logger.exception("recording a stale finish failed", extra={"run_id": run.run_id})
    logger.warning("stale finish rejected", extra={"run_id": run.run_id, "fencing_token": item.fencing_token})


def after_attempt_end(run: Run, deps: Deps, *, wake_up: bool = True) -> None:
    """What follows an attempt's end, wherever it was decided (worker, sweeper, timeout handler);
    ``wake_up=False``: a retry's wake-up is not sent (its caller starts the next attempt itself)."""
    if wake_up:
        send_retry_wake_up(run, deps)
    if run.state is RunState.TIMED_OUT and run.on_timeout.action == "trigger":
        trigger_on_timeout(run, deps)
    if run.attempts and run.attempts[-1].state is RunState.TIMED_OUT:
        emit_metric("RunTimedOut")
    after_terminal(run, deps)
    _count_dead_letter(run)


def trigger_on_timeout(run: Run, deps: Deps) -> Run | None:
    """Create (idempotently) the run of ``run.on_timeout.job_id`` that ``run``'s timeout triggers, due now.

    Its due time is the timed-out attempt's deadline, so a repeated handler finds the same run instead of
    making a second. Returns None if the job to trigger no longer exists or belongs to another tenant.
    """
    target_id = run.on_timeout.job_id
    target = deps.store.get_job(target_id) if target_id else None
    if not triggerable(target, run.tenant):
        logger.warning(
            "timeout handler: job to trigger is gone", extra={"run_id": run.run_id, "job": target_id}
        )
        return None
    assert target is not None
    triggered = timeout_triggered_run(
        run, target, now=deps.clock.now(), watch_after_seconds=deps.settings.first_watch_seconds
    )
    try:
        deps.store.put_new_run(triggered)
    except AlreadyClaimedError:
        pass
    deps.queues.send(triggered.task.tier, message_for(triggered))
    return triggered


def triggerable(target: Job | None, tenant: str) -> bool:
    """Whether ``on_timeout: trigger`` may start a run of ``target``: it exists, is the same tenant's and
    is not DELETED (a manual trigger of a deleted job is a 409 for the same reason)."""
    return target is not None and target.tenant == tenant and target.state is not JobState.DELETED


def _count_dead_letter(run: Run) -> None:
    if run.dead_lettered and run.state.terminal:
        emit_metric("RunDeadLettered")
        logger.error("run dead-lettered", extra={"run_id": run.run_id, "attempts": run.attempt})


def send_retry_wake_up(run: Run, deps: Deps) -> None:
    """For a run now in RETRY_WAIT, send the next attempt's message delayed until its ``retry_at``.

    Only when that is within SQS's 900 s delay limit; longer backoffs are released by the sweeper at
    ``retry_at`` (their ``watch_at``). Either way the start is conditional, so both paths are safe together.
    """
    if run.state is not RunState.RETRY_WAIT or run.retry_at is None:
        return
    delay = delay_seconds(run.retry_at, deps.clock.now())
    if (run.retry_at - deps.clock.now()).total_seconds() <= MAX_MESSAGE_DELAY_SECONDS:
        deps.queues.send(
            run.task.tier, message_for(run, attempt=run.attempt + 1, retry_at=run.retry_at), delay=delay
        )


def expire_lease(run: Run, deps: Deps) -> Run:
    """The sweeper's verdict on a RUNNING run whose lease expired: the attempt failed, ``worker_lost``.

    The fencing token is bumped so a paused worker that wakes up is rejected. Retry rules then apply.

    Raises:
        LeaseLostError: the run changed meanwhile (it finished, or another attempt started): nothing applied.
    """
    now = deps.clock.now()
    end = decide_attempt_end(
        run,
        outcome=RunState.FAILED,
        now=now,
        fencing_token=run.fencing_token,
        watch_after_seconds=deps.settings.first_watch_seconds,
        worker=run.lease_owner,
        error=(
            "worker lost: its session was not renewed"
            if run.session_id is not None
            else "worker lost: its lease expired"
        ),
        # the worker streamed the attempt's output in chunks while it ran: what it sent before dying stays
        log_key=log_key(run.job_id, run.run_id, run.attempt),
        reason="worker_lost",
    ).with_fence(lease_expired_by=now)
    ended = deps.store.end_attempt(end)
    after_attempt_end(ended, deps)
    return ended
