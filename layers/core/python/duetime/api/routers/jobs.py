"""``/jobs``: submit, list, read, change, pause, resume, trigger and delete jobs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from duetime.api.dependencies import ServiceDeps
from duetime.api.idempotent import IdempotencyKey, once
from duetime.api.responses import errors, ok
from duetime.api.routers import check_instant, new_router
from duetime.api.tenancy import Tenant
from duetime.config.deps import Deps
from duetime.domain.api_models import (
    CreateJobRequest,
    JobListResponse,
    JobResponse,
    RunResponse,
    SlotListResponse,
    SlotResponse,
    UpdateJobRequest,
    lag_stats,
)
from duetime.domain.models import Job, JobState
from duetime.services import jobs, slots

router = new_router()
TAGS = ["jobs"]

#: Most last-run reads a job listing makes at once (a page holds up to 100 jobs, each with its own Query).
LISTING_READERS = 8
#: the recent runs GET /jobs/{id}'s lag figures are of (one Query)
LAG_RUNS = 100


def job_response(job: Job, deps: Deps, *, with_lag: bool = True) -> JobResponse:
    """The job as the API shows it: with its next fire times, its most recent run and (``with_lag``) the
    schedule lag of its last :data:`LAG_RUNS` runs (one Query either way)."""
    fires, recent = jobs.describe_job(job, deps, recent=LAG_RUNS if with_lag else 1)
    return JobResponse.of(
        job,
        next_fire_times=fires,
        last_run=recent[0] if recent else None,
        lag=lag_stats(recent) if with_lag else None,
    )


def job_responses(found: list[Job], deps: Deps) -> list[JobResponse]:
    """:func:`job_response` of each job, in order, without the lag figures (a page of 100 jobs would read
    100 runs of each); their last-run Queries run side by side (at most :data:`LISTING_READERS` at once), so
    a page costs about one Query's latency, not one per job."""
    if len(found) <= 1:
        return [job_response(job, deps, with_lag=False) for job in found]
    with ThreadPoolExecutor(max_workers=min(LISTING_READERS, len(found))) as pool:
        return list(pool.map(lambda job: job_response(job, deps, with_lag=False), found))


@router.post(
    "/jobs",
    tags=TAGS,
    responses=ok(201, JobResponse, "The job, as stored (its first fire may already be claimed)")
    | errors(400, 409, 429),
)
def create_job(
    body: CreateJobRequest,
    deps: ServiceDeps,
    tenant: Tenant,
    idempotency_key: IdempotencyKey = None,
) -> Response[str]:
    """Submit a job.

    Runs it now (no `schedule`), at a set time (`at(...)`) or on a schedule (`rate(...)`, cron). A first fire
    within the tick's look-ahead is claimed at once. Answers 201 with the job and its `Location`; a retry with
    the same `Idempotency-Key` answers the first job again, the same key with another body is a 409.
    """

    def submit() -> dict[str, Any]:
        job = jobs.create_job(body, tenant=tenant, deps=deps)
        return {
            "status": 201,
            "body": job_response(job, deps).model_dump_json(),
            "location": f"/jobs/{job.job_id}",
        }

    return once(
        idempotency_key,
        tenant=tenant,
        route="POST /jobs",
        body=body.model_dump(mode="json"),
        deps=deps,
        action=submit,
        lambda_context=router.lambda_context,
    )


