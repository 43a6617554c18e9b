"""Idempotent submits (Powertools idempotency on moto), OpenAPI, and tenant isolation in the API handler."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from duetime.services.worker import Worker
from tests.helpers import call

JOB = {
    "name": "idem",
    "schedule": None,
    "task": {"kind": "container", "command": ["sh", "-c", "exit 5"]},
    "retry": {"max_attempts": 1},
}


def test_a_retried_submit_with_the_same_key_returns_the_first_job(api: ModuleType, deps) -> None:
    first = call(api, "POST", "/jobs", JOB, headers={"idempotency-key": "k-1"})
    again = call(api, "POST", "/jobs", JOB, headers={"idempotency-key": "k-1"})
    assert first[0] == again[0] == 201
    assert again[1]["job_id"] == first[1]["job_id"] and again[2]["location"] == first[2]["location"]
    # one job, one run
    listed = call(api, "GET", "/jobs")[1]["jobs"]
    assert [j["job_id"] for j in listed] == [first[1]["job_id"]]
    # a different key is a different job
    assert (
        call(api, "POST", "/jobs", JOB, headers={"idempotency-key": "k-2"})[1]["job_id"] != first[1]["job_id"]
    )


def test_the_same_key_with_a_different_body_is_a_409_that_says_so(api: ModuleType) -> None:
    call(api, "POST", "/jobs", JOB, headers={"idempotency-key": "k-1"})
    status, body, _ = call(api, "POST", "/jobs", {**JOB, "name": "other"}, headers={"idempotency-key": "k-1"})
    assert status == 409 and "different request body" in body["error"]["message"]


def test_the_same_key_while_its_first_request_runs_is_a_409_with_retry_after(
    api: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a submit that, while it is being handled, sees the same request with the same key arrive
    from duetime.services import jobs

    create = jobs.create_job
    seen: list[tuple[int, dict, dict]] = []

    def create_while_retried(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(call(api, "POST", "/jobs", JOB, headers={"idempotency-key": "k-busy"}))
        return create(*args, **kwargs)

    monkeypatch.setattr(jobs, "create_job", create_while_retried)
    first = call(api, "POST", "/jobs", JOB, headers={"idempotency-key": "k-busy"})
    # Then the second is told to retry shortly (the first still runs), and the first makes the job
    [(status, body, headers)] = seen
    assert status == 409 and body["error"]["code"] == "request_in_progress"
    assert "still in progress" in body["error"]["message"] and headers["retry-after"] == "1"
    assert first[0] == 201
    # and once the first is done, the same key answers with its job
    monkeypatch.setattr(jobs, "create_job", create)
    again = call(api, "POST", "/jobs", JOB, headers={"idempotency-key": "k-busy"})
    assert (again[0], again[1]["job_id"]) == (201, first[1]["job_id"])


def test_idempotency_keys_are_scoped_by_tenant(api: ModuleType) -> None:
    a = call(api, "POST", "/jobs", JOB, headers={"idempotency-key": "k"}, tenant="alice")
    b = call(api, "POST", "/jobs", JOB, headers={"idempotency-key": "k"}, tenant="bob")
    assert a[0] == b[0] == 201 and a[1]["job_id"] != b[1]["job_id"]


def test_a_retried_trigger_makes_one_run(api: ModuleType, deps, clock) -> None:
    _, job, _ = call(api, "POST", "/jobs", {**JOB, "schedule": {"expression": "rate(1 hour)"}})
    first = call(api, "POST", f"/jobs/{job['job_id']}/trigger", headers={"idempotency-key": "t-1"})
    clock.advance(5)
    again = call(api, "POST", f"/jobs/{job['job_id']}/trigger", headers={"idempotency-key": "t-1"})
    assert first[0] == again[0] == 202 and first[1]["run_id"] == again[1]["run_id"]
    manual = [
        r for r in call(api, "GET", f"/jobs/{job['job_id']}/runs")[1]["runs"] if r["trigger"] == "manual"
    ]
    assert len(manual) == 1


def test_tenants_see_only_their_own_jobs_runs_logs_and_dead_letters(api: ModuleType, deps) -> None:
    _, job, _ = call(api, "POST", "/jobs", JOB, tenant="alice")
    Worker(deps, "small", owner="w").poll_once()
    run_id = call(api, "GET", f"/jobs/{job['job_id']}/runs", tenant="alice")[1]["runs"][0]["run_id"]
    for path in (
        f"/jobs/{job['job_id']}",
        f"/jobs/{job['job_id']}/runs",
        f"/runs/{run_id}",
        f"/runs/{run_id}/logs",
    ):
        assert call(api, "GET", path, tenant="bob")[0] == 404, path
        assert call(api, "GET", path, tenant="alice")[0] == 200, path
    for method, path in (
        ("POST", f"/jobs/{job['job_id']}/pause"),
        ("POST", f"/jobs/{job['job_id']}/trigger"),
        ("DELETE", f"/jobs/{job['job_id']}"),
        ("POST", f"/runs/{run_id}/retry"),
        ("POST", f"/runs/{run_id}/cancel"),
        ("PATCH", f"/jobs/{job['job_id']}"),
    ):
        assert call(api, method, path, {} if method == "PATCH" else None, tenant="bob")[0] == 404, path
    assert call(api, "GET", "/jobs", tenant="bob")[1]["jobs"] == []
    assert call(api, "GET", "/dead-letters", tenant="bob")[1]["runs"] == []
    assert [r["run_id"] for r in call(api, "GET", "/dead-letters", tenant="alice")[1]["runs"]] == [run_id]
    # a timeout handler may not trigger another tenant's job
    body = {**JOB, "on_timeout": {"action": "trigger", "job_id": job["job_id"]}}
    status, answer, _ = call(api, "POST", "/jobs", body, tenant="bob")
    assert status == 400 and answer["error"]["field"] == "on_timeout.job_id"


def test_the_openapi_schema_documents_every_route_and_the_error_shape(api: ModuleType) -> None:
    status, text, headers = call(api, "GET", "/openapi.json")
    assert status == 200
    schema = json.loads(text) if isinstance(text, str) else text
    paths = schema["paths"]
    for path in (
        "/jobs",
        "/jobs/{job_id}",
        "/jobs/{job_id}/runs",
        "/jobs/{job_id}/pause",
        "/jobs/{job_id}/resume",
        "/jobs/{job_id}/trigger",
        "/runs/{run_id}",
        "/runs/{run_id}/logs",
        "/runs/{run_id}/cancel",
        "/runs/{run_id}/retry",
        "/dead-letters",
        "/schedules/preview",
    ):
        assert path in paths, path
    assert set(paths["/jobs/{job_id}"]) >= {"get", "patch", "delete"}
    assert "CreateJobRequest" in schema["components"]["schemas"]
    # Only statuses the API answers are documented: validation errors are 400s naming the field, never 422s
    documented = {c for item in paths.values() for op in item.values() for c in op["responses"]}
    assert documented == {"200", "201", "202", "400", "404", "409", "429", "503"}
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    status, answer, _ = call(api, "POST", "/jobs", {**JOB, "timeout_seconds": "x"})
    assert status == 400 and answer["error"]["field"] == "timeout_seconds"
    assert paths["/jobs"]["post"]["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"
    }
    status, page, _ = call(api, "GET", "/docs")
    assert status == 200 and "swagger" in str(page).lower()


@pytest.mark.parametrize("key", ["", " ", "x" * 256])
def test_a_bad_idempotency_key_is_a_400(api: ModuleType, key: str) -> None:
    status, body, _ = call(api, "POST", "/jobs", JOB, headers={"idempotency-key": key})
    assert status == 400
