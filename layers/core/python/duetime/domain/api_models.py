"""Request and response models of the HTTP API (validated by the Powertools resolver, shown in OpenAPI)."""

from __future__ import annotations

import math
import unicodedata
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    Strict,
    StringConstraints,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from duetime.domain.models import (
    MAX_LAMBDA_TIMEOUT_SECONDS,
    MAX_RULES,
    MAX_TIMEOUT_SECONDS,
    STORED_CONTEXT,
    AttemptRecord,
    CatchUpPolicy,
    Instant,
    Job,
    JobId,
    JobState,
    NotificationRule,
    OnTimeout,
    OverlapPolicy,
    RequestInstant,
    RetryPolicy,
    Run,
    RunEvent,
    RunState,
    ScheduleSpec,
    SInt,
    Task,
    Trigger,
)

#: Unicode categories a name may not hold: controls (C0, DEL, C1), format characters (bidirectional
#: overrides such as U+202E, zero-width spaces, soft hyphens), line and paragraph separators, surrogates
_REFUSED_CATEGORIES = {
    "Cc": "control",
    "Cf": "invisible format",
    "Zl": "line separator",
    "Zp": "paragraph separator",
    "Cs": "surrogate",
}
#: the zero-width joiner builds emoji sequences (a family emoji): allowed
_ALLOWED_FORMAT = {"\u200d"}


def _no_control_characters(text: str) -> str:
    """``text`` if it holds no control, invisible format or separator character (see _REFUSED_CATEGORIES).

    Raises:
        ValueError: naming the character (U+XXXX), its position (1-based) and its kind.
    """
    for index, char in enumerate(text):
        kind = _REFUSED_CATEGORIES.get(unicodedata.category(char))
        if kind is not None and char not in _ALLOWED_FORMAT:
            raise ValueError(
                f"must not contain {kind} characters (U+{ord(char):04X} at character {index + 1}): "
                "a name is a label shown in listings, logs and terminals"
            )
    return text


#: A job's name: 1-128 characters after trimming surrounding whitespace, no control characters (a NUL, an
#: escape sequence or a line break would corrupt listings, CLI tables and log lines).
JobName = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=128),
    AfterValidator(_no_control_characters),
]


def _no_rotation_fields(rules: list[NotificationRule]) -> list[NotificationRule]:
    """A request's webhook sends ``url`` and ``secret`` only: the rotation's fields are Duetime's own."""
    for rule in rules:
        if rule.webhook is not None and (
            rule.webhook.previous_secret is not None or rule.webhook.previous_valid_until is not None
        ):
            raise ValueError(
                "a webhook takes url and secret only: send a new secret to rotate it (the previous one stays "
                "valid for 24 h)"
            )
    return rules


#: a request's notification rules (docs/design/notifications.md)
RuleList = Annotated[
    list[NotificationRule],
    Field(max_length=MAX_RULES, description="notification rules: `on` events and one target"),
    AfterValidator(_no_rotation_fields),
]


def _lambda_timeout(timeout: int | None, info: ValidationInfo) -> int | None:
    """A Lambda task's timeout cannot exceed Lambda's own limit (900 s)."""
    task = info.data.get("task")
    if (
        timeout is not None
        and getattr(task, "kind", None) == "lambda"
        and timeout > MAX_LAMBDA_TIMEOUT_SECONDS
    ):
        raise ValueError(f"a Lambda task runs at most {MAX_LAMBDA_TIMEOUT_SECONDS} s (Lambda's limit)")
    return timeout


