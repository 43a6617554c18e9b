"""Jobs, runs and attempt ends with real values, built through the domain's own constructors."""

from __future__ import annotations

from datetime import datetime, timedelta

from duetime.domain.lifecycle import AttemptEnd, build_run, decide_attempt_end
from duetime.domain.models import (
    ContainerTask,
    Job,
    JobState,
    OnTimeout,
    OverlapPolicy,
    RetryPolicy,
    Run,
    RunState,
    ScheduleSpec,
    Trigger,
)
from duetime.domain.ports import Store
from tests.contract.conftest import T0

#: the sweeper's grace after a due time before it re-sends a PENDING run's wake-up, seconds
GRACE = 60.0
#: a worker's lease, seconds
LEASE = 30.0
MS = timedelta(milliseconds=1)


def make_job(
    job_id: str,
    *,
    tenant: str = "t1",
    name: str | None = None,
    shard: int = 0,
    next_fire_at: datetime | None = None,
    created_at: datetime = T0,
    state: JobState = JobState.ACTIVE,
    max_attempts: int = 3,
    backoff_seconds: float = 10.0,
    overlap: OverlapPolicy | None = None,
    on_timeout: OnTimeout | None = None,
    starting_deadline_seconds: int | None = None,
    tier: str = "small",
) -> Job:
    """A rate(5 minutes) job running ``echo hello``; retries without jitter so backoffs are exact."""
    return Job(
        job_id=job_id,
        tenant=tenant,
        name=name or f"job {job_id}",
        schedule=ScheduleSpec(expression="rate(5 minutes)"),
        task=ContainerTask(command=["echo", "hello"], tier=tier),
        timeout_seconds=300,
        retry=RetryPolicy(max_attempts=max_attempts, backoff_seconds=backoff_seconds, jitter="none"),
        on_timeout=on_timeout or OnTimeout(),
        overlap=overlap or OverlapPolicy(),
        starting_deadline_seconds=starting_deadline_seconds,
        state=state,
        shard=shard,
        next_fire_at=next_fire_at,
        anchor=created_at,
        created_at=created_at,
        updated_at=created_at,
    )


def make_run(job: Job, due_at: datetime = T0, *, now: datetime | None = None, **update: object) -> Run:
    """The PENDING first attempt a claim creates for ``job`` at ``due_at`` (created at ``now``)."""
    run = build_run(job, due_at, now=now or due_at, watch_after_seconds=GRACE, trigger=Trigger.SCHEDULE)
    return run.model_copy(update=update) if update else run


def put_run(store: Store, job: Job, due_at: datetime = T0, **kw: object) -> Run:
    run = make_run(job, due_at, **kw)  # type: ignore[arg-type]
    store.put_new_run(run)
    return run


def start(
    store: Store,
    run: Run,
    *,
    now: datetime,
    attempt: int | None = None,
    owner: str = "w1",
    lease_expires_at: datetime | None = None,
    running_tenant: str | None = None,
    session_id: str | None = None,
) -> Run:
    """Start ``run`` at ``attempt`` (default: its own) as a worker does: lease and watch ``LEASE`` s on
    (under the worker session ``session_id``, given one)."""
    lease = lease_expires_at or now + timedelta(seconds=LEASE)
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
        session_id=session_id,
    )


def attempt_end(
    run: Run,
    outcome: RunState,
    *,
    now: datetime,
    token: int | None = None,
    reason: str | None = None,
    exit_code: int | None = None,
) -> AttemptEnd:
    """How ``run`` (RUNNING, as read) ends its attempt with ``outcome`` at ``now``, as its worker says."""
    return decide_attempt_end(
        run,
        outcome=outcome,
        now=now,
        fencing_token=run.fencing_token if token is None else token,
        watch_after_seconds=GRACE,
        worker=run.lease_owner,
        exit_code=exit_code if exit_code is not None else (0 if outcome is RunState.SUCCEEDED else 1),
        error=None if outcome is RunState.SUCCEEDED else f"attempt {run.attempt}: {outcome.value}",
        reason=reason,
    )
