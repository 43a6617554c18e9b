"""Job service: submit a job, read jobs, runs and logs, scoped to the caller's tenant."""

from __future__ import annotations

import functools
import uuid
import zlib
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn, ParamSpec, TypeVar
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ValidationError

from duetime.config.observability import logger
from duetime.domain.admission import SLOT_TRIGGERS, next_fire_after, parse_spec, schedule_of, select_slots
from duetime.domain.api_models import CreateJobRequest, SchedulePreviewResponse, UpdateJobRequest
from duetime.domain.errors import (
    AlreadyClaimedError,
    ChangedMeanwhileError,
    ConflictError,
    JobExistsError,
    NotFoundError,
    QuotaExceededError,
    RequestFieldError,
    ScheduleError,
)
from duetime.domain.lifecycle import message_for
from duetime.domain.logs import PACK_PREFIX, log_key, lost_note, not_stored_note
from duetime.domain.models import (
    MAX_LAMBDA_TIMEOUT_SECONDS,
    MAX_YEAR,
    PAUSES_KEPT,
    CatchUpPolicy,
    Job,
    JobState,
    JobSummary,
    LambdaTask,
    OnTimeout,
    OverlapPolicy,
    PauseSpan,
    RetryPolicy,
    Run,
    RunState,
    ScheduleSpec,
    Trigger,
    parse_run_id,
)
from duetime.domain.schedules import DstPolicy, parse_schedule
from duetime.domain.timeutil import to_iso, truncate_ms
from duetime.services import history
from duetime.services.claims import MAX_WALKED_SLOTS, claim_until, new_run, plan_put_claimed, put_claimed
from duetime.services.deps import Deps
from duetime.services.history import HistoryRun
from duetime.services.notifier import prepare_rules
from duetime.services.runs import (
    HOLD_RECHECK_SECONDS,
    all_runs,
    cancel,
    held_runs,
    hold,
    release_held,
    settle_claimed_ahead,
)


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
        QuotaExceededError: the tenant's submits per minute (``retry_after`` set) or active jobs are used up.
        JobExistsError: ``request.job_id`` is taken.
    """
    now = truncate_ms(deps.clock.now())
    job_id = request.job_id or new_job_id()
    if request.on_timeout.action == "trigger":
        _check_trigger_target(request.on_timeout.job_id, job_id, tenant, deps)
    anchor = now
    if request.schedule is not None:
        spec = request.schedule
        anchor = truncate_ms(spec.start_at) if spec.start_at is not None else now
        parse_spec(spec, anchor)  # validates expression, zone and bounds; ScheduleError names the field
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
        late_after_seconds=request.late_after_seconds,
        expected_duration_seconds=request.expected_duration_seconds,
        notifications=prepare_rules(
            [], request.notifications, field="notifications", deps=deps, tenant=tenant
        ),
        inherit_tenant_notifications=request.inherit_tenant_notifications,
        mute_until=request.mute_until,
        state=JobState.ACTIVE,
        shard=shard_of(job_id, deps.settings.shard_count),
        next_fire_at=None,
        anchor=anchor,
        created_at=now,
        updated_at=now,
    )
    first = now if request.schedule is None else next_fire_after(job, now)
    if first is None:
        _no_fire_ahead(request.schedule, now)
    job = job.model_copy(update={"next_fire_at": first})
    _admit_submit(tenant, deps)
    # a job its first claim completes (run-now; a one-off due within the lookahead) is stored claimed
    claimed = plan_put_claimed(job, deps)
    if claimed is not None:
        if request.job_id is not None and deps.store.get_job(job_id) is not None:
            # a chosen id that is taken is refused before any run is written under it: its runs' keys
            # (job_id, due_at) are the existing job's, and one of them may be a slot it has yet to claim
            raise JobExistsError(f"job {job_id!r} already exists")
        return put_claimed(claimed, deps)[0]  # completed at once: it never counts as active
    counted = request.schedule is not None  # a run-now job completes at once: it never counts as active
    if counted and not deps.store.add_active_jobs(tenant, 1, limit=deps.settings.tenant_max_active_jobs):
        raise QuotaExceededError(
            f"tenant {tenant!r} has {deps.settings.tenant_max_active_jobs} active or paused jobs, its quota; "
            "delete some first"
        )
    try:
        deps.store.put_new_job(job)
    except Exception:
        if counted:
            deps.store.add_active_jobs(tenant, -1)
        raise
    return _claim_due_now(job, deps)


def _no_fire_ahead(schedule: ScheduleSpec | None, now: datetime) -> NoReturn:
    """Refuse a submitted or PATCHed schedule that has no fire time after ``now`` (UTC): an ``at(...)`` in
    the past, an ``end_at`` that has passed. Raises ScheduleError naming the field, always."""
    end_at = schedule.end_at if schedule is not None else None
    if end_at is not None and end_at <= now:
        raise ScheduleError(
            f"end_at {to_iso(end_at)} has passed: the schedule has no fire time after now", "schedule.end_at"
        )
    raise ScheduleError(
        f"the schedule has no fire time between now and the end of {MAX_YEAR} (an at(...) in the past, or a "
        f"first fire after {MAX_YEAR}, the last year Duetime accepts)",
        "schedule.expression",
    )


def _admit_submit(tenant: str, deps: Deps) -> None:
    """Count one submit against the tenant's per-minute quota (needs the idempotency table for counters).

    Raises:
        QuotaExceededError: with ``retry_after`` = seconds until the next minute starts.
    """
    now = deps.clock.now()
    minute = now.replace(second=0, microsecond=0)
    if not deps.store.count_submit(tenant, minute, limit=deps.settings.tenant_submits_per_minute):
        retry_after = max(1, 60 - now.second)
        raise QuotaExceededError(
            f"tenant {tenant!r} submitted {deps.settings.tenant_submits_per_minute} jobs this minute, its quota; "
            f"retry in {retry_after} s",
            retry_after=retry_after,
        )


def get_job(job_id: str, *, tenant: str, deps: Deps) -> Job:
    """The caller's job. Raises NotFoundError if it is absent or another tenant's."""
    job = deps.store.get_job(job_id)
    if job is None or job.tenant != tenant:
        raise NotFoundError("job", job_id)
    return job


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


def find_run(run_id: str, *, tenant: str, deps: Deps) -> HistoryRun:
    """The caller's run from the hot store or, once it left the hot window, the archive (``archived``).

    Raises:
        NotFoundError: the id is malformed, or neither holds it for this tenant.
    """
    try:
        job_id, due_at = parse_run_id(run_id)
    except ValueError:
        raise NotFoundError("run", run_id) from None
    found = history.find_run(job_id, due_at, tenant=tenant, deps=deps)
    if found is None:
        raise NotFoundError("run", run_id)
    return found


@dataclass(frozen=True)
class RunLog:
    """A read of one attempt's log (:func:`read_run_log`).

    ``pending`` says the attempt ended but its final log is not stored yet (its worker lingers over its log
    pack, ``log_pack_linger_seconds``): ``"partial"``, ``text`` is the chunks streamed so far (the rest comes
    with the pack); ``"note"``, it streamed none and ``text`` is a note saying so. None: ``text`` is the log.
    """

    text: str
    pending: Literal["partial", "note"] | None = None


def get_run_log(run_id: str, *, tenant: str, deps: Deps, attempt: int | None = None) -> str:
    """The text of :func:`read_run_log` (the same arguments and errors)."""
    return read_run_log(run_id, tenant=tenant, deps=deps, attempt=attempt).text


def read_run_log(run_id: str, *, tenant: str, deps: Deps, attempt: int | None = None) -> RunLog:
    """The combined stdout+stderr of one attempt of the caller's run (default: the current attempt while the
    run is RUNNING, else the latest attempt that left a log).

    A RUNNING attempt's log is its output so far: the chunks its worker streams every few seconds (empty until
    the first one). An attempt whose worker died keeps the chunks streamed before it died. An ended attempt
    whose log pack is not stored yet reads as its chunks, or a note, marked ``pending`` (:class:`RunLog`);
    one whose pack never came within a day of its end (its worker was killed in the linger) reads as its
    chunks, or a note saying the log was lost.

    Raises:
        NotFoundError: the run is not the caller's, ``attempt`` never happened, or it ended without leaving
            any log (neither a final object nor a streamed chunk).
    """
    found = find_run(run_id, tenant=tenant, deps=deps)
    run, archived_logs = found.run, found.logs
    # every ended attempt, with the key its worker wrote to: recorded, or (a lost worker's attempt recorded
    # without one) the key it streams under anyway
    keys = {a.attempt: a.log_key or log_key(run.job_id, run_id, a.attempt) for a in run.attempts}
    # attempts that printed nothing: their worker stored no object (nothing to read)
    empty = {a.attempt for a in run.attempts if a.log_bytes == 0}
    # the attempt being run has no record yet; its worker streams under its key
    running = run.attempt if run.state is RunState.RUNNING and run.attempt not in keys else None

    # attempts whose final log is a byte range of a log pack (read by range only: the pack holds others')
    # (6ea295a's workers recorded the pack as the attempt's log_key)
    ranges = {
        a.attempt: (a.log_pack or a.log_key or "", a.log_offset, a.log_bytes)
        for a in run.attempts
        if a.log_offset is not None
        and a.log_bytes is not None
        and (a.log_pack is not None or (a.log_key or "").startswith(PACK_PREFIX))
    }

    finished = {a.attempt: a.finished_at for a in run.attempts}
    pending: list[Literal["partial", "note"]] = []  # what the last read() found pending, if anything

    def text_of(data: bytes) -> str:
        return data.decode("utf-8", errors="replace")

    def read(key: str, number: int | None = None) -> str | None:
        pending.clear()
        if number in empty:
            return ""
        if number is not None and str(number) in archived_logs:  # archived with the run
            return archived_logs[str(number)]
        own = None if key.startswith(PACK_PREFIX) else key  # a pack is read by range only, never whole
        if number not in ranges:
            data = deps.logs.get(own) if own else None
            return text_of(data) if data is not None else None
        pack, offset, length = ranges[number]
        data = deps.logs.get_range(pack, offset, length)
        if data is None and own:
            data = deps.logs.get_final(own)  # the pack failed: its worker put the log under the own key
        if data is not None:
            return text_of(data)
        # the pack is not there: not stored yet (its worker lingers), or lost with its worker, or expired
        chunks = deps.logs.get(own) if own else None
        state = pack_state(finished.get(number), deps)
        if state == "pending":
            pending.append("partial" if chunks is not None else "note")
            return text_of(chunks) if chunks is not None else not_stored_note(number, pack_linger(deps))
        if chunks is not None:
            return text_of(chunks)
        return lost_note(number) if state == "lost" else None

    def result(text: str) -> RunLog:
        return RunLog(text, pending[0] if pending else None)

    if attempt is not None:
        if attempt < 1 or attempt > run.attempt:
            raise NotFoundError("log of attempt", f"{run_id}#{attempt}")
        if attempt == running:
            return result(read(log_key(run.job_id, run_id, attempt)) or "")
        if attempt not in keys:
            if attempt == run.attempt:
                return RunLog("")  # the current attempt has not started (PENDING)
            raise NotFoundError("log of attempt", f"{run_id}#{attempt}")
        text = read(keys[attempt], attempt)
        if text is None:
            raise NotFoundError("log of attempt", f"{run_id}#{attempt}")
        return result(text)
    if running is not None:
        return result(read(log_key(run.job_id, run_id, running)) or "")
    for number in sorted(keys, reverse=True):
        text = read(keys[number], number)
        if text is not None:
            return result(text)
    return RunLog("")


#: seconds past an attempt's end plus its worker's linger (``log_pack_linger_seconds``) after which a log pack
#: that is still not stored is taken as lost with its worker (a PUT retried by the SDK lands well within it)
PACK_LOST_AFTER_SECONDS = 60.0
#: until this long after an attempt's end, a missing pack and no chunks read as lost with its worker; later
#: the log may simply have expired (the logs bucket's lifecycle): not found, as before packs lingered
PACK_LOST_NOTE_SECONDS = 86_400.0


def pack_linger(deps: Deps) -> float:
    """Seconds a worker may hold a log pack after an end it recorded (this deployment's setting)."""
    settings = deps.settings
    return max(settings.log_pack_linger_seconds, settings.log_pack_window_seconds)


def pack_state(finished_at: datetime | None, deps: Deps) -> Literal["pending", "lost", "gone"]:
    """Why an attempt's recorded log pack is missing, by the time since the attempt's end (UTC): its worker
    may still hold it (``pending``: within the linger + :data:`PACK_LOST_AFTER_SECONDS`), it was lost with
    its worker (``lost``: within :data:`PACK_LOST_NOTE_SECONDS`), or it is gone (expired, or never known)."""
    if finished_at is None:
        return "gone"
    age = (deps.clock.now() - finished_at).total_seconds()
    if age <= pack_linger(deps) + PACK_LOST_AFTER_SECONDS:
        return "pending"
    return "lost" if age <= PACK_LOST_NOTE_SECONDS else "gone"


def list_dead_letters(
    *, tenant: str, deps: Deps, limit: int = 20, next_token: str | None = None
) -> tuple[list[Run], str | None]:
    """The caller's dead-lettered runs (FAILED after their last attempt), most recently dead-lettered first,
    and the next page's token (bound to the tenant: one tenant cannot page through another's).

    Raises:
        RequestFieldError: ``next_token`` is not a token of this tenant's dead-letter list.
    """
    return deps.store.query_dead_letters(tenant, limit=limit, page_token=next_token)


def redrive(run_id: str, *, tenant: str, deps: Deps) -> Run:
    """Re-drive a run that failed for good: it returns to PENDING as the next attempt, with a fresh retry
    budget (``max_attempts`` more attempts, the backoff starting again from its first step), leaves the
    dead-letter list, and is sent to its queue now.

    A run can be re-driven when it is dead-lettered (FAILED or TIMED_OUT after its last attempt) or
    TIMED_OUT because ``on_timeout`` said ``fail`` or ``trigger``.

    Raises:
        NotFoundError: the run is not the caller's.
        ConflictError: the run did not fail for good (it is still active, SUCCEEDED, CANCELLED or SKIPPED).
    """
    run = get_run(run_id, tenant=tenant, deps=deps)
    failed_for_good = (run.dead_lettered and run.state in (RunState.FAILED, RunState.TIMED_OUT)) or (
        run.state is RunState.TIMED_OUT
    )
    if not failed_for_good:
        raise ConflictError(
            f"run {run_id} is {run.state.value}: only a dead-lettered or timed-out run can be retried"
        )
    now = deps.clock.now()
    redriven = deps.store.redrive(
        run, now=now, watch_at=now + timedelta(seconds=deps.settings.first_watch_seconds)
    )
    if redriven is None:
        raise ConflictError(f"run {run_id} changed meanwhile; read it again")
    _after_commit(
        "send", {"run_id": run_id}, lambda: deps.queues.send(redriven.task.tier, message_for(redriven))
    )
    return redriven


#: the fields of a job body's schedule -> the preview's parameters of the same meaning
_PREVIEW_PARAMETERS = {"schedule.expression": "expression", "schedule.timezone": "timezone"}


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
        ScheduleError: the expression or zone is invalid or can never fire; its field is the preview's own
            parameter (``expression`` or ``timezone``), not a job body's ``schedule.*``.
    """
    try:
        schedule = parse_schedule(expression, timezone, anchor=anchor, dst_policy=dst_policy)
        fires = schedule.preview(after, count)
    except ScheduleError as exc:
        raise ScheduleError(exc.message, _PREVIEW_PARAMETERS.get(exc.field, exc.field)) from None
    zone = ZoneInfo(schedule.timezone)
    return SchedulePreviewResponse(
        expression=schedule.expression,
        timezone=schedule.timezone,
        kind=schedule.kind,
        description=schedule.describe(),
        fire_times=fires,
        local_times=[f.astimezone(zone).isoformat() for f in fires],
    )


# ---- listing -------------------------------------------------------------------------------------------
def describe_job(
    job: Job, deps: Deps, *, previews: int = 3, recent: int = 1
) -> tuple[list[datetime], list[Run]]:
    """The job's next ``previews`` fire times (UTC) and its ``recent`` most recent runs due by now, newest
    first (one Query).

    A claim takes every slot due within the lookahead (``services.claims.plan_ahead``), so the slots between
    now and ``next_fire_at`` (the first one not claimed yet) are runs already claimed: the next fires are the
    schedule's after now (for a COMPLETED job, whose last slots are claimed, those up to its ``end_at``), led
    by ``next_fire_at`` when it is overdue; and a run claimed ahead, due later, is not the job's last run."""
    now = deps.clock.now()
    fires: list[datetime] = []
    schedule = schedule_of(job)
    overdue = job.next_fire_at is not None and job.next_fire_at <= now
    if job.state is JobState.ACTIVE and job.next_fire_at is not None and (overdue or schedule is None):
        fires = [job.next_fire_at]
        if schedule is not None and previews > 1:
            fires += schedule.preview(job.next_fire_at, previews - 1)
    elif job.state in (JobState.ACTIVE, JobState.COMPLETED) and schedule is not None:
        fires = schedule.preview(now, previews)
    runs, _ = deps.store.query_runs(job.job_id, limit=recent, until=now)
    return fires, runs


def list_jobs(
    *,
    tenant: str,
    deps: Deps,
    limit: int = 20,
    next_token: str | None = None,
    state: str | None = None,
    name_prefix: str | None = None,
) -> tuple[list[Job], str | None]:
    """The caller's jobs, newest first (DELETED ones only when ``state=DELETED``), and the next page's token."""
    return deps.store.list_jobs(
        tenant, limit=limit, page_token=next_token, state=state, name_prefix=name_prefix
    )


def list_job_summaries(
    *,
    tenant: str,
    deps: Deps,
    limit: int = 20,
    next_token: str | None = None,
    state: str | None = None,
    name_prefix: str | None = None,
) -> tuple[list[JobSummary], str | None]:
    """A page of :func:`list_jobs` as summaries read from the listing index alone (no job read): the same
    order, filters and tokens; may lag a change of state by a moment."""
    return deps.store.list_job_summaries(
        tenant, limit=limit, page_token=next_token, state=state, name_prefix=name_prefix
    )


def next_fire_of(job: JobSummary, *, now: datetime) -> datetime | None:
    """The listed job's next fire after ``now`` by its schedule (UTC; None when PAUSED, DELETED, a run-now
    job or a schedule that has ended). Unlike :func:`describe_job` it does not read ``next_fire_at``, so a
    slot the tick has not claimed yet while overdue is not shown."""
    schedule = schedule_of(job)
    if schedule is None or job.state not in (JobState.ACTIVE, JobState.COMPLETED):
        return None
    fires = schedule.preview(now, 1)
    return fires[0] if fires else None


def recent_runs(job_id: str, *, deps: Deps, limit: int) -> list[Run]:
    """The job's ``limit`` most recent runs due by now, newest first (one Query of the hot store; the caller
    has checked the job's tenant)."""
    return deps.store.query_runs(job_id, limit=limit, until=deps.clock.now())[0]


def query_history(
    job_id: str,
    *,
    tenant: str,
    deps: Deps,
    limit: int = 20,
    next_token: str | None = None,
    state: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> tuple[list[HistoryRun], str | None]:
    """The job's runs, newest due time first, across the hot store and the archive (a DELETED job's too),
    filtered by state and due-time window; and the next page's token (:mod:`duetime.services.history`)."""
    get_job(job_id, tenant=tenant, deps=deps)
    return history.list_history(
        job_id,
        tenant=tenant,
        deps=deps,
        limit=limit,
        next_token=next_token,
        state=state,
        since=since,
        until=until,
    )


# ---- lifecycle -----------------------------------------------------------------------------------------
#: how many times a job action whose write found the job changed meanwhile is read and applied again
CHANGE_RETRIES = 5
P = ParamSpec("P")


def _reapplied(action: Callable[P, Job]) -> Callable[P, Job]:
    """``action`` (it reads the job, decides, writes it under its version) run again, from the read, when
    its write finds the job changed meanwhile (another PATCH of other fields, a pause, a tick's claim moving
    ``next_fire_at``): the request applies to the job as it is then, as if it had come a moment later.
    Raises ChangedMeanwhileError (HTTP 409) only after :data:`CHANGE_RETRIES` tries."""

    @functools.wraps(action)
    def again(*args: P.args, **kwargs: P.kwargs) -> Job:
        for _ in range(CHANGE_RETRIES - 1):
            try:
                return action(*args, **kwargs)
            except ChangedMeanwhileError:
                continue
        return action(*args, **kwargs)

    return again


@_reapplied
def update_job(job_id: str, request: UpdateJobRequest, *, tenant: str, deps: Deps) -> Job:
    """Change a job's schedule, task or policies (``PATCH``). Runs already claimed keep their task and
    policies.

    A schedule change takes effect from the new schedule's first slot after now (a ``rate`` still counts
    from ``start_at`` or the job's submission); the old schedule's runs claimed ahead end SKIPPED
    (``schedule_changed``) unless the new schedule fires at the same instant, and a fire of the new one
    inside the look-ahead is claimed at once. Sending the schedule the job already has changes nothing.

    Raises:
        NotFoundError, ScheduleError, RequestFieldError (a trigger job that is not the caller's),
        ConflictError: the job is DELETED; ChangedMeanwhileError: it kept changing under the PATCH
            (:func:`_reapplied`).
        QuotaExceededError: a COMPLETED job's new schedule would make it active past the tenant's quota.
    """
    job = get_job(job_id, tenant=tenant, deps=deps)
    if job.state is JobState.DELETED:
        raise ConflictError(f"job {job_id} is deleted")
    patch = request.model_dump(exclude_unset=True)
    if not patch:
        return job  # an empty patch changes nothing: no write, the version stays (RFC 7396)
    changes = merge_patch(job, patch)
    if request.notifications is not None:
        # replaced whole; write-only secrets sent as "set" are kept, a new one rotates the stored one
        rules = prepare_rules(
            job.notifications, request.notifications, field="notifications", deps=deps, tenant=tenant
        )
        changes["notifications"] = [rule.model_dump() for rule in rules]
    now = truncate_ms(deps.clock.now())
    merged = {**job.model_dump(), **changes, "updated_at": now, "version": job.version + 1}
    try:
        updated = Job.model_validate(merged)
    except ValidationError as exc:
        errors = exc.errors()
        sent = [e for e in errors if _sent(patch, e["loc"])]
        try:
            if sent:
                raise exc
            # only values the caller did not send break today's submit rules: the job was stored under
            # older ones (its row reads leniently, :meth:`Job.from_stored`), and a PATCH of others keeps them
            updated = Job.from_stored(merged)
        except ValidationError:
            first = (sent or errors)[0]
            field = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-"))
            raise RequestFieldError(f"{field}: {first['msg']}", field) from None
    if "on_timeout" in changes and updated.on_timeout.action == "trigger":
        _check_trigger_target(updated.on_timeout.job_id, job_id, tenant, deps)
    if isinstance(updated.task, LambdaTask) and updated.timeout_seconds > MAX_LAMBDA_TIMEOUT_SECONDS:
        raise RequestFieldError(
            f"timeout_seconds: a Lambda task runs at most {MAX_LAMBDA_TIMEOUT_SECONDS} s (Lambda's limit)",
            "timeout_seconds",
        )
    schedule_changed = "schedule" in changes and updated.schedule != job.schedule
    if schedule_changed and updated.schedule is not None:
        spec = updated.schedule
        # a rate keeps counting from start_at or the job's submission, as at submit: the same expression
        # sent again changes nothing, and a slot the old and new schedules share stays claimed
        anchor = truncate_ms(spec.start_at) if spec.start_at is not None else job.created_at
        parse_spec(spec, anchor)
        updated = updated.model_copy(update={"anchor": anchor, "schedule_changed_at": now})
        # the new schedule takes effect from its first slot after now; the old schedule's runs claimed
        # ahead end SKIPPED (schedule_changed) unless the new schedule has a slot at the same instant
        nxt = next_fire_after(updated, now)
        if nxt is None:
            _no_fire_ahead(updated.schedule, now)  # refused as at submit: nothing stored, nothing skipped
        if job.state is JobState.PAUSED:
            updated = updated.model_copy(update={"paused_next_fire_at": nxt})
        else:
            updated = updated.model_copy(
                update={"next_fire_at": nxt, "state": JobState.ACTIVE if nxt else JobState.COMPLETED}
            )
    if counts_as_active(updated) and not counts_as_active(job):
        # a COMPLETED job given a schedule with fire times ahead counts again, within the quota
        if not deps.store.add_active_jobs(tenant, 1, limit=deps.settings.tenant_max_active_jobs):
            raise QuotaExceededError(
                f"tenant {tenant!r} has {deps.settings.tenant_max_active_jobs} active or paused jobs, its "
                "quota; delete some first"
            )
        try:
            deps.store.replace_job(
                updated, expected_version=job.version, expected_next_fire_at=job.next_fire_at
            )
        except Exception:
            deps.store.add_active_jobs(tenant, -1)
            raise
    else:
        deps.store.replace_job(updated, expected_version=job.version, expected_next_fire_at=job.next_fire_at)
        _recount(job, updated, deps)  # an ACTIVE job whose new schedule has no fire time ahead COMPLETED
    if schedule_changed:
        _after_commit(
            "settle", {"job_id": job_id}, lambda: settle_claimed_ahead(updated, job_id, deps, since=now)
        )
    return _claim_due_now(updated, deps)


#: fields of a job that merge field by field in a PATCH (the others are replaced whole), and their models
_MERGED: dict[str, type[BaseModel]] = {
    "schedule": ScheduleSpec,
    "retry": RetryPolicy,
    "on_timeout": OnTimeout,
    "catch_up": CatchUpPolicy,
    "overlap": OverlapPolicy,
}


def _sent(patch: dict[str, Any], loc: tuple[int | str, ...]) -> bool:
    """Whether the value at ``loc`` (a validation error's location) is one the PATCH body gave: its path is
    in the patch, or a parent of it was replaced whole."""
    node: Any = patch
    for part in loc:
        if not isinstance(node, dict):
            return True  # the caller sent this subtree whole
        if str(part).startswith("function-") or part in ("container", "lambda"):
            continue  # pydantic's names of validators and union members, not fields
        if part not in node:
            return False
        node = node[part]
    return True


def merge_patch(job: Job, patch: dict[str, Any]) -> dict[str, Any]:
    """The job's fields a ``PATCH`` body changes, and their new values (JSON Merge Patch, RFC 7396).

    A field left out keeps its value; ``schedule`` and the policies merge field by field, the others are
    replaced. Null removes a field: it goes back to the default a ``POST /jobs`` without it would give
    (``timeout_seconds``: 3600, 900 for a Lambda task; a policy: the default policy; a policy's field: that
    field's default); a task of another kind sent without ``timeout_seconds`` moves a timeout that was the
    old kind's default to the new kind's. A field without a default (``name``, ``task``, ``schedule.expression``) cannot be
    removed, nor can a job's ``schedule`` (that would turn it into a run-once job); removing a schedule the
    job does not have changes nothing.

    Raises:
        RequestFieldError: the patch removes a field that cannot be removed (naming it).
    """
    changes: dict[str, Any] = {}
    for name, value in patch.items():
        if value is None and name == "schedule":
            if job.schedule is not None:
                raise _cannot_remove("schedule", "a job's schedule can be changed, not removed")
            continue
        if value is None and CreateJobRequest.model_fields[name].is_required():
            raise _cannot_remove(name, f"a job always has a {name}; send a new one to change it")
        if value is None and name == "timeout_seconds":
            changes[name] = _default_timeout((patch.get("task") or {}).get("kind", job.task.kind))
        elif value is None:
            changes[name] = CreateJobRequest.model_fields[name].get_default(call_default_factory=True)
        elif name in _MERGED:
            current = getattr(job, name)
            changes[name] = _merge_fields(
                name, _MERGED[name], current.model_dump() if current is not None else {}, value
            )
        else:
            changes[name] = value
    # a new task kind without a timeout: a timeout that was its old kind's default becomes the new kind's
    # (a default is not a choice the user made; one they set is kept, and checked against the new kind)
    kind = (patch.get("task") or {}).get("kind", job.task.kind)
    moved = kind != job.task.kind and "timeout_seconds" not in patch
    if moved and job.timeout_seconds == _default_timeout(job.task.kind):
        changes["timeout_seconds"] = _default_timeout(kind)
    return changes


def _default_timeout(kind: str) -> int:
    """``timeout_seconds`` of a submit that leaves it out: 3600 s, 900 s (Lambda's limit) for a Lambda task."""
    if kind == "lambda":
        return MAX_LAMBDA_TIMEOUT_SECONDS
    return int(CreateJobRequest.model_fields["timeout_seconds"].get_default())


def _merge_fields(
    name: str, model: type[BaseModel], current: dict[str, Any], sent: dict[str, Any]
) -> dict[str, Any]:
    """``current`` with the fields of ``sent``; a null one back to ``model``'s default for it."""
    merged = dict(current)
    for key, value in sent.items():
        if value is not None:
            merged[key] = value
        elif model.model_fields[key].is_required():
            raise _cannot_remove(f"{name}.{key}", "it has no default; send a new value to change it")
        else:
            merged[key] = model.model_fields[key].get_default(call_default_factory=True)
    return merged


def _cannot_remove(field: str, why: str) -> RequestFieldError:
    return RequestFieldError(f"{field}: cannot be removed (null): {why}", field)


T = TypeVar("T")


def _after_commit(step: str, ids: dict[str, str], action: Callable[[], T]) -> T | None:
    """Run ``action``, a step after the request's durable write, that the tick or the sweeper repairs if it
    does not happen (a claim, a queue message). Its failure (throttling, a network fault) is logged, not
    raised: the request did take effect, and a client told otherwise would send it again (a second job, a
    second manual run). Returns the action's result, or None if it failed."""
    try:
        return action()
    except Exception:  # noqa: BLE001 - repaired by the tick (claims) or the sweeper (PENDING re-send)
        logger.exception(
            f"{step} failed after the request was stored; the tick or sweeper completes it", extra=ids
        )
        return None


def _claim_due_now(job: Job, deps: Deps) -> Job:
    """Claim whatever of ``job`` is due inside the lookahead (the tick may already have passed that window).

    A claim that fails here leaves the job in the due index, as stored: the next tick claims it."""
    if job.state is not JobState.ACTIVE or job.next_fire_at is None:
        return job
    until = deps.clock.now() + timedelta(seconds=deps.settings.tick_lookahead_seconds)
    outcomes = _after_commit("claim", {"job_id": job.job_id}, lambda: claim_until(job, deps, until))
    if outcomes:
        last = outcomes[-1].next_fire_at
        job = job.model_copy(
            update={"next_fire_at": last, "state": JobState.COMPLETED if last is None else job.state}
        )
    return job


def counts_as_active(job: Job) -> bool:
    """Whether ``job`` counts against its tenant's active-jobs quota: a scheduled job ACTIVE or PAUSED (a
    run-now job, COMPLETED at its submit, never does)."""
    return job.schedule is not None and job.state in (JobState.ACTIVE, JobState.PAUSED)


@_reapplied
def pause_job(job_id: str, *, tenant: str, deps: Deps) -> Job:
    """ACTIVE or COMPLETED -> PAUSED: the job leaves the due index; its runs claimed ahead are held when they
    come due (they wait PENDING for the resume, whose catch-up policy decides them); runs already started
    continue. A COMPLETED job may still have runs claimed ahead (its last slots inside the look-ahead, a
    one-off due soon): pausing holds them too, and its resume completes it again.

    Pausing a paused job is a no-op. Raises NotFoundError; ConflictError if the job is DELETED.
    """
    job = get_job(job_id, tenant=tenant, deps=deps)
    if job.state is JobState.PAUSED:
        return job
    if job.state not in (JobState.ACTIVE, JobState.COMPLETED):
        raise ConflictError(f"job {job_id} is {job.state.value}: a deleted job cannot be paused")
    now = truncate_ms(deps.clock.now())
    paused = job.model_copy(
        update={
            "state": JobState.PAUSED,
            "paused_next_fire_at": job.next_fire_at,
            "paused_at": now,
            "next_fire_at": None,
            "updated_at": now,
            "version": job.version + 1,
        }
    )
    deps.store.replace_job(paused, expected_version=job.version, expected_next_fire_at=job.next_fire_at)
    _recount(job, paused, deps)
    return paused


def _recount(before: Job, after: Job, deps: Deps) -> None:
    """Move the tenant's active-jobs counter by what the change from ``before`` to ``after`` (both stored)
    did to :func:`counts_as_active` (no limit: the job is already stored as it is)."""
    delta = int(counts_as_active(after)) - int(counts_as_active(before))
    if not delta:
        return
    try:
        deps.store.add_active_jobs(after.tenant, delta)
    except Exception:  # noqa: BLE001 - the change is stored; the counter stays one off, as in claims
        logger.warning("active-jobs counter not updated", extra={"job_id": after.job_id}, exc_info=True)


@_reapplied
def resume_job(job_id: str, *, tenant: str, deps: Deps) -> Job:
    """PAUSED -> ACTIVE. Resuming an active job is a no-op.

    The slots due while the job was paused (runs claimed ahead and held at their start, and slots never
    claimed since the pause) follow the catch-up policy whatever their lateness: ``none`` runs none of them,
    ``latest`` the newest, ``all`` the ``max_runs`` newest; the others end SKIPPED (reason ``paused``) or,
    if never claimed, are counted in ``missed_slots``. The schedule then continues from its first slot after
    now (claimed at once if inside the look-ahead).

    Raises:
        NotFoundError; ConflictError if the job is neither ACTIVE nor PAUSED, or changed meanwhile.
    """
    job = get_job(job_id, tenant=tenant, deps=deps)
    if job.state is JobState.ACTIVE:
        return job
    if job.state is not JobState.PAUSED:
        raise ConflictError(f"job {job_id} is {job.state.value}: only a PAUSED job can be resumed")
    now = truncate_ms(deps.clock.now())
    # a slot due in the pause whose wake-up has not reached a worker yet is held now, while the job is still
    # PAUSED (a worker would hold it too): every slot due in the pause is decided here, whatever its lateness
    since = job.paused_at or now - timedelta(seconds=deps.settings.tick_lookahead_seconds)
    known: list[datetime] = []
    for run in _pending_first_attempts(job_id, deps, since=since, until=now):
        if run.trigger in SLOT_TRIGGERS and (run.held is not None or hold(job_id, run.due_at, deps)):
            known.append(run.due_at)
    slots = _slots_between(job, job.paused_next_fire_at, now)
    claimed = {r.due_at for r in all_runs(job_id, deps, since=slots[0], until=now)} if slots else set()
    unclaimed = [d for d in slots if d not in claimed]  # (a tick may have claimed one just before the pause)
    held = sorted({*known, *(r.due_at for r in held_runs(job_id, deps))})
    kept, dropped = select_slots([*held, *unclaimed], job.catch_up)
    keep_unclaimed = [d for d in kept if d in set(unclaimed)]
    # the kept slots nobody claimed yet become held runs first: if this request dies here, the sweeper
    # releases them once the job is resumed (or the next resume does); the newest says how many were dropped
    for due_at in keep_unclaimed:
        run = new_run(
            job,
            due_at,
            deps,
            trigger=Trigger.SCHEDULE,
            missed_slots=len(dropped) if due_at == kept[-1] else 0,
        ).model_copy(update={"held": "paused", "watch_at": now + timedelta(seconds=HOLD_RECHECK_SECONDS)})
        with suppress(AlreadyClaimedError):
            deps.store.put_new_run(run)
        known.append(due_at)
    if job.paused_next_fire_at is None:
        nxt = None
    elif job.paused_next_fire_at > now:
        nxt = job.paused_next_fire_at
    else:
        nxt = next_fire_after(job, now)
    resumed = job.model_copy(
        update={
            "state": JobState.ACTIVE if nxt else JobState.COMPLETED,
            "next_fire_at": nxt,
            "paused_next_fire_at": None,
            "paused_at": None,
            "pauses": [*job.pauses, PauseSpan(paused_at=job.paused_at or since, resumed_at=now)][
                -PAUSES_KEPT:
            ],
            "missed_slots": job.missed_slots + len(unclaimed) - len(keep_unclaimed),
            "updated_at": now,
            "version": job.version + 1,
        }
    )
    deps.store.replace_job(resumed, expected_version=job.version, expected_next_fire_at=None)
    _recount(job, resumed, deps)  # COMPLETED: no longer counts against the quota
    release_held(job_id, resumed, deps, known=known)
    # (the held runs it skipped added to missed_slots: the answer shows the job as stored now)
    return _claim_due_now(deps.store.get_job(job_id) or resumed, deps)


def _pending_first_attempts(job_id: str, deps: Deps, *, since: datetime, until: datetime) -> list[Run]:
    """The job's PENDING first attempts due in ``[since, until]`` (one Query of the job's runs)."""
    pending = all_runs(job_id, deps, since=since, until=until, state=RunState.PENDING)
    return [r for r in pending if r.attempt == 1]


def _slots_between(job: Job, first: datetime | None, now: datetime) -> list[datetime]:
    """The job's slots from ``first`` up to ``now`` (inclusive), oldest first: at most MAX_WALKED_SLOTS
    walked one by one, then the newest slot stands for the rest (catch-up keeps at most 1,000)."""
    schedule = schedule_of(job)
    if first is None or first > now:
        return []
    if schedule is None:  # a run-now job paused before its one run was claimed
        return [first]
    slots: list[datetime] = []
    cursor: datetime | None = first
    while cursor is not None and cursor <= now and len(slots) < MAX_WALKED_SLOTS:
        slots.append(truncate_ms(cursor))
        cursor = schedule.next_after(cursor)
    if cursor is not None and cursor <= now:
        latest = schedule.latest_at_or_before(now)
        if latest is not None:
            slots.append(truncate_ms(latest))
    return slots


def trigger_job(job_id: str, *, tenant: str, deps: Deps, ignore_overlap: bool = False) -> Run:
    """A run of the job now (trigger ``manual``), whatever its schedule or state (not DELETED).

    The run obeys the job's overlap policy unless ``ignore_overlap``. Raises NotFoundError, ConflictError.
    """
    from duetime.domain.models import OverlapPolicy

    job = get_job(job_id, tenant=tenant, deps=deps)
    if job.state is JobState.DELETED:
        raise ConflictError(f"job {job_id} is deleted")
    run = new_run(job, truncate_ms(deps.clock.now()), deps, trigger=Trigger.MANUAL)
    if ignore_overlap:
        run = run.model_copy(update={"overlap": OverlapPolicy()})
    try:
        deps.store.put_new_run(run)
    except AlreadyClaimedError:
        raise ConflictError(f"a run of job {job_id} is already due at this very millisecond; retry") from None
    _after_commit("send", {"run_id": run.run_id}, lambda: deps.queues.send(run.task.tier, message_for(run)))
    return run


def delete_job(job_id: str, *, tenant: str, deps: Deps, cancel_running: bool = False) -> Job:
    """The job gets no further runs (state DELETED; its history stays readable). With ``cancel_running``,
    its PENDING, RUNNING and RETRY_WAIT runs are CANCELLED too (running tasks are stopped through the fence).
    Deleting a deleted job is a no-op.
    """
    job = get_job(job_id, tenant=tenant, deps=deps)
    if job.state is not JobState.DELETED:
        now = truncate_ms(deps.clock.now())
        deleted = job.model_copy(
            update={
                "state": JobState.DELETED,
                "next_fire_at": None,
                "paused_next_fire_at": None,
                "updated_at": now,
                "version": job.version + 1,
            }
        )
        deps.store.replace_job(deleted, expected_version=job.version, expected_next_fire_at=job.next_fire_at)
        _recount(job, deleted, deps)
        job = deleted
    if cancel_running:
        for run in list(all_runs(job_id, deps, active_only=True)):
            cancel(run.job_id, run.due_at, deps, reason="job deleted with cancel_running=true")
    # no further runs: those claimed ahead or held by a pause end SKIPPED (deleted) now; any other PENDING
    # first attempt is skipped when its start re-checks the job
    since = deps.clock.now() - timedelta(seconds=deps.settings.tick_lookahead_seconds)

    def settle() -> None:
        release_held(job_id, job, deps)
        settle_claimed_ahead(job, job_id, deps, since=since)

    _after_commit("settle", {"job_id": job_id}, settle)
    return job


def cancel_run(run_id: str, *, tenant: str, deps: Deps) -> Run:
    """Cancel a run: a PENDING one never starts; a RUNNING one's worker is fenced off (its session finds it
    at its next beat) and kills the task; a RETRY_WAIT one is not retried.

    Raises:
        NotFoundError; ConflictError if the run already ended.
    """
    run = get_run(run_id, tenant=tenant, deps=deps)
    cancelled = cancel(run.job_id, run.due_at, deps, reason="cancelled by request")
    if cancelled is None:
        raise ConflictError(f"run {run_id} already ended ({run.state.value}); nothing to cancel")
    return cancelled


def _check_trigger_target(target_id: str | None, job_id: str, tenant: str, deps: Deps) -> None:
    """``on_timeout.job_id`` names another job of ``tenant`` that is not DELETED; a job that triggers itself
    is refused (each timeout would start one more run of it: a loop; ``retry`` is how a job runs again).

    Raises RequestFieldError (field ``on_timeout.job_id``)."""
    if target_id is None:
        return
    if target_id == job_id:
        raise RequestFieldError(
            "on_timeout.job_id: a job cannot trigger itself on its timeout (every timeout would start another "
            "run of it); use retry to run it again",
            "on_timeout.job_id",
        )
    target = deps.store.get_job(target_id)
    if target is None or target.tenant != tenant or target.state is JobState.DELETED:
        raise RequestFieldError(f"on_timeout.job_id: no job {target_id!r} to trigger", "on_timeout.job_id")