class CreateJobRequest(BaseModel):
    """``POST /jobs`` body. Omit ``schedule`` (or send null) to run the task once, now."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "hello",
                    "schedule": {"expression": "rate(1 minute)", "timezone": "UTC"},
                    "task": {"kind": "container", "command": ["sh", "-c", "echo hello $DUETIME_RUN_ID"]},
                }
            ]
        },
    )

    job_id: JobId | None = Field(default=None, description="Your own id; generated when omitted")
    name: JobName
    schedule: ScheduleSpec | None = None
    task: Task
    timeout_seconds: SInt = Field(
        default=3600,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="per attempt, s; default 3600 (900, Lambda's limit, for a Lambda task)",
    )
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    on_timeout: OnTimeout = Field(default_factory=OnTimeout)
    catch_up: CatchUpPolicy = Field(default_factory=CatchUpPolicy)
    overlap: OverlapPolicy = Field(default_factory=OverlapPolicy)
    starting_deadline_seconds: SInt | None = Field(
        default=None,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="a run not started this long after its due time is SKIPPED",
    )
    late_after_seconds: SInt | None = Field(
        default=None,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="a run not started this long after due is `late`",
    )
    expected_duration_seconds: SInt | None = Field(
        default=None, ge=1, le=MAX_TIMEOUT_SECONDS, description="a run running longer than this `overran`"
    )
    notifications: RuleList = Field(default_factory=list)
    inherit_tenant_notifications: Annotated[bool, Strict()] = Field(
        default=True, description="the tenant's rules (`/tenants/me/notifications`) apply too"
    )
    mute_until: RequestInstant | None = Field(
        default=None, description="until then events are recorded and listed, nothing is sent"
    )

    @model_validator(mode="before")
    @classmethod
    def _lambda_default_timeout(cls, data: Any) -> Any:
        task = data.get("task") if isinstance(data, dict) else None
        kind = task.get("kind") if isinstance(task, dict) else getattr(task, "kind", None)
        if kind == "lambda" and "timeout_seconds" not in data:
            return {**data, "timeout_seconds": MAX_LAMBDA_TIMEOUT_SECONDS}
        return data

    _timeout_fits_lambda = field_validator("timeout_seconds")(_lambda_timeout)


def patch_model(model: type[BaseModel]) -> type[BaseModel]:
    """``model``'s ``PATCH`` form: the same fields with the same constraints, each optional and nullable.

    A field left out keeps the job's value; one sent as null goes back to ``model``'s default (JSON Merge
    Patch, RFC 7396: null removes a member). The merged result is validated as ``model`` again, so the
    model's own cross-field rules still hold.
    """
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        annotation: Any = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        fields[name] = (annotation | None, Field(default=None, description=info.description))
    return create_model(
        f"{model.__name__}Patch",
        __config__=ConfigDict(frozen=True, extra="forbid"),
        __doc__=f"A partial `{model.__name__}` for `PATCH`: the fields sent replace the job's, the others "
        "stay; null puts a field back to its default.",
        **fields,
    )


RetryPolicyPatch = patch_model(RetryPolicy)
OnTimeoutPatch = patch_model(OnTimeout)
CatchUpPolicyPatch = patch_model(CatchUpPolicy)
OverlapPolicyPatch = patch_model(OverlapPolicy)


class SchedulePatch(BaseModel):
    """A partial schedule for ``PATCH``: the fields sent replace the job's, the others stay; null puts
    ``timezone``, ``dst_policy``, ``start_at`` or ``end_at`` back to its default (``expression`` has none)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    expression: str | None = Field(default=None, min_length=1, max_length=256)
    timezone: str | None = Field(default=None, min_length=1, max_length=64)
    start_at: RequestInstant | None = None
    end_at: RequestInstant | None = None
    dst_policy: Literal["shift", "skip"] | None = None


