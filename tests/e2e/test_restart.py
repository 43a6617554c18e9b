"""The default backend is durable: a `duetime local` killed with SIGKILL and started again with the same command
keeps every job, run, attempt and log; the attempt the kill interrupted is retried; slots due while it was
down follow the catch-up policy; nothing else runs twice (issue: the embedded default on SQLite)."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

ARGS = ("--tick-seconds", "1", "--workers", "2", "--lease-seconds", "4", "--heartbeat-seconds", "1")
#: how long the stack stays down: the window checked below (kill .. restart - 6 s, past the rate job's 5 s
#: catch-up tolerance) then lasts over 20 s, so at least two of the rate(10 seconds) job's slots fall in it
DOWNTIME_SECONDS = 26
#: the sleeper's first attempt: far longer than anything before the kill, so the kill always finds it RUNNING;
#: its retry sleeps SLEEPER_RETRY_SECONDS (a RUNNING task once more, not one that would keep the test waiting)
SLEEPER_FIRST_SECONDS = 300
SLEEPER_RETRY_SECONDS = 2


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _job(name: str, command: list[str], schedule: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    return {"name": name, "schedule": schedule, "task": {"kind": "container", "command": command}, **kw}


def _all_jobs(stack: Stack) -> dict[str, dict[str, Any]]:
    jobs: dict[str, dict[str, Any]] = {}
    token = None
    while True:
        _, page = stack.request("GET", "/jobs?limit=20" + (f"&next_token={token}" if token else ""))
        jobs.update({j["job_id"]: j for j in page["jobs"]})
        token = page.get("next_token")
        if not token:
            return jobs


def _runs(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    status, body = stack.request("GET", f"/jobs/{job_id}/runs?limit=100")
    assert status == 200, body
    return list(body["runs"])


def _with_success_after(runs: list[dict[str, Any]], after: datetime) -> list[dict[str, Any]] | None:
    """``runs`` if one of them due after ``after`` has SUCCEEDED, else None."""
    return runs if any(_ts(r["due_at"]) > after and r["state"] == "SUCCEEDED" for r in runs) else None


def _interrupted(run: dict) -> bool:
    """The run's first attempt was in flight when the stack died: handed back by its worker or found lost."""
    attempts = run.get("attempts") or []
    return bool(attempts) and attempts[0].get("reason") in ("worker_stopped", "worker_lost")


