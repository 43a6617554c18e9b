"""Job service: submit a job, read jobs, runs and logs, scoped to the caller's tenant."""

from __future__ import annotations

import uuid
import zlib
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from duetime.api_models import CreateJobRequest, SchedulePreviewResponse
from duetime.claims import claim_until, next_fire_after
from duetime.deps import Deps
from duetime.errors import ConflictError, NotFoundError, RequestFieldError, ScheduleError
from duetime.models import Job, JobState, Run, RunState, Trigger, parse_run_id
from duetime.resources import ACTIVE_INDEX_PK, DEAD_LETTER_INDEX_PK
from duetime.runs import message_for
from duetime.schedules import DstPolicy, parse_schedule
from duetime.store import ConditionFailedError, Update
from duetime.timeutil import truncate_ms


def shard_of(job_id: str, shard_count: int) -> int:
    """The job's shard: CRC-32 of its id mod ``shard_count`` (stable across processes and languages)."""
    return zlib.crc32(job_id.encode()) % shard_count


def new_job_id() -> str:
    """A fresh job id: ``job-`` and 20 hex digits of a random UUID."""
    return "job-" + uuid.uuid4().hex[:20]


def create_job(request: CreateJobRequest, *, tenant: str, deps: Deps) -> Job:
    """Validate and store a job, and claim its first run at once if it is due within the tick lookahead.

    The first fire is strictly after now (``rate`` counts from ``start_at`` or from now; ``at`` must lie in the
    future); no schedule means one run, due now. Claiming here (DESIGN.md section 4) means a run-now job or a
    first fire inside a window the tick already passed never waits for the next tick.

    Returns:
        The job as stored after the claim (its ``next_fire_at`` already moved past a claimed first fire).

    Raises:
        ScheduleError: the expression or zone is invalid, or the schedule has no future fire.
        RequestFieldError: ``on_timeout.job_id`` names no job of the caller's.
        JobExistsError: ``request.job_id`` is taken.
    """
    now = truncate_ms(deps.clock.now())
    job_id = request.job_id or new_job_id()
    if request.on_timeout.action == "trigger":
        target = deps.store.get_job(request.on_timeout.job_id or "")
        if target is None or target.tenant != tenant:
            raise RequestFieldError(
                f"on_timeout.job_id: no job {request.on_timeout.job_id!r} to trigger", "on_timeout.job_id"
            )
    anchor = now
    if request.schedule is not None:
        spec = request.schedule
        anchor = truncate_ms(spec.start_at) if spec.start_at is not None else now
        # validates expression, zone and bounds; raises ScheduleError naming the field
        parse_schedule(
            spec.expression, spec.timezone, anchor=anchor, start_at=spec.start_at, end_at=spec.end_at
        )
    job = Job(
        job_id=job_id,
        tenant=tenant,
        name=request.name,
        schedule=request.schedule,
        task=request.task,
        timeout_seconds=request.timeout_seconds,
        retry=request.retry,
        on_timeout=request.on_timeout,
        catch_up=request.catch_up,
        overlap=request.overlap,
        starting_deadline_seconds=request.starting_deadline_seconds,
        state=JobState.ACTIVE,
        shard=shard_of(job_id, deps.settings.shard_count),
        next_fire_at=None,
        anchor=anchor,
        created_at=now,
        updated_at=now,
    )
    first = now if request.schedule is None else next_fire_after(job, now)
    if first is None:
        raise ScheduleError(
            "the schedule has no fire time after now (an at(...) in the past, or end_at already passed)"
        )
    job = job.model_copy(update={"next_fire_at": first})
    deps.store.put_new_job(job)
    outcomes = claim_until(job, deps, now + timedelta(seconds=deps.settings.tick_lookahead_seconds))
    if outcomes:
        last = outcomes[-1].next_fire_at
        job = job.model_copy(
            update={"next_fire_at": last, "state": JobState.COMPLETED if last is None else job.state}
        )
    return job


def get_job(job_id: str, *, tenant: str, deps: Deps) -> Job:
    """The caller's job. Raises NotFoundError if it is absent or another tenant's."""
    job = deps.store.get_job(job_id)
    if job is None or job.tenant != tenant:
        raise NotFoundError("job", job_id)
    return job


def list_runs(job_id: str, *, tenant: str, deps: Deps, limit: int = 20) -> list[Run]:
    """The job's ``limit`` most recent runs, newest due time first. Raises NotFoundError like get_job."""
    get_job(job_id, tenant=tenant, deps=deps)
    return deps.store.list_runs(job_id, limit=limit)


