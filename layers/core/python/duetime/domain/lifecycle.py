"""How an attempt ends: one pure decision shared by every path that ends one (DESIGN.md section 5).

A worker's finish, the sweeper's lease expiry and the timeout handler's fence all end the current attempt of
a RUNNING run. :func:`decide_attempt_end` says, from the run as read and the outcome, what is recorded and
where the run goes (RETRY_WAIT with a backoff, or a terminal state, dead-lettered when a retryable outcome
ran out of attempts). The store applies it in one conditional write under the caller's fencing token
(:meth:`duetime.domain.ports.RunStore.end_attempt`); the services then run the same after-end actions on
every path (retry wake-up, ``on_timeout: trigger``, overlap successor, metrics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from duetime.domain.models import AttemptRecord, Job, Run, RunMessage, RunState, Session, Trigger
from duetime.domain.retries import backoff_delay
from duetime.domain.timeutil import truncate_ms

#: outcomes a worker may report at finish
FINISH_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.TIMED_OUT})
#: the attempt reason a worker records when it was told to stop (SIGTERM) and stopped its task
INTERRUPTED_REASON = "worker_stopped"
#: interrupted attempts of one run that do not count against its max_attempts
MAX_FREE_INTERRUPTIONS = 5
#: the longest delay a run queue message can carry, seconds (SQS's DelaySeconds limit, 15 minutes); a
#: longer backoff is released by the sweeper at ``retry_at`` instead
MAX_MESSAGE_DELAY_SECONDS = 900
#: a consumer holds a delivery that came at most this early (seconds before its attempt may start) until
#: then; one earlier (a clock far off) goes back to the queue until then
MAX_HOLD_SECONDS = 5.0


def lease_held(run: Run, session: Session | None, now: datetime) -> bool:
    """Whether a RUNNING ``run``'s lease still holds at ``now`` (UTC): its own ``lease_expires_at`` (set at
    the start) has not passed, or its worker session (``session``, the one ``run.session_id`` names; None:
    not found) is alive and listed the run at its last renewal. A run without a session has only its own
    lease (a Lambda task's, sized to the function's timeout). The rule of the sweeper's lease expiry
    (DESIGN.md section 5: a worker lost is found within the session lease plus one sweep)."""
    if run.lease_expires_at is not None and run.lease_expires_at > now:
        return True
    if run.session_id is None or session is None:
        return False
    return session.session_id == run.session_id and session.alive(now) and run.run_id in session.runs


def delay_seconds(ready_at: datetime, now: datetime) -> int:
    """The delay of a wake-up message for an attempt that may start at ``ready_at`` (UTC), whole seconds:
    ``floor(ready_at - now)`` clamped to 0..MAX_MESSAGE_DELAY_SECONDS (claims never look further ahead).

    SQS's ``DelaySeconds`` is an integer. Rounded up, every run would start up to a second late (half a
    second on average); rounded down, the delivery comes less than a second early and the worker holds it
    until the message's :attr:`~duetime.domain.models.RunMessage.ready_at`."""
    seconds = math.floor((ready_at - now).total_seconds())
    return max(0, min(MAX_MESSAGE_DELAY_SECONDS, seconds))


def hold_seconds(message: RunMessage, now: datetime) -> float:
    """Seconds from ``now`` until the attempt ``message`` wakes may start (its
    :attr:`~duetime.domain.models.RunMessage.ready_at`; 0: now). Its delay was rounded down
    (:func:`delay_seconds`), so a delivery comes up to about a second early: the consumer holds it, at most
    :data:`MAX_HOLD_SECONDS`."""
    return max(0.0, (message.ready_at - now).total_seconds())


