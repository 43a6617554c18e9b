"""The API's resolver: its own table of paths and methods (405 + Allow), docstrings as OpenAPI summaries and
descriptions, and dependencies injected through Powertools' ``Depends`` (overridable in tests)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from duetime.api.dependencies import ServiceDeps, service_deps
from duetime.api.resolver import DuetimeResolver, create_app, docstring_parts, rule_pattern
from duetime.api.routers import new_router
from duetime.api.tenancy import Tenant
from duetime.local.lambda_runtime import LocalLambdaContext
from tests.helpers import http_event

router = new_router()


@router.get("/things/<thing_id>")
def get_thing(thing_id: str) -> dict[str, str]:
    """Read a thing.

    The thing, as stored.
    """
    return {"thing": thing_id}


@router.delete("/things/<thing_id>", summary="Remove it")
def delete_thing(thing_id: str) -> dict[str, str]:
    """Delete a thing."""
    return {"deleted": thing_id}


@router.post("/things/<thing_id>/parts/<part_id>")
def add_part(thing_id: str, part_id: str) -> dict[str, str]:
    return {"thing": thing_id, "part": part_id}


@router.get("/whoami")
def whoami(deps: ServiceDeps, tenant: Tenant) -> dict[str, Any]:
    """Who is asking, and with which dependencies."""
    return {"tenant": tenant, "deps": str(deps)}


@pytest.fixture(scope="module")
def app() -> DuetimeResolver:
    made = create_app()
    made.include_router(router)
    return made


def _call(app: DuetimeResolver, method: str, path: str, **kw: Any) -> tuple[int, dict[str, Any], Any]:
    result = app.resolve(http_event(method, path, **kw), LocalLambdaContext("api"))
    headers = {k.lower(): v for k, v in (result.get("headers") or {}).items()}
    return result["statusCode"], headers, json.loads(result["body"])


@pytest.mark.parametrize(
    "path",
    [
        "/things/t1",
        "/things/a b",
        '/things/a"b',
        "/things/a%2Fb",
        "/things/é~!*'()",
        "/things/a\\b",
        "/things/a`b",
        "/things/",
        "/things/t1/",
        "/things//parts/p",
        "/things/t1/parts/p.1",
        "/things/t1/parts",
        "/nowhere",
    ],
)
@pytest.mark.parametrize("method", ["GET", "DELETE", "POST", "PUT"])
def test_the_method_table_matches_the_paths_powertools_routes(
    app: DuetimeResolver, path: str, method: str
) -> None:
    # Given the methods our table holds for a path
    allowed = app.allowed_methods(path)
    # When the path is requested
    status, headers, body = _call(app, method, path)
    # Then a method in the table reached its route, another one is a 405 listing the table, and a path the
    # table does not know is a 404
    if method in allowed:
        assert status == 200, body
    elif allowed:
        assert status == 405 and body["error"]["code"] == "method_not_allowed"
        assert headers["allow"] == ", ".join(allowed)
    else:
        assert status == 404 and body["error"]["code"] == "no_such_route"


def test_a_known_path_with_another_method_is_a_405_naming_the_allowed_ones(app: DuetimeResolver) -> None:
    status, headers, body = _call(app, "PUT", "/things/t1")
    assert (status, headers["allow"]) == (405, "DELETE, GET")
    assert body["error"]["message"] == "PUT is not allowed on /things/t1; use DELETE, GET"


def test_a_rule_pattern_matches_one_whole_segment_per_parameter() -> None:
    pattern = rule_pattern("/jobs/<job_id>/runs")
    assert pattern.match("/jobs/j-1/runs") and pattern.match("/jobs/j.1/runs")
    assert not pattern.match("/jobs/a/b/runs") and not pattern.match("/jobs//runs")
    assert not pattern.match("/jobs/j-1/runs/") and not rule_pattern("/jobs").match("/jobsx")


def test_a_routes_summary_and_description_come_from_its_docstring(app: DuetimeResolver) -> None:
    paths = app.get_openapi_schema().model_dump(by_alias=True, exclude_none=True)["paths"]
    assert (
        paths["/things/{thing_id}"]["get"]["summary"],
        paths["/things/{thing_id}"]["get"]["description"],
    ) == (
        "Read a thing.",
        "The thing, as stored.",
    )
    # an explicit summary wins; a one-line docstring has no description
    assert paths["/things/{thing_id}"]["delete"]["summary"] == "Remove it"
    assert "description" not in paths["/things/{thing_id}"]["delete"]
    # a route without a docstring keeps Powertools' default summary (method and path)
    assert (
        paths["/things/{thing_id}/parts/{part_id}"]["post"]["summary"]
        == "POST /things/{thing_id}/parts/{part_id}"
    )


def test_docstring_parts_joins_the_first_paragraph_into_one_line() -> None:
    def documented() -> None:
        """A summary
        over two lines.

        The description.

        Its second paragraph.
        """

    assert docstring_parts(documented) == (
        "A summary over two lines.",
        "The description.\n\nIts second paragraph.",
    )


def test_dependencies_are_injected_and_overridable(
    app: DuetimeResolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the services' dependencies overridden the way tests do it
    monkeypatch.setitem(app.dependency_overrides, service_deps, lambda: "test-deps")
    # When a route that takes them and the tenant is called by alice
    status, _, body = _call(app, "GET", "/whoami", tenant="alice")
    # Then it got both, and neither is a documented request parameter
    assert (status, body) == (200, {"tenant": "alice", "deps": "test-deps"})
    operation = app.get_openapi_schema().model_dump(by_alias=True, exclude_none=True)["paths"]["/whoami"][
        "get"
    ]
    assert "parameters" not in operation
    assert _call(app, "GET", "/whoami")[2]["tenant"] == "local"


def test_an_unreadable_body_is_refused_before_routing(app: DuetimeResolver) -> None:
    event = http_event("POST", "/things/t1/parts/p", raw_body="[" * 33 + "]" * 33)
    result = app.resolve(event, LocalLambdaContext("api"))
    assert result["statusCode"] == 400
    assert json.loads(result["body"])["error"] == {
        "code": "invalid_json",
        "message": "the request body nests deeper than 32 levels",
        "field": "body",
    }
