"""Catch-up after an outage: a stack stopped for 2 minutes (moto kept) follows each job's catch-up policy.

Catch-up is defined once (DESIGN.md section 5): a slot is missed when its run would start more than
``catch_up.tolerance_seconds`` after its due time, whatever made it late and whether it was claimed before
the stop (the tick claims 75 s ahead) or after the restart. ``make faults`` only: it takes 3 minutes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack, stop_stack
from tests.faults.conftest import runs_of

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(os.environ.get("DUETIME_FAULTS_FULL") != "1", reason="make faults only"),
]

TOLERANCE = 15.0


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _started(run: dict) -> bool:
    return run["started_at"] is not None or bool(run["attempts"])


def test_a_stack_down_for_two_minutes_follows_each_jobs_catch_up_policy(
    moto_endpoint: str, stacks: Callable[..., Stack], tmp_path: Path
) -> None:
    args = ("--workers", "1", "--aws-endpoint", moto_endpoint)  # the default 60 s tick
    first = stacks(tmp_path / "a", *args)
    jobs = {}
    for policy in ("none", "latest", "all"):
        body = {
            "job_id": f"outage-{policy}",
            "name": f"outage-{policy}",
            "schedule": {"expression": "rate(10 seconds)"},
            "task": {"kind": "container", "command": ["true"]},
            "catch_up": {"policy": policy, "tolerance_seconds": TOLERANCE},
        }
        status, job = first.request("POST", "/jobs", body)
        assert status == 201, job
        jobs[policy] = job
    # Given each job has run on time once, the stack stops for 2 minutes (its claims 75 s ahead stay behind)
    time.sleep(13)
    assert stop_stack(first) == 0
    stopped_at = datetime.now(UTC)
    time.sleep(120)
    # restart 6 s after a slot (mod 10 s): the slots 6 and 16 s before the restart lie well inside and well
    # outside the 15 s tolerance however long the stack takes to come up (up to ~8 s)
    created = _ts(jobs["latest"]["created_at"])
    phase = (datetime.now(UTC) - created).total_seconds() % 10
    time.sleep((6 - phase) % 10)
    restarted_at = datetime.now(UTC)
    second = stacks(tmp_path / "b", *args)
    time.sleep(30)
    for policy, job in jobs.items():
        found = sorted(runs_of(second, job["job_id"]), key=lambda r: r["due_at"])
        created = _ts(job["created_at"])
        slots = [created + timedelta(seconds=10 * k) for k in range(1, 400)]
        down = [s for s in slots if stopped_at < s <= restarted_at]
        by_due = {_ts(r["due_at"]): r for r in found}
        ran_late = [
            s for s in down if s in by_due and _started(by_due[s]) and by_due[s]["lag_seconds"] > TOLERANCE
        ]
        long_missed = [s for s in down if (restarted_at - s).total_seconds() > TOLERANCE]
        ran_long_missed = [s for s in long_missed if s in by_due and _started(by_due[s])]
        # Then of the slots due more than 15 s before the restart `none` ran none, `latest` one (the newest),
        # `all` every one; a slot due less than that before the restart ran on time
        assert len(long_missed) >= 10, (policy, long_missed)
        expected = {"none": [], "latest": long_missed[-1:], "all": long_missed}[policy]
        assert ran_long_missed == expected, (policy, found)
        if policy != "all":
            assert all(by_due[s]["lag_seconds"] > TOLERANCE for s in ran_late) and len(ran_late) == len(
                expected
            )
        # And each slot of the outage either ran or is counted in missed_slots (SKIPPED `missed` or never claimed)
        not_run = [s for s in down if not (s in by_due and _started(by_due[s]))]
        assert {(by_due[s]["state"], by_due[s]["error"]) for s in not_run if s in by_due} <= {
            ("SKIPPED", "missed")
        }
        status, stored = second.request("GET", f"/jobs/{job['job_id']}")
        assert status == 200 and stored["missed_slots"] == len(not_run), (policy, stored, not_run)
        # And after the restart the schedule runs on time again
        recent = [
            r
            for r in found
            if restarted_at + timedelta(seconds=5)
            < _ts(r["due_at"])
            < datetime.now(UTC) - timedelta(seconds=3)
        ]
        assert recent and all(r["state"] == "SUCCEEDED" and r["lag_seconds"] < 5 for r in recent), found