@dataclass(frozen=True)
class AttemptEnd:
    """The end of a run's current attempt, as one conditional write applies it.

    Attributes:
        job_id, due_at: the run's key.
        tenant: the run's tenant (a dead-lettered run is listed under it).
        expected_token: the fencing token the write requires (the run must be RUNNING under it).
        record: the attempt's history entry appended to ``attempts``.
        state: RETRY_WAIT, or the terminal state the run ends in.
        finished_at: when the attempt ended (UTC).
        exit_code, error, log_key: the run's last outcome fields (None: removed).
        retry_at: when the next attempt may start (RETRY_WAIT only).
        watch_at: when the sweeper looks at the run again (RETRY_WAIT only; a terminal run is not watched).
        max_attempts: the run's new ``max_attempts`` when an interrupted attempt was given back (else None).
        dead_lettered: the run ends terminal with a retryable outcome and no attempts left.
        timeout_action, timeout_outcome: for a TIMED_OUT attempt, the ``on_timeout`` action and what it did.
        bump_token: raise the fencing token (lease expiry and the timeout handler fence the stuck worker).
        lease_expired_by: also require ``lease_expires_at <= this`` (lease expiry: never before the run's
            own lease ends).
        timeout_execution: the timeout handler's execution name, recorded on the run.
        result_json, result_truncated: a Lambda function's response (JSON text), or that it was too large.
    """

    job_id: str
    due_at: datetime
    tenant: str
    expected_token: int
    record: AttemptRecord
    state: RunState
    finished_at: datetime
    exit_code: int | None = None
    error: str | None = None
    log_key: str | None = None
    retry_at: datetime | None = None
    watch_at: datetime | None = None
    max_attempts: int | None = None
    dead_lettered: bool = False
    timeout_action: str | None = None
    timeout_outcome: str | None = None
    bump_token: bool = False
    lease_expired_by: datetime | None = None
    timeout_execution: str | None = None
    result_json: str | None = None
    result_truncated: bool = False

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def with_fence(
        self, *, lease_expired_by: datetime | None = None, execution: str | None = None
    ) -> AttemptEnd:
        """The same end, applied by someone other than the attempt's worker: the token is raised so the
        stuck or lost worker is fenced, optionally only if the lease expired by ``lease_expired_by``."""
        return replace(self, bump_token=True, lease_expired_by=lease_expired_by, timeout_execution=execution)


def decide_attempt_end(
    run: Run,
    *,
    outcome: RunState,
    now: datetime,
    fencing_token: int,
    watch_after_seconds: float,
    worker: str | None = None,
    exit_code: int | None = None,
    error: str | None = None,
    log_key: str | None = None,
    reason: str | None = None,
    log_bytes: int | None = None,
    log_pack: str | None = None,
    log_offset: int | None = None,
) -> AttemptEnd:
    """Decide how ``run``'s current attempt ends with ``outcome``.

    Rules (seed S1: retries with backoff, then marked failed; DESIGN.md section 5):
    - SUCCEEDED is terminal.
    - FAILED, and TIMED_OUT under ``on_timeout: retry``, go to RETRY_WAIT while attempts are left, with
      ``retry_at = now + backoff`` (the backoff counts the failed attempts of the current budget: a
      re-drive starts a fresh one); without attempts left the run ends in that state, dead-lettered.
    - An attempt its worker was told to stop (reason ``worker_stopped``: a deploy, a scale-in) did not fail:
      it goes back at once without using up an attempt (Kubernetes' podFailurePolicy ``Ignore`` for
      DisruptionTarget), at most MAX_FREE_INTERRUPTIONS times per run.
    - TIMED_OUT under ``fail`` or ``trigger`` is terminal (the caller triggers the named job).

    Args:
        run: the run as read, RUNNING at the attempt that ends.
        outcome: SUCCEEDED, FAILED or TIMED_OUT.
        now: the end's instant (UTC).
        fencing_token: the token the end is applied under.
        watch_after_seconds: how long after ``retry_at`` the sweeper first looks at the run (backing up the
            retry's wake-up message; :attr:`Settings.first_watch_seconds`).
        worker, exit_code, error, log_key, reason: recorded on the attempt (and the run's last outcome).
        log_bytes, log_pack, log_offset: the final log's size, and where it is when it went into a log pack.

    Raises:
        ValueError: ``outcome`` is not one of FINISH_STATES.
    """
    if outcome not in FINISH_STATES:
        raise ValueError(f"an attempt cannot end as {outcome}")
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
        log_bytes=log_bytes,
        log_pack=log_pack,
        log_offset=log_offset,
    )
    retryable = outcome is RunState.FAILED or (
        outcome is RunState.TIMED_OUT and run.on_timeout.action == "retry"
    )
    timeout_action = run.on_timeout.action if outcome is RunState.TIMED_OUT else None
    interrupted_before = min(
        MAX_FREE_INTERRUPTIONS, sum(1 for a in run.attempts if a.reason == INTERRUPTED_REASON)
    )
    interrupted_in_budget = min(
        MAX_FREE_INTERRUPTIONS,
        sum(
            1 for a in run.attempts if a.reason == INTERRUPTED_REASON and a.attempt >= run.budget_from_attempt
        ),
    )
    failed_in_budget = run.attempt - run.budget_from_attempt + 1 - interrupted_in_budget
    free = (
        outcome is RunState.FAILED
        and reason == INTERRUPTED_REASON
        and interrupted_before < MAX_FREE_INTERRUPTIONS
    )
    max_attempts = run.max_attempts + 1 if free else run.max_attempts
    base = AttemptEnd(
        job_id=run.job_id,
        due_at=run.due_at,
        tenant=run.tenant,
        expected_token=fencing_token,
        record=record,
        state=outcome,
        finished_at=now,
        exit_code=exit_code,
        error=error,
        log_key=log_key,
        timeout_action=timeout_action,
    )
    if retryable and run.attempt < max_attempts:
        # the backoff grows with the attempts that failed, not with those given back for free
        delay = 0.0 if free else backoff_delay(run.retry, max(1, failed_in_budget))
        retry_at = now + timedelta(seconds=delay)
        # a delayed message wakes the retry up directly; the sweeper is the backstop one grace period later
        backstop = watch_after_seconds if delay <= MAX_MESSAGE_DELAY_SECONDS else 0.0
        return replace(
            base,
            state=RunState.RETRY_WAIT,
            retry_at=retry_at,
            watch_at=retry_at + timedelta(seconds=backstop),
            max_attempts=max_attempts if free else None,
            timeout_outcome=(
                f"attempt {run.attempt + 1} after a {delay:.1f} s backoff"
                if outcome is RunState.TIMED_OUT
                else None
            ),
        )
    timeout_outcome = None
    if outcome is RunState.TIMED_OUT:
        timeout_outcome = {
            "retry": "no attempts left: dead-lettered",
            "fail": "failed, no retry",
            "trigger": f"triggered job {run.on_timeout.job_id}",
        }[run.on_timeout.action]
    return replace(base, dead_lettered=retryable, timeout_outcome=timeout_outcome)


