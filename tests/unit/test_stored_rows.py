"""Stored job and run rows are read leniently (``Job.from_stored``, ``Run.from_stored``): a rollback or a newer
writer must never make a row unreadable. Unknown fields are ignored at every nesting level and submit-only
rules (bounds, sizes, request formats) are skipped; requests and queue messages stay strict."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pytest
from pydantic import ValidationError

from duetime.domain.api_models import CreateJobRequest, JobResponse
from duetime.domain.models import (
    AttemptRecord,
    CatchUpPolicy,
    ContainerTask,
    Job,
    JobState,
    LambdaTask,
    OnTimeout,
    OverlapPolicy,
    RetryPolicy,
    Run,
    RunEvent,
    RunMessage,
    RunState,
    ScheduleSpec,
    StoredModel,
    Trigger,
    parse_run_id,
    run_id_for,
)


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def _job() -> Job:
    return Job(
        job_id="nightly-report",
        tenant="acme",
        name="nightly report",
        schedule=ScheduleSpec(expression="cron(0 2 * * ? *)", timezone="Europe/Berlin", dst_policy="skip"),
        task=ContainerTask(
            command=["python", "report.py", "--day", "yesterday"],
            env={"REPORT_BUCKET": "acme-reports"},
            tier="medium",
        ),
        timeout_seconds=1800,
        retry=RetryPolicy(max_attempts=5, backoff_seconds=30.0, jitter="full"),
        on_timeout=OnTimeout(action="trigger", job_id="cleanup", kill_grace_seconds=20.0),
        catch_up=CatchUpPolicy(policy="all", max_runs=3, tolerance_seconds=120.0),
        overlap=OverlapPolicy(policy="skip"),
        starting_deadline_seconds=600,
        missed_slots=2,
        state=JobState.ACTIVE,
        shard=7,
        next_fire_at=_at("2026-03-02T01:00:00+00:00"),
        anchor=_at("2026-01-01T00:00:00+00:00"),
        created_at=_at("2026-01-01T00:00:00+00:00"),
        updated_at=_at("2026-02-15T09:30:00.250+00:00"),
        version=4,
    )


def _run() -> Run:
    return Run(
        job_id="nightly-report",
        due_at=_at("2026-03-02T01:00:00+00:00"),
        tenant="acme",
        shard=7,
        state=RunState.RETRY_WAIT,
        attempt=2,
        max_attempts=5,
        fencing_token=3,
        trigger=Trigger.SCHEDULE,
        task=LambdaTask(
            function="arn:aws:lambda:eu-west-1:123456789012:function:report:live",
            payload={"day": "2026-03-01", "format": None},
        ),
        timeout_seconds=900,
        retry=RetryPolicy(max_attempts=5, backoff_seconds=30.0),
        on_timeout=OnTimeout(action="fail"),
        overlap=OverlapPolicy(policy="buffer_one"),
        error="exit 1",
        retry_at=_at("2026-03-02T01:01:10+00:00"),
        watch_at=_at("2026-03-02T01:01:10+00:00"),
        attempts=[
            AttemptRecord(
                attempt=1,
                fencing_token=2,
                worker="lambda",
                started_at=_at("2026-03-02T01:00:00.120+00:00"),
                finished_at=_at("2026-03-02T01:00:40.005+00:00"),
                state=RunState.FAILED,
                reason="Unhandled",
                log_key="logs/nightly-report/1772413200000/1",
            )
        ],
        events=[
            RunEvent(
                at=_at("2026-03-02T01:00:41+00:00"),
                kind="stale_finish",
                detail={"fencing_token": 1, "worker": "w-0"},
            )
        ],
        created_at=_at("2026-03-02T00:58:00+00:00"),
    )


def _row(model: Job | Run) -> dict[str, Any]:
    """The row as the store gives it back: JSON types, instants as ISO text."""
    row: dict[str, Any] = json.loads(model.model_dump_json())
    return row


def _job_row_with_unknown_fields() -> dict[str, Any]:
    row = _row(_job())
    row["priority"] = "high"  # a newer version's field
    row["schedule"]["calendar"] = "de-holidays"
    row["task"]["cpu_millis"] = 500
    row["retry"]["retry_on_exit_codes"] = [75]
    row["on_timeout"]["notify"] = "ops@acme.test"
    row["catch_up"]["window_seconds"] = 3600
    row["overlap"]["queue_limit"] = 2
    return row


def _run_row_with_unknown_fields() -> dict[str, Any]:
    row = _row(_run())
    row["cost_cents"] = 3
    row["task"]["memory_mb"] = 512
    row["retry"]["retry_on_exit_codes"] = [75]
    row["on_timeout"]["notify"] = "ops@acme.test"
    row["overlap"]["queue_limit"] = 2
    row["attempts"][0]["billed_ms"] = 40_000
    row["events"][0]["source"] = "finish"
    return row


def _error_locations(excinfo: pytest.ExceptionInfo[ValidationError], kind: str) -> set[tuple[Any, ...]]:
    return {tuple(e["loc"]) for e in excinfo.value.errors() if e["type"] == kind}


# ---- unknown fields -----------------------------------------------------------------------------------------
def test_a_job_row_with_unknown_fields_at_every_level_reads_as_the_job_it_holds() -> None:
    job = Job.from_stored(_job_row_with_unknown_fields())

    assert job == _job()
    assert job.task == ContainerTask(
        command=["python", "report.py", "--day", "yesterday"],
        env={"REPORT_BUCKET": "acme-reports"},
        tier="medium",
    )
    assert (job.retry.max_attempts, job.retry.backoff_seconds, job.retry.jitter) == (5, 30.0, "full")
    assert job.on_timeout.job_id == "cleanup"
    assert job.schedule is not None and job.schedule.timezone == "Europe/Berlin"
    assert "priority" not in job.model_dump()


def test_a_run_row_with_unknown_fields_in_its_task_policies_attempts_and_events_reads_as_the_run_it_holds() -> (
    None
):
    run = Run.from_stored(_run_row_with_unknown_fields())

    assert run == _run()
    assert run.run_id == "nightly-report.1772413200000"
    assert isinstance(run.task, LambdaTask) and run.task.payload == {"day": "2026-03-01", "format": None}
    assert run.attempts[0].log_key == "logs/nightly-report/1772413200000/1"
    assert run.events[0].detail == {"fencing_token": 1, "worker": "w-0"}
    assert run.overlap.policy == "buffer_one"


def test_plain_model_validate_still_refuses_every_unknown_field_of_a_job_row() -> None:
    with pytest.raises(ValidationError) as excinfo:
        Job.model_validate(_job_row_with_unknown_fields())
    assert _error_locations(excinfo, "extra_forbidden") == {
        ("priority",),
        ("schedule", "calendar"),
        ("task", "container", "cpu_millis"),
        ("retry", "retry_on_exit_codes"),
        ("on_timeout", "notify"),
        ("catch_up", "window_seconds"),
        ("overlap", "queue_limit"),
    }


def test_plain_model_validate_still_refuses_every_unknown_field_of_a_run_row() -> None:
    with pytest.raises(ValidationError) as excinfo:
        Run.model_validate(_run_row_with_unknown_fields())
    assert _error_locations(excinfo, "extra_forbidden") == {
        ("cost_cents",),
        ("task", "lambda", "memory_mb"),
        ("retry", "retry_on_exit_codes"),
        ("on_timeout", "notify"),
        ("overlap", "queue_limit"),
        ("attempts", 0, "billed_ms"),
        ("events", 0, "source"),
    }


def test_another_validation_context_is_not_the_stored_one() -> None:
    with pytest.raises(ValidationError):
        Job.model_validate(_job_row_with_unknown_fields(), context={"stored": False})
    with pytest.raises(ValidationError):
        Job.model_validate(_job_row_with_unknown_fields(), context={"request_id": "r-1"})


def test_a_row_read_leniently_is_still_frozen_and_any_mapping_is_a_row() -> None:
    job = Job.from_stored(MappingProxyType(_job_row_with_unknown_fields()))
    with pytest.raises(ValidationError, match="frozen"):
        job.name = "renamed"  # type: ignore[misc]


# ---- submit-only rules --------------------------------------------------------------------------------------
#: (field of the job row, what a stored row holds there, the error a submission of it gets)
SUBMIT_ONLY_JOB_VALUES = [
    pytest.param("retry", {"max_attempts": 250}, "less_than_equal", id="retry.max_attempts over 100"),
    pytest.param(
        "retry", {"max_backoff_seconds": 30 * 86400.0}, "less_than_equal", id="retry backoff cap over 7 days"
    ),
    pytest.param("retry", {"max_attempts": 5.0}, "int_type", id="retry.max_attempts written as a float"),
    pytest.param("catch_up", {"max_runs": 5000}, "less_than_equal", id="catch_up.max_runs over 1000"),
    pytest.param(
        "catch_up",
        {"tolerance_seconds": 30 * 86400.0},
        "less_than_equal",
        id="catch_up tolerance over 7 days",
    ),
    pytest.param(
        "overlap", {"max_concurrency": 2000}, "less_than_equal", id="overlap.max_concurrency over 1000"
    ),
    pytest.param("on_timeout", {"kill_grace_seconds": 900.0}, "less_than_equal", id="kill grace over 300 s"),
    pytest.param(
        "on_timeout",
        {"action": "fail", "job_id": "cleanup"},
        "value_error",
        id="job_id kept after action changed",
    ),
    pytest.param(
        "schedule", {"start_at": "2300-01-01T00:00:00.000Z"}, "value_error", id="start_at after 2199"
    ),
    pytest.param("schedule", {"end_at": "1969-12-31T23:59:59.000Z"}, "value_error", id="end_at before 1970"),
    pytest.param(
        "task", {"env": {"1ST_REGION": "eu-west-1"}}, "string_pattern_mismatch", id="env name not POSIX"
    ),
    pytest.param("task", {"env": {"REPORT_TEMPLATE": "x" * 100_000}}, "value_error", id="task over 96 KB"),
    pytest.param(
        "task",
        {"command": ["sh", "-c", "echo " + "x" * 9000]},
        "string_too_long",
        id="argv element over 8192",
    ),
    pytest.param("task", {"command": ["echo", *["x"] * 299]}, "too_long", id="argv over 256 elements"),
    pytest.param("task", {"command": ["printf", "a\x00b"]}, "value_error", id="NUL in an argument"),
    pytest.param("task", {"stdin": "x" * 70_000}, "string_too_long", id="stdin over 65536"),
]


@pytest.mark.parametrize(("field", "stored", "error"), SUBMIT_ONLY_JOB_VALUES)
def test_a_stored_job_breaking_a_submit_only_rule_reads_with_its_stored_value(
    field: str, stored: dict[str, Any], error: str
) -> None:
    row = _row(_job())
    row[field] = {**row[field], **stored}

    job = Job.from_stored(row)

    shown = getattr(job, field).model_dump(mode="json")
    assert {key: shown[key] for key in stored} == stored
    assert job.job_id == "nightly-report" and job.version == 4

    with pytest.raises(ValidationError) as excinfo:
        Job.model_validate(row)
    assert any(e["type"] == error and e["loc"][0] == field for e in excinfo.value.errors())


@pytest.mark.parametrize(("field", "stored", "error"), SUBMIT_ONLY_JOB_VALUES)
def test_a_submission_breaking_a_submit_only_rule_is_still_refused(
    field: str, stored: dict[str, Any], error: str
) -> None:
    body = {
        k: v
        for k, v in _row(_job()).items()
        if k in ("name", "schedule", "task", "timeout_seconds", "retry", "on_timeout", "catch_up", "overlap")
    }
    body[field] = {**body[field], **stored}
    with pytest.raises(ValidationError) as excinfo:
        CreateJobRequest.model_validate(body)
    assert any(e["type"] == error and e["loc"][0] == field for e in excinfo.value.errors())


def test_a_stored_lambda_run_with_a_name_and_payload_a_submission_may_not_have_reads() -> None:
    row = _row(_run())
    row["task"] = {
        "kind": "lambda",
        "function": "report.v2",
        "payload": {"rows": ["x" * 1000] * 100},
        "tier": "lambda",
    }

    run = Run.from_stored(row)

    assert isinstance(run.task, LambdaTask)
    assert run.task.function == "report.v2"
    assert run.task.payload == {"rows": ["x" * 1000] * 100}
    with pytest.raises(ValidationError) as excinfo:
        Run.model_validate(row)
    assert [e["msg"] for e in excinfo.value.errors()] == [
        "Value error, give a function name (1-64 of A-Z a-z 0-9 _ -), ACCOUNT:function:NAME or a Lambda function "
        "ARN, optionally followed by :VERSION or :ALIAS"
    ]


def test_a_job_read_leniently_is_shown_with_its_stored_values() -> None:
    row = _row(_job())
    row["retry"]["max_attempts"] = 250
    row["schedule"]["start_at"] = "2300-01-01T00:00:00.000Z"

    response = JobResponse.of(Job.from_stored(row))

    assert response.retry.max_attempts == 250
    assert response.schedule is not None and response.schedule.start_at == datetime(2300, 1, 1, tzinfo=UTC)


# ---- what still holds for a stored row ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "error"),
    [
        pytest.param({"state": "ARCHIVED"}, "enum", id="unknown state"),
        pytest.param({"job_id": "nightly report"}, "string_pattern_mismatch", id="job id not a key"),
        pytest.param({"retry": {"max_attempts": 0}}, "greater_than_equal", id="no attempt at all"),
        pytest.param({"retry": {"backoff_seconds": -5.0}}, "greater_than_equal", id="negative delay"),
        pytest.param({"on_timeout": {"action": "trigger"}}, "value_error", id="trigger without its job"),
        pytest.param({"task": {"kind": "docker", "image": "busybox"}}, "task_kind", id="unknown task kind"),
        pytest.param({"task": {"command": []}}, "too_short", id="no program"),
        pytest.param({"shard": "seven"}, "int_parsing", id="wrong type"),
    ],
)
def test_a_stored_row_still_needs_the_types_and_invariants_the_code_relies_on(
    change: dict[str, Any], error: str
) -> None:
    row = _row(_job())
    row.update(change)
    with pytest.raises(ValidationError) as excinfo:
        Job.from_stored(row)
    assert error in {e["type"] for e in excinfo.value.errors()}


def test_a_stored_row_without_a_required_field_is_refused() -> None:
    row = _row(_run())
    del row["task"]
    with pytest.raises(ValidationError) as excinfo:
        Run.from_stored(row)
    assert _error_locations(excinfo, "missing") == {("task",)}


# ---- requests and messages stay strict ---------------------------------------------------------------------
def test_a_create_job_request_with_an_unknown_field_is_refused_at_any_level() -> None:
    body = {"name": "hello", "task": {"command": ["echo", "hi"]}}
    assert CreateJobRequest.model_validate(body).task == ContainerTask(command=["echo", "hi"])

    for unknown, loc in [
        ({**body, "priority": "high"}, ("priority",)),
        ({**body, "retry": {"max_attempts": 2, "retry_on": [75]}}, ("retry", "retry_on")),
        ({**body, "task": {"command": ["echo"], "cpu_millis": 500}}, ("task", "container", "cpu_millis")),
    ]:
        with pytest.raises(ValidationError) as excinfo:
            CreateJobRequest.model_validate(unknown)
        assert _error_locations(excinfo, "extra_forbidden") == {loc}


def test_a_run_message_with_an_unknown_field_is_refused() -> None:
    body = {"job_id": "nightly-report", "due_at": "2026-03-02T01:00:00.000Z", "attempt": 2, "tier": "lambda"}
    assert RunMessage.model_validate_json(json.dumps(body)).run_id == "nightly-report.1772413200000"

    with pytest.raises(ValidationError) as excinfo:
        RunMessage.model_validate_json(json.dumps({**body, "priority": "high"}))
    assert _error_locations(excinfo, "extra_forbidden") == {("priority",)}
    assert not issubclass(RunMessage, StoredModel)


@pytest.mark.parametrize(
    "run_id",
    [
        "alice-job.01796351490774",
        "alice-job.１７９６３５１４９０７７４",
        "alice-job.١٧٩٦٣٥١٤٩٠٧٧٤",
        "alice-job.²",
    ],
)
def test_a_run_id_not_in_the_form_run_id_for_writes_is_malformed(run_id: str) -> None:
    with pytest.raises(ValueError, match="malformed run id"):
        parse_run_id(run_id)


def test_a_canonical_run_id_parses_to_its_job_and_due_time() -> None:
    due = datetime(2026, 11, 30, 12, 38, 10, 774000, tzinfo=UTC)
    assert run_id_for("alice-job", due) == "alice-job.1796042290774"
    assert parse_run_id("alice-job.1796042290774") == ("alice-job", due)
