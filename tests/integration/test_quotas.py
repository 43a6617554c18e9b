"""Per-tenant quotas: submits per minute (429 + Retry-After) and active jobs (409)."""

from __future__ import annotations

from datetime import timedelta
from types import ModuleType

import pytest

from duetime.config.deps import Deps
from tests.helpers import call

JOB = {
    "name": "q",
    "schedule": {"expression": "rate(1 hour)"},
    "task": {"kind": "container", "command": ["true"]},
}


@pytest.fixture
def small_quotas(deps: Deps) -> Deps:
    deps.settings = deps.settings.model_copy(
        update={"tenant_submits_per_minute": 3, "tenant_max_active_jobs": 5}
    )
    return deps


def test_submits_over_the_per_minute_quota_get_429_with_retry_after(
    api: ModuleType, small_quotas, clock
) -> None:
    clock.advance(15)  # 12:00:15
    for _ in range(3):
        assert call(api, "POST", "/jobs", JOB, tenant="alice")[0] == 201
    status, body, headers = call(api, "POST", "/jobs", JOB, tenant="alice")
    assert status == 429 and body["error"]["code"] == "too_many_requests"
    assert headers["retry-after"] == "45"
    # another tenant is not affected, and the next minute the quota is fresh
    assert call(api, "POST", "/jobs", JOB, tenant="bob")[0] == 201
    clock.advance(45)
    assert call(api, "POST", "/jobs", JOB, tenant="alice")[0] == 201


def test_active_jobs_over_the_quota_get_409_until_one_is_deleted(
    api: ModuleType, small_quotas, clock
) -> None:
    ids = []
    for _ in range(5):
        clock.advance(20)  # stay under the submit rate
        status, job, _ = call(api, "POST", "/jobs", JOB, tenant="alice")
        assert status == 201
        ids.append(job["job_id"])
    clock.advance(20)
    status, body, _ = call(api, "POST", "/jobs", JOB, tenant="alice")
    assert status == 409 and body["error"]["code"] == "quota_exceeded"
    assert call(api, "DELETE", f"/jobs/{ids[0]}", tenant="alice")[0] == 200
    assert call(api, "POST", "/jobs", JOB, tenant="alice")[0] == 201


def test_a_completed_one_off_job_frees_its_quota(api: ModuleType, small_quotas, clock) -> None:
    for _ in range(6):  # run-now jobs complete at submit (their one run is claimed): never over 5 active
        clock.advance(20)
        assert call(api, "POST", "/jobs", {**JOB, "schedule": None}, tenant="alice")[0] == 201


def _at(when) -> dict:  # type: ignore[no-untyped-def]
    return {**JOB, "schedule": {"expression": f"at({when:%Y-%m-%dT%H:%M:%S})"}}


def _active_jobs(api: ModuleType, clock, tenant: str, count: int) -> None:  # type: ignore[no-untyped-def]
    """Submit ``count`` scheduled jobs for ``tenant``, 20 s apart (under the submit rate)."""
    for _ in range(count):
        clock.advance(20)
        assert call(api, "POST", "/jobs", JOB, tenant=tenant)[0] == 201


def _quota_left(api: ModuleType, clock, tenant: str) -> bool:
    """Whether one more scheduled job fits ``tenant``'s active-jobs quota (the probe is deleted again)."""
    clock.advance(20)  # stay under the submit rate
    status, job, _ = call(api, "POST", "/jobs", JOB, tenant=tenant)
    if status == 201:
        assert call(api, "DELETE", f"/jobs/{job['job_id']}", tenant=tenant)[0] == 200
    return status == 201


def test_pausing_and_resuming_a_completed_job_with_a_claimed_run_leaves_the_quota_as_it_was(
    api: ModuleType, small_quotas, clock
) -> None:
    # Given four active jobs (quota 5) and a one-off due in 30 s, COMPLETED at its submit (its run claimed)
    _active_jobs(api, clock, "alice", 4)
    clock.advance(20)
    status, at_job, _ = call(api, "POST", "/jobs", _at(clock.now() + timedelta(seconds=30)), tenant="alice")
    assert status == 201 and at_job["state"] == "COMPLETED"
    # When it is paused: its claimed run is held, and the PAUSED job counts against the quota
    status, paused, _ = call(api, "POST", f"/jobs/{at_job['job_id']}/pause", tenant="alice")
    assert status == 200 and paused["state"] == "PAUSED"
    assert not _quota_left(api, clock, "alice")
    # When it is resumed: it is COMPLETED again and the quota is as before the pause
    status, resumed, _ = call(api, "POST", f"/jobs/{at_job['job_id']}/resume", tenant="alice")
    assert status == 200 and resumed["state"] == "COMPLETED"
    assert _quota_left(api, clock, "alice")