def test_a_sigkilled_stack_started_again_keeps_everything_and_runs_nothing_twice(tmp_path) -> None:
    stack = start_stack(tmp_path, *ARGS)
    restarted: Stack | None = None
    try:
        # Given 50 jobs: 20 cron and 10 rate jobs not due yet, 10 at(...) an hour away, 8 run-now jobs that
        # finish, one run-now long sleep RUNNING at the kill, and a rate(10 seconds) job without catch-up
        # (counting from a start_at 2 s after its submit: its first slot comes at once, not 10 s later)
        later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
        bodies = [_job(f"cron-{i}", ["true"], {"expression": f"cron({i} 3 * * ? *)"}) for i in range(20)]
        bodies += [_job(f"rate-{i}", ["true"], {"expression": f"rate({i + 2} hours)"}) for i in range(10)]
        bodies += [_job(f"at-{i}", ["true"], {"expression": f"at({later})"}) for i in range(10)]
        bodies += [_job(f"now-{i}", ["sh", "-c", f"echo now {i}"]) for i in range(8)]
        sleep = (
            f'if [ "$DUETIME_ATTEMPT" = 1 ]; then sleep {SLEEPER_FIRST_SECONDS};'
            f" else sleep {SLEEPER_RETRY_SECONDS}; fi"
        )
        bodies.append(_job("sleeper", ["sh", "-c", f"echo slept; {sleep}; echo woke"]))
        bodies.append(
            _job(
                "every-10s",
                ["sh", "-c", "echo tick $DUETIME_RUN_ID"],
                {"expression": "rate(10 seconds)"},
                catch_up={"policy": "none", "tolerance_seconds": 5},
            )
        )
        ids = {}
        for body in bodies:
            if body["name"] == "every-10s":  # (its start_at from the moment of its own submit)
                start_at = datetime.now(UTC) + timedelta(seconds=2)
                body["schedule"]["start_at"] = start_at.isoformat(timespec="milliseconds")
            status, job = stack.request("POST", "/jobs", body)
            assert status == 201, job
            ids[body["name"]] = job["job_id"]
        assert len(ids) == 50
        for i in range(8):
            stack.wait_run(ids[f"now-{i}"], {"SUCCEEDED"}, timeout=60)
        [sleeping] = stack.wait_run(ids["sleeper"], {"RUNNING"}, timeout=60)
        stack.wait_run(ids["every-10s"], {"SUCCEEDED"}, timeout=60)
        # the sleeper's first chunk of output is streamed (FLUSH_SECONDS after its start)
        wait_for(
            "the sleeper's first chunk",
            lambda: stack.request("GET", f"/runs/{sleeping['run_id']}/logs")[1] == "slept\n",
            timeout=30,
        )
        before_jobs = _all_jobs(stack)
        before_runs = {job_id: _runs(stack, job_id) for job_id in ids.values()}
        logs = {
            r["run_id"]: stack.request("GET", f"/runs/{r['run_id']}/logs")[1]
            for runs in before_runs.values()
            for r in runs
            if r["state"] == "SUCCEEDED"
        }

        # When the stack is killed with SIGKILL, stays down 26 s, and is started again with the same command
        os.kill(stack.proc.pid, signal.SIGKILL)
        stack.proc.wait(timeout=10)
        killed_at = datetime.now(UTC)
        time.sleep(DOWNTIME_SECONDS)
        # (the new stack ticks and runs from its first moments, before it says Ready: under load that can be
        # seconds later, so what was due while it was down is judged from when it was started)
        restarting_at = datetime.now(UTC)
        restarted = start_stack(tmp_path, *ARGS)
        back_at = datetime.now(UTC)

        # Then every job is there as it was (next fire times of due jobs move on; nothing else changes)
        after_jobs = _all_jobs(restarted)
        assert set(after_jobs) == set(before_jobs) == set(ids.values())
        for job_id, job in before_jobs.items():
            moving = ("next_fire_at", "next_fire_times", "last_run", "missed_slots", "updated_at")
            steady = {k: v for k, v in job.items() if k not in moving}
            assert {k: v for k, v in after_jobs[job_id].items() if k in steady} == steady
        # every run and attempt seen before the kill is there, ended runs exactly as they were, with their logs
        for job_id, runs in before_runs.items():
            now_runs = {r["run_id"]: r for r in _runs(restarted, job_id)}
            for run in runs:
                assert run["run_id"] in now_runs, run
                if run["state"] in ("SUCCEEDED", "FAILED", "SKIPPED"):
                    assert now_runs[run["run_id"]] == run
        for run_id, text in logs.items():
            assert restarted.request("GET", f"/runs/{run_id}/logs")[1] == text
        # the interrupted attempt was handed back by its worker as the stack died (the state file outlives the
        # stack, so the worker could record it), or found lost by the sweeper; either way it is retried once
        runs = restarted.wait_run(ids["sleeper"], {"SUCCEEDED"}, timeout=90)
        [sleeper] = [r for r in runs if r["run_id"] == sleeping["run_id"]]
        assert [a["state"] for a in sleeper["attempts"]] == ["FAILED", "SUCCEEDED"]
        assert sleeper["attempts"][0]["reason"] in ("worker_stopped", "worker_lost")
        assert restarted.request("GET", f"/runs/{sleeper['run_id']}/logs?attempt=1")[1].startswith("slept\n")
        assert restarted.request("GET", f"/runs/{sleeper['run_id']}/logs")[1] == "slept\nwoke\n"
        # the rate job's slots due while it was down are not caught up (policy none): skipped or never run,
        # and counted as missed; its schedule goes on after the restart
        restarted.wait_run(ids["every-10s"], {"SUCCEEDED"}, count=len(before_runs[ids["every-10s"]]) + 1)
        # (a slot due within its tolerance before the restart may run too: wait for one due after it)
        every = wait_for(
            "a slot of every-10s due after the restart to succeed",
            lambda: _with_success_after(_runs(restarted, ids["every-10s"]), back_at),
            timeout=30,
        )
        down = [r for r in every if killed_at < _ts(r["due_at"]) < restarting_at - timedelta(seconds=6)]
        # (a slot due just after the kill may have been started by a worker in the moment before its death
        # signal came: interrupted then, like the sleeper, it is retried; a retry is not subject to catch-up)
        assert all(r["state"] == "SKIPPED" or _interrupted(r) for r in down), (
            killed_at,
            restarting_at,
            back_at,
            down,
        )
        assert restarted.request("GET", f"/jobs/{ids['every-10s']}")[1]["missed_slots"] >= 1
        assert any(_ts(r["due_at"]) > back_at and r["state"] == "SUCCEEDED" for r in every)
        # and nothing ran twice: every run but the interrupted one has one attempt
        for job_id in ids.values():
            for run in _runs(restarted, job_id):
                if run["run_id"] != sleeper["run_id"] and not _interrupted(run):
                    assert len(run["attempts"]) <= 1, run
    finally:
        if stack.proc.poll() is None:
            os.killpg(stack.proc.pid, signal.SIGKILL)
        if restarted is not None:
            stop_stack(restarted)
