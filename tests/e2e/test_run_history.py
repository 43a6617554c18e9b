"""Run history on the live local stack (issue 19): with short hot windows, a job's older runs leave the hot
store for the archive under the state directory and are still listed, found by id and readable."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack

pytestmark = pytest.mark.e2e

#: 0.0005 days is 43.2 s: a run leaves the hot store that long after it finished
RETENTION_DAYS = "0.0005"
KEEP_LAST = 2


@pytest.fixture(scope="module")
def short_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(
        tmp_path_factory.mktemp("history"),
        "--tick-seconds",
        "1",
        "--workers",
        "1",
        "--run-retention-days",
        RETENTION_DAYS,
        "--failed-run-retention-days",
        RETENTION_DAYS,
        "--keep-last-runs",
        str(KEEP_LAST),
    )
    yield s
    stop_stack(s)


def test_older_runs_are_archived_and_still_listed_found_and_readable(short_history: Stack) -> None:
    stack = short_history
    # Given a job triggered four times (its own schedule hourly)
    status, job = stack.request(
        "POST",
        "/jobs",
        {
            "name": "history",
            "schedule": {"expression": "rate(1 hour)"},
            "task": {"kind": "container", "command": ["sh", "-c", 'echo "run $DUETIME_RUN_ID"']},
        },
    )
    assert status == 201, job
    job_id = job["job_id"]
    for _ in range(4):
        status, run = stack.request("POST", f"/jobs/{job_id}/trigger")
        assert status in (200, 201, 202), run
        time.sleep(0.2)
    finished = stack.wait_run(job_id, {"SUCCEEDED"}, count=4, timeout=20)
    # When the hot window has passed for every run but the job's last KEEP_LAST
    deadline = time.monotonic() + 75
    while time.monotonic() < deadline:
        _, body = stack.request("GET", f"/jobs/{job_id}/runs?limit=50")
        runs = body["runs"]
        ended = len(runs) >= 4 and all(r["state"] == "SUCCEEDED" for r in runs)
        if ended and sum(r["archived"] for r in runs) == len(runs) - KEEP_LAST:
            break
        time.sleep(1.0)
    else:
        raise AssertionError(f"runs never archived: {finished}\n" + "".join(stack.output[-30:]))

    # Then the listing still holds every run, newest first: the last KEEP_LAST hot, the rest archived
    assert [r["due_at"] for r in runs] == sorted((r["due_at"] for r in runs), reverse=True)
    assert [r["archived"] for r in runs] == [False] * KEEP_LAST + [True] * (len(runs) - KEEP_LAST)
    # and the archive objects are under the state directory, not in the hot store
    archive = Path(stack.workdir) / ".duetime" / "archive" / "runs"
    assert list(archive.rglob("*.jsonl.gz")), "no archive object under the state directory"
    for old in runs[KEEP_LAST:]:
        # an archived run is found by id, whole, and its log is readable
        status, found = stack.request("GET", f"/runs/{old['run_id']}")
        assert status == 200 and found["archived"] is True, found
        assert (found["state"], found["exit_code"]) == (old["state"], old["exit_code"])
        status, text = stack.request("GET", f"/runs/{old['run_id']}/logs")
        assert status == 200 and text.strip() == f"run {old['run_id']}", text
    # and a deleted job's history stays readable, across both stores
    assert stack.request("DELETE", f"/jobs/{job_id}")[0] in (200, 204)
    _, after = stack.request("GET", f"/jobs/{job_id}/runs?limit=50")
    assert [r["run_id"] for r in after["runs"]] == [r["run_id"] for r in runs]
