"""Lambda tasks: the dispatcher's claim-and-invoke and the finish handler's outcome (DESIGN.md section 7).

Dispatch (the ``lambda`` tier's SQS consumer, one record at a time):
1. **Claim**: ``runs.start`` (PENDING -> RUNNING, fencing token + 1) with a lease sized to the function's
   timeout (the run's ``timeout_seconds`` plus :data:`LAMBDA_LEASE_MARGIN_SECONDS`): no worker session
   holds a Lambda run, only its own lease. A rejected start (a duplicate or stale delivery, or the overlap
   policy) drops the record; it is never a batch failure. So one attempt is invoked at most once, whatever
   SQS redelivers.
2. **Invoke** the function asynchronously (``InvocationType="Event"``) with the run's envelope::

       {"duetime": {"run_id", "job_id", "attempt", "fencing_token", "due_at", "timeout_seconds"},
        "payload": {...the task's payload...}}

   The function's own retries must be off (its event invoke config's ``MaximumRetryAttempts=0``): Duetime's
   retry policy decides. If Lambda refuses the invocation (no such function, access denied, throttled past
   the SDK's retries) the attempt is FAILED at once with Lambda's error, and the retry policy applies.

Finish (the target's Lambda destination, on success and on failure): the destination record carries the
envelope back (``requestPayload``) with the function's response or error object (``responsePayload``). The
attempt ends under the envelope's fencing token: SUCCEEDED with the response kept as ``result`` (at most
:data:`~duetime.domain.models.MAX_RESULT_BYTES`), FAILED with Lambda's error (the retry policy applies), or
TIMED_OUT when Lambda reports ``Task timed out after N seconds`` (``on_timeout`` applies). The outcome is
written to the attempt's S3 log. A stale envelope (an old token) is rejected and recorded, never applied.

A run whose outcome never arrives (the dispatcher died after the claim, a destination record was lost) is
RUNNING past its deadline: the sweeper hands it to the timeout handler like a stuck worker's.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
from pydantic import BaseModel, ConfigDict, Field, Json, JsonValue, ValidationError

from duetime.config.observability import logger
from duetime.domain.errors import InvokeError, LeaseLostError, StartRejectedError
from duetime.domain.lifecycle import MAX_HOLD_SECONDS, hold_seconds
from duetime.domain.logs import log_key
from duetime.domain.models import (
    MAX_LAMBDA_TIMEOUT_SECONDS,
    MAX_RESULT_BYTES,
    Instant,
    LambdaTask,
    Run,
    RunMessage,
    RunState,
    function_name_of,
    json_text,
    parse_run_id,
)
from duetime.domain.ports import LambdaInvoker
from duetime.services.deps import Deps
from duetime.services.runs import finish, start


class NotReadyError(Exception):
    """A delivery came far earlier than its attempt may start: it goes back to the queue."""


#: A Lambda run's lease: its timeout plus this margin (the destination record arrives after the function).
LAMBDA_LEASE_MARGIN_SECONDS = 60.0
#: Longest error message kept on a run; the whole error, with its stack trace, is in the run's log.
MAX_ERROR_CHARS = 2000
#: Most bytes of a response copied into the run's log.
MAX_LOGGED_RESPONSE_BYTES = 256 * 1024

#: Lambda's message for a function that outlived its timeout (errorMessage of the destination record).
_TIMED_OUT = re.compile(r"Task timed out after ([0-9.]+) seconds")


# ---- the envelope -------------------------------------------------------------------------------------
class EnvelopeIds(BaseModel):
    """The run's identity as the function sees it. ``run_id`` is the idempotency key."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    run_id: str
    job_id: str
    attempt: int = Field(ge=1)
    fencing_token: int = Field(ge=0)
    due_at: Instant
    #: the run's timeout, s (locally also the function's; in AWS the function's own setting rules)
    timeout_seconds: int | None = None


