"""Run history that scales (issue 19): the hot window's tiers, the archive and one API over both.

One job is driven through 1,000 runs over 120 simulated days (a run every 2.88 hours, every 7th failing)
on the embedded store with a fixed clock, the local archiver run after each; then the hot store holds exactly
what the tiers say, and the API lists all 1,000 across the boundary and reads archived runs and their logs.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from duetime.api.tenancy import DEFAULT_TENANT
from duetime.config.deps import sqlite_deps
from duetime.config.settings import Settings
from duetime.domain.archive import DATA_PREFIX, decode_member
from duetime.domain.clock import FixedClock
from duetime.domain.logs import log_key
from duetime.domain.models import Run, RunState
from duetime.services import archiver
from duetime.services.deps import Deps
from tests.contract.conftest import T0
from tests.contract.factories import attempt_end, make_job, make_run, start
from tests.helpers import call

RUNS = 1000
STEP = timedelta(days=120) / RUNS
JOB = "history-job"


@pytest.fixture
def history(tmp_path: Path) -> tuple[Deps, FixedClock]:
    clock = FixedClock(T0)
    settings = Settings(
        state_dir=str(tmp_path),
        run_retention_days=14,
        failed_run_retention_days=90,
        keep_last_runs=20,
    )
    deps = sqlite_deps(settings, clock)
    deps.store.put_new_job(make_job(JOB, tenant=DEFAULT_TENANT, max_attempts=1))
    return deps, clock


@pytest.fixture
def history_api(history: tuple[Deps, FixedClock], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    from duetime.api.dependencies import service_deps
    from duetime.local.lambda_runtime import load_module

    module = load_module("api")
    monkeypatch.setitem(module.app.dependency_overrides, service_deps, lambda: history[0])
    return module


def fails(i: int) -> bool:
    return i % 7 == 3


def drive(deps: Deps, clock: FixedClock, first: int, last: int, *, archive: bool = True) -> None:
    """Runs ``first .. last - 1``: each due, started, logged and ended at its due time + 5 s; the local
    archiver after each."""
    job = deps.store.get_job(JOB)
    assert job is not None
    for i in range(first, last):
        due = T0 + STEP * i
        clock.set(due)
        run = make_run(job, due)
        deps.store.put_new_run(run)
        running = start(deps.store, run, now=due)
        text = f"run {i} output\n".encode()
        deps.logs.put(log_key(JOB, run.run_id, 1), text)
        end = attempt_end(
            running, RunState.FAILED if fails(i) else RunState.SUCCEEDED, now=due + timedelta(seconds=5)
        )
        end = end.__class__(
            **{**end.__dict__, "record": end.record.model_copy(update={"log_bytes": len(text)})}
        )
        deps.store.end_attempt(end)
        if archive:
            clock.set(due + timedelta(seconds=10))
            archiver.archive_expired(deps, deps.store)  # type: ignore[arg-type]


def hot_runs(deps: Deps) -> list[Run]:
    return deps.store.list_runs(JOB, limit=RUNS + 1)


def expected_hot(now: datetime) -> set[int]:
    """The runs the tiers keep hot at ``now``: the last 20, successes finished within 14 days, failures 90."""
    keep = set(range(RUNS - 20, RUNS))
    for i in range(RUNS):
        finished = T0 + STEP * i + timedelta(seconds=5)
        days = 90 if fails(i) else 14
        if finished + timedelta(days=days) > now:
            keep.add(i)
    return keep


def index_of(run: Run) -> int:
    return round((run.due_at - T0) / STEP)


def test_the_hot_store_holds_exactly_what_the_tiers_say(history: tuple[Deps, FixedClock]) -> None:
    deps, clock = history
    # Given 1,000 runs over 120 days, archived as they go
    drive(deps, clock, 0, RUNS)
    # Then the hot store holds the last 20, the successes of the last 14 days and the failures of the last 90
    held = {index_of(r) for r in hot_runs(deps)}
    assert held == expected_hot(clock.now())
    # And the archive holds every other run, once
    archive = deps.archive
    assert archive is not None
    archived = [
        line["run_id"]
        for key in archive.list_keys(DATA_PREFIX)
        for line in decode_member(archive.get(key) or b"")
    ]
    assert len(archived) == len(set(archived)) == RUNS - len(held)


def test_the_listing_returns_all_runs_newest_first_across_the_boundary(
    history: tuple[Deps, FixedClock], history_api: ModuleType
) -> None:
    deps, clock = history
    drive(deps, clock, 0, RUNS)
    # When the job's runs are paged by 50
    seen: list[dict[str, Any]] = []
    token = None
    while True:
        query = {"limit": "50", **({"next_token": token} if token else {})}
        status, page, _ = call(history_api, "GET", f"/jobs/{JOB}/runs", query=query)
        assert status == 200, page
        seen.extend(page["runs"])
        token = page.get("next_token")
        if not token:
            break
    # Then all 1,000 come, newest due first, each once, the archived ones marked
    assert len(seen) == RUNS
    assert [r["due_at"] for r in seen] == sorted((r["due_at"] for r in seen), reverse=True)
    assert len({r["run_id"] for r in seen}) == RUNS
    hot = {r.run_id for r in hot_runs(deps)}
    assert {r["run_id"] for r in seen if not r["archived"]} == hot
    assert sum(r["archived"] for r in seen) == RUNS - len(hot)


def test_a_filter_applies_across_the_boundary(
    history: tuple[Deps, FixedClock], history_api: ModuleType
) -> None:
    deps, clock = history
    drive(deps, clock, 0, 300)
    clock.set(T0 + timedelta(days=400))
    drive(deps, clock, 300, 300)
    archiver.archive_expired(deps, deps.store)  # type: ignore[arg-type]
    status, page, _ = call(history_api, "GET", f"/jobs/{JOB}/runs", query={"state": "FAILED", "limit": "100"})
    assert status == 200, page
    assert [r["state"] for r in page["runs"]] == ["FAILED"] * len([i for i in range(300) if fails(i)])


def test_an_archived_run_and_its_log_are_found_by_id(
    history: tuple[Deps, FixedClock], history_api: ModuleType
) -> None:
    deps, clock = history
    drive(deps, clock, 0, RUNS)
    # Given the first run, long archived, and its log file gone from the logs store
    run = make_run(deps.store.get_job(JOB), T0)  # type: ignore[arg-type]
    assert deps.store.get_run(JOB, T0) is None
    (Path(deps.settings.state_dir or "") / "logs" / log_key(JOB, run.run_id, 1)).unlink()
    # When it and its log are read by id
    status, body, _ = call(history_api, "GET", f"/runs/{run.run_id}")
    log_status, text, _ = call(history_api, "GET", f"/runs/{run.run_id}/logs")
    # Then both come from the archive
    assert status == 200, body
    assert (body["archived"], body["state"], body["attempts"][0]["state"]) == (True, "SUCCEEDED", "SUCCEEDED")
    assert log_status == 200
    assert text == "run 0 output\n"
    # And a hot run says it is not archived
    status, body, _ = call(history_api, "GET", f"/runs/{hot_runs(deps)[0].run_id}")
    assert (status, body["archived"]) == (200, False)


def test_a_deleted_jobs_history_stays_readable(
    history: tuple[Deps, FixedClock], history_api: ModuleType
) -> None:
    deps, clock = history
    drive(deps, clock, 0, 100)
    clock.set(clock.now() + timedelta(days=100))
    archiver.archive_expired(deps, deps.store)  # type: ignore[arg-type]
    status, _, _ = call(history_api, "DELETE", f"/jobs/{JOB}")
    assert status in (200, 202), status
    status, page, _ = call(history_api, "GET", f"/jobs/{JOB}/runs", query={"limit": "100"})
    assert status == 200, page
    assert len(page["runs"]) == 100
    assert sum(r["archived"] for r in page["runs"]) == 80


def test_an_archiver_crash_mid_batch_loses_and_duplicates_nothing(
    history: tuple[Deps, FixedClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    deps, clock = history
    drive(deps, clock, 0, 200, archive=False)
    clock.set(clock.now() + timedelta(days=100))
    # Given an archiver that dies after writing the archive and before deleting the runs from the hot store
    real = deps.store.delete_runs  # type: ignore[attr-defined]

    def crash(keys: Any) -> int:
        raise RuntimeError("killed between the archive write and the hot delete")

    monkeypatch.setattr(deps.store, "delete_runs", crash)
    with pytest.raises(RuntimeError):
        archiver.archive_expired(deps, deps.store)  # type: ignore[arg-type]
    # And one that dies half way through writing a batch's objects
    archive = deps.archive
    assert archive is not None
    put = archive.put
    writes = 0

    def dying_put(key: str, data: bytes) -> None:
        nonlocal writes
        writes += 1
        if writes == 2:
            raise RuntimeError("killed mid-batch")
        put(key, data)

    monkeypatch.setattr(archive, "put", dying_put)
    monkeypatch.setattr(deps.store, "delete_runs", real)
    with pytest.raises(RuntimeError):
        archiver.archive_expired(deps, deps.store)  # type: ignore[arg-type]
    # When the archiver runs again whole
    monkeypatch.setattr(archive, "put", put)
    assert archiver.archive_expired(deps, deps.store) == 180  # type: ignore[arg-type]
    # Then every run is in exactly one place: 20 hot, 180 archived once
    lines = [
        line["run_id"]
        for key in archive.list_keys(DATA_PREFIX)
        for line in decode_member(archive.get(key) or b"")
    ]
    assert len(hot_runs(deps)) == 20
    assert len(lines) == len(set(lines)) == 180
