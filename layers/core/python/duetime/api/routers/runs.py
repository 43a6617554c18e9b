"""Runs: a job's runs, one run, its logs; cancel a run or re-drive a dead-lettered one."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from duetime.api.dependencies import ServiceDeps
from duetime.api.idempotent import IdempotencyKey, once
from duetime.api.responses import errors, ok, text_ok
from duetime.api.routers import check_instant, new_router
from duetime.api.tenancy import Tenant
from duetime.domain.api_models import RunListResponse, RunResponse
from duetime.domain.logs import LOG_PENDING_HEADER
from duetime.domain.models import RunState
from duetime.services import jobs

router = new_router()
TAGS = ["runs"]


@router.get(
    "/jobs/<job_id>/runs",
    tags=TAGS,
    responses=ok(200, RunListResponse, "A page of runs, newest due time first") | errors(400, 404),
)
def list_runs(
    job_id: str,
    deps: ServiceDeps,
    tenant: Tenant,
    state: Annotated[RunState | None, Query()] = None,
    since: Annotated[datetime | None, Query(description="due at or after, ISO-8601 with offset")] = None,
    until: Annotated[datetime | None, Query(description="due at or before, ISO-8601 with offset")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> RunListResponse:
    """List a job's runs.

    Newest due time first, `limit` to a page, optionally of one `state` or due between `since` and `until`;
    pass the answer's `next_token` for the next page.
    """
    check_instant("since", since)
    check_instant("until", until)
    found, token = jobs.query_history(
        job_id,
        tenant=tenant,
        deps=deps,
        limit=limit,
        next_token=next_token,
        state=state.value if state else None,
        since=since,
        until=until,
    )
    return RunListResponse(runs=[RunResponse.of(h.run, archived=h.archived) for h in found], next_token=token)


@router.get("/runs/<run_id>", tags=TAGS, responses=ok(200, RunResponse, "The run") | errors(404))
def get_run(run_id: str, deps: ServiceDeps, tenant: Tenant) -> RunResponse:
    """Read a run.

    Its state, attempt, timings, exit code, schedule lag, attempt history and events. A run's id is
    `<job_id>.<due time in epoch ms>`, stable across retries.
    """
    found = jobs.find_run(run_id, tenant=tenant, deps=deps)
    return RunResponse.of(found.run, archived=found.archived)


@router.post(
    "/runs/<run_id>/cancel",
    tags=TAGS,
    responses=ok(200, RunResponse, "The run, CANCELLED") | errors(404, 409),
)
def cancel_run(run_id: str, deps: ServiceDeps, tenant: Tenant) -> RunResponse:
    """Cancel a run.

    A PENDING run never starts; a RUNNING one is fenced off and its task killed. A finished run is a 409.
    """
    return RunResponse.of(jobs.cancel_run(run_id, tenant=tenant, deps=deps))


@router.get(
    "/runs/<run_id>/logs", tags=TAGS, responses={**errors(400, 404), **text_ok("The attempt's stdout+stderr")}
)
def get_run_logs(
    run_id: str, deps: ServiceDeps, tenant: Tenant, attempt: Annotated[int | None, Query(ge=1)] = None
) -> Response[str]:
    """Read a run's log.

    The stdout+stderr of its latest attempt (`attempt=N`: an earlier one) as plain text; while the run
    runs, its output so far. An attempt that ended while its worker still holds its log (the worker stores
    the logs of several seconds as one object) answers with the header `Duetime-Log-Pending`: `partial`,
    the body is the output streamed so far and the rest is on its way; `note`, the body is a note saying so.
    Read it again a few seconds later.
    """
    log = jobs.read_run_log(run_id, tenant=tenant, deps=deps, attempt=attempt)
    headers = {LOG_PENDING_HEADER: log.pending} if log.pending else None
    return Response(status_code=200, content_type="text/plain; charset=utf-8", body=log.text, headers=headers)


@router.post(
    "/runs/<run_id>/retry",
    tags=TAGS,
    responses=ok(200, RunResponse, "The run, PENDING again") | errors(400, 404, 409),
)
def retry_run(
    run_id: str, deps: ServiceDeps, tenant: Tenant, idempotency_key: IdempotencyKey = None
) -> Response[str]:
    """Re-drive a dead-lettered or TIMED_OUT run.

    It runs again with a fresh retry budget, its backoff from its first step. Any other run is a 409; a
    retry with the same `Idempotency-Key` answers the same run.
    """

    def redrive() -> dict[str, Any]:
        return {
            "status": 200,
            "body": RunResponse.of(jobs.redrive(run_id, tenant=tenant, deps=deps)).model_dump_json(),
        }

    return once(
        idempotency_key,
        tenant=tenant,
        route=f"POST /runs/{run_id}/retry",
        body={},
        deps=deps,
        action=redrive,
        lambda_context=router.lambda_context,
    )