class UpdateJobRequest(BaseModel):
    """``PATCH /jobs/{job_id}`` body, a JSON Merge Patch (RFC 7396): the fields to change, others keep
    their values; ``schedule`` and the policies merge field by field, ``task`` is replaced whole. Null
    removes a field, which puts it back to its default (what ``POST /jobs`` gives when it is left out);
    ``name``, ``task``, a job's ``schedule`` and ``schedule.expression`` have no default and cannot be
    removed (400). A schedule change recomputes ``next_fire_at`` from now and never fires a slot that was
    already claimed again."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: JobName | None = Field(default=None, description="cannot be removed: null is a 400")
    schedule: SchedulePatch | None = Field(
        default=None, description="merged field by field; a job's schedule cannot be removed: null is a 400"
    )
    task: Task | None = Field(default=None, description="replaced whole; cannot be removed: null is a 400")
    timeout_seconds: SInt | None = Field(
        default=None, ge=1, le=MAX_TIMEOUT_SECONDS, description="null: the default, 3600 (900 for Lambda)"
    )
    retry: RetryPolicyPatch | None = Field(default=None, description="null: the default policy")  # type: ignore[valid-type]
    on_timeout: OnTimeoutPatch | None = Field(default=None, description="null: the default policy")  # type: ignore[valid-type]
    catch_up: CatchUpPolicyPatch | None = Field(default=None, description="null: the default policy")  # type: ignore[valid-type]
    overlap: OverlapPolicyPatch | None = Field(default=None, description="null: the default policy")  # type: ignore[valid-type]
    starting_deadline_seconds: SInt | None = Field(
        default=None, ge=1, le=MAX_TIMEOUT_SECONDS, description="null: no deadline"
    )
    late_after_seconds: SInt | None = Field(
        default=None, ge=1, le=MAX_TIMEOUT_SECONDS, description="null: none"
    )
    expected_duration_seconds: SInt | None = Field(
        default=None, ge=1, le=MAX_TIMEOUT_SECONDS, description="null: none"
    )
    notifications: RuleList | None = Field(
        default=None,
        description='replaced whole; a webhook secret sent as "set" keeps the stored one, a new one rotates it',
    )
    inherit_tenant_notifications: Annotated[bool, Strict()] | None = Field(
        default=None, description="null: true"
    )
    mute_until: RequestInstant | None = Field(default=None, description="null: not muted")

    _timeout_fits_lambda = field_validator("timeout_seconds")(_lambda_timeout)


class TenantNotificationsRequest(BaseModel):
    """``PUT /tenants/me/notifications``: the tenant's default rules, replaced whole (every job that does not
    say ``inherit_tenant_notifications: false`` uses them besides its own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    notifications: RuleList


class TenantNotificationsResponse(BaseModel):
    """The tenant's default rules (webhook secrets shown as "set")."""

    tenant: str
    notifications: list[dict[str, Any]]
    updated_at: Instant | None = None


class RunSummary(BaseModel):
    """A job's most recent run, in brief."""

    run_id: str
    due_at: Instant
    state: RunState
    exit_code: int | None
    finished_at: Instant | None


class JobResponse(BaseModel):
    """A job as the API shows it."""

    job_id: str
    name: str
    tenant: str
    state: JobState
    schedule: ScheduleSpec | None
    task: Task
    timeout_seconds: int
    retry: RetryPolicy
    on_timeout: OnTimeout
    catch_up: CatchUpPolicy
    overlap: OverlapPolicy
    starting_deadline_seconds: int | None
    late_after_seconds: int | None = None
    expected_duration_seconds: int | None = None
    notifications: list[dict[str, Any]] = Field(
        default_factory=list, description='the job\'s rules; webhook secrets shown as "set", never returned'
    )
    inherit_tenant_notifications: bool = True
    mute_until: Instant | None = None
    missed_slots: int = Field(description="slots that did not run: skipped by catch-up or a pause, or missed")
    paused_at: Instant | None = Field(default=None, description="PAUSED jobs: when the pause began, UTC")
    next_fire_at: Instant | None
    next_fire_times: list[Instant] = Field(default_factory=list, description="the next few fires, UTC")
    last_run: RunSummary | None = None
    lag: LagStats | None = Field(
        default=None,
        description="the schedule lag of the job's last 100 runs (a single job's answers; null in listings)",
    )
    version: int
    created_at: Instant
    updated_at: Instant

    @classmethod
    def of(
        cls,
        job: Job,
        *,
        next_fire_times: list[datetime] | None = None,
        last_run: Run | None = None,
        lag: LagStats | None = None,
    ) -> JobResponse:
        data = job.model_dump(exclude={"shard", "anchor", "paused_next_fire_at", "schedule_changed_at"})
        data["next_fire_times"] = next_fire_times or []
        data["notifications"] = [rule.shown() for rule in job.notifications]
        data["lag"] = lag.model_dump() if lag is not None else None
        if last_run is not None:
            data["last_run"] = RunSummary(
                run_id=last_run.run_id,
                due_at=last_run.due_at,
                state=last_run.state,
                exit_code=last_run.exit_code,
                finished_at=last_run.finished_at,
            )
        # a stored job (read leniently) is shown as stored: submit-only rules are not applied again
        return cls.model_validate(data, context=STORED_CONTEXT)


