"""The OpenAPI document of the real API: every operation tagged by resource, summarised and described by its
handler's docstring, with the error statuses it answers documented in the error shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from duetime.api.resolver import TAGS
from duetime.local.lambda_runtime import LocalLambdaContext, load_module
from tests.helpers import http_event


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    api = load_module("api")
    result = api.lambda_handler(http_event("GET", "/openapi.json"), LocalLambdaContext("api"))
    assert result["statusCode"] == 200
    parsed: dict[str, Any] = json.loads(result["body"])
    return parsed


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, item in schema["paths"].items() for method, op in item.items()]


def test_every_operation_has_one_resource_tag_a_summary_and_a_description(schema: dict[str, Any]) -> None:
    names = [t.name for t in TAGS]
    assert [t["name"] for t in schema["tags"]] == names
    for method, path, op in _operations(schema):
        assert len(op["tags"]) == 1 and op["tags"][0] in names, (method, path)
        assert op["summary"] and op["summary"] != f"{method.upper()} {path}", (method, path)
        assert op["description"], (method, path)


def test_the_routes_are_grouped_by_resource(schema: dict[str, Any]) -> None:
    tagged = {(method, path): op["tags"][0] for method, path, op in _operations(schema)}
    assert tagged[("post", "/jobs")] == tagged[("post", "/jobs/{job_id}/trigger")] == "jobs"
    assert tagged[("get", "/jobs/{job_id}/runs")] == tagged[("get", "/runs/{run_id}/logs")] == "runs"
    assert tagged[("get", "/dead-letters")] == "dead-letters"
    assert tagged[("get", "/schedules/preview")] == "schedules"
    assert tagged[("get", "/healthz")] == "health"


def test_every_error_status_is_documented_in_the_error_shape(schema: dict[str, Any]) -> None:
    for method, path, op in _operations(schema):
        for status, response in op["responses"].items():
            if status.startswith(("4", "5")):
                assert response["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/ErrorResponse"
                }, (method, path, status)
        # the liveness check and a read of the caller's own tenant settings answer no 4xx
        if (method, path) not in (("get", "/healthz"), ("get", "/tenants/me/notifications")):
            assert any(s.startswith("4") for s in op["responses"]), (method, path)
