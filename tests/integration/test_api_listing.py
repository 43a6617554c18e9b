"""``GET /jobs`` reads each listed job's last run side by side, not one Query after another."""

from __future__ import annotations

import threading
from types import ModuleType

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
    api: ModuleType, deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three jobs, each with a run claimed at submit
    ids = [call(api, "POST", "/jobs", {**EVERY_MINUTE, "job_id": f"list-{i}"})[1]["job_id"] for i in range(3)]
    # And a last-run read that waits until all three reads are under way (a serial listing would wait forever)
    all_reading = threading.Barrier(3, timeout=10)
    real = deps.store.list_runs
    readers: set[str] = set()

    def list_runs_together(job_id: str, *, limit: int = 20) -> list:  # type: ignore[type-arg]
        readers.add(threading.current_thread().name)
        all_reading.wait()
        return real(job_id, limit=limit)

    monkeypatch.setattr(deps.store, "list_runs", list_runs_together)
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
    real = deps.store.list_runs
    lock = threading.Lock()
    reading = peak = 0

    def list_runs_counted(job_id: str, *, limit: int = 20) -> list:  # type: ignore[type-arg]
        nonlocal reading, peak
        with lock:
            reading += 1
            peak = max(peak, reading)
        try:
            return real(job_id, limit=limit)
        finally:
            with lock:
                reading -= 1

    monkeypatch.setattr(deps.store, "list_runs", list_runs_counted)
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

    def throttled(job_id: str, *, limit: int = 20) -> list:  # type: ignore[type-arg]
        raise ThrottledError("DynamoDB kept throttling Query")

    monkeypatch.setattr(deps.store, "list_runs", throttled)
    status, body, headers = call(api, "GET", "/jobs")
    assert status == 503 and body["error"]["code"] == "throttled" and headers["retry-after"] == "1"