class LagStats(BaseModel):
    """How late a job's recent runs started (seconds from due time to attempt 1's start)."""

    runs: int = Field(description="runs that started, of the job's last 100 by due time")
    p50_seconds: float | None = Field(description="median schedule lag, seconds; null if none started")
    p99_seconds: float | None = Field(description="99th percentile (nearest rank), seconds; null if none")


def lag_stats(runs: list[Run]) -> LagStats:
    """:class:`LagStats` of ``runs`` (those that started; nearest-rank percentiles)."""
    lags = sorted(lag for run in runs if (lag := schedule_lag(run)) is not None)

    def rank(q: float) -> float | None:
        if not lags:
            return None
        return lags[min(len(lags) - 1, max(0, math.ceil(q * len(lags)) - 1))]

    return LagStats(runs=len(lags), p50_seconds=rank(0.50), p99_seconds=rank(0.99))


class SlotResponse(BaseModel):
    """One expected fire time of a job's schedule and what became of it (``GET /jobs/{id}/slots``)."""

    due_at: Instant
    outcome: Literal["ran", "skipped", "missed", "pending", "upcoming"]
    run_id: str | None = Field(default=None, description="the run claimed for the slot, if any")
    state: RunState | None = None
    reason: str | None = Field(
        default=None,
        description="skipped/missed: why (overlap, paused, starting_deadline_exceeded, deleted, "
        "schedule_changed, cancelled, missed); pending or upcoming: paused if the job is paused",
    )
    lag_seconds: float | None = Field(default=None, description="ran: seconds from due time to its start")


class SlotListResponse(BaseModel):
    slots: list[SlotResponse]
    next_token: str | None = Field(description="pass as next_token for the next page; null on the last")


class JobListResponse(BaseModel):
    jobs: list[JobResponse]
    next_token: str | None = Field(description="pass as next_token for the next page; null on the last")


class RunResponse(BaseModel):
    """A run as the API shows it: its state, current attempt, outcome and history."""

    run_id: str
    job_id: str
    due_at: Instant
    state: RunState
    attempt: int
    max_attempts: int
    trigger: Trigger
    fencing_token: int
    started_at: Instant | None
    finished_at: Instant | None
    exit_code: int | None
    error: str | None
    result: JsonValue = Field(
        default=None, description="a Lambda task's response (at most 32 KB of JSON; see `result_truncated`)"
    )
    result_truncated: bool = Field(
        default=False, description="the response was larger than 32 KB: only the run's log holds it"
    )
    lease_owner: str | None
    lease_expires_at: Instant | None
    retry_at: Instant | None
    deadline_at: Instant | None
    triggered_by: str | None
    timeout_action: str | None
    timeout_outcome: str | None
    timeout_execution: str | None
    dead_lettered: bool
    dead_lettered_at: Instant | None
    missed_slots: int
    held: str | None = Field(
        default=None,
        description="`paused`: a PENDING run its job's pause holds back; the resume's catch-up decides it",
    )
    lag_seconds: float | None = Field(
        description="schedule lag, seconds: when the run's first attempt started minus `due_at` (retries do "
        "not change it; null until the run starts)"
    )
    attempts: list[AttemptRecord] = Field(description="every ended attempt, oldest first, as recorded")
    current_attempt: AttemptRecord | None = Field(
        default=None,
        description="the attempt now RUNNING (its state RUNNING, no finished_at), which joins `attempts` when "
        "it ends; null when the run is not RUNNING",
    )
    events: list[RunEvent]
    archived: bool = Field(
        default=False, description="the run has left the hot window: read from the archive (read only)"
    )

    @classmethod
    def of(cls, run: Run, *, archived: bool = False) -> RunResponse:
        data: dict[str, Any] = run.model_dump(
            exclude={
                "tenant",
                "shard",
                "task",
                "timeout_seconds",
                "retry",
                "log_key",
                "watch_at",
                "created_at",
            }
        )
        data["run_id"] = run.run_id
        data["archived"] = archived
        data["lag_seconds"] = schedule_lag(run)
        if run.state is RunState.RUNNING and all(a.attempt != run.attempt for a in run.attempts):
            # the attempt being run has no record until it ends: shown as it stands, apart from the ended
            # ones (a reader that takes every entry of `attempts` as ended, an earlier CLI's follow, stays right)
            data["current_attempt"] = AttemptRecord(
                attempt=run.attempt,
                fencing_token=run.fencing_token,
                worker=run.lease_owner,
                started_at=run.started_at,
                state=RunState.RUNNING,
            ).model_dump()
        # a stored run (read leniently) is shown as stored: submit-only rules are not applied again
        return cls.model_validate(data, context=STORED_CONTEXT)


