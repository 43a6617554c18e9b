"""What the console's jobs page reads from DynamoDB (moto): one page of the listing index and one Query of each
listed job's recent runs, whatever the tenant holds; the jobs themselves are never read (no BatchGetItem)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.resources import JOBS_BY_TENANT_INDEX
from duetime.api.console.routes import PAGE_SIZE
from tests.helpers import call

NIGHTLY = {
    "schedule": {"expression": "cron(0 3 * * ? *)", "timezone": "Europe/Paris"},
    "task": {"kind": "container", "command": ["true"]},
}


@pytest.fixture
def dynamodb_calls(aws_mock: None) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every DynamoDB call made through Duetime's cached client while the test runs: (operation, params)."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        seen.append((model.name, params))

    events = aws.client("dynamodb").meta.events
    events.register("provide-client-params.dynamodb.*", record)
    yield seen
    events.unregister("provide-client-params.dynamodb.*", record)


def test_the_jobs_page_reads_one_index_page_and_each_listed_jobs_runs(
    api: ModuleType, clock: Any, dynamodb_calls: list[tuple[str, dict[str, Any]]]
) -> None:
    # Given a tenant with more jobs than a page (two pages and a bit), created a second apart
    for i in range(2 * PAGE_SIZE + 3):
        assert call(api, "POST", "/jobs", {**NIGHTLY, "name": f"report {i}"})[0] == 201
        clock.advance(1)
    dynamodb_calls.clear()
    # When its jobs page is shown
    status, page, _ = call(api, "GET", "/console/jobs")
    # Then it lists the newest page, from one Query of the listing index asking for one page
    assert status == 200
    assert page.count("<tr>") - 1 == PAGE_SIZE
    assert f"report {2 * PAGE_SIZE + 2}<" in page and "report 2<" not in page
    operations = Counter(op for op, _ in dynamodb_calls)
    index_queries = [
        p for op, p in dynamodb_calls if op == "Query" and p.get("IndexName") == JOBS_BY_TENANT_INDEX
    ]
    assert len(index_queries) == 1
    assert index_queries[0]["Limit"] == PAGE_SIZE
    # And one Query of each listed job's runs (the table, no index), and no read of the jobs themselves
    assert operations == Counter({"Query": 1 + PAGE_SIZE})
    run_queries = [p for op, p in dynamodb_calls if op == "Query" and "IndexName" not in p]
    assert len({p["ExpressionAttributeValues"][":j"]["S"] for p in run_queries}) == PAGE_SIZE


def test_a_sparse_name_filter_reads_ever_larger_pages_of_the_index(
    api: ModuleType, clock: Any, dynamodb_calls: list[tuple[str, dict[str, Any]]]
) -> None:
    # Given 120 jobs of which the oldest 2 match a name filter
    for i in range(120):
        name = f"needle {i}" if i < 2 else f"hay {i}"
        assert call(api, "POST", "/jobs", {**NIGHTLY, "name": name})[0] == 201
        clock.advance(1)
    dynamodb_calls.clear()
    # When the jobs page is filtered by that name
    status, page, _ = call(api, "GET", "/console/jobs", query={"name": "needle"})
    # Then both matches are shown, found with a few Queries of growing Limit (not one per 25 jobs)
    assert status == 200
    assert "needle 0<" in page and "needle 1<" in page and "hay" not in page
    limits = [p["Limit"] for op, p in dynamodb_calls if p.get("IndexName") == JOBS_BY_TENANT_INDEX]
    assert limits == [PAGE_SIZE, 4 * PAGE_SIZE]


@pytest.mark.parametrize("attempt", ["²", "١"])
def test_a_log_attempt_in_digits_that_are_not_ascii_is_a_404_page(api: ModuleType, attempt: str) -> None:
    # Given a run (claimed at submit)
    _, job, _ = call(
        api, "POST", "/jobs", {"name": "nightly", **NIGHTLY, "schedule": {"expression": "rate(1 minute)"}}
    )
    _, runs, _ = call(api, "GET", f"/jobs/{job['job_id']}/runs")
    run_id = runs["runs"][0]["run_id"]
    # When its console page is asked for attempt `²` (int() raises on it) or `١` (int() reads 1)
    status, _, _ = call(api, "GET", f"/console/runs/{run_id}/log", query={"attempt": attempt})
    # Then the page says there is no such log, rather than failing
    assert status == 404
