"""`duetime local --slots N`: each worker process of the stack runs up to N tasks at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.conftest import start_stack, stop_stack

pytestmark = pytest.mark.e2e


def test_one_worker_with_two_slots_runs_two_tasks_at_once(tmp_path: Path) -> None:
    # Given a stack with one worker per tier, two slots each
    stack = start_stack(tmp_path, "--tick-seconds", "1", "--workers", "1", "--slots", "2")
    try:
        # When two large jobs of 3 s are submitted (a large worker's default is one slot)
        job_ids = []
        for i in range(2):
            body = {
                "name": f"slot{i}",
                "task": {"kind": "container", "command": ["sleep", "3"], "tier": "large"},
            }
            status, job = stack.request("POST", "/jobs", body)
            assert status == 201, job
            job_ids.append(job["job_id"])
        # Then both run at the same time, held by the one large worker process
        deadline = time.monotonic() + 30
        owners: list[str] = []
        while time.monotonic() < deadline:
            runs = [stack.request("GET", f"/jobs/{j}/runs")[1]["runs"][0] for j in job_ids]
            if all(r["state"] == "RUNNING" for r in runs):
                owners = [r["lease_owner"] for r in runs]
                break
            time.sleep(0.1)
        assert len(owners) == 2, "the two runs were never RUNNING at once\n" + "".join(stack.output[-30:])
        assert owners[0] == owners[1]
        # And both succeed
        for job_id in job_ids:
            [run] = stack.wait_run(job_id, {"SUCCEEDED"}, timeout=30)
            assert [a["attempt"] for a in run["attempts"]] == [1]
    finally:
        stop_stack(stack)
