"""The API's error answers, and Duetime's own list of AWS throttling error codes."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from duetime.adapters.aws.errors import THROTTLING_CODES
from duetime.api.errors import (
    aws_error,
    error_response,
    error_result,
    field_of,
    quota_exceeded,
)
from duetime.domain.errors import QuotaExceededError


def test_ours_includes_every_throttling_code_botocore_retries() -> None:
    # A drift warning only: botocore keeps its list private (ThrottledRetryableChecker), so Duetime keeps its
    # own; when botocore learns a new throttling code, this says which one to add to THROTTLING_CODES.
    from botocore.retries.standard import ThrottledRetryableChecker

    theirs = getattr(ThrottledRetryableChecker, "_THROTTLED_ERROR_CODES", None)
    if theirs is None:
        pytest.skip("botocore no longer has _THROTTLED_ERROR_CODES: nothing to compare with")
    assert set(theirs) - set(THROTTLING_CODES) == set()


@pytest.mark.parametrize(
    "code", ["ProvisionedThroughputExceededException", "ThrottlingException", "RequestThrottled", "SlowDown"]
)
def test_a_throttled_aws_call_is_a_503_with_retry_after(code: str) -> None:
    refused = ClientError({"Error": {"Code": code, "Message": "slow down"}}, "Query")
    response = aws_error(refused)
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert json.loads(response.body)["error"] == {
        "code": "throttled",
        "message": f"AWS throttled Query ({code}); try again shortly",
        "field": None,
    }


def test_any_other_aws_error_stays_a_server_error() -> None:
    denied = ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "PutItem")
    with pytest.raises(ClientError):
        aws_error(denied)


def test_a_quota_that_waiting_frees_is_a_429_and_one_that_needs_a_delete_a_409() -> None:
    later = quota_exceeded(QuotaExceededError("5 submits a minute", retry_after=12))
    assert (later.status_code, later.headers["Retry-After"]) == (429, "12")
    assert json.loads(later.body)["error"]["code"] == "too_many_requests"
    full = quota_exceeded(QuotaExceededError("100 jobs"))
    assert full.status_code == 409 and "Retry-After" not in full.headers
    assert json.loads(full.body)["error"]["code"] == "quota_exceeded"


def test_the_error_shape_is_the_same_from_a_route_and_before_routing() -> None:
    response = error_response(400, "invalid_json", "nope", "body")
    result = error_result(400, "invalid_json", "nope", "body")
    assert response.body == result["body"]
    assert json.loads(result["body"]) == {
        "error": {"code": "invalid_json", "message": "nope", "field": "body"}
    }
    assert (result["statusCode"], result["headers"]) == (400, {"Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("loc", "field"),
    [
        (("body", "task", "command", 0), "task.command.0"),
        (("body", "task", "lambda", "function"), "task.function"),
        (("body", "schedule", "function-after[check(), str]"), "schedule"),
        (("query", "limit"), "limit"),
        (("body",), "body"),
        (("body", "task", "container", "env", "A=B", "[key]"), "task.env"),
    ],
)
def test_an_error_location_names_the_request_field(loc: tuple[object, ...], field: str) -> None:
    assert field_of(loc) == field
