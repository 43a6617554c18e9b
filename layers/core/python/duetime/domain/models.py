"""Domain models: jobs, runs, attempts and the queue message.

A job is split the way Temporal splits a schedule: ``schedule`` (when), ``task`` (what), policies
(``retry``, ``timeout_seconds``) and ``state``. A run is one due time of one job; its id is derived from
``(job_id, due_at)`` and is the idempotency key handed to the task (DESIGN.md sections 3 and 5).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from functools import cache
from types import MappingProxyType
from typing import Annotated, Any, Literal, Self, TypeVar, get_origin

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    JsonValue,
    PlainSerializer,
    Strict,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from duetime.domain.timeutil import from_epoch_ms, to_epoch_ms, to_iso


def json_text(value: Any) -> str:
    """Compact JSON text of a user's JSON value (a Lambda payload or result), non-ASCII escaped: whatever
    strings a function returns, the text is valid UTF-8 for any store."""
    return json.dumps(value, separators=(",", ":"))


# ---- stored rows: read leniently --------------------------------------------------------------------------
# A row in the store was valid when it was written, by this version or by another one: a newer version may
# have added fields, a rollback may leave rows a newer version wrote, and a rule for submissions may have
# been tightened since. None of that may make a row unreadable (a job that cannot be read cannot even be
# deleted). So a stored row is validated with the ``stored`` context (``StoredModel.from_stored``): unknown
# fields are dropped at every nesting level and the rules marked submit-only are skipped. Requests and queue
# messages get no context: for them every rule holds and an unknown field is an error, as before.

#: the key of the validation context that marks a stored row (``context={STORED: True}``)
STORED = "stored"
#: the validation context of a stored row
STORED_CONTEXT: Mapping[str, Any] = MappingProxyType({STORED: True})


def is_stored(info: ValidationInfo) -> bool:
    """True when the value being validated comes from a stored row (the ``stored`` validation context)."""
    context = info.context
    if context is None or context is STORED_CONTEXT:  # the common cases, without an ABC check per field
        return context is not None
    return isinstance(context, Mapping) and context.get(STORED) is True


def _shallow(source: Any) -> Any:
    """``source`` with its items left unchecked (``list[Argument]`` -> ``list[Any]``): a constraint on a
    container is checked on the container, its items were validated already."""
    origin = get_origin(source)
    if origin is list:
        return list[Any]
    if origin is dict:
        return dict[Any, Any]
    return source


#: pydantic constraints a SubmitOnly rule may be
_Constraint = FieldInfo | StringConstraints


class SubmitOnly:
    """Annotation: rules a *submission* must follow, skipped when a stored row is read.

    Each rule is a pydantic constraint (``Field(le=100)``, ``Field(max_length=256)``, ``StringConstraints``),
    checked as pydantic checks it (the same errors; a list's or a dict's size before its items, as pydantic
    does), or a check function ``value -> value`` raising ValueError, run after the value's own validation
    (with ``mode="before"``: on the raw input, functions only). Rules run in order. The constraints appear in
    the JSON schema too, so the OpenAPI document still shows them.

    Use it for limits that may be tuned (upper bounds, sizes, formats a request must use); a rule the code
    relies on to use the value (its type, a lower bound that gives it its meaning) stays a plain one.
    """

    __slots__ = ("_mode", "_rules")

    def __init__(
        self,
        *rules: _Constraint | Callable[[Any], Any],
        mode: Literal["after", "before"] = "after",
    ):
        if mode == "before" and any(isinstance(rule, _Constraint) for rule in rules):
            raise TypeError("SubmitOnly(mode='before') takes check functions only")
        self._rules = rules
        self._mode = mode

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        container = get_origin(source) if get_origin(source) in (list, dict) else None
        before: list[Callable[[Any], Any]] = []
        after: list[Callable[[Any], Any]] = []
        for rule in self._rules:
            if not isinstance(rule, _Constraint):
                (before if self._mode == "before" else after).append(rule)
                continue
            checker = _constrained(_shallow(source), rule).validator.validate_python
            if container is not None:  # pydantic checks a container's size before its items
                before.append(_when_instance(container, checker))
            after.append(checker)

        def check_submission(value: Any, validate: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
            if is_stored(info):
                return validate(value)
            for check in before:
                value = check(value)
            value = validate(value)
            for check in after:
                value = check(value)
            return value

        names = [getattr(rule, "__name__", "") for rule in self._rules if not isinstance(rule, _Constraint)]
        check_submission.__name__ = check_submission.__qualname__ = (
            "_".join(n for n in names if n) or "submit_only"
        )
        return core_schema.with_info_wrap_validator_function(check_submission, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        shown = handler(schema)
        python_type = _PYTHON_TYPE_OF_JSON.get(shown.get("type"), Any)
        for rule in self._rules:
            if isinstance(rule, _Constraint):
                own = _constrained(python_type, rule).json_schema()
                shown.update({key: value for key, value in own.items() if key not in shown})
        return shown


_PYTHON_TYPE_OF_JSON: dict[Any, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "array": list[Any],
    "object": dict[Any, Any],
}


def _constrained(python_type: Any, constraint: _Constraint) -> TypeAdapter[Any]:
    """A validator of ``python_type`` under ``constraint`` (the way pydantic checks it on a field)."""
    annotated: Any = Annotated[python_type, constraint]
    return TypeAdapter(annotated)


def _when_instance(kind: type, check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``check`` applied to a value of type ``kind`` only (others are left to the type's own validation)."""

    def checked(value: Any) -> Any:
        return check(value) if isinstance(value, kind) else value

    return checked


