"""The console's routing through the real API handler (moto): where a sign-in goes on to, the console's root
with a trailing slash, and query parameters a page does not take."""

from __future__ import annotations

from types import ModuleType

import pytest

from duetime.api.console.render import CSRF_COOKIE, CSRF_FIELD
from tests.helpers import call

CSRF = "a" * 64


def sign_in(api: ModuleType, goal: str) -> tuple[int, str]:
    """POST the sign-in form (with its CSRF token) going on to ``goal``; returns (status, Location)."""
    body = f"{CSRF_FIELD}={CSRF}&token=alice-token&next={goal}"
    status, _, headers = call(
        api,
        "POST",
        "/console/sign-in",
        raw_body=body,
        headers={"content-type": "application/x-www-form-urlencoded", "cookie": f"{CSRF_COOKIE}={CSRF}"},
    )
    return status, headers.get("location", "")


@pytest.mark.parametrize(
    "goal",
    [
        "/console/../jobs",
        "/console/%2e%2e/jobs",
        "/console/%2E%2E/openapi.json",
        "/console/runs/../../docs",
        "/console/..",
        "/console/.%2e/",
        "/console/%5c%5cevil.example",
        "/console/\\evil.example",
        "/console/%2f%2fevil.example",
        "https://evil.example/",
        "//evil.example/x",
        "/jobs",
    ],
)
def test_a_sign_in_never_goes_on_outside_the_console(api: ModuleType, goal: str) -> None:
    # When the sign-in form is posted with a next page that leaves the console once its dot segments resolve
    status, location = sign_in(api, goal.replace("%", "%25").replace("\\", "%5C"))
    # Then it goes on to the jobs page
    assert (status, location) == (303, "/console/jobs")


@pytest.mark.parametrize(
    ("goal", "expected"),
    [
        ("/console/jobs/j1", "/console/jobs/j1"),
        ("/console/runs/r1/../../jobs", "/console/jobs"),
        ("/console/./dead-letters", "/console/dead-letters"),
        ("/console/jobs?state=PAUSED", "/console/jobs?state=PAUSED"),
    ],
)
def test_a_sign_in_goes_on_to_the_console_page_it_names(api: ModuleType, goal: str, expected: str) -> None:
    # When the next page is a console page (dot segments resolved within the console)
    status, location = sign_in(api, goal.replace("%", "%25").replace("?", "%3F").replace("=", "%3D"))
    # Then that is where it goes
    assert (status, location) == (303, expected)


@pytest.mark.parametrize("path", ["/console", "/console/"])
def test_the_console_root_with_or_without_a_slash_goes_to_the_jobs_page(api: ModuleType, path: str) -> None:
    status, _, headers = call(api, "GET", path)
    assert (status, headers.get("location")) == (303, "/console/jobs")


@pytest.mark.parametrize(
    ("path", "query", "named"),
    [
        ("/console/jobs", {"name_prefix": "a"}, "name_prefix"),
        ("/console/jobs", {"foo": "1"}, "foo"),
        ("/console/jobs", {"state": "ACTIVE", "zzz": "1"}, "zzz"),
        ("/console/dead-letters", {"limit": "5"}, "limit"),
        ("/console/lag", {"minutes": "5"}, "minutes"),
    ],
)
def test_a_query_parameter_a_page_does_not_take_is_a_400_page_naming_it(
    api: ModuleType, path: str, query: dict[str, str], named: str
) -> None:
    # When a console page is asked for with a parameter it does not read
    status, page, headers = call(api, "GET", path, query=query)
    # Then the answer is the console's 400 page (HTML, not the API's JSON) naming it and what the page takes
    assert status == 400
    assert headers["content-type"].startswith("text/html")
    assert f"{named}: unknown query parameter of {path}" in page
    assert f"(field <code>{named}</code>)" in page


def test_the_parameters_a_page_takes_are_still_taken(api: ModuleType) -> None:
    status, page, _ = call(api, "GET", "/console/jobs", query={"state": "ACTIVE", "name": "a"})
    assert status == 200 and "unknown query parameter" not in page