def schedule_lag(run: Run) -> float | None:
    """How late the run started, seconds: its first attempt's start minus its due time (the "on time"
    promise, as the ``ScheduleLag`` metric counts it), from attempt 1's record in the run's history.

    While attempt 1 is still running it has no record yet, and a run whose history lacks it has only its
    current attempt's start: then the current ``started_at`` is used (None before any start).
    """
    first = next((a for a in run.attempts if a.attempt == 1 and a.started_at is not None), None)
    started = first.started_at if first is not None else run.started_at
    return round((started - run.due_at).total_seconds(), 3) if started is not None else None


class RunListResponse(BaseModel):
    runs: list[RunResponse]
    next_token: str | None = Field(description="pass as next_token for the next page; null on the last")


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    """Every error the API returns has this shape."""

    error: ErrorBody


class SchedulePreviewResponse(BaseModel):
    """The next fire times of an expression, in UTC and in the schedule's zone (with its UTC offset)."""

    expression: str
    timezone: str
    kind: str
    description: str
    fire_times: list[Instant] = Field(description="UTC")
    local_times: list[str] = Field(description="ISO-8601 wall times in `timezone`, with their UTC offsets")


class DeliveryTryResponse(BaseModel):
    """One try of a delivery."""

    at: Instant
    ok: bool
    status_code: int | None = None
    error: str | None = None
    duration_ms: int | None = None


class DeliveryResponse(BaseModel):
    """One event to one rule's target: ``pending`` (retried until ``next_attempt_at``), ``delivered``,
    ``dead_lettered`` (retried for a day, or the address is forbidden) or ``cancelled`` (its rule removed)."""

    delivery_id: str
    kind: str = Field(description="webhook, sns or email")
    target: str = Field(description="the URL, topic ARN or addresses (never a secret)")
    origin: str = Field(description="job: the job's own rule; tenant: the tenant's default")
    status: str
    tries: int = Field(description="tries made so far")
    attempts: list[DeliveryTryResponse] = Field(description="the newest 20 tries, oldest first")
    next_attempt_at: Instant | None = None
    created_at: Instant
    finished_at: Instant | None = None


class NotificationEventResponse(BaseModel):
    """One event of a job, with its deliveries. ``notified``: ``sent``, ``muted`` (the job's ``mute_until``
    was ahead: nothing sent), ``suppressed`` (the incident had alerted already) or ``no_rules``."""

    event_id: str = Field(description="the receivers' idempotency key: the same for every duplicate")
    type: str
    run_id: str
    attempt: int
    state: str
    reason: str | None = None
    occurred_at: Instant
    notified: str
    deliveries: list[DeliveryResponse]


class DeliveryListResponse(BaseModel):
    events: list[NotificationEventResponse]
    next_token: str | None = Field(description="pass as next_token for the next page; null on the last")