_M = TypeVar("_M", bound=BaseModel)


def submit_only(check: Callable[[_M], _M]) -> Callable[[_M, ValidationInfo], _M]:
    """A ``model_validator(mode="after")`` that a submission must pass and a stored row skips (see
    :class:`SubmitOnly`): put it under ``@model_validator(mode="after")``."""

    def checked(self: _M, info: ValidationInfo) -> _M:
        return self if is_stored(info) else check(self)

    checked.__name__ = check.__name__
    checked.__qualname__ = check.__qualname__
    checked.__doc__ = check.__doc__
    return checked


class StoredModel(BaseModel):
    """Base of the models the store holds (a job, a run and what they are made of): frozen and, given no
    context, strict (an unknown field is an error, every rule holds), as a request or a message needs.

    Read a stored row with :meth:`from_stored`: a rollback or a newer writer must never make rows
    unreadable, so with the ``stored`` context (:data:`STORED_CONTEXT`, which nested models inherit) unknown
    fields are ignored at every level and :class:`SubmitOnly` rules are skipped. Types, required fields,
    enum values and the rules the code relies on to use a value still hold.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> Self:
        """The model of a stored row ``data``, read leniently: fields this version does not know (a newer
        version's, or an older one's since removed) are ignored at every nesting level, submit-only rules
        (:class:`SubmitOnly`: bounds, sizes, request formats such as "numbers are numbers") are skipped.

        Raises:
            pydantic.ValidationError: the row lacks a required field or holds a value of the wrong type.
        """
        return cls.model_validate(dict(data), strict=False, context=STORED_CONTEXT)

    @model_validator(mode="before")
    @classmethod
    def _ignore_unknown_fields_when_stored(cls, data: Any, info: ValidationInfo) -> Any:
        if not is_stored(info) or not isinstance(data, dict | Mapping):
            return data
        known = _field_keys(cls)
        if known.issuperset(data):  # the common case: nothing to drop, no copy
            return data
        return {key: value for key, value in data.items() if key in known}


@cache
def _field_keys(model: type[BaseModel]) -> frozenset[str]:
    """The keys ``model`` reads from its input: its field names and aliases."""
    return frozenset(
        key
        for name, field in model.model_fields.items()
        for key in (name, field.alias, field.validation_alias)
        if isinstance(key, str)
    )


#: Numbers in requests are numbers: "10" or true is not accepted where an integer or float is expected
#: (a submission's rule: ``StoredModel.from_stored`` reads a stored row with ``strict=False``).
SInt = Annotated[int, Strict()]
SFloat = Annotated[float, Strict()]


def _no_epoch_numbers(value: object) -> object:
    if isinstance(value, int | float):
        raise ValueError(
            "give an ISO-8601 instant with a UTC offset, e.g. 2026-12-01T10:00:00Z, not a number"
        )
    return value


#: Instants Duetime accepts: EventBridge Scheduler's year range (its cron year field is 1970-2199).
MIN_YEAR, MAX_YEAR = 1970, 2199


def in_supported_range(value: datetime) -> datetime:
    """``value`` if its UTC instant lies in years 1970-2199.

    Raises:
        ValueError: outside that range (a year-1 or year-9999 instant cannot even be shifted to UTC).
    """
    try:
        year = value.astimezone(UTC).year
    except (OverflowError, ValueError):
        year = 0
    if not MIN_YEAR <= year <= MAX_YEAR:
        raise ValueError(f"must lie between {MIN_YEAR} and {MAX_YEAR} (UTC)")
    return value


#: An instant in a request: ISO-8601 with an offset; epoch numbers are refused (seconds or milliseconds?).
#: Both rules are a submission's (a stored schedule keeps the instant it was accepted with).
RequestInstant = Annotated[
    AwareDatetime,
    SubmitOnly(_no_epoch_numbers, mode="before"),
    SubmitOnly(in_supported_range),
    PlainSerializer(lambda d: to_iso(d), return_type=str, when_used="json"),
]

#: An aware instant, shown in JSON as fixed-width UTC with milliseconds: ``2026-11-29T18:52:10.123Z``.
Instant = Annotated[AwareDatetime, PlainSerializer(to_iso, return_type=str, when_used="json")]

JOB_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)
JobId = Annotated[str, Field(pattern=JOB_ID_PATTERN, description="Job id: 1-64 of A-Z a-z 0-9 _ -")]


class JobState(StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    DELETED = "DELETED"


class RunState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    SKIPPED = "SKIPPED"
    RETRY_WAIT = "RETRY_WAIT"

    @property
    def terminal(self) -> bool:
        """True for states a run never leaves (it has dropped out of the watchdog index)."""
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.TIMED_OUT, RunState.CANCELLED, RunState.SKIPPED}
)


class Trigger(StrEnum):
    """Why a run exists (DESIGN.md section 3)."""

    SCHEDULE = "schedule"
    MANUAL = "manual"
    RETRY = "retry"
    BACKFILL = "backfill"
    TIMEOUT_HANDLER = "timeout-handler"


Tier = Literal["small", "medium", "large"]


def _no_empty_args(argv: list[str]) -> list[str]:
    if not argv[0].strip():
        raise ValueError("the program (first element of command) must not be empty")
    return argv


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("must not contain a NUL character (no process can receive one)")
    return text


#: a string handed to a process (argv element, environment value, stdin): no NUL characters (submissions)
ProcessText = Annotated[str, SubmitOnly(_no_nul)]
#: Longest argv element and stdin, characters (submissions). The length is checked before the NUL check.
MAX_ARG_CHARS = 8192
MAX_STDIN_CHARS = 65536
Argument = Annotated[str, SubmitOnly(Field(max_length=MAX_ARG_CHARS), _no_nul)]
StdinText = Annotated[str, SubmitOnly(Field(max_length=MAX_STDIN_CHARS), _no_nul)]

#: Most bytes of command + env + stdin in one task: the task is copied into every run record, and a
#: DynamoDB item holds at most 400 KB with its attempt history.
MAX_TASK_BYTES = 96 * 1024


#: how many past pauses a job keeps (:attr:`Job.pauses`; about 70 bytes each on the job's row)
PAUSES_KEPT = 10


class PauseSpan(StoredModel):
    """One pause of a job: from ``paused_at`` (its pause) to ``resumed_at`` (its resume), UTC."""

    paused_at: Instant
    resumed_at: Instant


class ScheduleSpec(StoredModel):
    """When a job fires. ``None`` instead of a schedule means "run once, now"."""

    # submit-only (a stored row skips them): the lengths' upper bounds and the instants' rules (no epoch
    # numbers, years 1970-2199); the expression's own submit rules are skipped by parse_spec(stored=True)

    expression: Annotated[str, Field(min_length=1), SubmitOnly(Field(max_length=256))] = Field(
        description="`rate(N minutes|hours|days)`, `at(yyyy-mm-ddThh:mm:ss)` or a cron expression",
        examples=["rate(5 minutes)", "at(2026-12-01T10:00:00)", "cron(0 12 ? * MON-FRI *)", "*/15 * * * *"],
    )
    timezone: Annotated[str, Field(min_length=1), SubmitOnly(Field(max_length=64))] = Field(
        default="UTC", description="IANA time zone name", examples=["UTC"]
    )
    start_at: RequestInstant | None = Field(default=None, description="No fire before this instant")
    end_at: RequestInstant | None = Field(default=None, description="No fire after this instant")
    dst_policy: Literal["shift", "skip"] = Field(
        default="shift",
        description="a fixed-time fire inside a spring-forward gap: `shift` runs it when the gap ends "
        "(Debian cron), `skip` drops it (EventBridge Scheduler)",
    )


class ContainerTask(StoredModel):
    """A command run by a worker of ``tier`` in a subprocess (argv, no shell unless you ask for one)."""

    # submit-only (a stored row skips them): the sizes (argv length, each string's, the task's bytes), the
    # environment names' format, NUL characters, an empty program name; a stored command still needs one

    kind: Literal["container"] = "container"
    command: Annotated[
        list[Argument],
        Field(min_length=1),
        SubmitOnly(Field(max_length=256), _no_empty_args),
    ] = Field(description="argv list", examples=[["sh", "-c", "echo hello $DUETIME_RUN_ID"]])
    env: dict[
        Annotated[str, SubmitOnly(StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256))],
        ProcessText,
    ] = Field(default_factory=dict, description="extra environment variables for the task")
    tier: Tier = Field(default="small", description="resource tier: which worker fleet runs it")
    stdin: StdinText | None = Field(
        default=None, description="text fed to the task's standard input (cron's `%` lines)"
    )

    @model_validator(mode="after")
    @submit_only
    def _fits_a_run_record(self) -> ContainerTask:
        size = sum(len(a.encode()) for a in self.command)
        size += sum(len(k.encode()) + len(v.encode()) for k, v in self.env.items())
        size += len(self.stdin.encode()) if self.stdin else 0
        if size > MAX_TASK_BYTES:
            raise ValueError(
                f"command, env and stdin together are {size // 1024} KB; at most {MAX_TASK_BYTES // 1024} KB fit"
            )
        return self


#: Lambda's longest function timeout, seconds: a Lambda task's ``timeout_seconds`` cannot exceed it.
MAX_LAMBDA_TIMEOUT_SECONDS = 900

#: A function name (1-64 of A-Z a-z 0-9 _ -), a partial ARN ``123456789012:function:NAME`` or a full ARN
#: ``arn:aws:lambda:REGION:ACCOUNT:function:NAME``, each with an optional version or alias qualifier: the
#: forms Lambda's Invoke accepts (its own pattern, without the characters it would reject later).
FUNCTION_PATTERN = (
    r"^(arn:aws[a-zA-Z-]*:lambda:[a-z]{2}(-gov)?-[a-z]+-\d{1}:\d{12}:function:|\d{12}:function:)?"
    r"[A-Za-z0-9_-]{1,64}(:(\$LATEST|[A-Za-z0-9_-]{1,128}))?$"
)
_FUNCTION_RE = re.compile(FUNCTION_PATTERN)


def _function_ref(value: str) -> str:
    if not _FUNCTION_RE.match(value):
        raise ValueError(
            "give a function name (1-64 of A-Z a-z 0-9 _ -), ACCOUNT:function:NAME or a Lambda function ARN, "
            "optionally followed by :VERSION or :ALIAS"
        )
    return value


#: How a Lambda task names its function (checked with a readable message; the pattern is in the schema).
#: The length bound and the pattern are a submission's: a stored row keeps the name it was accepted with.
FunctionRef = Annotated[
    str,
    Field(min_length=1, json_schema_extra={"pattern": FUNCTION_PATTERN}),
    SubmitOnly(Field(max_length=170), _function_ref),
]


def function_name_of(function: str) -> str:
    """The bare function name of a name, partial ARN or ARN, without its qualifier (``hello`` for
    ``arn:aws:lambda:us-east-1:123456789012:function:hello:live``)."""
    rest = function.split(":function:", 1)[1] if ":function:" in function else function
    return rest.split(":", 1)[0]


class LambdaTask(StoredModel):
    """A Lambda function invoked asynchronously by the dispatcher with the run's envelope
    ``{"duetime": {run_id, job_id, attempt, fencing_token, due_at, timeout_seconds}, "payload": payload}``.

    Always on the ``lambda`` tier. The function's own retries must be off (``MaximumRetryAttempts=0``):
    Duetime's retry policy decides. Its outcome comes back through a Lambda destination.
    """

    # submit-only (a stored row skips them): the function name's length and format, the payload's size

    kind: Literal["lambda"] = "lambda"
    function: FunctionRef = Field(
        description="function name, partial ARN or ARN, optionally with a version or alias",
        examples=["hello", "arn:aws:lambda:eu-west-1:123456789012:function:report:live"],
    )
    payload: dict[str, JsonValue] = Field(
        default_factory=dict, description="a JSON object handed to the function as `payload`"
    )
    tier: Literal["lambda"] = Field(default="lambda", description="always `lambda`: the dispatcher's queue")

    @model_validator(mode="after")
    @submit_only
    def _fits_a_run_record(self) -> LambdaTask:
        try:
            size = len(json.dumps(self.payload, separators=(",", ":"), ensure_ascii=False).encode())
        except UnicodeEncodeError:
            raise ValueError("payload strings must be valid Unicode (no lone surrogates)") from None
        if size > MAX_TASK_BYTES:
            raise ValueError(
                f"payload is {size:,} bytes of JSON; at most {MAX_TASK_BYTES:,} ({MAX_TASK_BYTES // 1024} KB) fit"
            )
        return self

    @property
    def function_name(self) -> str:
        """The bare function name (no ARN prefix, no qualifier)."""
        return function_name_of(self.function)


#: the task kinds, as ``task.kind`` names them
TASK_KINDS = ("container", "lambda")


def _task_kind(value: Any) -> str | None:
    """The tag of a task: its ``kind``; a task without one is a container task (as before Lambda tasks)."""
    kind = value.get("kind", "container") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if isinstance(kind, str) else None


#: What a job runs: a command on a worker fleet, or a Lambda function (a union on ``kind``).
Task = Annotated[
    Annotated[ContainerTask, Tag("container")] | Annotated[LambdaTask, Tag("lambda")],
    Discriminator(
        _task_kind,
        custom_error_type="task_kind",
        custom_error_message="kind must be `container` or `lambda`",
    ),
]

#: Largest function result kept on a run (``result``), bytes of JSON; a larger one is only in the run's log.
MAX_RESULT_BYTES = 32 * 1024


class RetryPolicy(StoredModel):
    """Retries of failed attempts: exponential backoff with jitter (defaults from [S0]; see ``duetime.domain.retries``)."""

    # the upper bounds are submit-only (a stored policy keeps the values it was accepted with); the lower
    # bounds hold always (an attempt count is at least 1, a delay is not negative, a backoff never shrinks)

    max_attempts: Annotated[SInt, Field(ge=1), SubmitOnly(Field(le=100))] = Field(
        default=3, description="attempts in all, the first included"
    )
    backoff_seconds: Annotated[SFloat, Field(ge=0), SubmitOnly(Field(le=86400))] = Field(
        default=10.0, description="delay before attempt 2, s"
    )
    backoff_multiplier: Annotated[SFloat, Field(ge=1), SubmitOnly(Field(le=100))] = 4.0
    max_backoff_seconds: Annotated[SFloat, Field(ge=0), SubmitOnly(Field(le=7 * 86400))] = Field(
        default=900.0, description="cap on any delay, s"
    )
    jitter: Literal["equal", "full", "none"] = Field(
        default="equal",
        description="equal: uniform in [c/2, c) so gaps grow; full: uniform in [0, c); none: c "
        "(c = min(max_backoff_seconds, backoff_seconds * backoff_multiplier ** (attempt - 1)))",
    )


#: One week: the longest run timeout accepted.
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600


class OnTimeout(StoredModel):
    """What happens when an attempt outlives ``timeout_seconds`` ([S4] timeout handler).

    ``retry`` (default): the timed-out attempt counts as a failed attempt under the retry policy (as in
    Airflow and Temporal); ``fail``: the run ends TIMED_OUT with no retry (Kubernetes'
    ``activeDeadlineSeconds``); ``trigger``: the run ends TIMED_OUT and a run of job ``job_id`` starts now
    with ``DUETIME_TRIGGERED_BY`` = the timed-out run's id. The task's process group gets SIGTERM, then
    SIGKILL after ``kill_grace_seconds``.
    """

    # submit-only (a stored row skips them): the grace's upper bound, refusing a job_id for another action
    # (nothing reads it then); action `trigger` needs its job_id always: the timeout handler uses it

    action: Literal["retry", "fail", "trigger"] = "retry"
    job_id: JobId | None = Field(default=None, description="the job to trigger (action `trigger` only)")
    kill_grace_seconds: Annotated[SFloat, Field(ge=0), SubmitOnly(Field(le=300))] = Field(
        default=10.0, description="SIGTERM to SIGKILL, s"
    )

    @model_validator(mode="after")
    def _job_for_trigger(self) -> OnTimeout:
        if self.action == "trigger" and self.job_id is None:
            raise ValueError("action `trigger` needs the job_id of the job to trigger")
        return self

    @model_validator(mode="after")
    @submit_only
    def _job_only_for_trigger(self) -> OnTimeout:
        if self.action != "trigger" and self.job_id is not None:
            raise ValueError(f"job_id is only for action `trigger`, not `{self.action}`")
        return self


class CatchUpPolicy(StoredModel):
    """What to do with missed slots (DESIGN.md section 5, "catch-up, defined once").

    A slot is *missed* when its run would start more than ``tolerance_seconds`` after its due time, whatever
    made it late (the stack down, no worker free, a backlog) and whether it was claimed before or after.
    ``latest`` (default): of the job's missed slots only the newest runs; ``all``: the ``max_runs`` newest
    run (older ones are claimed with trigger ``backfill``); ``none``: none of them runs. The others end
    ``SKIPPED`` (reason ``missed``) or, if never claimed, are only counted (the job's ``missed_slots``).
    Slots held back by a pause follow the same policy at resume, whatever their lateness (reason
    ``paused``). Never a stall (Kubernetes' "too many missed start times"), never a storm unless ``all``
    was asked for.
    """

    # the upper bounds are submit-only (a stored policy keeps the values it was accepted with)

    policy: Literal["latest", "all", "none"] = "latest"
    max_runs: Annotated[SInt, Field(ge=1), SubmitOnly(Field(le=1000))] = Field(
        default=100, description="bound on backfilled runs for `all`"
    )
    tolerance_seconds: Annotated[SFloat, Field(ge=1), SubmitOnly(Field(le=7 * 86400))] = Field(
        default=60.0,
        description="a slot whose run would start more than this many seconds after its due time is missed",
    )


class OverlapPolicy(StoredModel):
    """What happens when a run is due while earlier runs of the same job are still active.

    ``allow`` (default): runs overlap freely, up to ``max_concurrency`` if set (further runs wait);
    ``skip``: the new run is recorded SKIPPED; ``buffer_one``: the new run waits for the active one, and any
    further run while one waits is SKIPPED; ``cancel_previous``: the active runs are CANCELLED (their workers
    are fenced off and kill their tasks) and the new one starts. ``max_concurrency`` (default 1 for every
    policy but ``allow``) is how many runs may be active at once. Sources: Kubernetes CronJob
    ``concurrencyPolicy``, Temporal ``ScheduleOverlapPolicy``.
    """

    # the upper bound of max_concurrency is submit-only (a stored policy keeps the value it was accepted with)

    policy: Literal["allow", "skip", "buffer_one", "cancel_previous"] = "allow"
    max_concurrency: Annotated[SInt, Field(ge=1), SubmitOnly(Field(le=1000))] | None = None

    @property
    def enforced(self) -> bool:
        """True when starting a run must look at the job's other active runs."""
        return self.policy != "allow" or self.max_concurrency is not None

    @property
    def limit(self) -> int:
        """How many runs of the job may be active at once (a large number when unbounded)."""
        if self.max_concurrency is not None:
            return self.max_concurrency
        return 1 if self.policy != "allow" else 1_000_000


# ---- notification rules (docs/design/notifications.md) -------------------------------------------------
class EventType(StrEnum):
    """What a rule can be ``on``."""

    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    TIMED_OUT = "timed_out"
    LATE = "late"
    MISSED = "missed"
    OVERRAN = "overran"
    RECOVERED = "recovered"


#: the failing streak's events: the first of each type in an incident alerts, the rest are recorded only
FAILURE_EVENTS = frozenset({EventType.FAILED, EventType.DEAD_LETTERED, EventType.TIMED_OUT})
#: an internal signal (never a rule's event): a run SUCCEEDED; it closes an open incident with ``recovered``
SUCCEEDED = "succeeded"

#: shortest webhook secret, bytes (HMAC-SHA256 keys shorter than this are guessable)
MIN_SECRET_BYTES = 16
#: what an answer shows in place of a secret; a write may send it back to keep the stored secret
SECRET_SET = "set"
#: how long a replaced webhook secret still signs deliveries (both signatures are sent), seconds
ROTATION_SECONDS = 24 * 3600
#: the shortest reminder period, seconds
MIN_REMIND_SECONDS = 60
#: most rules on a job or a tenant, and most addresses in an email rule
MAX_RULES = 10
MAX_EMAILS = 10


def _secret_ok(secret: str) -> str:
    if secret != SECRET_SET and len(secret.encode()) < MIN_SECRET_BYTES:
        raise ValueError(
            f"must be at least {MIN_SECRET_BYTES} bytes (or {SECRET_SET!r} to keep the stored one)"
        )
    return secret


def _email_ok(address: str) -> str:
    local, at, domain = address.partition("@")
    if not at or not local or "." not in domain or any(c.isspace() for c in address):
        raise ValueError(f"{address!r} is not an email address")
    return address


Email = Annotated[str, Field(min_length=3, max_length=254), AfterValidator(_email_ok)]


class WebhookTarget(StoredModel):
    """A webhook: deliveries are POSTed to ``url``, signed with ``secret`` (write-only).

    Stored with the secret it replaced (``previous_secret``) while a rotation lasts (until
    ``previous_valid_until``): deliveries then carry a ``v1=`` signature for each."""

    url: Annotated[str, Field(min_length=8, max_length=2048)]
    secret: Annotated[str, Field(max_length=256), AfterValidator(_secret_ok)]
    previous_secret: str | None = None
    previous_valid_until: Instant | None = None

    def secrets(self, now: datetime) -> list[str]:
        """The secrets that sign a delivery at ``now``: the current one, then the previous during rotation."""
        keys = [self.secret]
        if self.previous_secret and self.previous_valid_until and now < self.previous_valid_until:
            keys.append(self.previous_secret)
        return keys


class NotificationRule(StoredModel):
    """One rule: the events it is ``on`` and exactly one target (a webhook, an SNS topic or email addresses)."""

    on: Annotated[list[EventType], Field(min_length=1, max_length=len(EventType))]
    webhook: WebhookTarget | None = None
    sns_topic_arn: (
        Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$")] | None
    ) = None
    email: Annotated[list[Email], Field(min_length=1, max_length=MAX_EMAILS)] | None = None
    remind_every_seconds: Annotated[SInt, Field(ge=MIN_REMIND_SECONDS, le=30 * 86400)] | None = None

    @field_validator("on")
    @classmethod
    def _unique(cls, value: list[EventType]) -> list[EventType]:
        if len(set(value)) != len(value):
            raise ValueError("lists an event twice")
        return value

    @model_validator(mode="after")
    def _one_target(self) -> NotificationRule:
        given = [n for n in ("webhook", "sns_topic_arn", "email") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"needs exactly one of webhook, sns_topic_arn, email (got {given or 'none'})")
        return self

    @property
    def kind(self) -> Literal["webhook", "sns", "email"]:
        return "webhook" if self.webhook else "sns" if self.sns_topic_arn else "email"

    @property
    def target(self) -> str:
        """What the rule sends to, as shown in deliveries (never a secret)."""
        if self.webhook is not None:
            return self.webhook.url
        if self.sns_topic_arn is not None:
            return self.sns_topic_arn
        return ",".join(sorted(self.email or []))

    @property
    def key(self) -> str:
        """A stable id of the rule's target (its deliveries and reminders are keyed by it)."""
        return hashlib.sha256(f"{self.kind}:{self.target}".encode()).hexdigest()[:16]

    def shown(self) -> dict[str, Any]:
        """The rule as an answer shows it: secrets replaced by ``"set"``."""
        data = self.model_dump(mode="json", exclude_none=True)
        if self.webhook is not None:
            hook: dict[str, Any] = {"url": self.webhook.url, "secret": SECRET_SET}
            if self.webhook.previous_secret and self.webhook.previous_valid_until:
                hook["previous_secret"] = SECRET_SET
                hook["previous_valid_until"] = to_iso(self.webhook.previous_valid_until)
            data["webhook"] = hook
        return data


class Job(StoredModel):
    """A job as stored. ``next_fire_at`` is present only while the job has a future fire.

    Read a stored row with ``Job.from_stored(row)``, never ``model_validate``: a rollback or a newer writer
    must never make rows unreadable, so unknown fields (here, in the task, the schedule and the policies) are
    ignored and submit-only rules skipped (:class:`StoredModel`). ``model_validate`` stays strict.
    """

    job_id: JobId
    tenant: str
    name: str
    schedule: ScheduleSpec | None
    task: Task
    timeout_seconds: int
    retry: RetryPolicy
    on_timeout: OnTimeout = Field(default_factory=OnTimeout)
    catch_up: CatchUpPolicy = Field(default_factory=CatchUpPolicy)
    overlap: OverlapPolicy = Field(default_factory=OverlapPolicy)
    starting_deadline_seconds: int | None = None
    #: notifications: a run not started this long after its due time is ``late``
    late_after_seconds: int | None = None
    #: notifications: a run running longer than this is ``overran``
    expected_duration_seconds: int | None = None
    #: the job's own notification rules (webhook secrets included: never shown)
    notifications: list[NotificationRule] = Field(default_factory=list)
    #: the tenant's default rules apply too (``GET|PUT /tenants/me/notifications``)
    inherit_tenant_notifications: bool = True
    #: until then events are recorded, nothing is sent
    mute_until: Instant | None = None
    #: slots skipped by catch-up over the job's life
    missed_slots: int = 0
    #: PAUSED jobs: the first fire the pause held back (resume restarts from it; catch-up applies)
    paused_next_fire_at: Instant | None = None
    #: PAUSED jobs: when the pause began (the resume decides every slot due since, claimed or not)
    paused_at: Instant | None = None
    #: the job's last :data:`PAUSES_KEPT` pauses, oldest first: a slot due in one that no run was claimed for
    #: is listed ``skipped`` (``paused``) among the job's slots, not ``missed``
    pauses: list[PauseSpan] = Field(default_factory=list)
    #: when the schedule was last changed by a PATCH: runs claimed for later instants must be its slots
    schedule_changed_at: Instant | None = None
    state: JobState
    shard: int
    next_fire_at: Instant | None
    #: anchor of ``rate`` schedules (start_at or creation time), UTC.
    anchor: Instant
    created_at: Instant
    updated_at: Instant
    version: int = 1


class JobSummary(StoredModel):
    """What a listing shows of a job (``StorePort.list_job_summaries``): the fields a tick's claim never
    changes, so a store's listing index holds them without a write per claim (on DynamoDB, the ``by_tenant``
    index's projection). No ``next_fire_at``: read the job itself for it, or preview ``schedule``."""

    job_id: JobId
    tenant: str
    name: str
    state: JobState
    schedule: ScheduleSpec | None = None
    #: anchor of ``rate`` schedules (start_at or creation time), UTC.
    anchor: Instant
    created_at: Instant

    @classmethod
    def of(cls, job: Job) -> JobSummary:
        """The summary of ``job``."""
        return cls(
            job_id=job.job_id,
            tenant=job.tenant,
            name=job.name,
            state=job.state,
            schedule=job.schedule,
            anchor=job.anchor,
            created_at=job.created_at,
        )


class AttemptRecord(StoredModel):
    """What happened to one attempt of a run (the run's history)."""

    attempt: int
    fencing_token: int
    worker: str | None = None
    started_at: Instant | None = None
    finished_at: Instant | None = None
    state: RunState
    exit_code: int | None = None
    reason: str | None = None
    log_key: str | None = None
    #: bytes of the attempt's final log; 0: it printed nothing and no log object was stored (none is read)
    log_bytes: int | None = None
    #: a log pack holding the attempt's final log (several attempts' final logs in one object, written
    #: together by one worker): bytes ``log_offset .. log_offset + log_bytes - 1`` of it; read by range only.
    #: ``log_key`` stays the attempt's own key (its live chunks; a reader that knows no packs finds no log
    #: there, never the whole pack)
    log_pack: str | None = None
    log_offset: int | None = None


class RunEvent(StoredModel):
    """A notable event on a run that changed nothing, e.g. a stale finish that was rejected."""

    at: Instant
    kind: str
    detail: dict[str, str | int | None] = Field(default_factory=dict)


class Run(StoredModel):
    """One due time of one job, with its current attempt's lease.

    Read a stored row with ``Run.from_stored(row)``, never ``model_validate``: a rollback or a newer writer
    must never make rows unreadable, so unknown fields (here, in the task, the policies, the attempts and the
    events) are ignored and submit-only rules skipped (:class:`StoredModel`). ``model_validate`` stays strict.
    """

    job_id: JobId
    due_at: Instant
    tenant: str
    shard: int
    state: RunState
    attempt: int = 1
    max_attempts: int = 1
    fencing_token: int = 0
    trigger: Trigger = Trigger.SCHEDULE
    task: Task
    timeout_seconds: int
    retry: RetryPolicy
    on_timeout: OnTimeout = Field(default_factory=OnTimeout)
    overlap: OverlapPolicy = Field(default_factory=OverlapPolicy)
    #: RUNNING: when the current attempt's ``timeout_seconds`` run out (set at start).
    deadline_at: Instant | None = None
    #: the run whose timeout handler created this run (``DUETIME_TRIGGERED_BY``).
    triggered_by: str | None = None
    #: the timeout handler's action and what it did, once an attempt timed out
    timeout_action: str | None = None
    timeout_outcome: str | None = None
    #: name of the timeout-handler state machine execution, when the sweeper had to start one
    timeout_execution: str | None = None
    #: attempt 1 must start by this instant (due + starting_deadline_seconds) or the run is SKIPPED.
    start_deadline_at: Instant | None = None
    #: notifications: not started by this instant (due + the job's ``late_after_seconds``), the run is
    #: ``late`` (it is watched no later than then)
    late_at: Instant | None = None
    #: notifications: an attempt running longer than this is ``overran`` (the job's, when claimed)
    expected_duration_seconds: int | None = None
    lease_owner: str | None = None
    lease_expires_at: Instant | None = None
    #: RUNNING on a container worker: the worker session whose renewals keep the lease (:class:`Session`);
    #: None for a run whose own ``lease_expires_at`` is its whole lease (a Lambda task's)
    session_id: str | None = None
    started_at: Instant | None = None
    finished_at: Instant | None = None
    exit_code: int | None = None
    error: str | None = None
    log_key: str | None = None
    #: Lambda tasks: the function's response of the current attempt (at most MAX_RESULT_BYTES of JSON)
    result: JsonValue = None
    #: the response was larger than MAX_RESULT_BYTES: ``result`` is empty, the run's log holds it
    result_truncated: bool = False
    #: non-terminal runs: when the sweeper must look at it (watchdog GSI); None once terminal.
    watch_at: Instant | None = None
    #: RETRY_WAIT runs: when the next attempt may start (its wake-up message is delayed until then).
    retry_at: Instant | None = None
    #: for catch-up: how many earlier slots were skipped when this one was claimed.
    missed_slots: int = 0
    #: a PENDING run held back at its start because its job was paused (``"paused"``); resume decides
    held: str | None = None
    #: the attempt from which the current retry budget counts (a re-drive starts a fresh one), for backoff
    budget_from_attempt: int = 1
    #: the ``created_at`` of the job the run was claimed for: a job of the same id created later (deleted
    #: and submitted again, or a submit that failed half way) does not own it; its start skips it (deleted)
    job_created_at: Instant | None = None
    dead_lettered: bool = False
    dead_lettered_at: Instant | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    events: list[RunEvent] = Field(default_factory=list)
    created_at: Instant

    @property
    def run_id(self) -> str:
        return run_id_for(self.job_id, self.due_at)


def run_id_for(job_id: str, due_at: datetime) -> str:
    """The run id of ``(job_id, due_at)``: ``<job_id>.<due epoch ms>`` (stable: the idempotency key)."""
    return f"{job_id}.{to_epoch_ms(due_at)}"


def parse_run_id(run_id: str) -> tuple[str, datetime]:
    """Split a run id into ``(job_id, due_at)`` (UTC).

    Only the canonical form names a run: the one :func:`run_id_for` writes (ASCII digits, no leading
    zero), so ``job.01796351490774`` or ``job.１７９６３５１４９０７７４`` (``int()`` reads both) is no run id.

    Raises:
        ValueError: if ``run_id`` is not ``<job_id>.<epoch ms>`` exactly as :func:`run_id_for` writes it.
    """
    job_id, sep, ms = run_id.rpartition(".")
    if not sep or not ms.isascii() or not ms.isdigit() or len(ms) > 15 or not _JOB_ID_RE.match(job_id):
        raise ValueError(f"malformed run id {run_id!r}")
    try:
        due_at = from_epoch_ms(int(ms))
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"malformed run id {run_id!r}: due time out of range") from None
    if run_id_for(job_id, due_at) != run_id:
        raise ValueError(f"malformed run id {run_id!r}: not in its canonical form")
    return job_id, due_at


#: how long a worker session's row outlives its end, seconds (a worker resumed within it finds it revoked;
#: one resumed later is still fenced from its runs by their tokens)
SESSION_RETAIN_SECONDS = 86_400


@dataclass(frozen=True)
class Session:
    """A worker session (DESIGN.md section 5): the lease on every run its worker process holds past the
    run's own lease.

    A run started by a container worker records the worker's session id (``Run.session_id``). While it
    holds a run its own lease no longer covers for long, the worker renews the session every
    ``heartbeat_seconds`` with the ids of every run it holds (``runs``): one write per worker per interval,
    whatever it runs. A RUNNING run is held while :func:`~duetime.domain.lifecycle.lease_held` says so;
    the sweeper revokes an expired (or never written) session before it expires any of its runs, and a
    revoked session is never renewed again.

    Attributes:
        session_id: a random id (``uuid4().hex``), new at each worker start and after a refused renewal.
        owner: the worker's id (the runs' ``lease_owner``; empty for a session revoked before it was written).
        expires_at: UTC; the last renewal's time + ``lease_seconds``.
        runs: the run ids (``<job_id>.<due epoch ms>``) the worker held at its last renewal.
        revoked_at: UTC, set once by the sweeper that found the session expired; never cleared.
    """

    session_id: str
    owner: str
    expires_at: datetime
    runs: tuple[str, ...] = ()
    revoked_at: datetime | None = None

    def alive(self, now: datetime) -> bool:
        """Whether it holds the runs it lists at ``now`` (UTC): not revoked and not expired."""
        return self.revoked_at is None and self.expires_at > now


class RunMessage(BaseModel):
    """SQS message body: a wake-up for one attempt of one run. The run row stays the source of truth."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: JobId
    due_at: Instant
    attempt: int = Field(ge=1)
    #: the run's job has an overlap policy: starting it must look at the job's other active runs
    overlap: bool = False
    #: the attempt's time limit and kill grace, seconds, so the start can record its deadline
    timeout_seconds: int | None = None
    kill_grace_seconds: float = 10.0
    #: the run's tenant: the message's SQS MessageGroupId, so SQS fair queues serve tenants fairly
    tenant: str | None = None
    #: the queue it travels on (so a start held back by a tenant quota can put it back)
    tier: str | None = None
    #: why the run exists (a schedule slot is re-checked against its job at start; a manual run is not)
    trigger: Trigger | None = None
    #: the ``created_at`` of the job the run was claimed for (:attr:`Run.job_created_at`)
    job_created_at: Instant | None = None
    #: a retry's ``retry_at``: its attempt may not start before it (None: the run's due time governs)
    retry_at: Instant | None = None
    #: notifications: the start watches the run no later than this many seconds after it (``overran``)
    expected_duration_seconds: int | None = None

    @property
    def run_id(self) -> str:
        return run_id_for(self.job_id, self.due_at)

    def body(self) -> str:
        """The queue message's body: this message as JSON, without its unset (None) fields, so a consumer of
        an earlier version, which forbids fields it does not know, still reads a message that does not use
        a field added since (during a rolling deploy or a rollback)."""
        return self.model_dump_json(exclude_none=True)

    @property
    def ready_at(self) -> datetime:
        """When the attempt may start (UTC): the retry's ``retry_at``, else the run's due time.

        A queue delay is whole seconds rounded down (:func:`~duetime.domain.lifecycle.delay_seconds`), so a
        delivery comes up to about a second before this; the worker holds it until then."""
        return self.retry_at or self.due_at
