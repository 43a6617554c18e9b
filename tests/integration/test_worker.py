"""Worker + run lifecycle against moto: start, finish, fencing, duplicates, retries, logs."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest

from duetime.config.deps import Deps
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.errors import LeaseLostError, StartRejectedError
from duetime.domain.models import ContainerTask, OnTimeout, RetryPolicy, RunMessage, RunState
from duetime.services import jobs, runs
from duetime.services.sessions import WorkerSession
from duetime.services.sweeper import sweep
from duetime.services.worker import Worker
from tests.helpers import drain


def _submit(deps: Deps, command: list[str], **kw) -> str:
    job = jobs.create_job(
        CreateJobRequest(name="t", task=ContainerTask(command=command), **kw), tenant="t1", deps=deps
    )
    return job.job_id


def test_worker_runs_the_command_and_stores_its_output(deps: Deps) -> None:
    # Given a run-now job that prints its run id, attempt and fencing token
    job_id = _submit(
        deps,
        ["sh", "-c", 'echo "id=$DUETIME_RUN_ID a=$DUETIME_ATTEMPT t=$DUETIME_FENCING_TOKEN"; echo err >&2'],
    )
    # When a worker polls
    finished = Worker(deps, "small", owner="w1").poll_once()
    # Then the run SUCCEEDED with exit 0, and its S3 log has stdout and stderr with its own ids
    assert finished == 1
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.exit_code, run.attempt, run.fencing_token) == (RunState.SUCCEEDED, 0, 1, 1)
    log = jobs.get_run_log(run.run_id, tenant="t1", deps=deps)
    assert f"id={run.run_id} a=1 t=1" in log
    assert "err" in log
    assert run.watch_at is None  # terminal runs leave the watchdog index
    assert list(deps.store.query_overdue(run.shard, run.due_at.replace(year=2100))) == []


def test_a_task_that_prints_nothing_stores_no_log_object_and_reads_as_an_empty_log(deps: Deps) -> None:
    # Given a run-now job whose command prints nothing, and one that prints a line
    quiet = _submit(deps, ["true"])
    chatty = _submit(deps, ["echo", "hi"])
    # When a worker runs both
    worker = Worker(deps, "small", owner="w1")
    assert worker.poll_once() + worker.poll_once() == 2
    # Then the quiet attempt records a 0-byte log and no object was stored (no PUT); its log reads as ""
    [run] = deps.store.list_runs(quiet)
    [attempt] = run.attempts
    assert (run.state, attempt.log_bytes) == (RunState.SUCCEEDED, 0)
    assert attempt.log_key is not None and deps.logs.get(attempt.log_key) is None
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps) == ""
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1) == ""
    # and the other's log is stored and sized
    [other] = deps.store.list_runs(chatty)
    assert other.attempts[0].log_bytes == 3
    assert jobs.get_run_log(other.run_id, tenant="t1", deps=deps) == "hi\n"


def test_a_duplicate_message_does_not_start_a_second_attempt(deps: Deps) -> None:
    # Given a run-now job whose wake-up message was delivered twice
    job_id = _submit(deps, ["true"])
    [run] = deps.store.list_runs(job_id)
    deps.queues.send("small", RunMessage(job_id=job_id, due_at=run.due_at, attempt=1))
    worker = Worker(deps, "small", owner="w1")
    # When the worker takes both deliveries
    worker.poll_once()
    worker.poll_once()
    # Then the task ran once: one attempt, token 1, and the queue is empty
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.attempt, run.fencing_token, len(run.attempts)) == (RunState.SUCCEEDED, 1, 1, 1)
    assert drain(deps.settings.queue_url("small")) == []


def test_start_with_a_stale_attempt_is_rejected(deps: Deps) -> None:
    job_id = _submit(deps, ["true"])
    [run] = deps.store.list_runs(job_id)
    with pytest.raises(StartRejectedError):
        runs.start(RunMessage(job_id=job_id, due_at=run.due_at, attempt=2), deps, owner="w1")


def test_a_finish_with_a_stale_fencing_token_is_rejected_and_recorded(deps: Deps, clock) -> None:
    # Given worker A started the run (token 1) and then paused past its lease
    job_id = _submit(deps, ["true"], retry=RetryPolicy(max_attempts=2, backoff_seconds=0))
    [pending] = deps.store.list_runs(job_id)
    msg = RunMessage(job_id=job_id, due_at=pending.due_at, attempt=1)
    session_a = WorkerSession(deps, "A", monotonic=lambda: clock.now().timestamp())
    run_a = runs.start(msg, deps, owner="A", session_id=session_a.session_id)
    session_a.hold(run_a)
    clock.advance(deps.settings.lease_seconds + 1)
    # When the sweeper expires the lease (worker_lost, token bumped) and attempt 2 is started by worker B
    assert sweep(run_a.shard, deps).leases_expired == 1
    run_b = runs.start(RunMessage(job_id=job_id, due_at=pending.due_at, attempt=2), deps, owner="B")
    assert run_b.fencing_token == 3
    # Then A's session, at its next beat, finds the run superseded (read only: nothing written to the run)
    session_a.beat()
    lost = session_a.lost(run_a.run_id)
    assert lost is not None and lost.why == "fencing token superseded" and lost.cancelled is None
    # And A's finish is rejected, never applied, and the rejection is in the run's history
    with pytest.raises(LeaseLostError):
        runs.finish(run_a, deps, fencing_token=run_a.fencing_token, outcome=RunState.SUCCEEDED, exit_code=0)
    now = deps.store.get_run(job_id, pending.due_at)
    assert now is not None
    assert (now.state, now.attempt, now.lease_owner, now.fencing_token) == (RunState.RUNNING, 2, "B", 3)
    assert [e.kind for e in now.events] == ["stale_finish_rejected"]
    assert now.attempts[0].reason == "worker_lost" and now.attempts[0].worker == "A"
    # And B's own finish is applied
    done = runs.finish(run_b, deps, fencing_token=3, outcome=RunState.SUCCEEDED, exit_code=0)
    assert done.state is RunState.SUCCEEDED


def test_a_failing_command_is_retried_by_its_delayed_wake_up_then_dead_lettered(deps: Deps, clock) -> None:
    # Given a job that always exits 3, allowed 2 attempts, no jitter, 1 s backoff
    job_id = _submit(
        deps,
        ["sh", "-c", "echo failing; exit 3"],
        retry=RetryPolicy(max_attempts=2, backoff_seconds=1, jitter="none"),
    )
    worker = Worker(deps, "small", owner="w1")
    # When attempt 1 fails
    worker.poll_once()
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.exit_code) == (RunState.RETRY_WAIT, 3)
    assert run.retry_at == clock.now() + timedelta(seconds=1)
    # Then the retry's own message, delayed by the backoff, starts attempt 2 without the sweeper
    clock.advance(1)
    assert worker.poll_once(wait_seconds=5) == 1
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.attempt, run.dead_lettered, run.exit_code) == (RunState.FAILED, 2, True, 3)
    assert [(a.attempt, a.state, a.exit_code) for a in run.attempts] == [
        (1, RunState.FAILED, 3),
        (2, RunState.FAILED, 3),
    ]
    assert "failing" in jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1)
    assert sweep(run.shard, deps).retries_released == 0


def test_an_early_retry_wake_up_does_not_start_the_retry_before_its_time(deps: Deps, clock) -> None:
    # Given attempt 1 failed with a 1 s backoff, and the worker's clock has not reached retry_at yet
    job_id = _submit(
        deps, ["sh", "-c", "exit 1"], retry=RetryPolicy(max_attempts=2, backoff_seconds=1, jitter="none")
    )
    worker = Worker(deps, "small", owner="w1")
    worker.poll_once()
    # When the wake-up arrives early, it goes back to the queue: attempt 2 does not start before its time
    assert worker.poll_once(wait_seconds=5) == 1
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.attempt) == (RunState.RETRY_WAIT, 1)
    # Then the sweeper's backstop (one grace period after retry_at) releases it and it runs
    clock.advance(1)
    assert sweep(run.shard, deps).retries_released == 0
    clock.advance(deps.settings.pending_grace_seconds)
    assert sweep(run.shard, deps).retries_released == 1
    worker.poll_once(wait_seconds=2)
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.attempt) == (RunState.FAILED, 2)


def test_a_backoff_beyond_the_sqs_delay_limit_is_released_by_the_sweeper_on_time(deps: Deps, clock) -> None:
    # Given a 20-minute backoff (SQS delays stop at 15 minutes)
    job_id = _submit(
        deps,
        ["sh", "-c", "exit 1"],
        retry=RetryPolicy(max_attempts=2, backoff_seconds=1200, max_backoff_seconds=3600, jitter="none"),
    )
    worker = Worker(deps, "small", owner="w1")
    worker.poll_once()
    [run] = deps.store.list_runs(job_id)
    # Then no wake-up message was sent; the sweeper releases attempt 2 exactly at retry_at
    assert drain(deps.settings.queue_url("small")) == []
    assert run.watch_at == run.retry_at == clock.now() + timedelta(seconds=1200)
    clock.advance(1199)
    assert sweep(run.shard, deps).retries_released == 0
    clock.advance(1)
    assert sweep(run.shard, deps).retries_released == 1
    assert worker.poll_once(wait_seconds=1) == 1
    assert deps.store.list_runs(job_id)[0].attempt == 2


def _gone(pid: int, *, within: float) -> bool:
    """Whether process ``pid`` no longer exists, waiting up to ``within`` seconds (an orphan killed is
    reparented to init, which reaps it)."""
    deadline = time.monotonic() + within
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def test_what_a_task_left_running_in_its_process_group_is_killed_when_it_exits(
    deps: Deps, tmp_path: Path
) -> None:
    # Given a task that starts a background sleep (its pid written to a file) and exits at once, well
    # within its timeout
    pid_file = tmp_path / "background.pid"
    job_id = _submit(deps, ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo bye"], timeout_seconds=10)
    # When a worker runs it
    started = time.monotonic()
    assert Worker(deps, "small", owner="w1").poll_once() == 1
    # Then the run succeeded, without waiting for the sleep or the timeout
    assert time.monotonic() - started < 10
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.exit_code) == (RunState.SUCCEEDED, 0)
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps) == "bye\n"
    # And the sleep it left in its process group is gone (SIGKILLed as the task's main process exited)
    background = int(pid_file.read_text())
    try:
        assert _gone(background, within=5)
    finally:
        if not _gone(background, within=0):
            os.kill(background, 9)


@pytest.mark.parametrize(
    ("script", "grace", "exit_code", "says"),
    [
        # the default SIGTERM ends it
        ("echo started; sleep 30", 1.0, -15, "process group killed (SIGTERM)"),
        # it traps SIGTERM and exits 0: its own exit code, and no success
        (
            "trap 'exit 0' TERM; echo started; while :; do sleep 0.1; done",
            5.0,
            0,
            "SIGTERM sent to the process group; the task exited with code 0 (not a success)",
        ),
        # it ignores SIGTERM: SIGKILL after the grace
        (
            "trap '' TERM; echo started; while :; do sleep 0.1; done",
            0.5,
            -9,
            "process group killed (SIGKILL after the 0.5 s grace)",
        ),
    ],
    ids=["sigterm", "exits-0-after-sigterm", "sigkill"],
)
def test_a_task_past_its_timeout_is_stopped_timed_out_and_its_log_says_how(
    deps: Deps, script: str, grace: float, exit_code: int, says: str
) -> None:
    job_id = _submit(
        deps,
        ["sh", "-c", script],
        timeout_seconds=1,
        on_timeout=OnTimeout(action="fail", kill_grace_seconds=grace),
    )
    Worker(deps, "small", owner="w1").poll_once()
    [run] = deps.store.list_runs(job_id)
    log = jobs.get_run_log(run.run_id, tenant="t1", deps=deps)
    assert run.state is RunState.TIMED_OUT and run.attempts[-1].exit_code == exit_code
    assert f"timed out after 1 s; {says}\n" in log


def test_a_missing_program_fails_the_attempt_with_a_message(deps: Deps) -> None:
    job_id = _submit(deps, ["/nonexistent/program"], retry=RetryPolicy(max_attempts=1))
    Worker(deps, "small", owner="w1").poll_once()
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.exit_code) == (RunState.FAILED, 127)
    assert "cannot start" in (run.error or "")


def test_the_sweeper_resends_a_pending_run_whose_message_was_lost(deps: Deps, clock) -> None:
    # Given a run-now job whose message vanished before any worker saw it
    job_id = _submit(deps, ["echo", "recovered"])
    assert len(drain(deps.settings.queue_url("small"))) == 1
    worker = Worker(deps, "small", owner="w1")
    assert worker.poll_once() == 0
    # When the grace period passes and the sweeper runs
    clock.advance(deps.settings.pending_grace_seconds + 1)
    [run] = deps.store.list_runs(job_id)
    assert sweep(run.shard, deps).resent == 1
    # Then a worker gets the re-sent message and the run succeeds, once
    assert worker.poll_once() == 1
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.attempt) == (RunState.SUCCEEDED, 1)
    assert "recovered" in jobs.get_run_log(run.run_id, tenant="t1", deps=deps)
    # And a second sweep finds nothing to do
    assert sweep(run.shard, deps).resent == 0


def test_starting_a_first_attempt_publishes_its_schedule_lag(deps: Deps, clock, capsys, monkeypatch) -> None:
    # Given a run due now that starts 2.5 s later
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    job_id = _submit(deps, ["true"])
    [pending] = deps.store.list_runs(job_id)
    clock.advance(2.5)
    capsys.readouterr()
    runs.start(RunMessage(job_id=job_id, due_at=pending.due_at, attempt=1), deps, owner="w1")
    # Then an EMF record of ScheduleLag = 2.5 seconds, namespace Duetime, is printed for CloudWatch
    import json

    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"ScheduleLag"' in line]
    assert len(records) == 1 and records[0]["ScheduleLag"] in (2.5, [2.5])
    assert records[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Duetime"


def _stop_while_running(worker: Worker) -> None:
    """Run one message on ``worker`` and tell the worker to stop (SIGTERM's effect) once the task started."""
    import threading

    stopper = threading.Timer(0.7, worker.stop)
    stopper.start()
    try:
        worker.poll_once(wait_seconds=2)
    finally:
        stopper.cancel()
        worker.stopping.clear()


def test_a_worker_told_to_stop_hands_its_run_back_without_using_up_an_attempt(deps: Deps) -> None:
    # Given a job allowed ONE attempt (no retry), whose task runs for a while
    job_id = _submit(deps, ["sh", "-c", "echo begun; sleep 5; echo done"], retry=RetryPolicy(max_attempts=1))
    worker = Worker(deps, "small", owner="w1")
    # When its worker is told to stop (a deploy, a scale-in) while the task runs
    _stop_while_running(worker)
    # Then the attempt is recorded as interrupted, the run is not dead-lettered but waits to run again now,
    # and its budget grew by the interrupted attempt
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.dead_lettered, run.max_attempts) == (RunState.RETRY_WAIT, False, 2)
    assert [(a.attempt, a.state, a.reason) for a in run.attempts] == [(1, RunState.FAILED, "worker_stopped")]
    assert run.retry_at == run.attempts[0].finished_at
    # And another worker runs it to the end as attempt 2 from the wake-up sent at once
    assert Worker(deps, "small", owner="w2").poll_once(wait_seconds=2) == 1
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.attempt) == (RunState.SUCCEEDED, 2)


