"""Page tokens: paging returns every item once, in order; a token the store did not issue for this very
listing (same job, same tenant) raises PageTokenError."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from duetime.domain.errors import PageTokenError
from duetime.domain.models import JobSummary, RunState
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import attempt_end, make_job, put_run, start

TOTAL, PAGE = 25, 10
S = timedelta(seconds=1)


def pages(read: Callable[[str | None], tuple[list[Any], str | None]]) -> list[list[Any]]:
    """Every page of a listing, following its tokens from the first page to the one with None."""
    out, token = [], None
    for _ in range(TOTAL + 2):  # bounded: a token that never ends fails the test
        items, token = read(token)
        out.append(items)
        if token is None:
            return out
    raise AssertionError("the listing never ended")


def _runs(adapters: Adapters, job_id: str, count: int = TOTAL) -> list:
    job = make_job(job_id)
    return [put_run(adapters.store, job, T0 + i * S, now=T0) for i in range(count)]


def _jobs(adapters: Adapters, tenant: str, count: int = TOTAL) -> list:
    jobs = [make_job(f"{tenant}-{i:02d}", tenant=tenant, created_at=T0 + i * S) for i in range(count)]
    for job in jobs:
        adapters.store.put_new_job(job)
    return jobs


def _dead_letters(adapters: Adapters, tenant: str, count: int = TOTAL) -> list:
    job = make_job(f"{tenant}-dead", tenant=tenant, max_attempts=1)
    dead = []
    for i in range(count):
        running = start(adapters.store, put_run(adapters.store, job, T0 + i * S), now=T0)
        dead.append(adapters.store.end_attempt(attempt_end(running, RunState.FAILED, now=T0 + (100 + i) * S)))
    return dead


# ---- all of them, once, in order ---------------------------------------------------------------------------
def test_query_runs_pages_through_25_runs_10_at_a_time_newest_first(adapters: Adapters) -> None:
    runs = _runs(adapters, "paged")
    got = pages(lambda token: adapters.store.query_runs("paged", limit=PAGE, page_token=token))
    assert [len(p) for p in got] == [10, 10, 5]
    assert [r.due_at for p in got for r in p] == [r.due_at for r in reversed(runs)]


def test_a_listing_that_ends_on_a_full_page_gives_no_token_on_it(adapters: Adapters) -> None:
    job = make_job("paged-exact")
    for i in range(2 * PAGE):
        put_run(adapters.store, job, T0 + i * S, now=T0)
    got = pages(lambda token: adapters.store.query_runs("paged-exact", limit=PAGE, page_token=token))
    assert [len(p) for p in got] == [PAGE, PAGE]  # "None on the last page": not a third, empty one
    assert adapters.store.query_runs("paged-exact", limit=2 * PAGE)[1] is None


def test_query_runs_pages_with_a_filter_return_every_match_once(adapters: Adapters) -> None:
    runs = _runs(adapters, "paged-filtered")
    for run in runs[::2]:  # 13 of them end SKIPPED
        adapters.store.skip_pending(run.job_id, run.due_at, attempt=1, reason="missed", now=T0)
    got = pages(
        lambda token: adapters.store.query_runs(
            "paged-filtered", limit=PAGE, page_token=token, state="PENDING", active_only=True
        )
    )
    assert all(len(p) <= PAGE for p in got)
    assert [r.due_at for p in got for r in p] == [r.due_at for r in reversed(runs[1::2])]


def test_list_jobs_pages_through_25_jobs_10_at_a_time_newest_first(adapters: Adapters) -> None:
    jobs = _jobs(adapters, "t-paged")
    got = pages(lambda token: adapters.store.list_jobs("t-paged", limit=PAGE, page_token=token))
    assert [len(p) for p in got] == [10, 10, 5]
    assert [j.job_id for p in got for j in p] == [j.job_id for j in reversed(jobs)]


def test_job_summaries_page_like_list_jobs_and_a_sparse_name_filter_returns_every_match_once(
    adapters: Adapters,
) -> None:
    # Given 60 jobs of which every 13th is named "needle ..." (5 of them, far apart in the listing)
    jobs = [
        make_job(
            f"t-sparse-{i:02d}",
            tenant="t-sparse",
            name=f"needle {i}" if i % 13 == 0 else f"hay {i}",
            created_at=T0 + i * S,
        )
        for i in range(60)
    ]
    for job in jobs:
        adapters.store.put_new_job(job)
    store = adapters.store
    # When the listing is paged as summaries, with and without the filter
    everything = pages(lambda token: store.list_job_summaries("t-sparse", limit=PAGE, page_token=token))
    needles = pages(
        lambda token: store.list_job_summaries("t-sparse", limit=2, page_token=token, name_prefix="needle")
    )
    # Then the summaries are list_jobs' page (same order, same tokens), every match comes once, newest first
    first, token = store.list_jobs("t-sparse", limit=PAGE)
    assert store.list_job_summaries("t-sparse", limit=PAGE) == ([JobSummary.of(j) for j in first], token)
    assert [j.job_id for p in everything for j in p] == [j.job_id for j in reversed(jobs)]
    assert all(len(p) <= 2 for p in needles)
    assert [j.name for p in needles for j in p] == [
        "needle 52",
        "needle 39",
        "needle 26",
        "needle 13",
        "needle 0",
    ]


def test_query_dead_letters_pages_through_25_most_recent_first(adapters: Adapters) -> None:
    dead = _dead_letters(adapters, "t-paged-dead")
    got = pages(lambda token: adapters.store.query_dead_letters("t-paged-dead", limit=PAGE, page_token=token))
    assert [len(p) for p in got] == [10, 10, 5]
    assert [r.due_at for p in got for r in p] == [r.due_at for r in reversed(dead)]


# ---- forged tokens ---------------------------------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


FORGED = {
    "random-base64": _b64(os.urandom(48)),
    "garbage": "not a token!",
    "base64-json-list": _b64(json.dumps(["job_id", "due_at"]).encode()),
    "base64-json-object": _b64(json.dumps({"page": 2}).encode()),
}


@pytest.mark.parametrize("token", FORGED.values(), ids=FORGED.keys())
def test_a_forged_token_raises_page_token_error_on_every_listing(adapters: Adapters, token: str) -> None:
    store = adapters.store
    _runs(adapters, "forged", PAGE + 1)
    with pytest.raises(PageTokenError):
        store.query_runs("forged", limit=PAGE, page_token=token)
    with pytest.raises(PageTokenError):
        store.list_jobs("t1", limit=PAGE, page_token=token)
    with pytest.raises(PageTokenError):
        store.query_dead_letters("t1", limit=PAGE, page_token=token)


def test_a_token_of_another_jobs_runs_raises_page_token_error(adapters: Adapters) -> None:
    _runs(adapters, "job-a", PAGE + 1)
    _runs(adapters, "job-b", PAGE + 1)
    _, token = adapters.store.query_runs("job-a", limit=PAGE)
    assert token is not None
    with pytest.raises(PageTokenError):
        adapters.store.query_runs("job-b", limit=PAGE, page_token=token)
    # the token still works for its own listing
    assert len(adapters.store.query_runs("job-a", limit=PAGE, page_token=token)[0]) == 1


def test_a_token_of_another_tenants_list_raises_page_token_error(adapters: Adapters) -> None:
    store = adapters.store
    _jobs(adapters, "t-a", PAGE + 1)
    _jobs(adapters, "t-b", PAGE + 1)
    _, jobs_token = store.list_jobs("t-a", limit=PAGE)
    assert jobs_token is not None
    with pytest.raises(PageTokenError):
        store.list_jobs("t-b", limit=PAGE, page_token=jobs_token)
    _dead_letters(adapters, "t-a", count=PAGE + 1)
    _dead_letters(adapters, "t-b", count=PAGE + 1)
    _, dead_token = store.query_dead_letters("t-a", limit=PAGE)
    assert dead_token is not None
    with pytest.raises(PageTokenError):
        store.query_dead_letters("t-b", limit=PAGE, page_token=dead_token)


def test_a_token_of_another_kind_of_listing_raises_page_token_error(adapters: Adapters) -> None:
    store = adapters.store
    _runs(adapters, "kinds", PAGE + 1)
    _jobs(adapters, "t1", PAGE + 1)
    _dead_letters(adapters, "t1", count=PAGE + 1)
    tokens = {
        "runs": store.query_runs("kinds", limit=PAGE)[1],
        "jobs": store.list_jobs("t1", limit=PAGE)[1],
        "dead": store.query_dead_letters("t1", limit=PAGE)[1],
    }
    assert None not in tokens.values()
    reads: dict[str, Callable[[str], object]] = {
        "runs": lambda t: store.query_runs("kinds", limit=PAGE, page_token=t),
        "jobs": lambda t: store.list_jobs("t1", limit=PAGE, page_token=t),
        "dead": lambda t: store.query_dead_letters("t1", limit=PAGE, page_token=t),
    }
    for issued_by, token in tokens.items():
        for listing, read in reads.items():
            if listing != issued_by:
                with pytest.raises(PageTokenError):
                    read(token)  # type: ignore[arg-type]
