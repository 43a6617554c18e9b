"""Faults of the whole stack: a restart while runs are in flight, and a throttled store; on both backends.

On moto the restart uses a moto server owned by the test (``duetime local --aws-endpoint``), so the tables and
queues outlive the stack's processes; on sqlite the second stack starts in the first one's directory, on its
state file. Throttling on moto is injected into every process of the stack by ``inject/sitecustomize.py``
(botocore ``before-send`` hooks), per HTTP attempt, so botocore's standard retries get most calls through and a
few give up. On sqlite the real fault is another process holding the file's write lock: the test process takes
``BEGIN IMMEDIATE`` and holds it for intervals shorter and longer than the adapter's busy timeout, so writers
wait, and some wait in vain (``ThrottledError``); ``inject/sitecustomize.py`` counts both in every process.
Both scenarios are slow: their moto variants run under ``make faults`` only (``SLOW``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime.adapters.sqlite.db import BUSY_TIMEOUT_MS
from tests.faults.conftest import (
    FAST,
    FULL,
    TERMINAL,
    Effects,
    Stack,
    WriteLockHolder,
    backend_params,
    faulty_env,
    kill_stack_hard,
    logged_failures,
    run_problems,
    runs_of,
    stack_state,
    stop_stack,
    unwatched,
    wait_for,
)

pytestmark = pytest.mark.faults


def _submit(stack: Stack, job_id: str, command: list[str], **fields: Any) -> str:
    """Submit (retrying a 5xx: the API itself may be throttled; a 409 then means the first try stored it)."""
    body = {"job_id": job_id, "name": "faults", "task": {"kind": "container", "command": command}, **fields}
    for _ in range(10):
        status, answer = stack.request("POST", "/jobs", body)
        if status in (201, 409):
            return job_id
        assert status >= 500, answer
    raise AssertionError(f"could not submit {job_id}: {answer}")


def _rate_until(seconds: float) -> dict[str, Any]:
    end = datetime.now(UTC) + timedelta(seconds=seconds)
    return {"expression": "rate(10 seconds)", "end_at": end.isoformat()}


def _at(when: datetime) -> dict[str, Any]:
    return {"expression": f"at({when:%Y-%m-%dT%H:%M:%S})"}


def _all_settled(stack: Stack, job_ids: list[str]) -> list[dict[str, Any]] | None:
    runs = [r for j in job_ids for r in runs_of(stack, j)]
    done = all(stack.request("GET", f"/jobs/{j}")[1]["next_fire_at"] is None for j in job_ids)
    return runs if done and runs and all(r["state"] in TERMINAL for r in runs) else None


def _check_schedule_covered(stack: Stack, job_id: str, runs: list[dict[str, Any]], period: float) -> None:
    """Never lost: every 2 s slot of the rate job has a run, or was counted as missed by catch-up."""
    _, job = stack.request("GET", f"/jobs/{job_id}")
    dues = sorted(datetime.fromisoformat(r["due_at"].replace("Z", "+00:00")) for r in runs)
    gaps = sum(round((b - a).total_seconds() / period) - 1 for a, b in zip(dues, dues[1:], strict=False))
    assert gaps <= job.get("missed_slots", 0), (gaps, job)


#: the slow scenarios' moto variants run under `make faults` only (both together would cost `make test` about a
#: minute on 2 cores); their sqlite variants always run
SLOW = backend_params(moto_full_only=True)


@pytest.mark.parametrize(
    "how", ["sigterm", pytest.param("sigkill", marks=pytest.mark.skipif(not FULL, reason="make faults only"))]
)
@pytest.mark.parametrize("backend", SLOW, indirect=True)
def test_a_stack_restarted_while_runs_are_in_flight_completes_every_run(
    backend: str,
    request: pytest.FixtureRequest,
    stacks: Callable[..., Stack],
    effects: Effects,
    tmp_path: Path,
    how: str,
) -> None:
    if backend == "moto":  # the tables and queues live in a moto server the test owns
        args = (*FAST, "--workers", "2", "--aws-endpoint", request.getfixturevalue("moto_endpoint"))
        second_dir = tmp_path / "b"
    else:  # the second stack starts on the first one's state directory
        args = (*FAST, "--workers", "2")
        second_dir = tmp_path / "a"
    first = stacks(tmp_path / "a", *args, backend=backend)
    retry = {"max_attempts": 4, "backoff_seconds": 0}
    # Given runs in flight: three 3-second run-now jobs and a job firing every 10 s for 30 s
    job_ids = [_submit(first, f"inflight{i}", effects.command("sleep 3"), retry=retry) for i in range(3)]
    job_ids.append(_submit(first, "rate", effects.command("sleep 1"), retry=retry, schedule=_rate_until(30)))
    wait_for(
        "runs in flight",
        lambda: sum(r["state"] == "RUNNING" for j in job_ids for r in runs_of(first, j)) >= 2,
    )
    state = stack_state(first)
    # When the whole stack stops: politely (SIGTERM: workers stop their tasks and fail the attempt), or
    # at once (SIGKILL to every process: nothing gets to say anything)
    if how == "sigterm":
        assert stop_stack(first) == 0
    else:
        kill_stack_hard(first)
    assert unwatched(state.runs()) == [], "a run nothing would ever look at again"
    # And a new stack starts on the same state
    second = stacks(second_dir, *args, backend=backend)
    # Then every run of every job completes, each attempt accounted for
    runs = wait_for("every run to settle", lambda: _all_settled(second, job_ids), timeout=90, every=1)
    problems = [p for r in runs for p in run_problems(r, effects.of(r["run_id"]))]
    assert problems == []
    assert Counter(r["state"] for r in runs) == {"SUCCEEDED": len(runs)}
    interrupted = [r for r in runs if r["attempt"] > 1]
    assert interrupted, "no run was in flight across the restart"
    reasons = {a.get("reason") for r in interrupted for a in r["attempts"][:-1]}
    assert reasons <= {"worker_stopped", "worker_lost"}, reasons
    _check_schedule_covered(second, "rate", [r for r in runs if r["job_id"] == "rate"], 10.0)


#: how long the test process holds the SQLite write lock, in turn (0.5 s apart): shorter and longer than the
#: adapter's busy timeout (5 s), so writers of every process wait, and some wait in vain
LOCK_HOLDS = [1.0, 3.0, 6.5, 2.0, 6.5]


@pytest.mark.parametrize("backend", SLOW, indirect=True)
def test_a_throttled_store_still_runs_everything_once_or_retries_it(
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
    stacks: Callable[..., Stack],
    effects: Effects,
    tmp_path: Path,
) -> None:
    control = tmp_path / "faults.json"
    control.write_text(json.dumps({"rate": 0}))
    faulty_env(monkeypatch, control)
    stack = stacks(tmp_path / "stack", *FAST, "--workers", "2", backend=backend)
    # Given one-off jobs due in 4 to 7 s and a job firing every 10 s for 30 s: the tick claims them all
    retry = {"max_attempts": 5, "backoff_seconds": 0}
    soon = datetime.now(UTC) + timedelta(seconds=4)
    job_ids = [
        _submit(
            stack,
            f"at{i}",
            effects.command("sleep 1"),
            retry=retry,
            schedule=_at(soon + timedelta(seconds=i)),
        )
        for i in range(4)
    ]
    job_ids.append(_submit(stack, "rate", effects.command("true"), retry=retry, schedule=_rate_until(30)))
    held: list[tuple[float, float]] = []
    if backend == "moto":
        # When DynamoDB throttles half the HTTP attempts of claims, starts, session beats and finishes, in
        # every process of the stack, for 8 s (botocore retries each call up to 5 times: ~3% give up)
        control.write_text(json.dumps({"rate": 0.5, "ops": ["PutItem", "UpdateItem", "Query", "GetItem"]}))
        time.sleep(8)
        control.write_text(json.dumps({"rate": 0}))
    else:
        # When another process holds the state file's write lock, again and again, for 1 to 6.5 s at a time
        # while the runs start, are held and finish (every claim, start, session beat, finish, receive and
        # delete of every process of the stack waits; those that wait past the busy timeout fail)
        held = WriteLockHolder(stack_state(stack).path, LOCK_HOLDS).start().join()
    # Then every run ends, each execution under a granted lease, none twice under one lease
    runs = wait_for("every run to settle", lambda: _all_settled(stack, job_ids), timeout=90, every=1)
    assert [p for r in runs for p in run_problems(r, effects.of(r["run_id"]))] == []
    assert {r["state"] for r in runs} <= {"SUCCEEDED", "FAILED"}
    assert all(r["state"] == "SUCCEEDED" or r["attempts"][-1].get("reason") for r in runs)
    _check_schedule_covered(stack, "rate", [r for r in runs if r["job_id"] == "rate"], 10.0)
    # And the faults really happened: calls throttled and retried by the SDK (moto), writers that waited for
    # the lock and writers whose busy timeout ran out (sqlite)
    events = Counter(
        line for log in tmp_path.glob("faults.json.*.log") for line in log.read_text().splitlines()
    )
    print(
        f"faults: {dict(events)}; lock held (waited, held): {held}; final: {Counter(r['state'] for r in runs)}"
    )
    print(f"logged: {dict(logged_failures(stack))}")
    print(
        f"retried: {[(r['run_id'], [a.get('reason') for a in r['attempts']]) for r in runs if r['attempt'] > 1]}"
    )
    if backend == "moto":
        assert events["throttled"] >= 5 and events["recovered"] >= 1, events
    else:
        assert len(held) == len(LOCK_HOLDS) and all(
            h >= want for (_, h), want in zip(held, LOCK_HOLDS, strict=True)
        ), held
        assert max(LOCK_HOLDS) > BUSY_TIMEOUT_MS / 1000 > min(LOCK_HOLDS)
        assert events["lock_waited"] >= 1 and events["lock_gave_up"] >= 1, events