def test_past_five_interruptions_a_stop_counts_as_a_failed_attempt(deps: Deps) -> None:
    # Given a run interrupted by five worker stops already (each given back for free)
    job_id = _submit(deps, ["sh", "-c", "sleep 5"], retry=RetryPolicy(max_attempts=1))
    worker = Worker(deps, "small", owner="w1")
    for _ in range(runs.MAX_FREE_INTERRUPTIONS):
        _stop_while_running(worker)
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.attempt, run.max_attempts) == (RunState.RETRY_WAIT, 5, 6)
    # When a sixth stop interrupts it
    _stop_while_running(worker)
    # Then that one counts: the run is out of attempts and dead-lettered, saying why
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.dead_lettered, run.attempt, run.max_attempts) == (RunState.FAILED, True, 6, 6)
    assert [a.reason for a in run.attempts] == ["worker_stopped"] * 6


def test_interruptions_do_not_lengthen_the_backoff_of_the_next_real_failure(deps: Deps) -> None:
    # Given a run interrupted twice by worker stops, whose command then fails (backoff 10 s x4, no jitter)
    job_id = _submit(
        deps,
        ["sh", "-c", "sleep 1.5; exit 7"],
        retry=RetryPolicy(max_attempts=2, backoff_seconds=10, jitter="none"),
    )
    worker = Worker(deps, "small", owner="w1")
    _stop_while_running(worker)
    _stop_while_running(worker)
    # When attempt 3 (the first that really ran to its end) fails
    assert worker.poll_once(wait_seconds=2) == 1
    # Then it waits the first backoff (10 s), as a first failure does, not the third (160 s)
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.attempt, run.max_attempts) == (RunState.RETRY_WAIT, 3, 4)
    assert (run.retry_at - run.attempts[-1].finished_at).total_seconds() == 10


