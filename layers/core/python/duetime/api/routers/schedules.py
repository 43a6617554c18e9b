"""``/schedules/preview``: a schedule expression's next fire times, without submitting a job."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from aws_lambda_powertools.event_handler.openapi.params import Query

from duetime.api.dependencies import ServiceDeps
from duetime.api.responses import errors, ok
from duetime.api.routers import new_router
from duetime.domain.api_models import SchedulePreviewResponse
from duetime.domain.errors import RequestFieldError, ScheduleError
from duetime.domain.models import in_supported_range
from duetime.services import jobs

router = new_router()
TAGS = ["schedules"]


@router.get(
    "/schedules/preview",
    tags=TAGS,
    responses=ok(200, SchedulePreviewResponse, "The next fire times") | errors(400, aws=False),
)
def preview_schedule(
    deps: ServiceDeps,
    expression: Annotated[str, Query(min_length=1, max_length=256)],
    timezone: Annotated[str, Query(max_length=64)] = "UTC",
    count: Annotated[int, Query(ge=1, le=100)] = 5,
    after: Annotated[datetime | None, Query(description="ISO-8601 instant with offset; default now")] = None,
    anchor: Annotated[datetime | None, Query(description="start of a rate(...); default `after`")] = None,
    dst_policy: Annotated[Literal["shift", "skip"], Query()] = "shift",
) -> SchedulePreviewResponse:
    """Preview a schedule.

    The next `count` fire times of `expression` in `timezone` after `after` (default now), in UTC and local
    time, with a description of the schedule. An expression that can never fire is a 400 saying why.
    """
    start = after or deps.clock.now()
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
