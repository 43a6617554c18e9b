"""``GET /jobs`` reads each listed job's last run side by side, not one Query after another."""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import pytest

from duetime.api.routers.jobs import LISTING_READERS
from duetime.config.deps import Deps
from tests.helpers import call

EVERY_MINUTE = {
    "name": "lister",
    "schedule": {"expression": "rate(1 minute)"},
    "task": {"kind": "container", "command": ["true"]},
}


def test_a_listing_reads_its_jobs_last_runs_at_the_same_time(
    api: ModuleType, deps: Deps, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three jobs, each with a run claimed at submit, now due (the clock a minute on)
    ids = [call(api, "POST", "/jobs", {**EVERY_MINUTE, "job_id": f"list-{i}"})[1]["job_id"] for i in range(3)]
    clock.advance(61)
    # And a last-run read that waits until all three reads are under way (a serial listing would wait forever)
    all_reading = threading.Barrier(3, timeout=10)
    real = deps.store.query_runs
    readers: set[str] = set()

    def list_runs_together(job_id: str, **kw: Any) -> Any:
        readers.add(threading.current_thread().name)
        all_reading.wait()
        return real(job_id, **kw)

    monkeypatch.setattr(deps.store, "query_runs", list_runs_together)
    # When the jobs are listed
    status, page, _ = call(api, "GET", "/jobs")
    # Then the three reads overlapped, on three threads, and every job still shows its last run, newest first
    assert status == 200, page
    assert len(readers) == 3
    assert [j["job_id"] for j in page["jobs"]] == list(reversed(ids))
    assert all(j["last_run"]["due_at"] == "2026-11-29T12:01:00.000Z" for j in page["jobs"])


def test_a_page_of_many_jobs_reads_at_most_a_few_at_once(
    api: ModuleType, deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given more jobs than the listing reads at once
    count = LISTING_READERS + 4
    for i in range(count):
        call(api, "POST", "/jobs", {**EVERY_MINUTE, "job_id": f"many-{i}"})
    real = deps.store.query_runs
    lock = threading.Lock()
    reading = peak = 0

    def list_runs_counted(job_id: str, **kw: Any) -> Any:
        nonlocal reading, peak
        with lock:
            reading += 1
            peak = max(peak, reading)
        try:
            return real(job_id, **kw)
        finally:
            with lock:
                reading -= 1

    monkeypatch.setattr(deps.store, "query_runs", list_runs_counted)
    # When a page of all of them is listed
    status, page, _ = call(api, "GET", "/jobs", query={"limit": str(count)})
    # Then each job is there, and no more than LISTING_READERS reads ran at once
    assert status == 200 and len(page["jobs"]) == count
    assert 1 <= peak <= LISTING_READERS


def test_a_throttled_last_run_read_is_a_503(
    api: ModuleType, deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    from duetime.domain.errors import ThrottledError

    for i in range(2):
        call(api, "POST", "/jobs", {**EVERY_MINUTE, "job_id": f"slow-{i}"})

    def throttled(job_id: str, **kw: Any) -> Any:
        raise ThrottledError("DynamoDB kept throttling Query")

    monkeypatch.setattr(deps.store, "query_runs", throttled)
    status, body, headers = call(api, "GET", "/jobs")
    assert status == 503 and body["error"]["code"] == "throttled" and headers["retry-after"] == "1"


def test_a_job_with_slots_claimed_ahead_shows_them_as_its_next_fires_and_not_as_its_last_run(
    api: ModuleType, clock: Any
) -> None:
    # Given a rate(10 seconds) job: its submit claims its slots T0+10s..T0+70s (one claim, 75 s lookahead)
    status, job, _ = call(
        api,
        "POST",
        "/jobs",
        {**EVERY_MINUTE, "job_id": "ahead", "schedule": {"expression": "rate(10 seconds)"}},
    )
    assert status == 201
    # Then its next fires are the claimed slots, not the first unclaimed one (T0+80s), and it has no last run
    assert job["next_fire_times"][:3] == [
        "2026-11-29T12:00:10.000Z",
        "2026-11-29T12:00:20.000Z",
        "2026-11-29T12:00:30.000Z",
    ]
    assert job.get("last_run") is None
    # When 25 s pass: the last run is the one due at T0+20s (still PENDING: no worker here), the next T0+30s
    clock.advance(25)
    status, job, _ = call(api, "GET", "/jobs/ahead")
    assert status == 200
    assert job["last_run"]["due_at"] == "2026-11-29T12:00:20.000Z"
    assert job["next_fire_times"][0] == "2026-11-29T12:00:30.000Z"
    # And in the listing too
    [listed] = call(api, "GET", "/jobs")[1]["jobs"]
    assert listed["last_run"]["due_at"] == "2026-11-29T12:00:20.000Z"