def test_a_worker_told_to_stop_while_polling_starts_nothing_and_leaves_the_message(deps: Deps) -> None:
    # Given a run waiting in the queue, and a worker told to stop while its poll was out (stop before
    # receive here: the receive still returns the message)
    job_id = _submit(deps, ["sh", "-c", "echo ran"])
    stopping = Worker(deps, "small", owner="w1")
    stopping.stop()
    # When that poll returns the message
    assert stopping.poll_once(wait_seconds=1) == 1
    # Then no attempt started and the message is back for another worker, which runs the task once
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.attempt, run.fencing_token, run.attempts) == (RunState.PENDING, 1, 0, [])
    assert Worker(deps, "small", owner="w2").poll_once(wait_seconds=1) == 1
    [run] = deps.store.list_runs(job_id)
    assert (run.state, run.attempt, [a.worker for a in run.attempts]) == (RunState.SUCCEEDED, 1, ["w2"])


#: Run in a process of its own: installs the worker's real signal handlers, then delivers SIGTERM with a second
#: and a third one landing at each line of code the handler runs in turn (through a trace function), as
#: PR_SET_PDEATHSIG's SIGTERM on top of the stack's own or ECS's would. A handler that takes a lock (as
#: ``threading.Event.set`` does) deadlocks at the second line: py-spy's ``Worker.stop -> Event.set ->
#: Condition.__enter__``, twice.
_NESTED_SIGTERMS = """
import signal, sys, types
from duetime.services.worker import Worker, handle_stop_signals

worker = Worker(types.SimpleNamespace(settings=types.SimpleNamespace(kill_grace_seconds=1.0)), "small", owner="p")
handle_stop_signals(worker, budget_seconds=60)
handler = signal.getsignal(signal.SIGTERM)


def below_handler(frame):
    while frame is not None:
        if frame.f_code is handler.__code__:
            return True
        frame = frame.f_back
    return False


nested = 0
for point in range(1, 12):
    worker.stopping.clear()
    lines = 0

    def local(frame, event, arg):
        global lines, nested
        if event == "line":
            lines += 1
            if lines in (point, point + 1):
                nested += 1
                signal.raise_signal(signal.SIGTERM)
        return local

    sys.settrace(lambda frame, event, arg: local if below_handler(frame) else None)
    signal.raise_signal(signal.SIGTERM)
    sys.settrace(None)
    assert worker.stopping.is_set()
print("stopped", nested, flush=True)
"""


def test_a_second_and_third_sigterm_landing_inside_the_stop_handler_are_harmless() -> None:
    import subprocess
    import sys

    # When SIGTERMs land inside the worker's SIGTERM handler, at every line it runs
    try:
        done = subprocess.run(
            [sys.executable, "-c", _NESTED_SIGTERMS], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("the worker's signal handler deadlocked on a nested SIGTERM") from None
    # Then each one only set the stop flag: no deadlock, the worker is stopping
    assert done.returncode == 0, done.stderr
    stopped, nested = done.stdout.split()
    assert stopped == "stopped" and int(nested) >= 2