def get_run(run_id: str, *, tenant: str, deps: Deps) -> Run:
    """The caller's run. Raises NotFoundError if the id is malformed, absent or another tenant's."""
    try:
        job_id, due_at = parse_run_id(run_id)
    except ValueError:
        raise NotFoundError("run", run_id) from None
    run = deps.store.get_run(job_id, due_at)
    if run is None or run.tenant != tenant:
        raise NotFoundError("run", run_id)
    return run


def get_run_log(run_id: str, *, tenant: str, deps: Deps, attempt: int | None = None) -> str:
    """The combined stdout+stderr of one attempt of the caller's run (default: the latest that has a log).

    Returns an empty string while the current attempt has no log yet (it has not finished).

    Raises:
        NotFoundError: the run is not the caller's, or ``attempt`` never happened or left no log (its
            worker was lost before uploading one).
    """
    run = get_run(run_id, tenant=tenant, deps=deps)
    keys = {a.attempt: a.log_key for a in run.attempts if a.log_key}
    if attempt is not None:
        if attempt < 1 or attempt > run.attempt or (attempt not in keys and attempt < run.attempt):
            raise NotFoundError("log of attempt", f"{run_id}#{attempt}")
        key = keys.get(attempt)
    else:
        key = keys[max(keys)] if keys else None
    if key is None:
        return ""
    data = deps.logs.get(key)
    return data.decode("utf-8", errors="replace") if data is not None else ""


def list_dead_letters(*, tenant: str, deps: Deps, limit: int = 20) -> list[Run]:
    """The caller's dead-lettered runs (FAILED after their last attempt), most recently dead-lettered first."""
    return deps.store.query_dead_letters(tenant, limit=limit)


def redrive(run_id: str, *, tenant: str, deps: Deps) -> Run:
    """Re-drive a dead-lettered run: it returns to PENDING as the next attempt, with a fresh retry budget
    (``max_attempts`` more attempts), leaves the dead-letter list, and is sent to its queue now.

    Raises:
        NotFoundError: the run is not the caller's.
        ConflictError: the run is not dead-lettered (only a FAILED run that exhausted its attempts can be).
    """
    run = get_run(run_id, tenant=tenant, deps=deps)
    if not run.dead_lettered or run.state is not RunState.FAILED:
        raise ConflictError(
            f"run {run_id} is {run.state.value}, not dead-lettered: only dead letters can be retried"
        )
    now = deps.clock.now()
    upd = Update(conditions={"state": RunState.FAILED.value, "attempt": run.attempt, "dead_lettered": True})
    upd.sets.update(
        state=RunState.PENDING.value,
        attempt=run.attempt + 1,
        max_attempts=run.attempt + run.retry.max_attempts,
        dead_lettered=False,
        trigger=Trigger.RETRY.value,
        watch_at=now + timedelta(seconds=deps.settings.pending_grace_seconds),
        watch_shard=run.shard,
    )
    if run.overlap.enforced:
        upd.sets[ACTIVE_INDEX_PK] = run.job_id
    upd.removes.extend(["dead_lettered_at", DEAD_LETTER_INDEX_PK, "finished_at", "exit_code", "error"])
    upd.appends["events"] = [{"at": now, "kind": "redriven", "detail": {"attempt": run.attempt + 1}}]
    try:
        redriven = deps.store.update_run(run.job_id, run.due_at, upd)
    except ConditionFailedError:
        raise ConflictError(f"run {run_id} changed meanwhile; read it again") from None
    deps.queues.send(redriven.task.tier, message_for(redriven))
    return redriven


def preview_schedule(
    expression: str,
    timezone: str,
    *,
    after: datetime,
    anchor: datetime,
    count: int = 5,
    dst_policy: DstPolicy = "shift",
) -> SchedulePreviewResponse:
    """The next ``count`` fire times of an expression strictly after ``after`` (aware), with a description.

    Raises:
        ScheduleError: the expression or zone is invalid or can never fire (naming the field).
    """
    schedule = parse_schedule(expression, timezone, anchor=anchor, dst_policy=dst_policy)
    fires = schedule.preview(after, count)
    zone = ZoneInfo(schedule.timezone)
    return SchedulePreviewResponse(
        expression=schedule.expression,
        timezone=schedule.timezone,
        kind=schedule.kind,
        description=schedule.describe(),
        fire_times=fires,
        local_times=[f.astimezone(zone).isoformat() for f in fires],
    )
