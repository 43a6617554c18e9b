"""HTTP API (API Gateway HTTP API, payload v2) -> Powertools resolver with validation and OpenAPI.

Thin: parse, call one service in ``duetime.jobs``, map the result. Errors are JSON
``{"error": {"code", "message", "field"}}``; bad input is a 4xx naming the field, never a 500.
"""

from __future__ import annotations

import base64
import json
import math
from datetime import datetime
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Header, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError
from botocore.retries.standard import ThrottledRetryableChecker
from pydantic import BaseModel

from duetime import __version__, idempotency, jobs
from duetime.api_models import (
    CreateJobRequest,
    ErrorResponse,
    JobListResponse,
    JobResponse,
    RunListResponse,
    RunResponse,
    SchedulePreviewResponse,
    UpdateJobRequest,
)
from duetime.deps import default_deps
from duetime.errors import (
    ConflictError,
    NotFoundError,
    QuotaExceededError,
    RequestFieldError,
    ScheduleError,
    ThrottledError,
)
from duetime.models import TASK_KINDS, Job, JobState, RunState, in_supported_range
from duetime.observability import logger
from duetime.store import JobExistsError


class DuetimeResolver(APIGatewayHttpResolver):
    """Powertools' HTTP API resolver, with an OpenAPI document that lists only the statuses the API answers.

    Powertools adds a 422 ``HTTPValidationError`` response to every operation (its request validation's
    default status, aws-powertools/powertools-lambda-python#3995); Duetime's handler turns every validation
    error into a 400 ``ErrorResponse`` naming the field, so the 422 entries and their schemas are removed.
    """

    def get_openapi_schema(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 (see the class)
        schema = super().get_openapi_schema(*args, **kwargs)
        for item in (schema.paths or {}).values():
            for method in ("get", "put", "post", "delete", "options", "head", "patch", "trace"):
                operation = getattr(item, method, None)
                if operation is not None and operation.responses:
                    operation.responses.pop(422, None)
                    operation.responses.pop("422", None)
        if schema.components is not None and schema.components.schemas:
            for name in ("HTTPValidationError", "ValidationError", "ResponseValidationError"):
                schema.components.schemas.pop(name, None)
        return schema


class _NotJsonNumber(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJsonNumber(f"{name} is not a JSON number (RFC 8259 section 6)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJsonNumber(f"{text[:40]} is too large for a 64-bit float")
    return value


def read_json_body(text: str) -> Any:
    """The resolver's JSON parser: strict JSON (RFC 8259), every unreadable body a ``JSONDecodeError``, so
    a 400 naming the body says why. Python's ``json.loads`` would take ``NaN``/``Infinity`` and turn
    ``1e400`` into infinity (both then stored as null), and raises a plain ValueError for an integer of more
    than 4,300 digits (``sys.int_max_str_digits``)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError:
        raise
    except _NotJsonNumber as exc:
        raise json.JSONDecodeError(str(exc), text[:100], 0) from None
    except ValueError as exc:
        raise json.JSONDecodeError(f"a number has more than 4,300 digits ({exc})", text[:100], 0) from None


app = DuetimeResolver(enable_validation=True, json_body_deserializer=read_json_body)
app.enable_swagger(
    path="/docs",
    title="Duetime",
    version=__version__,
    summary="Submit jobs to run now, at a set time or on a schedule; read their runs and logs.",
)

#: Tenant of requests that carry no authorizer identity (the single-tenant local stack).
DEFAULT_TENANT = "local"


def current_tenant() -> str:
    """The caller's tenant from the HTTP API authorizer context (JWT ``sub`` or the IAM principal)."""
    authorizer: dict[str, Any] = (app.current_event.raw_event.get("requestContext") or {}).get(
        "authorizer"
    ) or {}
    jwt = authorizer.get("jwt") or {}
    claims = jwt.get("claims") or {}
    if claims.get("tenant") or claims.get("sub"):
        return str(claims.get("tenant") or claims["sub"])
    iam = authorizer.get("iam") or {}
    if iam.get("userArn"):
        return str(iam["userArn"])
    lam = authorizer.get("lambda") or {}
    if lam.get("tenant"):
        return str(lam["tenant"])
    return DEFAULT_TENANT


_ERROR_DESCRIPTIONS = {
    400: "Invalid request: the error names the field",
    404: "No such job or run (or another tenant's)",
    409: "Conflicts with the resource's state, an Idempotency-Key reused with another body, or a quota",
    429: "Too many submits this minute: retry after the Retry-After header's seconds",
    503: "AWS throttled the request: nothing was changed; retry after the Retry-After header's seconds",
}


def errors(*codes: int, aws: bool = True) -> dict[int, OpenAPIResponse]:
    """OpenAPI ``responses`` for the error statuses a route can answer, all in the ErrorResponse shape.

    ``aws``: the route calls AWS, so it may also answer 503 when AWS throttles it.
    """
    codes = (*codes, 503) if aws else codes
    return {
        code: {
            "description": _ERROR_DESCRIPTIONS[code],
            "content": {"application/json": {"model": ErrorResponse}},
        }
        for code in codes
    }


def ok(code: int, model: type[BaseModel], description: str) -> dict[int, OpenAPIResponse]:
    """OpenAPI ``responses`` entry of a route's success status and body model."""
    return {code: {"description": description, "content": {"application/json": {"model": model}}}}


TEXT_200: dict[int, OpenAPIResponse] = {
    200: {
        "description": "The attempt's stdout+stderr",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


def error(status: int, code: str, message: str, field: str | None = None) -> Response[str]:
    body = ErrorResponse.model_validate({"error": {"code": code, "message": message, "field": field}})
    return Response(
        status_code=status, content_type=content_types.APPLICATION_JSON, body=body.model_dump_json()
    )


def _field_of(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    # pydantic adds the union member / validator name for tagged types (a task's kind: `task.lambda.x`);
    # keep field names and indexes
    kept = [
        p
        for i, p in enumerate(parts)
        if not p.startswith("function-") and not (i and parts[i - 1] == "task" and p in TASK_KINDS)
    ]
    return ".".join(kept) or "body"


@app.exception_handler(RequestValidationError)
def _validation_error(exc: RequestValidationError) -> Response[str]:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    field = _field_of(tuple(first.get("loc", ())))
    kind = first.get("type", "")
    if kind == "json_invalid":
        why = (first.get("ctx") or {}).get("error")
        return error(
            400, "invalid_json", "the request body is not valid JSON" + (f": {why}" if why else ""), "body"
        )
    message = f"{field}: {first.get('msg', 'invalid value')}"
    if kind == "extra_forbidden":
        message = f"{field}: unknown field"
    return error(400, "validation_error", message, field)


@app.exception_handler(ScheduleError)
def _schedule_error(exc: ScheduleError) -> Response[str]:
    return error(400, "invalid_schedule", exc.message, exc.field)


@app.exception_handler(RequestFieldError)
def _field_error(exc: RequestFieldError) -> Response[str]:
    return error(400, "invalid_field", exc.message, exc.field)


@app.exception_handler(NotFoundError)
def _not_found(exc: NotFoundError) -> Response[str]:
    return error(404, "not_found", str(exc))


@app.exception_handler(ConflictError)
def _conflict(exc: ConflictError) -> Response[str]:
    return error(409, "conflict", str(exc))


@app.exception_handler(QuotaExceededError)
def _quota(exc: QuotaExceededError) -> Response[str]:
    if exc.retry_after is None:
        return error(409, "quota_exceeded", str(exc))
    response = error(429, "too_many_requests", str(exc))
    response.headers["Retry-After"] = str(exc.retry_after)
    return response


#: error codes of capacity refusals (after the SDK's own retries): botocore's standard retry mode's list
#: (DynamoDB ProvisionedThroughputExceeded, SQS RequestThrottled, S3 SlowDown, ...); ours if it moves
THROTTLING_CODES = frozenset(
    getattr(ThrottledRetryableChecker, "_THROTTLED_ERROR_CODES", None)
    or ("ProvisionedThroughputExceededException", "ThrottlingException", "RequestThrottled", "SlowDown")
)


@app.exception_handler(ThrottledError)
def _throttled(exc: ThrottledError) -> Response[str]:
    response = error(503, "throttled", f"{exc}; try again shortly")
    response.headers["Retry-After"] = "1"
    return response


@app.exception_handler(ClientError)
def _aws_error(exc: ClientError) -> Response[str]:
    """A throttled AWS call is a 503 with Retry-After; any other AWS error stays a server error (re-raised)."""
    code = exc.response.get("Error", {}).get("Code", "")
    if code in THROTTLING_CODES:
        return _throttled(ThrottledError(f"AWS throttled {exc.operation_name} ({code})"))
    raise exc


@app.exception_handler(JobExistsError)
def _exists(exc: JobExistsError) -> Response[str]:
    return error(409, "job_exists", str(exc), "job_id")


@app.not_found
def _no_route(_: Exception) -> Response[str]:
    method, path = app.current_event.http_method, app.current_event.path
    allowed = sorted(
        {r.method for r in app._static_routes + app._dynamic_routes if r.rule.match(path)} - {method}
    )
    if allowed:  # the resource exists; the method does not (RFC 9110 section 15.5.6)
        response = error(
            405, "method_not_allowed", f"{method} is not allowed on {path}; use {', '.join(allowed)}"
        )
        response.headers["Allow"] = ", ".join(allowed)
        return response
    return error(404, "no_such_route", f"no route {method} {path}")


@app.get("/openapi.json", include_in_schema=False)
def openapi_json() -> Response[str]:
    schema = app.get_openapi_json_schema(title="Duetime", version=__version__)
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=schema)


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post(
    "/jobs",
    responses=ok(201, JobResponse, "The job, as stored (its first fire may already be claimed)")
    | errors(400, 409, 429),
)
def create_job(
    body: CreateJobRequest,
    idempotency_key: Annotated[str | None, Header(alias="idempotency-key", max_length=255)] = None,
) -> Response[str]:
    tenant, deps = current_tenant(), default_deps()

    def submit() -> dict[str, Any]:
        job = jobs.create_job(body, tenant=tenant, deps=deps)
        return {
            "status": 201,
            "body": _job_response(job).model_dump_json(),
            "location": f"/jobs/{job.job_id}",
        }

    return _replayable(
        idempotency.once(
            idempotency_key,
            tenant=tenant,
            route="POST /jobs",
            body=body.model_dump(mode="json"),
            settings=deps.settings,
            handler=submit,
            lambda_context=app.lambda_context,
        )
    )


def _replayable(stored: dict[str, Any]) -> Response[str]:
    """The HTTP response of a (possibly replayed) idempotent action."""
    headers = {"Location": stored["location"]} if stored.get("location") else None
    return Response(
        status_code=stored["status"],
        content_type=content_types.APPLICATION_JSON,
        body=stored["body"],
        headers=headers,
    )


@app.get("/jobs", responses=ok(200, JobListResponse, "A page of jobs, newest first") | errors(400))
def list_jobs(
    state: Annotated[JobState | None, Query()] = None,
    name_prefix: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> JobListResponse:
    deps = default_deps()
    found, token = jobs.list_jobs(
        tenant=current_tenant(),
        deps=deps,
        limit=limit,
        next_token=next_token,
        state=state.value if state else None,
        name_prefix=name_prefix,
    )
    return JobListResponse(jobs=[_job_response(j) for j in found], next_token=token)


def _job_response(job: Job) -> JobResponse:
    fires, last = jobs.describe_job(job, default_deps())
    return JobResponse.of(job, next_fire_times=fires, last_run=last)


@app.get("/jobs/<job_id>", responses=ok(200, JobResponse, "The job") | errors(404))
def get_job(job_id: str) -> JobResponse:
    return _job_response(jobs.get_job(job_id, tenant=current_tenant(), deps=default_deps()))


@app.patch("/jobs/<job_id>", responses=ok(200, JobResponse, "The job, changed") | errors(400, 404, 409))
def update_job(job_id: str, body: UpdateJobRequest) -> JobResponse:
    return _job_response(jobs.update_job(job_id, body, tenant=current_tenant(), deps=default_deps()))


@app.delete("/jobs/<job_id>", responses=ok(200, JobResponse, "The job, DELETED") | errors(400, 404, 409))
def delete_job(job_id: str, cancel_running: Annotated[bool, Query()] = False) -> JobResponse:
    job = jobs.delete_job(job_id, tenant=current_tenant(), deps=default_deps(), cancel_running=cancel_running)
    return _job_response(job)


@app.post("/jobs/<job_id>/pause", responses=ok(200, JobResponse, "The job, PAUSED") | errors(404, 409))
def pause_job(job_id: str) -> JobResponse:
    return _job_response(jobs.pause_job(job_id, tenant=current_tenant(), deps=default_deps()))


@app.post("/jobs/<job_id>/resume", responses=ok(200, JobResponse, "The job, ACTIVE") | errors(404, 409))
def resume_job(job_id: str) -> JobResponse:
    return _job_response(jobs.resume_job(job_id, tenant=current_tenant(), deps=default_deps()))


@app.post(
    "/jobs/<job_id>/trigger",
    responses=ok(202, RunResponse, "The manual run, PENDING") | errors(400, 404, 409),
)
def trigger_job(
    job_id: str,
    ignore_overlap: Annotated[bool, Query()] = False,
    idempotency_key: Annotated[str | None, Header(alias="idempotency-key", max_length=255)] = None,
) -> Response[str]:
    tenant, deps = current_tenant(), default_deps()

    def trigger() -> dict[str, Any]:
        run = jobs.trigger_job(job_id, tenant=tenant, deps=deps, ignore_overlap=ignore_overlap)
        return {
            "status": 202,
            "body": RunResponse.of(run).model_dump_json(),
            "location": f"/runs/{run.run_id}",
        }

    return _replayable(
        idempotency.once(
            idempotency_key,
            tenant=tenant,
            route=f"POST /jobs/{job_id}/trigger",
            body={"ignore_overlap": ignore_overlap},
            settings=deps.settings,
            handler=trigger,
            lambda_context=app.lambda_context,
        )
    )


@app.get(
    "/jobs/<job_id>/runs",
    responses=ok(200, RunListResponse, "A page of runs, newest due time first") | errors(400, 404),
)
def list_runs(
    job_id: str,
    state: Annotated[RunState | None, Query()] = None,
    since: Annotated[datetime | None, Query(description="due at or after, ISO-8601 with offset")] = None,
    until: Annotated[datetime | None, Query(description="due at or before, ISO-8601 with offset")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> RunListResponse:
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise RequestFieldError(f"{name}: needs a UTC offset, e.g. 2026-12-01T10:00:00Z", name)
        if value is not None:
            try:
                in_supported_range(value)
            except ValueError as exc:
                raise RequestFieldError(f"{name}: {exc}", name) from None
    found, token = jobs.query_runs(
        job_id,
        tenant=current_tenant(),
        deps=default_deps(),
        limit=limit,
        next_token=next_token,
        state=state.value if state else None,
        since=since,
        until=until,
    )
    return RunListResponse(runs=[RunResponse.of(r) for r in found], next_token=token)


@app.post("/runs/<run_id>/cancel", responses=ok(200, RunResponse, "The run, CANCELLED") | errors(404, 409))
def cancel_run(run_id: str) -> RunResponse:
    return RunResponse.of(jobs.cancel_run(run_id, tenant=current_tenant(), deps=default_deps()))


@app.get("/runs/<run_id>", responses=ok(200, RunResponse, "The run") | errors(404))
def get_run(run_id: str) -> RunResponse:
    return RunResponse.of(jobs.get_run(run_id, tenant=current_tenant(), deps=default_deps()))


@app.get("/runs/<run_id>/logs", responses={**errors(400, 404), **TEXT_200})
def get_run_logs(run_id: str, attempt: Annotated[int | None, Query(ge=1)] = None) -> Response[str]:
    text = jobs.get_run_log(run_id, tenant=current_tenant(), deps=default_deps(), attempt=attempt)
    return Response(status_code=200, content_type="text/plain; charset=utf-8", body=text)


@app.get(
    "/dead-letters",
    responses=ok(200, RunListResponse, "A page of dead-lettered runs, newest first") | errors(400),
)
def list_dead_letters(
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> RunListResponse:
    found, token = jobs.list_dead_letters(
        tenant=current_tenant(), deps=default_deps(), limit=limit, next_token=next_token
    )
    return RunListResponse(runs=[RunResponse.of(r) for r in found], next_token=token)


@app.post(
    "/runs/<run_id>/retry", responses=ok(200, RunResponse, "The run, PENDING again") | errors(400, 404, 409)
)
def retry_run(
    run_id: str,
    idempotency_key: Annotated[str | None, Header(alias="idempotency-key", max_length=255)] = None,
) -> Response[str]:
    tenant, deps = current_tenant(), default_deps()

    def redrive() -> dict[str, Any]:
        return {
            "status": 200,
            "body": RunResponse.of(jobs.redrive(run_id, tenant=tenant, deps=deps)).model_dump_json(),
        }

    return _replayable(
        idempotency.once(
            idempotency_key,
            tenant=tenant,
            route=f"POST /runs/{run_id}/retry",
            body={},
            settings=deps.settings,
            handler=redrive,
            lambda_context=app.lambda_context,
        )
    )


@app.get(
    "/schedules/preview",
    responses=ok(200, SchedulePreviewResponse, "The next fire times") | errors(400, aws=False),
)
def preview_schedule(
    expression: Annotated[str, Query(min_length=1, max_length=256)],
    timezone: Annotated[str, Query(max_length=64)] = "UTC",
    count: Annotated[int, Query(ge=1, le=100)] = 5,
    after: Annotated[datetime | None, Query(description="ISO-8601 instant with offset; default now")] = None,
    anchor: Annotated[datetime | None, Query(description="start of a rate(...); default `after`")] = None,
    dst_policy: Annotated[Literal["shift", "skip"], Query()] = "shift",
) -> SchedulePreviewResponse:
    start = after or default_deps().clock.now()
    for name, value in (("after", after), ("anchor", anchor)):
        if value is not None and value.tzinfo is None:
            raise ScheduleError(f"{name} needs a UTC offset, e.g. 2026-12-01T10:00:00Z", name)
        if value is not None:
            try:
                in_supported_range(value)
            except ValueError as exc:
                raise RequestFieldError(f"{name}: {exc}", name) from None
    return jobs.preview_schedule(
        expression, timezone, after=start, anchor=anchor or start, count=count, dst_policy=dst_policy
    )


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    problem = unreadable_body(event)
    if problem is not None:
        return {
            "statusCode": 400,
            "headers": {"Content-Type": content_types.APPLICATION_JSON},
            "body": ErrorResponse.model_validate(
                {"error": {"code": "invalid_json", "message": problem, "field": "body"}}
            ).model_dump_json(),
            "isBase64Encoded": False,
        }
    return app.resolve(as_json(event), context)


#: Deepest JSON nesting accepted in a body (Python's parser recurses; no Duetime body needs more than ~6).
MAX_JSON_DEPTH = 32


def unreadable_body(event: dict[str, Any]) -> str | None:
    """Why the body cannot be read as JSON (not UTF-8, malformed, nested too deep), or None if it can."""
    body = event.get("body")
    if not body:
        return None
    raw: bytes | str = base64.b64decode(body) if event.get("isBase64Encoded") else body
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except (UnicodeDecodeError, ValueError):
        return "the request body is not UTF-8 text"
    depth = deepest = 0
    in_string = escaped = False
    for char in text:  # nesting depth without recursion: count brackets outside strings
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    if deepest > MAX_JSON_DEPTH:
        return f"the request body nests deeper than {MAX_JSON_DEPTH} levels"
    return None


def as_json(event: dict[str, Any]) -> dict[str, Any]:
    """The API speaks only JSON: a body is read as JSON whatever its declared content type (curl -d sends a
    form type by default)."""
    headers = event.get("headers") or {}
    if event.get("body") and not headers.get("content-type", "").startswith("application/json"):
        event = {**event, "headers": {**headers, "content-type": "application/json"}}
    if event.get("isBase64Encoded") and event.get("body"):
        event = {**event, "body": base64.b64decode(event["body"]).decode("utf-8"), "isBase64Encoded": False}
    return event
