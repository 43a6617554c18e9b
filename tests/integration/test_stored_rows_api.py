"""A job stored under older, looser rules stays usable through the API: it reads, and a PATCH of other
fields keeps its stored values; what the caller sends is held to today's rules."""

from __future__ import annotations

from types import ModuleType

from duetime.domain.models import Job
from tests.helpers import call

BODY = {
    "name": "legacy",
    "schedule": {"expression": "rate(1 hour)"},
    "task": {"kind": "container", "command": ["true"]},
    "retry": {"max_attempts": 5},
}


def _legacy_job(api: ModuleType, deps) -> str:  # type: ignore[no-untyped-def]
    status, job, _ = call(api, "POST", "/jobs", BODY)
    assert status == 201, job
    stored = deps.store.get_job(job["job_id"])
    # as an older version wrote it: 150 attempts, over today's submit bound of 100
    legacy = Job.from_stored(
        {**stored.model_dump(), "retry": {**stored.retry.model_dump(), "max_attempts": 150}}
    )
    deps.store.replace_job(legacy, expected_version=stored.version, expected_next_fire_at=stored.next_fire_at)
    return str(job["job_id"])


def test_a_patch_of_other_fields_keeps_a_stored_value_that_todays_rules_refuse(api: ModuleType, deps) -> None:
    job_id = _legacy_job(api, deps)
    assert call(api, "GET", f"/jobs/{job_id}")[1]["retry"]["max_attempts"] == 150
    status, patched, _ = call(
        api, "PATCH", f"/jobs/{job_id}", {"name": "renamed", "retry": {"backoff_seconds": 5}}
    )
    assert status == 200, patched
    assert (patched["name"], patched["retry"]["max_attempts"], patched["retry"]["backoff_seconds"]) == (
        "renamed",
        150,
        5,
    )
    assert deps.store.get_job(job_id).retry.max_attempts == 150


def test_a_value_the_caller_sends_is_held_to_todays_rules(api: ModuleType, deps) -> None:
    job_id = _legacy_job(api, deps)
    status, body, _ = call(api, "PATCH", f"/jobs/{job_id}", {"retry": {"max_attempts": 150}})
    assert status == 400 and body["error"]["field"] == "retry.max_attempts", body
    assert deps.store.get_job(job_id).retry.max_attempts == 150