def test_a_completed_job_patched_to_a_schedule_with_fires_ahead_counts_again(
    api: ModuleType, small_quotas, clock
) -> None:
    _active_jobs(api, clock, "alice", 4)
    clock.advance(20)
    status, done, _ = call(api, "POST", "/jobs", {**JOB, "schedule": None}, tenant="alice")
    assert status == 201 and done["state"] == "COMPLETED"
    assert _quota_left(api, clock, "alice")
    # the run-now job given a schedule is ACTIVE and takes the last place
    status, active, _ = call(
        api, "PATCH", f"/jobs/{done['job_id']}", {"schedule": {"expression": "rate(1 hour)"}}, tenant="alice"
    )
    assert status == 200 and active["state"] == "ACTIVE"
    assert not _quota_left(api, clock, "alice")
    # and a schedule with nothing ahead is refused as at submit: the job and the quota stay as they are
    past = _at(clock.now() - timedelta(days=1))["schedule"]
    status, refused, _ = call(api, "PATCH", f"/jobs/{done['job_id']}", {"schedule": past}, tenant="alice")
    assert status == 400 and refused["error"]["field"] == "schedule.expression"
    assert call(api, "GET", f"/jobs/{done['job_id']}", tenant="alice")[1]["state"] == "ACTIVE"
    assert not _quota_left(api, clock, "alice")


def _run_now(deps: Deps, tenant: str):  # type: ignore[no-untyped-def]
    """Submit a run-now job for ``tenant``; its one run (PENDING)."""
    from duetime.domain.api_models import CreateJobRequest
    from duetime.domain.models import ContainerTask
    from duetime.services import jobs

    job = jobs.create_job(
        CreateJobRequest(name="r", task=ContainerTask(command=["true"])), tenant=tenant, deps=deps
    )
    return deps.store.list_runs(job.job_id)[0]


def test_a_tenant_at_its_running_quota_waits_and_others_do_not(deps: Deps) -> None:
    from duetime.domain.errors import StartRejectedError
    from duetime.domain.models import RunState
    from duetime.services import runs
    from tests.helpers import drain, queue_counts

    deps.settings = deps.settings.model_copy(update={"tenant_max_running": 1})

    first, second, other = _run_now(deps, "alice"), _run_now(deps, "alice"), _run_now(deps, "bob")
    drain(deps.settings.queue_url("small"))
    running = runs.start(runs.message_for(first), deps, owner="w1")
    # alice's second run is held back (PENDING) and its wake-up is put back on the queue, delayed
    with pytest.raises(StartRejectedError):
        runs.start(runs.message_for(second), deps, owner="w2")
    assert deps.store.get_run(second.job_id, second.due_at).state is RunState.PENDING
    assert queue_counts(deps.settings.queue_url("small"))["delayed"] == 1
    # bob is not affected
    assert runs.start(runs.message_for(other), deps, owner="w3").state is RunState.RUNNING
    # once alice's first run ends, her second one starts
    runs.finish(running, deps, fencing_token=running.fencing_token, outcome=RunState.SUCCEEDED, exit_code=0)
    assert runs.start(runs.message_for(second), deps, owner="w2").state is RunState.RUNNING


def test_one_poll_of_a_tenants_runs_starts_no_more_than_its_running_quota(deps: Deps) -> None:
    from duetime.domain.errors import StartRejectedError
    from duetime.domain.models import Run, RunState
    from duetime.services import runs
    from tests.helpers import drain

    deps.settings = deps.settings.model_copy(update={"tenant_max_running": 2})

    alices = [_run_now(deps, "alice") for _ in range(4)]
    bob = _run_now(deps, "bob")
    drain(deps.settings.queue_url("small"))
    # When one worker's poll brings all five wake-ups and starts them together
    outcomes = runs.start_many([runs.message_for(r) for r in [*alices, bob]], deps, owner="w1")
    # Then alice gets her two RUNNING, her others wait (PENDING), and bob's starts
    assert [isinstance(o, Run) for o in outcomes] == [True, True, False, False, True]
    assert all(isinstance(o, StartRejectedError) for o in outcomes[2:4])
    assert deps.store.count_running("alice") == 2
    assert [deps.store.get_run(r.job_id, r.due_at).state for r in alices] == [  # type: ignore[union-attr]
        RunState.RUNNING,
        RunState.RUNNING,
        RunState.PENDING,
        RunState.PENDING,
    ]


def test_a_paused_run_now_job_never_counts_not_even_when_deleted(
    api: ModuleType, small_quotas, clock
) -> None:
    _active_jobs(api, clock, "alice", 5)
    clock.advance(20)
    status, once, _ = call(api, "POST", "/jobs", {**JOB, "schedule": None}, tenant="alice")
    assert status == 201
    assert call(api, "POST", f"/jobs/{once['job_id']}/pause", tenant="alice")[0] == 200
    assert call(api, "DELETE", f"/jobs/{once['job_id']}", tenant="alice")[0] == 200
    # the quota is still full: deleting the paused run-now job freed no place it never took
    assert not _quota_left(api, clock, "alice")