@router.get(
    "/jobs", tags=TAGS, responses=ok(200, JobListResponse, "A page of jobs, newest first") | errors(400)
)
def list_jobs(
    deps: ServiceDeps,
    tenant: Tenant,
    state: Annotated[JobState | None, Query()] = None,
    name_prefix: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> JobListResponse:
    """List your jobs.

    Newest first, `limit` to a page; pass the answer's `next_token` for the next page. DELETED jobs are
    listed only with `state=DELETED`.
    """
    found, token = jobs.list_jobs(
        tenant=tenant,
        deps=deps,
        limit=limit,
        next_token=next_token,
        state=state.value if state else None,
        name_prefix=name_prefix,
    )
    return JobListResponse(jobs=job_responses(found, deps), next_token=token)


@router.get("/jobs/<job_id>", tags=TAGS, responses=ok(200, JobResponse, "The job") | errors(404))
def get_job(job_id: str, deps: ServiceDeps, tenant: Tenant) -> JobResponse:
    """Read a job.

    Its definition, state, next fire times, most recent run, and the schedule lag (p50, p99) of its last
    100 runs.
    """
    return job_response(jobs.get_job(job_id, tenant=tenant, deps=deps), deps)


@router.get(
    "/jobs/<job_id>/slots",
    tags=TAGS,
    responses=ok(200, SlotListResponse, "A page of the job's slots, newest due time first")
    | errors(400, 404),
)
def list_slots(
    job_id: str,
    deps: ServiceDeps,
    tenant: Tenant,
    since: Annotated[
        datetime | None, Query(description="due at or after, ISO-8601 with offset (default: 24 h ago)")
    ] = None,
    until: Annotated[
        datetime | None, Query(description="due at or before, ISO-8601 with offset (default: now)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> SlotListResponse:
    """List a job's slots: did it run?

    Every due time the job's schedule expected between `since` and `until`, newest first, with its
    outcome: `ran` (its run id, state and lag), `skipped` (and why), `missed`, `pending` or `upcoming`.
    Slots before the job's last schedule change are the runs recorded then; from it on, the current
    schedule's fires. Pass the answer's `next_token` for the next page.
    """
    check_instant("since", since)
    check_instant("until", until)
    found, token = slots.list_slots(
        job_id, tenant=tenant, deps=deps, since=since, until=until, limit=limit, next_token=next_token
    )
    return SlotListResponse(
        slots=[SlotResponse.model_validate(slot, from_attributes=True) for slot in found], next_token=token
    )


@router.patch(
    "/jobs/<job_id>", tags=TAGS, responses=ok(200, JobResponse, "The job, changed") | errors(400, 404, 409)
)
def update_job(job_id: str, body: UpdateJobRequest, deps: ServiceDeps, tenant: Tenant) -> JobResponse:
    """Change a job.

    A JSON Merge Patch (RFC 7396): a field left out keeps its value, `null` puts it back to its default.
    A new schedule takes effect from its first slot after the change.
    """
    return job_response(jobs.update_job(job_id, body, tenant=tenant, deps=deps), deps)


@router.delete(
    "/jobs/<job_id>", tags=TAGS, responses=ok(200, JobResponse, "The job, DELETED") | errors(400, 404, 409)
)
def delete_job(
    job_id: str, deps: ServiceDeps, tenant: Tenant, cancel_running: Annotated[bool, Query()] = False
) -> JobResponse:
    """Delete a job.

    No further runs, at once: its runs claimed ahead end SKIPPED; runs already started continue unless
    `cancel_running=true`. Its history stays readable.
    """
    job = jobs.delete_job(job_id, tenant=tenant, deps=deps, cancel_running=cancel_running)
    return job_response(job, deps)


@router.post(
    "/jobs/<job_id>/pause", tags=TAGS, responses=ok(200, JobResponse, "The job, PAUSED") | errors(404, 409)
)
def pause_job(job_id: str, deps: ServiceDeps, tenant: Tenant) -> JobResponse:
    """Pause a job.

    No new runs, at once: a run that comes due is held PENDING; runs already started continue.
    """
    return job_response(jobs.pause_job(job_id, tenant=tenant, deps=deps), deps)


@router.post(
    "/jobs/<job_id>/resume", tags=TAGS, responses=ok(200, JobResponse, "The job, ACTIVE") | errors(404, 409)
)
def resume_job(job_id: str, deps: ServiceDeps, tenant: Tenant) -> JobResponse:
    """Resume a paused job.

    Its catch-up policy decides the slots that came due during the pause.
    """
    return job_response(jobs.resume_job(job_id, tenant=tenant, deps=deps), deps)


@router.post(
    "/jobs/<job_id>/trigger",
    tags=TAGS,
    responses=ok(202, RunResponse, "The manual run, PENDING") | errors(400, 404, 409),
)
def trigger_job(
    job_id: str,
    deps: ServiceDeps,
    tenant: Tenant,
    ignore_overlap: Annotated[bool, Query()] = False,
    idempotency_key: IdempotencyKey = None,
) -> Response[str]:
    """Run a job now.

    A manual run, even of a paused job; `ignore_overlap=true` bypasses the overlap policy. Answers 202 with
    the run and its `Location`; a retry with the same `Idempotency-Key` answers the same run.
    """

    def trigger() -> dict[str, Any]:
        run = jobs.trigger_job(job_id, tenant=tenant, deps=deps, ignore_overlap=ignore_overlap)
        return {
            "status": 202,
            "body": RunResponse.of(run).model_dump_json(),
            "location": f"/runs/{run.run_id}",
        }

    return once(
        idempotency_key,
        tenant=tenant,
        route=f"POST /jobs/{job_id}/trigger",
        body={"ignore_overlap": ignore_overlap},
        deps=deps,
        action=trigger,
        lambda_context=router.lambda_context,
    )
