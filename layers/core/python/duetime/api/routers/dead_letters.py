"""``/dead-letters``: runs that used up their attempts, newest first."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Query

from duetime.api.dependencies import ServiceDeps
from duetime.api.responses import errors, ok
from duetime.api.routers import new_router
from duetime.api.tenancy import Tenant
from duetime.domain.api_models import RunListResponse, RunResponse
from duetime.services import jobs

router = new_router()
TAGS = ["dead-letters"]


@router.get(
    "/dead-letters",
    tags=TAGS,
    responses=ok(200, RunListResponse, "A page of dead-lettered runs, newest first") | errors(400),
)
def list_dead_letters(
    deps: ServiceDeps,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> RunListResponse:
    """List your dead-lettered runs.

    Runs that exhausted their attempts, most recently dead-lettered first; pass the answer's `next_token` for
    the next page. `POST /runs/{run_id}/retry` re-drives one.
    """
    found, token = jobs.list_dead_letters(tenant=tenant, deps=deps, limit=limit, next_token=next_token)
    return RunListResponse(runs=[RunResponse.of(r) for r in found], next_token=token)