def build_run(
    job: Job,
    due_at: datetime,
    *,
    now: datetime,
    watch_after_seconds: float,
    trigger: Trigger,
    missed_slots: int = 0,
) -> Run:
    """A fresh PENDING first attempt of ``job`` at ``due_at`` (UTC), created ``now``.

    It is watched from ``max(due_at, now) + watch_after_seconds`` (:attr:`Settings.first_watch_seconds`: the
    sweeper's first look, which re-sends a lost wake-up once the pending grace has passed and finds a worker
    that died early in the run; a start leaves the watch time), or from its starting deadline
    when that comes first (``job.starting_deadline_seconds`` after ``due_at``), or from its ``late`` instant
    (``job.late_after_seconds`` after ``due_at``) when that comes first.
    """
    grace = timedelta(seconds=watch_after_seconds)
    deadline = (
        due_at + timedelta(seconds=job.starting_deadline_seconds)
        if job.starting_deadline_seconds is not None
        else None
    )
    watch_at = max(due_at, now) + grace
    if deadline is not None:
        watch_at = min(watch_at, max(deadline, now))
    late_at = (
        due_at + timedelta(seconds=job.late_after_seconds) if job.late_after_seconds is not None else None
    )
    if late_at is not None:
        watch_at = min(watch_at, max(late_at, now))  # the sweeper finds it late at once (notifications)
    return Run(
        job_id=job.job_id,
        due_at=due_at,
        tenant=job.tenant,
        shard=job.shard,
        state=RunState.PENDING,
        attempt=1,
        max_attempts=job.retry.max_attempts,
        fencing_token=0,
        trigger=trigger,
        task=job.task,
        timeout_seconds=job.timeout_seconds,
        retry=job.retry,
        on_timeout=job.on_timeout,
        overlap=job.overlap,
        start_deadline_at=deadline,
        late_at=late_at,
        expected_duration_seconds=job.expected_duration_seconds,
        watch_at=watch_at,
        missed_slots=missed_slots,
        created_at=now,
        job_created_at=truncate_ms(job.created_at),
    )


def timeout_triggered_run(timed_out: Run, target: Job, *, now: datetime, watch_after_seconds: float) -> Run:
    """The run of ``target`` that ``timed_out``'s ``on_timeout: trigger`` creates.

    Its due time is the timed-out attempt's deadline (else its end, else ``now``), to the millisecond, so the
    worker, the sweeper and a repeated timeout handler all name the same run: its put is idempotent.
    """
    due_at = truncate_ms(timed_out.deadline_at or timed_out.finished_at or now)
    return build_run(
        target, due_at, now=now, watch_after_seconds=watch_after_seconds, trigger=Trigger.TIMEOUT_HANDLER
    ).model_copy(update={"triggered_by": timed_out.run_id})


def message_for(run: Run, *, attempt: int | None = None, retry_at: datetime | None = None) -> RunMessage:
    """The wake-up message of ``run``'s current (or the given) attempt; ``retry_at``: a retry's, which its
    attempt may not start before (:attr:`RunMessage.ready_at`)."""
    return RunMessage(
        job_id=run.job_id,
        due_at=run.due_at,
        attempt=attempt or run.attempt,
        overlap=run.overlap.enforced,
        timeout_seconds=run.timeout_seconds,
        kill_grace_seconds=run.on_timeout.kill_grace_seconds,
        tenant=run.tenant,
        tier=run.task.tier,
        trigger=run.trigger,
        job_created_at=run.job_created_at,
        retry_at=retry_at,
        expected_duration_seconds=run.expected_duration_seconds,
    )
