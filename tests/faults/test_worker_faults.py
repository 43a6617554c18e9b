"""Faults of workers and of the queue, on the real local stack with real worker processes.

SIGKILL a worker (and its task's process group, as a container's death would) at every attempt; SIGSTOP a
worker past its lease and SIGCONT it (its session must find the run lost, its finish be rejected, its task
tree killed, the run finished exactly once by another attempt); deliver a queue message several times;
delete a message before any worker sees it. Each task records its executions
(:class:`~tests.faults.conftest.Effects`). Every scenario runs on both backends (``sqlite``, ``moto``);
the queue is reached through :func:`~tests.faults.conftest.stack_state`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import (
    FAST,
    Effects,
    Stack,
    alive,
    backend_params,
    descendants,
    run_problems,
    runs_of,
    settled,
    stack_state,
    start_stack,
    stop_stack,
    stored_message,
    unwatched,
    wait_for,
    worker_pid,
)

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module", params=backend_params(moto_full_only=True))
def backend(request: pytest.FixtureRequest) -> str:
    """This module's scenarios on SQLite in ``make test``; their moto variants (a minute of the suite's
    time) under ``make faults`` only, with the rest of the AWS adapters' fault runs."""
    return str(request.param)


@pytest.fixture(scope="module")
def stack(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack per backend for the scenarios that leave it healthy: two workers per tier, short leases."""
    s = start_stack(
        tmp_path_factory.mktemp(f"worker-faults-{backend}"), *FAST, "--workers", "2", backend=backend
    )
    yield s
    stop_stack(s)


def _submit(stack: Stack, command: list[str], **fields: Any) -> str:
    status, job = stack.request(
        "POST", "/jobs", {"name": "faults", "task": {"kind": "container", "command": command}, **fields}
    )
    assert status == 201, job
    return str(job["job_id"])


def _running(stack: Stack, job_id: str, attempt: int) -> dict[str, Any] | None:
    return next(
        (r for r in runs_of(stack, job_id) if r["state"] == "RUNNING" and r["attempt"] == attempt), None
    )


def _later_attempts_ok(run: dict[str, Any]) -> bool:
    """After attempt 1, the run succeeded on attempt 2 (or, if an overloaded box made a session renewal miss
    the 4 s lease, on a later one, every attempt in between lost the same way)."""
    *middle, last = run["attempts"][1:]
    return last["state"] == "SUCCEEDED" and all(a.get("reason") == "worker_lost" for a in middle)


def _kill_container(pid: int) -> None:
    """What a dead Fargate task does to a worker: the worker and every process below it die at once."""
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_worker_killed_at_every_attempt_is_retried_until_one_survives_or_none_is_left(
    stack: Stack, effects: Effects
) -> None:
    # Given two long jobs: one with three attempts whose third is quick, one with a single attempt
    script = '[ "$DUETIME_ATTEMPT" -ge 3 ] && exit 0; sleep 60'
    three = _submit(stack, effects.command(script), retry={"max_attempts": 3, "backoff_seconds": 0})
    one = _submit(stack, effects.command(script), retry={"max_attempts": 1})
    state = stack_state(stack)
    # When the worker running each attempt dies with its task (SIGKILL to the whole container), twice
    for job_id, attempt in ((three, 1), (one, 1), (three, 2)):
        run = wait_for(
            f"{job_id} attempt {attempt} running", lambda j=job_id, a=attempt: _running(stack, j, a)
        )
        wait_for(
            "the task to start", lambda r=run, a=attempt: (a, r["fencing_token"]) in effects.of(r["run_id"])
        )
        _kill_container(worker_pid(run))
        # Then the orphaned run is still watched: the sweeper will find it
        assert unwatched(state.runs()) == []
    # Then the first job succeeds on its third attempt and the second is dead-lettered, both saying why
    [survivor] = wait_for("the first job to settle", lambda: settled(stack, three), timeout=60)
    [dead] = wait_for("the second job to settle", lambda: settled(stack, one), timeout=60)
    assert (survivor["state"], survivor["attempt"]) == ("SUCCEEDED", 3)
    assert [a["reason"] for a in survivor["attempts"][:2]] == ["worker_lost", "worker_lost"]
    assert (dead["state"], dead["dead_lettered"]) == ("FAILED", True)
    assert [a["reason"] for a in dead["attempts"]] == ["worker_lost"]
    # And every execution matches an attempt, each lease ran once
    assert [a for a, _ in effects.of(survivor["run_id"])] == [1, 2, 3]
    assert [a for a, _ in effects.of(dead["run_id"])] == [1]
    assert run_problems(survivor, effects.of(survivor["run_id"])) == []
    assert run_problems(dead, effects.of(dead["run_id"])) == []


def test_a_worker_paused_past_its_lease_is_fenced_off_and_kills_its_task(
    stack: Stack, effects: Effects, tmp_path: Path
) -> None:
    # Given a run whose first attempt is long (its task leaves the pid of a grandchild) and later ones quick
    pidfile = tmp_path / "grandchild.pid"
    script = f'if [ "$DUETIME_ATTEMPT" = 1 ]; then sleep 60 & echo $! > {pidfile}; wait; else sleep 1; fi'
    job_id = _submit(stack, effects.command(script), retry={"max_attempts": 3, "backoff_seconds": 0})
    first = wait_for("attempt 1 running", lambda: _running(stack, job_id, 1))
    grandchild = int(
        wait_for("the task's grandchild", lambda: pidfile.exists() and pidfile.read_text().strip())
    )
    worker = worker_pid(first)
    # When its worker is paused (SIGSTOP) until another attempt has taken over the run
    os.kill(worker, signal.SIGSTOP)
    try:
        wait_for(
            "another attempt",
            lambda: any(
                r["attempt"] >= 2 and r["state"] in ("RUNNING", "SUCCEEDED") for r in runs_of(stack, job_id)
            ),
            timeout=30,
        )
    finally:
        os.kill(worker, signal.SIGCONT)
    # Then the woken worker finds the run lost (by its own clock, then its session's beat) and kills its
    # task's whole process tree, and lives on
    wait_for("the stale task's grandchild to die", lambda: not alive(grandchild), timeout=20)
    assert alive(worker)
    # And the run was finished exactly once, by attempt 2, under its own token
    [run] = wait_for("the run to settle", lambda: settled(stack, job_id))
    assert run["state"] == "SUCCEEDED"
    assert (run["attempts"][0]["attempt"], run["attempts"][0]["reason"]) == (1, "worker_lost")
    assert _later_attempts_ok(run)
    assert run["fencing_token"] == run["attempts"][-1]["fencing_token"]
    assert run_problems(run, effects.of(run["run_id"])) == []


def test_a_paused_worker_whose_task_ended_meanwhile_has_its_finish_rejected(
    stack: Stack, effects: Effects
) -> None:
    # Given a 3 s task whose worker is paused right after it starts (later attempts take 1 s)
    script = '[ "$DUETIME_ATTEMPT" = 1 ] && sleep 3; sleep 1'
    job_id = _submit(stack, effects.command(script), retry={"max_attempts": 3, "backoff_seconds": 0})
    first = wait_for("attempt 1 running", lambda: _running(stack, job_id, 1))
    worker = worker_pid(first)
    os.kill(worker, signal.SIGSTOP)
    try:
        # When another attempt finishes the run while the first worker sleeps through its lease
        wait_for(
            "attempt 2 to succeed",
            lambda: any(r["attempt"] >= 2 and r["state"] == "SUCCEEDED" for r in runs_of(stack, job_id)),
            timeout=30,
        )
    finally:
        os.kill(worker, signal.SIGCONT)
    # Then the woken worker's finish (exit 0, stale token) is rejected and recorded, never applied
    [run] = wait_for(
        "the stale finish to be recorded",
        lambda: [
            r
            for r in runs_of(stack, job_id)
            if any(e["kind"] == "stale_finish_rejected" for e in r["events"])
        ],
        timeout=20,
    )
    [event] = [e for e in run["events"] if e["kind"] == "stale_finish_rejected"]
    assert event["detail"]["fencing_token"] == first["fencing_token"]
    assert (run["state"], run["attempts"][0]["reason"]) == ("SUCCEEDED", "worker_lost")
    assert _later_attempts_ok(run)
    assert run_problems(run, effects.of(run["run_id"])) == []


def test_a_worker_stopped_past_its_session_lease_has_every_run_it_held_fenced_and_retried(
    stack: Stack, effects: Effects
) -> None:
    # Given four runs whose first attempts take 3 s (later ones 1 s), spread over the tier's two workers of
    # four slots: one worker holds at least two of them under its session
    script = '[ "$DUETIME_ATTEMPT" = 1 ] && sleep 3; sleep 1'
    job_ids = [
        _submit(stack, effects.command(script), retry={"max_attempts": 3, "backoff_seconds": 0})
        for _ in range(4)
    ]
    firsts = wait_for(
        "every attempt 1 running",
        lambda: found if all(found := [_running(stack, j, 1) for j in job_ids]) else None,
    )
    by_worker: dict[int, list[str]] = {}
    for job_id, first in zip(job_ids, firsts, strict=True):
        assert first is not None
        by_worker.setdefault(worker_pid(first), []).append(job_id)
    worker, held = max(by_worker.items(), key=lambda item: len(item[1]))
    assert len(held) >= 2
    tokens = {j: f["fencing_token"] for j, f in zip(job_ids, firsts, strict=True) if f is not None}
    # When that worker is stopped (SIGSTOP) until another attempt has finished each of its runs
    os.kill(worker, signal.SIGSTOP)
    try:
        wait_for(
            "attempt 2 of each of its runs to succeed",
            lambda: all(
                any(r["attempt"] >= 2 and r["state"] == "SUCCEEDED" for r in runs_of(stack, j)) for j in held
            ),
            timeout=40,
        )
    finally:
        os.kill(worker, signal.SIGCONT)
    # Then every run it held was fenced (attempt 1 worker_lost) and retried elsewhere, and each of its late
    # finishes (the tasks exited 0 while it slept) is recorded as rejected under its old token, never applied
    for job_id in held:
        [run] = wait_for(
            f"the stale finish of {job_id} to be recorded",
            lambda job_id=job_id: [  # type: ignore[misc]
                r
                for r in runs_of(stack, job_id)
                if any(e["kind"] == "stale_finish_rejected" for e in r["events"])
            ],
            timeout=45,  # after SIGCONT a loaded 2-core machine may take a while
        )
        [event] = [e for e in run["events"] if e["kind"] == "stale_finish_rejected"]
        assert event["detail"]["fencing_token"] == tokens[job_id]
        assert (run["state"], run["attempts"][0]["reason"]) == ("SUCCEEDED", "worker_lost")
        assert _later_attempts_ok(run)
        assert run_problems(run, effects.of(run["run_id"])) == []
    # And the worker lives on, and the stack still runs new work
    assert alive(worker)
    again = _submit(stack, effects.command("sleep 0.2"))
    [done] = wait_for("a new run to finish", lambda: settled(stack, again), timeout=30)
    assert done["state"] == "SUCCEEDED"


def _each_attempt_ran_once(run: dict[str, Any], executed: list[tuple[int, int]]) -> None:
    """Exactly one execution per attempt the run recorded; a repeated attempt only after a lost lease."""
    assert run_problems(run, executed) == []
    assert sorted(executed) == sorted((a["attempt"], a["fencing_token"]) for a in run["attempts"])
    # (on a badly overloaded machine a session renewal can miss the 4 s lease: that, not a duplicate, is a
    # retry)
    assert all(a.get("reason") in ("worker_lost", "exit_code") for a in run["attempts"][:-1]), run["attempts"]


def test_a_message_delivered_many_times_runs_each_attempt_once(stack: Stack, effects: Effects) -> None:
    state = stack_state(stack)
    # Given a run-now job, and a job whose first attempt fails and retries after 4 s
    once = _submit(stack, effects.command("sleep 2"))
    retried = _submit(
        stack,
        effects.command('[ "$DUETIME_ATTEMPT" -ge 2 ]'),
        retry={"max_attempts": 3, "backoff_seconds": 4, "jitter": "none"},
    )
    # When the first run's message is delivered three more times at once, and again after the run ended
    body = stored_message(state, once, 1)
    for _ in range(3):
        state.send(body)
    wait_for("the run to settle", lambda: settled(stack, once))
    state.send(body)
    # And the retry's wake-up is duplicated: early (before its backoff ends), on time, and late
    wait_for("attempt 1 to fail", lambda: any(r["attempts"] for r in runs_of(stack, retried)))
    retry_body = stored_message(state, retried, 2)
    for delay in (0, 4, 5, 7):
        state.send(retry_body, delay=delay)
    wait_for("the retried run to settle", lambda: settled(stack, retried), timeout=30)
    time.sleep(8)  # every duplicate has been delivered and dropped by now
    # Then each attempt ran exactly once, under the token its start granted
    [single] = runs_of(stack, once)
    assert single["state"] == "SUCCEEDED"
    _each_attempt_ran_once(single, effects.of(single["run_id"]))
    [run] = runs_of(stack, retried)
    assert (run["state"], [a["state"] for a in run["attempts"]][:1]) == ("SUCCEEDED", ["FAILED"])
    _each_attempt_ran_once(run, effects.of(run["run_id"]))


@pytest.mark.parametrize("backend", backend_params(moto_full_only=True), indirect=True)  # a stack of its own
def test_a_message_deleted_before_any_worker_saw_it_is_resent_by_the_sweeper(
    backend: str, stacks: Callable[..., Stack], tmp_path: Path, effects: Effects
) -> None:
    # Given a stack with no worker at all, a run-now job and a one-off due in 4 s
    stack = stacks(tmp_path / "stack", *FAST, "--workers", "0", backend=backend)
    worker: subprocess.Popen[bytes] | None = None
    try:
        state = stack_state(stack)
        due = (datetime.now(UTC) + timedelta(seconds=4)).replace(microsecond=0)
        now_job = _submit(stack, effects.command("true"))
        at_job = _submit(
            stack, effects.command("true"), schedule={"expression": f"at({due:%Y-%m-%dT%H:%M:%S})"}
        )
        # When both wake-up messages are deleted from the queue as soon as they become visible
        lost: list[str] = []

        def delete_visible() -> bool:
            lost.extend(state.take_visible())
            return {now_job, at_job} <= set(lost)

        wait_for("both messages to be deleted", delete_visible, timeout=20, every=0)
        # And only then a worker is started by hand in the stack's directory
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DUETIME_"))}
        worker = subprocess.Popen(
            [sys.executable, "-m", "duetime", "worker", "--tier", "small"],
            cwd=stack.workdir,
            env=env,
            start_new_session=True,
        )
        # Then the sweeper re-sends both PENDING runs after their grace period, and each runs once
        for job_id in (now_job, at_job):
            [run] = wait_for(f"{job_id} to settle", lambda j=job_id: settled(stack, j), timeout=30)
            assert (run["state"], run["attempt"], run["fencing_token"]) == ("SUCCEEDED", 1, 1)
            assert effects.of(run["run_id"]) == [(1, 1)]
            assert run["lag_seconds"] >= 3  # it waited for the sweeper, not for its lost message
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=20)
