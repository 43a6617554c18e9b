"""End to end on the real local stack: HTTP API -> tick -> SQS delay queue -> worker process -> S3 logs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack

pytestmark = pytest.mark.e2e


def _job(command: list[str], schedule: dict | None = None, **kw) -> dict:
    return {"name": "e2e", "schedule": schedule, "task": {"kind": "container", "command": command}, **kw}


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_state_file_says_where_everything_is(stack: Stack) -> None:
    state = json.loads((stack.workdir / ".duetime" / "local.json").read_text())
    assert state["api_url"] == stack.api
    # the default backend: everything in one SQLite file of the state directory, logs beside it
    assert state["backend"] == "sqlite" and "aws_endpoint" not in state
    assert Path(state["database"]) == (stack.workdir / ".duetime" / "duetime.sqlite").resolve()
    assert Path(state["database"]).is_file() and Path(state["logs"]).is_dir()
    assert stack.request("GET", "/healthz") == (200, {"status": "ok"})


def test_the_moto_backend_state_file_names_its_endpoint_tables_and_queues(tmp_path) -> None:
    s = start_stack(tmp_path, "--tick-seconds", "1", "--workers", "0", backend="moto")
    try:
        state = json.loads((tmp_path / ".duetime" / "local.json").read_text())
        assert state["backend"] == "moto" and state["aws_endpoint"].startswith("http://127.0.0.1:")
        assert set(state["queues"]) == {"lambda", "small", "medium", "large"}
        assert state["tables"] == {"jobs": "duetime-jobs", "runs": "duetime-runs"}
        status, job = s.request("POST", "/jobs", _job(["true"], schedule={"expression": "rate(1 hour)"}))
        assert status == 201, job
    finally:
        assert stop_stack(s) == 0


def test_a_run_now_job_succeeds_and_its_log_names_its_run(stack: Stack) -> None:
    status, job = stack.request("POST", "/jobs", _job(["sh", "-c", "echo hello $DUETIME_RUN_ID"]))
    assert status == 201
    [run] = stack.wait_run(job["job_id"], {"SUCCEEDED"})
    assert run["exit_code"] == 0 and run["attempt"] == 1
    status, text = stack.request("GET", f"/runs/{run['run_id']}/logs")
    assert status == 200 and text.strip() == f"hello {run['run_id']}"


def test_an_at_job_is_claimed_by_the_tick_and_starts_on_time(stack: Stack) -> None:
    # Given a one-off due 8 s from now, beyond the 1 s tick's 3 s lookahead at submit time
    due = (datetime.now(UTC) + timedelta(seconds=8)).replace(microsecond=0)
    body = _job(["true"], {"expression": f"at({due:%Y-%m-%dT%H:%M:%S})", "timezone": "UTC"})
    status, job = stack.request("POST", "/jobs", body)
    assert status == 201 and _ts(job["next_fire_at"]) == due
    # Then it runs at its due time, not before, and the job completes
    [run] = stack.wait_run(job["job_id"], {"SUCCEEDED"}, timeout=20)
    assert _ts(run["due_at"]) == due
    assert 0 <= run["lag_seconds"] < 3
    _, after = stack.request("GET", f"/jobs/{job['job_id']}")
    assert after["state"] == "COMPLETED" and after["next_fire_at"] is None


def test_a_rate_job_keeps_firing_with_distinct_runs(stack: Stack) -> None:
    # counting from a start_at 1 s away: its first slot comes at once, not a whole period after the submit
    start_at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat(timespec="milliseconds")
    schedule = {"expression": "rate(10 seconds)", "start_at": start_at}
    status, job = stack.request("POST", "/jobs", _job(["true"], schedule))
    assert status == 201
    runs = stack.wait_run(job["job_id"], {"SUCCEEDED"}, count=3, timeout=45)
    due_times = sorted(_ts(r["due_at"]) for r in runs if r["state"] == "SUCCEEDED")
    assert len(set(r["run_id"] for r in runs)) == len(runs)
    gaps = {(b - a).total_seconds() for a, b in zip(due_times, due_times[1:], strict=False)}
    assert gaps == {10.0}


def test_a_failing_job_is_retried_then_dead_lettered(stack: Stack) -> None:
    body = _job(["sh", "-c", "echo boom; exit 3"], retry={"max_attempts": 2, "backoff_seconds": 1})
    _, job = stack.request("POST", "/jobs", body)
    [run] = stack.wait_run(job["job_id"], {"FAILED"}, timeout=30)
    assert (run["attempt"], run["exit_code"], run["dead_lettered"]) == (2, 3, True)
    assert [a["state"] for a in run["attempts"]] == ["FAILED", "FAILED"]
    assert "boom" in stack.request("GET", f"/runs/{run['run_id']}/logs")[1]


def test_exit_1_three_times_waits_longer_each_time_is_dead_lettered_and_a_retry_runs_it_again(
    stack: Stack,
) -> None:
    # Given `sh -c 'exit 1'` with 3 attempts (backoff 1 s x4 with the default equal jitter: 0.5-1 s, then 2-4 s)
    body = _job(["sh", "-c", "exit 1"], retry={"max_attempts": 3, "backoff_seconds": 1})
    _, job = stack.request("POST", "/jobs", body)
    [run] = stack.wait_run(job["job_id"], {"FAILED"}, timeout=40)
    # Then three attempts ran, each gap longer than the one before, and the run is dead-lettered
    assert [(a["attempt"], a["state"], a["exit_code"]) for a in run["attempts"]] == [
        (1, "FAILED", 1),
        (2, "FAILED", 1),
        (3, "FAILED", 1),
    ]
    first, second, third = run["attempts"]
    gap1 = (_ts(second["started_at"]) - _ts(first["finished_at"])).total_seconds()
    gap2 = (_ts(third["started_at"]) - _ts(second["finished_at"])).total_seconds()
    assert 0.5 <= gap1 < gap2, (gap1, gap2)
    assert gap2 >= 2.0
    assert run["dead_lettered"] is True
    _, dead = stack.request("GET", "/dead-letters")
    assert run["run_id"] in [r["run_id"] for r in dead["runs"]]
    # When it is re-driven
    status, redriven = stack.request("POST", f"/runs/{run['run_id']}/retry")
    assert status == 200 and (redriven["attempt"], redriven["trigger"]) == (4, "retry")
    # Then it runs again, as a fourth attempt, and fails again (the command still exits 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, again = stack.request("GET", f"/runs/{run['run_id']}")
        if len(again["attempts"]) >= 4 and again["state"] in {"FAILED", "SUCCEEDED"}:
            break
        time.sleep(0.3)
    assert [a["attempt"] for a in again["attempts"]][:4] == [1, 2, 3, 4]
    assert again["attempts"][3]["exit_code"] == 1


def test_a_killed_worker_loses_its_lease_and_the_run_finishes_as_attempt_two(stack: Stack) -> None:
    # Given a 3-second job, running (its retry 0.5-1 s after a failed attempt, not the default 5-10 s)
    _, job = stack.request(
        "POST",
        "/jobs",
        _job(["sh", "-c", "sleep 3; echo done"], retry={"max_attempts": 3, "backoff_seconds": 1}),
    )
    [run] = stack.wait_run(job["job_id"], {"RUNNING"}, timeout=15)
    pid = int(run["lease_owner"].split(":")[1])
    # When its worker is killed with SIGKILL (the supervisor starts a new one, as a Fargate service would)
    os.kill(pid, signal.SIGKILL)
    # Then the lease expires, the sweeper fails attempt 1 as worker_lost, and attempt 2 succeeds
    [run] = stack.wait_run(job["job_id"], {"SUCCEEDED"}, timeout=40)
    assert run["attempt"] == 2
    assert run["attempts"][0]["reason"] == "worker_lost"
    assert run["attempts"][1]["state"] == "SUCCEEDED"


def test_bad_input_over_http_is_a_4xx_naming_the_field(stack: Stack) -> None:
    status, body = stack.request("POST", "/jobs", _job([]))
    assert status == 400 and body["error"]["field"] == "task.command"
    status, body = stack.request("GET", "/runs/nope.123")
    assert status == 404 and body["error"]["code"] == "not_found"


def test_sigterm_stops_every_process_the_stack_started(tmp_path) -> None:
    s = start_stack(tmp_path, "--tick-seconds", "1", "--workers", "1", backend="moto")
    state = json.loads((tmp_path / ".duetime" / "local.json").read_text())
    port = int(state["aws_endpoint"].rsplit(":", 1)[1])
    assert stop_stack(s) == 0
    time.sleep(0.5)
    import socket

    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "moto's server is still listening"
    children = os.popen(f"pgrep -g {s.proc.pid}").read().split()
    assert children == []


def test_a_sigkilled_stack_takes_moto_its_workers_and_their_tasks_with_it(tmp_path) -> None:
    import socket

    # Given a stack whose one small worker runs a long task (a sleep with a marker duration)
    s = start_stack(tmp_path, "--tick-seconds", "1", "--workers", "1", backend="moto")
    try:
        port = int(
            json.loads((tmp_path / ".duetime" / "local.json").read_text())["aws_endpoint"].rsplit(":")[-1]
        )
        _, job = s.request("POST", "/jobs", _job(["sleep", "97.25"]))
        [run] = s.wait_run(job["job_id"], {"RUNNING"}, timeout=20)
        worker = int(run["lease_owner"].split(":")[1])
        task = [int(p) for p in os.popen("pgrep -f 'sleep 97.25'").read().split()]
        assert task
        # When `duetime local` is killed with SIGKILL (no cleanup of its own can run)
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait(timeout=10)
        # Then its children follow it: moto's server stops listening, the worker exits, the task is killed
        deadline = time.monotonic() + 20
        alive = {"moto": True, "worker": True, "task": True}
        while time.monotonic() < deadline and any(alive.values()):
            with socket.socket() as sock:
                alive["moto"] = sock.connect_ex(("127.0.0.1", port)) == 0
            alive["worker"] = _alive(worker)
            alive["task"] = any(_alive(p) for p in task)
            time.sleep(0.3)
        assert not any(alive.values()), alive
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(s.proc.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as gone
    with contextlib.suppress(OSError):
        return "Z" not in open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0]
    return False


def test_a_crontab_imports_as_jobs_that_run_with_its_env_and_stdin(stack: Stack, tmp_path) -> None:
    import subprocess
    import sys

    crontab = tmp_path / "crontab"
    crontab.write_text('GREETING=bonjour\n* * * * * echo "$GREETING from cron"; cat%line one%line two\n')
    out = subprocess.run(
        [sys.executable, "-m", "duetime", "import", "crontab", str(crontab), "--api", stack.api],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.split("created job ")[1].split()[0]
    _, job = stack.request("GET", f"/jobs/{job_id}")
    assert job["schedule"]["expression"] == "* * * * *"
    assert job["task"]["command"][:2] == ["/bin/sh", "-c"] and job["task"]["env"]["GREETING"] == "bonjour"
    # trigger it now through a second, run-now job with the same task (cron's next minute may be 60 s away)
    status, now_job = stack.request("POST", "/jobs", {"name": "now", "task": job["task"]})
    assert status == 201
    [run] = stack.wait_run(now_job["job_id"], {"SUCCEEDED"})
    assert stack.request("GET", f"/runs/{run['run_id']}/logs")[1] == "bonjour from cron\nline one\nline two\n"


def _pids_running(pattern: str) -> list[str]:
    """Pids whose command line contains ``pattern`` (bracketed so pgrep's own shell does not match)."""
    return os.popen(f"pgrep -f '[{pattern[0]}]{pattern[1:]}'").read().split()


def test_a_timeout_kills_the_task_and_triggers_the_handler_job(stack: Stack) -> None:
    # Given job B, and job A (`sleep 300`, 3 s timeout) whose timeout triggers B
    marker = f"sleep 3{os.getpid() % 100:02d}"  # a command line unique to this test
    _, b = stack.request("POST", "/jobs", _job(["sh", "-c", "echo triggered by $DUETIME_TRIGGERED_BY"]))
    stack.wait_run(b["job_id"], {"SUCCEEDED"})
    body = _job(
        ["sh", "-c", marker],
        timeout_seconds=3,
        on_timeout={"action": "trigger", "job_id": b["job_id"], "kill_grace_seconds": 1},
    )
    status, a = stack.request("POST", "/jobs", body)
    assert status == 201, a
    # Then A ends TIMED_OUT within a few seconds of its deadline, its sleep is gone, and B ran for it
    [run] = stack.wait_run(a["job_id"], {"TIMED_OUT"}, timeout=20)
    took = (_ts(run["finished_at"]) - _ts(run["started_at"])).total_seconds()
    assert 3 <= took < 6
    assert run["timeout_action"] == "trigger"
    # (the state may flip first: on a loaded machine the timeout handler can fence the attempt before the
    # worker's kill lands; the worker then kills the group at its session's next beat)
    deadline = time.monotonic() + 10
    while _pids_running(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _pids_running(marker) == []
    runs_b = stack.wait_run(b["job_id"], {"SUCCEEDED"}, count=2)
    triggered = [r for r in runs_b if r["trigger"] == "timeout-handler"]
    assert len(triggered) == 1
    assert (
        stack.request("GET", f"/runs/{triggered[0]['run_id']}/logs")[1].strip()
        == f"triggered by {run['run_id']}"
    )


def test_a_stopped_worker_past_the_deadline_is_fenced_by_the_state_machine(stack: Stack) -> None:
    # Given a 2 s-timeout job whose worker is frozen (SIGSTOP) while it runs
    marker = f"sleep 2{os.getpid() % 100:02d}"
    _, job = stack.request(
        "POST",
        "/jobs",
        _job(
            ["sh", "-c", marker],
            timeout_seconds=2,
            on_timeout={"action": "fail", "kill_grace_seconds": 1},
            retry={"max_attempts": 1},
        ),
    )
    [run] = stack.wait_run(job["job_id"], {"RUNNING"}, timeout=15)
    pid = int(run["lease_owner"].split(":")[1])
    os.kill(pid, signal.SIGSTOP)
    try:
        # Then the sweeper starts the timeout handler, which fences the attempt: TIMED_OUT, token bumped
        [run] = stack.wait_run(job["job_id"], {"TIMED_OUT"}, timeout=30)
        assert run["timeout_execution"] and run["fencing_token"] == 2
        # (the default backend runs the handler's plan in-process, under the same execution name)
        assert run["timeout_execution"] == f"{run['run_id'].replace('.', '-')}-a1"
    finally:
        os.kill(pid, signal.SIGCONT)
    # And after SIGCONT the worker finds the run lost (a finish would be rejected) and its task's process
    # tree is gone
    deadline = time.monotonic() + 15
    while _pids_running(marker) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _pids_running(marker) == []
    time.sleep(1.5)
    _, final = stack.request("GET", f"/runs/{run['run_id']}")
    assert final["state"] == "TIMED_OUT" and len(final["attempts"]) == 1
