"""The API's errors: one JSON shape, ``{"error": {"code", "message", "field"}}``, and one exception handler
per domain error (:func:`register_error_handlers` puts them on the app).

Bad input is a 400 naming the field, an unknown id a 404, a conflict with the resource's state a 409, a
quota a 409 or 429, AWS throttling a 503 with Retry-After; never a 500 for anything the caller sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler import ApiGatewayResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError

from duetime.adapters.aws.errors import SdkError, translate
from duetime.domain.api_models import ErrorResponse
from duetime.domain.errors import (
    ConflictError,
    JobExistsError,
    NotFoundError,
    QuotaExceededError,
    RequestFieldError,
    RequestInProgressError,
    ScheduleError,
    ThrottledError,
)
from duetime.domain.models import TASK_KINDS


def error_body(code: str, message: str, field: str | None = None) -> str:
    """The error shape, as JSON text."""
    body = ErrorResponse.model_validate({"error": {"code": code, "message": message, "field": field}})
    return body.model_dump_json()


def error_response(status: int, code: str, message: str, field: str | None = None) -> Response[str]:
    """An error answer of a route or an exception handler."""
    return Response(
        status_code=status, content_type=content_types.APPLICATION_JSON, body=error_body(code, message, field)
    )


def error_result(status: int, code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """An error answer as the Lambda result API Gateway expects (for requests refused before routing)."""
    return {
        "statusCode": status,
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": error_body(code, message, field),
        "isBase64Encoded": False,
    }


def field_of(loc: tuple[Any, ...]) -> str:
    """The dotted request field of a pydantic error location (``("body", "task", "command", 0)`` ->
    ``task.command.0``), without pydantic's union-member and validator names."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    if len(parts) >= 2 and parts[-1] == "[key]":
        # a mapping's key that failed (an env variable's name): the field is the mapping, as pydantic
        # locates it at the key then "[key]" (`task.env.A=B.[key]`)
        parts = parts[:-2]
    # pydantic adds the union member / validator name for tagged types (a task's kind: `task.lambda.x`);
    # keep field names and indexes
    kept = [
        p
        for i, p in enumerate(parts)
        if not p.startswith("function-") and not (i and parts[i - 1] == "task" and p in TASK_KINDS)
    ]
    return ".".join(kept) or "body"


def validation_error(exc: RequestValidationError) -> Response[str]:
    """400 naming the first invalid field (Powertools' own answer would be a 422 without the message)."""
    found = exc.errors()
    first: dict[str, Any] = dict(found[0]) if found else {"loc": (), "msg": "invalid request"}
    field = field_of(tuple(first.get("loc", ())))
    kind = first.get("type", "")
    if kind == "json_invalid":
        why = (first.get("ctx") or {}).get("error")
        message = "the request body is not valid JSON" + (f": {why}" if why else "")
        return error_response(400, "invalid_json", message, "body")
    message = f"{field}: {first.get('msg', 'invalid value')}"
    loc = tuple(first.get("loc", ()))
    if len(loc) >= 2 and loc[-1] == "[key]":  # a mapping's key: say which one
        message = f"{field}: the name {str(loc[-2])[:64]!r}: {first.get('msg', 'invalid value')}"
    if kind == "extra_forbidden":
        message = f"{field}: unknown field"
    return error_response(400, "validation_error", message, field)


def schedule_error(exc: ScheduleError) -> Response[str]:
    return error_response(400, "invalid_schedule", exc.message, exc.field)


def field_error(exc: RequestFieldError) -> Response[str]:
    return error_response(400, "invalid_field", exc.message, exc.field)


def not_found(exc: NotFoundError) -> Response[str]:
    return error_response(404, "not_found", str(exc))


def conflict(exc: ConflictError) -> Response[str]:
    return error_response(409, "conflict", str(exc))


def request_in_progress(exc: RequestInProgressError) -> Response[str]:
    """409 ``request_in_progress`` + Retry-After: the same Idempotency-Key's first request is still running."""
    response = error_response(409, "request_in_progress", str(exc))
    response.headers["Retry-After"] = str(exc.retry_after)
    return response


def job_exists(exc: JobExistsError) -> Response[str]:
    return error_response(409, "job_exists", str(exc), "job_id")


def quota_exceeded(exc: QuotaExceededError) -> Response[str]:
    """409 when the tenant must first free something; 429 + Retry-After when waiting helps."""
    if exc.retry_after is None:
        return error_response(409, "quota_exceeded", str(exc))
    response = error_response(429, "too_many_requests", str(exc))
    response.headers["Retry-After"] = str(exc.retry_after)
    return response


def throttled(exc: ThrottledError) -> Response[str]:
    response = error_response(503, "throttled", f"{exc}; try again shortly")
    response.headers["Retry-After"] = "1"
    return response


def aws_error(exc: SdkError) -> Response[str]:
    """A throttled AWS call is a 503 with Retry-After (the AWS adapters' :func:`translate`); any other AWS
    error stays a server error (re-raised)."""
    translated = translate(exc)
    if isinstance(translated, ThrottledError):
        return throttled(translated)
    raise exc


#: each error the routes may raise -> its answer
HANDLERS: dict[type[Exception], Callable[[Any], Response[str]]] = {
    RequestValidationError: validation_error,
    ScheduleError: schedule_error,
    RequestFieldError: field_error,
    NotFoundError: not_found,
    ConflictError: conflict,
    RequestInProgressError: request_in_progress,
    JobExistsError: job_exists,
    QuotaExceededError: quota_exceeded,
    ThrottledError: throttled,
    SdkError: aws_error,
}


def register_error_handlers(app: ApiGatewayResolver) -> None:
    """Register :data:`HANDLERS` on ``app``, and for :class:`RequestValidationError` one that also knows the
    request: a body that is JSON ``null`` reaches validation as no body at all (Powertools reads it as None),
    which would be "body: Field required"; it is named for what it is, as a list or a number would be."""
    for exc_class, handler in HANDLERS.items():
        app.exception_handler(exc_class)(handler)

    def validation_of_request(exc: RequestValidationError) -> Response[str]:
        body = app.current_event.body
        missing = any(
            e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",) for e in exc.errors()
        )
        if missing and body is not None and body.strip() == "null":
            message = "body: Input should be a valid dictionary or object (the body is JSON null)"
            return error_response(400, "validation_error", message, "body")
        return validation_error(exc)

    app.exception_handler(RequestValidationError)(validation_of_request)
