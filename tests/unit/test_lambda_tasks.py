"""Lambda tasks, pure parts: the task model, the envelope helper, reading destination records, registration."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from duetime.domain.api_models import CreateJobRequest, UpdateJobRequest
from duetime.domain.models import ContainerTask, LambdaTask, RunState, Task, function_name_of
from duetime.lambda_target import EnvelopeError, read_envelope, run_task
from duetime.local.lambda_service import (
    functions_from_pyproject,
    parse_function_spec,
    registered_functions,
    timeout_of,
)
from duetime.services.lambda_tasks import DestinationRecord, RunEnvelope, outcome_of, result_of

TASK: TypeAdapter[ContainerTask | LambdaTask] = TypeAdapter(Task)

ENVELOPE = {
    "duetime": {
        "run_id": "nightly.1796040000000",
        "job_id": "nightly",
        "attempt": 2,
        "fencing_token": 3,
        "due_at": "2026-11-30T12:00:00.000Z",
        "timeout_seconds": 30,
    },
    "payload": {"name": "Ada", "n": 1.0, "none": None},
}


# ---- the task ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "function",
    [
        "hello",
        "hello:live",
        "hello:$LATEST",
        "hello:7",
        "123456789012:function:hello",
        "arn:aws:lambda:eu-west-1:123456789012:function:my_report-2",
        "arn:aws:lambda:eu-west-1:123456789012:function:report:live",
        "arn:aws-cn:lambda:cn-north-1:123456789012:function:report",
        "arn:aws-us-gov:lambda:us-gov-west-1:123456789012:function:report",
    ],
)
def test_function_names_and_arns_lambda_accepts_are_accepted(function: str) -> None:
    task = TASK.validate_python({"kind": "lambda", "function": function})
    assert isinstance(task, LambdaTask) and task.tier == "lambda"


@pytest.mark.parametrize(
    "function",
    [
        "",
        "has space",
        "dots.are.not.allowed",
        "x" * 65,
        "arn:aws:lambda:eu-west-1:1234:function:short-account",
        "arn:aws:s3:::bucket",
        "hello:",
        "hello:a:b",
    ],
)
def test_malformed_function_names_are_refused(function: str) -> None:
    with pytest.raises(ValidationError):
        TASK.validate_python({"kind": "lambda", "function": function})


def test_a_lambda_task_is_always_on_the_lambda_tier() -> None:
    assert TASK.validate_python({"kind": "lambda", "function": "f"}).tier == "lambda"
    with pytest.raises(ValidationError):
        TASK.validate_python({"kind": "lambda", "function": "f", "tier": "small"})


def test_a_payload_larger_than_a_run_record_holds_is_refused() -> None:
    with pytest.raises(
        ValidationError, match=r"payload is 99,008 bytes of JSON; at most 98,304 \(96 KB\) fit"
    ):
        TASK.validate_python({"kind": "lambda", "function": "f", "payload": {"x": "y" * 99_000}})
    with pytest.raises(ValidationError):
        TASK.validate_python({"kind": "lambda", "function": "f", "payload": ["not", "an", "object"]})
    with pytest.raises(ValidationError, match="lone surrogates"):
        TASK.validate_python({"kind": "lambda", "function": "f", "payload": {"x": "\ud800"}})


def test_a_task_without_kind_is_still_a_container_task_and_an_unknown_kind_is_refused() -> None:
    assert TASK.validate_python({"command": ["true"]}) == ContainerTask(command=["true"])
    with pytest.raises(ValidationError, match="kind must be `container` or `lambda`"):
        TASK.validate_python({"kind": "docker", "image": "x"})


def test_function_name_of_strips_arn_and_qualifier() -> None:
    assert function_name_of("arn:aws:lambda:eu-west-1:123456789012:function:report:live") == "report"
    assert function_name_of("123456789012:function:report") == "report"
    assert function_name_of("report:7") == "report"


def test_a_lambda_job_defaults_to_lambdas_limit_and_may_not_exceed_it() -> None:
    task = {"kind": "lambda", "function": "f"}
    assert CreateJobRequest.model_validate({"name": "l", "task": task}).timeout_seconds == 900
    assert (
        CreateJobRequest.model_validate({"name": "c", "task": {"command": ["true"]}}).timeout_seconds == 3600
    )
    with pytest.raises(ValidationError) as info:
        CreateJobRequest.model_validate({"name": "l", "task": task, "timeout_seconds": 901})
    assert info.value.errors()[0]["loc"] == ("timeout_seconds",)
    with pytest.raises(ValidationError):
        UpdateJobRequest.model_validate({"task": task, "timeout_seconds": 3600})


# ---- the helper for target functions ---------------------------------------------------------------------
def test_read_envelope_exposes_the_run_and_the_payload() -> None:
    info, payload = read_envelope(ENVELOPE, context="ctx")
    assert (info.run_id, info.job_id, info.attempt, info.fencing_token) == (
        "nightly.1796040000000",
        "nightly",
        2,
        3,
    )
    assert info.idempotency_key == info.run_id
    assert info.due_at == datetime(2026, 11, 30, 12, tzinfo=UTC)
    assert (info.timeout_seconds, info.lambda_context) == (30, "ctx")
    assert payload == {"name": "Ada", "n": 1.0, "none": None}


@pytest.mark.parametrize("event", [{}, {"payload": {}}, {"duetime": {"run_id": "x"}}, "text", None])
def test_an_event_that_is_no_envelope_is_refused(event: object) -> None:
    with pytest.raises(EnvelopeError):
        read_envelope(event)


def test_run_task_returns_the_result_in_the_shape_the_finish_handler_unwraps() -> None:
    @run_task
    def handler(payload: dict, run) -> str:
        return f"hello {payload['name']} ({run.attempt})"

    response = handler(ENVELOPE, None)
    assert response == {
        "duetime": {"run_id": "nightly.1796040000000", "attempt": 2, "fencing_token": 3},
        "result": "hello Ada (2)",
    }
    assert result_of(response, "nightly.1796040000000") == "hello Ada (2)"
    # a response of another shape, or naming another run, is the result as it is
    assert result_of(response, "other.1") == response
    assert result_of({"result": 1}, "nightly.1796040000000") == {"result": 1}
    assert result_of([1, 2], "x") == [1, 2]


# ---- reading destination records -------------------------------------------------------------------------
def _record(condition: str, response: object, function_error: str | None = None) -> DestinationRecord:
    return DestinationRecord.model_validate(
        {
            "requestContext": {
                "requestId": "r-1",
                "functionArn": "arn:aws:lambda:us-east-1:1:function:f:$LATEST",
                "condition": condition,
                "approximateInvokeCount": 1,
            },
            "requestPayload": ENVELOPE,
            "responseContext": {
                "statusCode": 200,
                "executedVersion": "$LATEST",
                "functionError": function_error,
            },
            "responsePayload": response,
        }
    )


ENV = RunEnvelope.model_validate(ENVELOPE)


def test_success_is_succeeded_with_the_response_as_result() -> None:
    outcome = outcome_of(_record("Success", {"rows": 3}), ENV)
    assert (outcome.state, outcome.result, outcome.has_result, outcome.error) == (
        RunState.SUCCEEDED,
        {"rows": 3},
        True,
        None,
    )


def test_a_raised_error_is_a_failed_attempt_with_type_and_message() -> None:
    error = {"errorMessage": "boom", "errorType": "ValueError", "stackTrace": ['  File "f.py", line 1\n']}
    outcome = outcome_of(_record("RetriesExhausted", error, "Unhandled"), ENV)
    assert (outcome.state, outcome.reason, outcome.error) == (
        RunState.FAILED,
        "function_error",
        "ValueError: boom",
    )


@pytest.mark.parametrize(
    "error",
    [
        {"errorMessage": "2026-11-30T12:00:31.000Z 1a2b Task timed out after 30.03 seconds"},
        {
            "errorType": "Sandbox.Timedout",
            "errorMessage": "RequestId: 1a2b Error: Task timed out after 30.03 seconds",
        },
    ],
)
def test_lambdas_timeout_is_timed_out(error: dict) -> None:
    outcome = outcome_of(_record("RetriesExhausted", error, "Unhandled"), ENV)
    assert (outcome.state, outcome.reason) == (RunState.TIMED_OUT, "timeout")
    assert outcome.error is not None and outcome.error.startswith("timed out after 30.03 s")


def test_a_users_error_that_mentions_a_timeout_is_still_a_failure() -> None:
    error = {"errorType": "RuntimeError", "errorMessage": "upstream: Task timed out after 5 seconds"}
    assert outcome_of(_record("RetriesExhausted", error, "Unhandled"), ENV).state is RunState.FAILED


def test_an_event_too_old_for_lambdas_queue_is_a_failed_attempt() -> None:
    outcome = outcome_of(_record("EventAgeExceeded", None), ENV)
    assert (outcome.state, outcome.reason) == (RunState.FAILED, "event_age_exceeded")


# ---- local registration ----------------------------------------------------------------------------------
def test_function_specs_are_name_equals_module_colon_function() -> None:
    assert parse_function_spec("hello=examples.lambdas.hello:lambda_handler") == (
        "hello",
        "examples.lambdas.hello:lambda_handler",
    )
    for bad in ["hello", "hello=module", "bad name=m:f", "h=m:f:g", "h=1m:f"]:
        with pytest.raises(ValueError, match="NAME=module:function"):
            parse_function_spec(bad)


def test_the_pyproject_table_registers_functions_and_the_cli_wins(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.duetime.local.lambdas]\nhello = "app.hello:handler"\nreport = "app.report:handler"\n'
    )
    assert functions_from_pyproject(tmp_path / "pyproject.toml") == {
        "hello": "app.hello:handler",
        "report": "app.report:handler",
    }
    functions, roots = registered_functions({"hello": "other:fn"}, cwd=tmp_path, project_root=None)
    assert functions == {"hello": "other:fn", "report": "app.report:handler"}
    assert roots == [tmp_path]


def test_without_a_table_in_the_current_directory_the_projects_is_used(tmp_path: Path) -> None:
    project = Path(__file__).resolve().parents[2]
    functions, roots = registered_functions({}, cwd=tmp_path, project_root=project)
    assert functions["hello"] == "examples.lambdas.hello:lambda_handler"
    assert roots == [tmp_path, project]


def test_a_malformed_table_entry_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.duetime.local.lambdas]\nhello = 3\n")
    with pytest.raises(ValueError, match="hello"):
        functions_from_pyproject(tmp_path / "pyproject.toml")


def test_the_local_timeout_is_the_runs_within_lambdas_limit() -> None:
    assert (
        timeout_of(b'{"duetime": {"run_id": "a.1", "job_id": "a", "attempt": 1, "timeout_seconds": 5}}') == 5
    )
    assert (
        timeout_of(b'{"duetime": {"run_id": "a.1", "job_id": "a", "attempt": 1, "timeout_seconds": 5000}}')
        == 900
    )
    assert timeout_of(b'{"anything": 1}') == 60