class RunEnvelope(BaseModel):
    """What the dispatcher sends a Lambda task's function, and what comes back in ``requestPayload``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    duetime: EnvelopeIds
    payload: dict[str, JsonValue] = Field(default_factory=dict)


def envelope_for(run: Run, task: LambdaTask) -> RunEnvelope:
    """The envelope of ``run``'s current attempt (its fencing token is the one its start took)."""
    return RunEnvelope(
        duetime=EnvelopeIds(
            run_id=run.run_id,
            job_id=run.job_id,
            attempt=run.attempt,
            fencing_token=run.fencing_token,
            due_at=run.due_at,
            timeout_seconds=run.timeout_seconds,
        ),
        payload=task.payload,
    )


# ---- dispatch ------------------------------------------------------------------------------------------
class RunMessageRecord(SqsRecordModel):
    """An SQS record of the ``lambda`` queue whose body is a :class:`RunMessage` (Powertools parser model).

    A body that is not one fails the record alone; SQS moves it to the DLQ after ``maxReceiveCount``."""

    body: Json[RunMessage]


class DispatchOutcome(StrEnum):
    INVOKED = "invoked"
    #: a duplicate, stale or early delivery, or one the overlap policy kept from starting
    DROPPED = "dropped"
    #: claimed, but Lambda refused the invocation: the attempt FAILED (retry policy applies)
    FAILED = "failed"


def dispatch(message: RunMessage, deps: Deps, invoker: LambdaInvoker, *, owner: str) -> DispatchOutcome:
    """Claim the run ``message`` wakes up and invoke its function once, asynchronously.

    A delivery that came early (its delay was rounded down to whole seconds) is held until its attempt may
    start (:func:`~duetime.domain.lifecycle.hold_seconds`).

    Raises:
        the store's fault before the claim (the record fails; SQS redelivers it); NotReadyError for a
        delivery more than MAX_HOLD_SECONDS early (the record fails and comes back later).
    """
    wait = hold_seconds(message, deps.clock.now())
    if wait > MAX_HOLD_SECONDS:
        raise NotReadyError(f"run {message.run_id} attempt {message.attempt} may not start for {wait:.1f} s")
    if wait > 0:
        time.sleep(wait)
    timeout = message.timeout_seconds or MAX_LAMBDA_TIMEOUT_SECONDS
    try:
        run = start(message, deps, owner=owner, lease_seconds=timeout + LAMBDA_LEASE_MARGIN_SECONDS)
    except StartRejectedError as exc:
        logger.info("delivery dropped", extra={"run_id": message.run_id, "reason": str(exc)})
        return DispatchOutcome.DROPPED
    task = run.task
    if not isinstance(task, LambdaTask):
        _fail_attempt(run, deps, f"a {task.kind} task reached the lambda queue", reason="wrong_tier")
        return DispatchOutcome.FAILED
    envelope = envelope_for(run, task)
    try:
        request_id = invoker.invoke_event(task.function, envelope.model_dump_json().encode())
    except InvokeError as exc:
        message_text = f"cannot invoke function {task.function}: {exc}"
        logger.warning(
            "invoke failed", extra={"run_id": run.run_id, "function": task.function, "code": exc.code}
        )
        _fail_attempt(run, deps, message_text, reason="invoke_failed")
        return DispatchOutcome.FAILED
    logger.info(
        "function invoked",
        extra={
            "run_id": run.run_id,
            "attempt": run.attempt,
            "function": task.function,
            "request_id": request_id,
        },
    )
    return DispatchOutcome.INVOKED


def _fail_attempt(run: Run, deps: Deps, error: str, *, reason: str) -> None:
    """End a claimed attempt that never reached its function: FAILED, with the reason in its log."""
    key = log_key(run.job_id, run.run_id, run.attempt)
    written: str | None = key
    try:
        deps.logs.put(key, f"duetime: {error}\n".encode())
    except Exception:  # noqa: BLE001 - a log upload failure must not lose the outcome
        logger.exception("log upload failed", extra={"run_id": run.run_id})
        written = None
    try:
        finish(
            run,
            deps,
            fencing_token=run.fencing_token,
            outcome=RunState.FAILED,
            error=error[:MAX_ERROR_CHARS],
            log_key=written,
            reason=reason,
        )
    except LeaseLostError:
        pass  # fenced meanwhile (cancelled): nothing to apply


# ---- finish --------------------------------------------------------------------------------------------
class DestinationRequestContext(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    requestId: str = ""
    functionArn: str = ""
    #: ``Success``, ``RetriesExhausted`` or ``EventAgeExceeded``
    condition: str
    approximateInvokeCount: int = 1


class DestinationResponseContext(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    statusCode: int | None = None
    executedVersion: str | None = None
    functionError: str | None = None


class DestinationRecord(BaseModel):
    """The record Lambda sends an asynchronous invocation's destination (AWS's shape)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: str = "1.0"
    timestamp: str | None = None
    requestContext: DestinationRequestContext
    requestPayload: Any = None
    responseContext: DestinationResponseContext = Field(default_factory=DestinationResponseContext)
    responsePayload: Any = None


class FinishStatus(StrEnum):
    APPLIED = "applied"
    #: the envelope's fencing token is no longer the run's: rejected and recorded on the run
    STALE = "stale"
    #: not a Duetime envelope, or its run is gone
    IGNORED = "ignored"


@dataclass(frozen=True)
class FinishResult:
    status: FinishStatus
    run_id: str | None = None
    state: RunState | None = None


@dataclass(frozen=True)
class Outcome:
    """How one invocation ended, read off its destination record."""

    state: RunState
    reason: str | None
    error: str | None
    result: Any = None
    has_result: bool = False


def result_of(response: Any, run_id: str) -> Any:
    """The function's result: unwrapped from :func:`duetime.lambda_target.run_task`'s shape
    ``{"duetime": {"run_id": ...}, "result": ...}`` when it names this run, else the whole response."""
    if (
        isinstance(response, dict)
        and set(response) == {"duetime", "result"}
        and isinstance(response["duetime"], dict)
        and response["duetime"].get("run_id") == run_id
    ):
        return response["result"]
    return response


def outcome_of(record: DestinationRecord, envelope: RunEnvelope) -> Outcome:
    """SUCCEEDED with the response, TIMED_OUT for Lambda's timeout, else FAILED with Lambda's error."""
    condition = record.requestContext.condition
    response = record.responsePayload
    if condition == "Success" and not record.responseContext.functionError:
        return Outcome(RunState.SUCCEEDED, None, None, result_of(response, envelope.duetime.run_id), True)
    if condition == "EventAgeExceeded":
        return Outcome(
            RunState.FAILED,
            "event_age_exceeded",
            "the invocation waited in Lambda's queue past its maximum event age and was dropped",
        )
    error = response if isinstance(response, dict) else {"errorMessage": str(response)}
    message = str(error.get("errorMessage") or "")
    kind = str(error.get("errorType") or "")
    timed_out = _TIMED_OUT.search(message)
    if kind == "Sandbox.Timedout" or (timed_out and kind in ("", "Sandbox.Timedout")):
        after = timed_out.group(1) if timed_out else str(envelope.duetime.timeout_seconds)
        return Outcome(RunState.TIMED_OUT, "timeout", f"timed out after {after} s (Lambda: {message})")
    text = f"{kind}: {message}" if kind else message or f"the function failed ({condition})"
    return Outcome(RunState.FAILED, "function_error", text[:MAX_ERROR_CHARS])


def _valid_unicode(value: Any) -> Any:
    """``value`` with any lone surrogate in its strings replaced by ``?`` (they cannot be shown as UTF-8)."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode()
        return value
    except UnicodeEncodeError:
        return json.loads(text.encode("utf-8", errors="replace"))


def finish_from_record(record: DestinationRecord, deps: Deps) -> FinishResult:
    """Apply one destination record to its run under the envelope's fencing token, and log it.

    Never raises for a record it cannot use (logged and ignored: Lambda would only retry it).

    Raises:
        the store's fault (Lambda retries the destination invocation).
    """
    try:
        envelope = RunEnvelope.model_validate(record.requestPayload)
        job_id, due_at = parse_run_id(envelope.duetime.run_id)
    except (ValidationError, ValueError):
        logger.error("not a Duetime envelope", extra={"request_id": record.requestContext.requestId})
        return FinishResult(FinishStatus.IGNORED)
    ids = envelope.duetime
    run = deps.store.get_run(job_id, due_at)
    if run is None or job_id != ids.job_id:
        logger.error("finish for an unknown run", extra={"run_id": ids.run_id})
        return FinishResult(FinishStatus.IGNORED, ids.run_id)
    outcome = outcome_of(record, envelope)
    result_json: str | None = None
    truncated = False
    if outcome.has_result:
        text = json_text(_valid_unicode(outcome.result))
        if len(text.encode()) <= MAX_RESULT_BYTES:
            result_json = text
        else:
            truncated = True
    key = _write_log(record, envelope, outcome, deps)
    try:
        ended = finish(
            run,
            deps,
            fencing_token=ids.fencing_token,
            outcome=outcome.state,
            error=outcome.error,
            log_key=key,
            reason=outcome.reason,
            result_json=result_json,
            result_truncated=truncated,
        )
    except LeaseLostError:
        return FinishResult(FinishStatus.STALE, ids.run_id)  # recorded on the run by runs.finish
    logger.info(
        "lambda run finished",
        extra={"run_id": ids.run_id, "attempt": ids.attempt, "state": ended.state.value},
    )
    return FinishResult(FinishStatus.APPLIED, ids.run_id, ended.state)


def _write_log(record: DestinationRecord, envelope: RunEnvelope, outcome: Outcome, deps: Deps) -> str | None:
    """Append the invocation's outcome to the attempt's log and return its key (None if S3 failed).

    The object may already hold the function's output: the local stack's Lambda runtime puts it there, as
    CloudWatch Logs holds it in AWS (then the log points there). A repeated record is not appended twice.
    """
    ids = envelope.duetime
    key = log_key(ids.job_id, ids.run_id, ids.attempt)
    context = record.requestContext
    function = function_name_of(context.functionArn) if context.functionArn else "?"
    header = f"--- duetime: function {function}, request {context.requestId or '?'}: {context.condition}"
    if record.responseContext.functionError:
        header += f" ({record.responseContext.functionError})"
    header += f" -> {outcome.state.value} ---"
    try:
        existing = deps.logs.get_final(key) or b""
    except Exception:  # noqa: BLE001 - no log yet (or not readable): start one
        existing = b""
    if header.encode() in existing:
        return key
    lines = [header]
    if not existing:
        lines.append(
            f"function output: CloudWatch Logs group /aws/lambda/{function}, request {context.requestId}"
        )
    response = record.responsePayload
    if outcome.state is RunState.SUCCEEDED:
        text = json.dumps(outcome.result, indent=2, ensure_ascii=False, default=str)
        if len(text) > MAX_LOGGED_RESPONSE_BYTES:
            text = text[:MAX_LOGGED_RESPONSE_BYTES] + f"\n[... {len(text)} characters in all ...]"
        lines += ["result:", text]
    else:
        if outcome.error:
            lines.append(outcome.error)
        trace = response.get("stackTrace") if isinstance(response, dict) else None
        if isinstance(trace, list) and trace:
            lines.append("Traceback (most recent call last):")
            lines += [str(frame).rstrip("\n") for frame in trace]
    body = existing + (b"\n" if existing and not existing.endswith(b"\n") else b"")
    body += ("\n".join(lines) + "\n").encode("utf-8", errors="replace")
    try:
        deps.logs.put(key, body)
    except Exception:  # noqa: BLE001 - a log upload failure must not lose the outcome
        logger.exception("log upload failed", extra={"run_id": ids.run_id})
        return None
    return key


__all__ = [
    "LAMBDA_LEASE_MARGIN_SECONDS",
    "DestinationRecord",
    "DispatchOutcome",
    "FinishResult",
    "FinishStatus",
    "LambdaInvoker",
    "RunEnvelope",
    "RunMessageRecord",
    "dispatch",
    "envelope_for",
    "finish_from_record",
    "outcome_of",
    "result_of",
]
