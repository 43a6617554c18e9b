"""The container worker: ``duetime worker --tier small`` (a Fargate task in AWS, an OS process locally).

Loop: pull one message from the tier's queue ([S0] pull, not push) -> start the run (PENDING -> RUNNING, new
fencing token) -> run the task's command in its own process group -> heartbeat every ``heartbeat_seconds``
while it runs -> enforce ``timeout_seconds`` (SIGTERM to the group, ``kill_grace_seconds``, SIGKILL) -> upload
stdout+stderr to S3 -> finish under the fencing token -> delete the message.

A rejected heartbeat means another party owns the run now: the worker kills the task's process tree and
does not finish. A duplicate message fails the conditional start and is deleted unprocessed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from duetime.deps import Deps
from duetime.errors import LeaseLostError, StartRejectedError
from duetime.logs import log_key
from duetime.models import ContainerTask, Run, RunState
from duetime.observability import logger
from duetime.queue import ReceivedMessage
from duetime.resources import QUEUE_VISIBILITY_SECONDS
from duetime.runs import INTERRUPTED_REASON, finish, heartbeat, start
from duetime.timeutil import to_iso

#: Largest log uploaded per attempt, bytes; longer output keeps its head and tail.
MAX_LOG_BYTES = 4 * 1024 * 1024
#: Environment variables passed from the worker to tasks (never its AWS credentials).
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME")


@dataclass(frozen=True)
class TaskOutcome:
    """How a task process ended: exit code (negative = killed by that signal) and whether we timed it out."""

    exit_code: int | None
    timed_out: bool
    lease_lost: bool
    error: str | None = None


def _task_marker() -> Path | None:
    """Where this worker notes its running task's process group (local stack only: the supervisor kills it
    if the worker dies, as a container's exit would)."""
    directory = os.environ.get("DUETIME_WORKER_STATE_DIR")
    return Path(directory) / f"{os.getpid()}.task" if directory else None


def worker_id() -> str:
    """``<hostname>:<pid>:<random>``, recorded as the lease owner."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def task_env(run: Run) -> dict[str, str]:
    """The task's environment: a few of the worker's variables, the task's ``env``, and the DUETIME_* ids."""
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    if isinstance(run.task, ContainerTask):
        env.update(run.task.env)
    env.update(
        DUETIME_RUN_ID=run.run_id,
        DUETIME_JOB_ID=run.job_id,
        DUETIME_ATTEMPT=str(run.attempt),
        DUETIME_FENCING_TOKEN=str(run.fencing_token),
        DUETIME_DUE_AT=to_iso(run.due_at),
    )
    if run.triggered_by:
        env["DUETIME_TRIGGERED_BY"] = run.triggered_by
    return env


def kill_group(proc: subprocess.Popen[bytes], grace_seconds: float) -> None:
    """SIGTERM the process group of ``proc``, wait up to ``grace_seconds``, then SIGKILL it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def read_log(out: IO[bytes]) -> bytes:
    """The captured output, keeping head and tail if it exceeds MAX_LOG_BYTES."""
    out.flush()
    out.seek(0, os.SEEK_END)
    size = out.tell()
    out.seek(0)
    if size <= MAX_LOG_BYTES:
        return out.read()
    half = MAX_LOG_BYTES // 2
    head = out.read(half)
    out.seek(size - half)
    return head + f"\n[... {size - 2 * half} bytes elided by duetime ...]\n".encode() + out.read()


class Worker:
    """One worker process's loop over one tier's queue.

    Args:
        deps: settings, store, queues, logs, clock.
        tier: the container tier whose queue it pulls from.
        owner: lease owner id (default :func:`worker_id`).
    """

    def __init__(self, deps: Deps, tier: str, *, owner: str | None = None) -> None:
        self.deps = deps
        self.tier = tier
        self.owner = owner or worker_id()
        self.stopping = threading.Event()

    def run_forever(self, *, wait_seconds: int = 2) -> None:
        """Poll and process until :meth:`stop` (or SIGTERM via the CLI). Transient AWS errors back off."""
        failures = 0
        while not self.stopping.is_set():
            try:
                self.poll_once(wait_seconds=wait_seconds)
                failures = 0
            except Exception:  # noqa: BLE001 - a worker must outlive transient faults
                failures += 1
                logger.exception("worker poll failed", extra={"tier": self.tier})
                self.stopping.wait(min(30.0, 0.5 * 2 ** min(failures, 6)))

    def stop(self) -> None:
        self.stopping.set()

    def poll_once(self, *, wait_seconds: int = 0) -> int:
        """Receive at most one message and process it. Returns how many messages were received."""
        received = self.deps.queues.receive(self.tier, max_messages=1, wait_seconds=wait_seconds)
        for message in received:
            if self.stopping.is_set():
                # told to stop while the poll was out: never start a task only to stop it at once (its
                # effects would happen twice); the message goes back to the queue for another worker
                self.deps.queues.extend_visibility(self.tier, message.receipt_handle, 0)
                continue
            self.process(message)
        return len(received)

    def process(self, received: ReceivedMessage) -> Run | None:
        """Handle one delivery end to end. Returns the run as finished, or None if it was dropped."""
        if received.message is None:
            # not a run message: leave it; SQS moves it to the tier's DLQ after maxReceiveCount deliveries
            logger.error("poison message", extra={"tier": self.tier, "body": received.body[:500]})
            return None
        try:
            run = start(received.message, self.deps, owner=self.owner)
        except StartRejectedError:
            logger.info("duplicate or stale message dropped", extra={"run_id": received.message.run_id})
            self.deps.queues.delete(self.tier, received.receipt_handle)
            return None
        logger.append_keys(run_id=run.run_id, attempt=run.attempt)
        try:
            return self._execute(run, received)
        finally:
            logger.remove_keys(["run_id", "attempt"])

    def _execute(self, run: Run, received: ReceivedMessage) -> Run | None:
        token = run.fencing_token
        with tempfile.TemporaryFile() as out:
            outcome = self._run_task(run, token, out, received)
            key = log_key(run.job_id, run.run_id, run.attempt)
            try:
                self.deps.logs.put(key, read_log(out))
            except Exception:  # noqa: BLE001 - a log upload failure must not lose the outcome
                logger.exception("log upload failed")
                key = None  # type: ignore[assignment]
        if outcome.lease_lost:
            logger.warning("lease lost: task stopped, not finishing")
            self.deps.queues.delete(self.tier, received.receipt_handle)
            return None
        if outcome.timed_out:
            state, reason = RunState.TIMED_OUT, "timeout"
            error = f"timed out after {run.timeout_seconds} s"
        elif outcome.exit_code == 0 and outcome.error is None:
            state, reason, error = RunState.SUCCEEDED, None, None
        else:
            state, reason = (
                RunState.FAILED,
                INTERRUPTED_REASON if outcome.error == "worker stopped" else "exit_code",
            )
            error = outcome.error or f"exit code {outcome.exit_code}"
        try:
            finished = finish(
                run,
                self.deps,
                fencing_token=token,
                outcome=state,
                exit_code=outcome.exit_code,
                error=error,
                log_key=key,
                reason=reason,
            )
        except LeaseLostError:
            finished = None
        self.deps.queues.delete(self.tier, received.receipt_handle)
        logger.info("run finished", extra={"state": state.value, "exit_code": outcome.exit_code})
        if os.environ.get("DUETIME_WORKER_ECHO"):
            shown = finished.state.value if finished is not None else f"{state.value} (rejected: stale token)"
            print(
                f"worker[{self.tier}]: run {run.run_id} attempt {run.attempt} -> {shown} "
                f"(exit {outcome.exit_code})",
                flush=True,
            )
        return finished

    def _run_task(self, run: Run, token: int, out: IO[bytes], received: ReceivedMessage) -> TaskOutcome:
        task = run.task
        if not isinstance(task, ContainerTask):  # a Lambda task belongs to the dispatcher, not a worker
            out.write(b"duetime: a Lambda task cannot run on a container worker\n")
            return TaskOutcome(
                exit_code=None, timed_out=False, lease_lost=False, error="not a container task"
            )
        try:
            with tempfile.TemporaryFile() as stdin:
                if task.stdin:
                    stdin.write(task.stdin.encode())
                    stdin.seek(0)
                proc = subprocess.Popen(  # noqa: S603 - argv list, no shell unless the job asked for one
                    task.command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=stdin,
                    env=task_env(run),
                    start_new_session=True,
                )
        except (OSError, ValueError) as exc:
            out.write(f"duetime: cannot start {task.command[0]!r}: {exc}\n".encode())
            return TaskOutcome(exit_code=127, timed_out=False, lease_lost=False, error=f"cannot start: {exc}")
        marker = _task_marker()
        if marker is not None:
            marker.write_text(str(proc.pid))  # the task's process group: reaped if this worker dies
        try:
            return self._supervise(run, token, out, received, proc)
        finally:
            if marker is not None:
                marker.unlink(missing_ok=True)

    def _supervise(
        self, run: Run, token: int, out: IO[bytes], received: ReceivedMessage, proc: subprocess.Popen[bytes]
    ) -> TaskOutcome:
        """Wait for the task, heartbeating and enforcing its deadline; stop it if the lease is lost."""
        settings = self.deps.settings
        deadline = time.monotonic() + run.timeout_seconds
        next_beat = time.monotonic() + settings.heartbeat_seconds
        while True:
            now = time.monotonic()
            wait = max(0.0, min(next_beat, deadline) - now)
            try:
                code = proc.wait(timeout=min(wait, 0.5))
                return TaskOutcome(exit_code=code, timed_out=False, lease_lost=False)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if self.stopping.is_set():
                kill_group(proc, settings.kill_grace_seconds)
                out.write(b"\nduetime: worker stopping (SIGTERM); process group killed\n")
                return TaskOutcome(
                    exit_code=proc.returncode, timed_out=False, lease_lost=False, error="worker stopped"
                )
            if now >= deadline:
                kill_group(proc, run.on_timeout.kill_grace_seconds)
                out.write(
                    f"\nduetime: timed out after {run.timeout_seconds} s; process group killed\n".encode()
                )
                return TaskOutcome(exit_code=proc.returncode, timed_out=True, lease_lost=False)
            if now >= next_beat:
                next_beat = now + settings.heartbeat_seconds
                try:
                    heartbeat(run, self.deps, fencing_token=token)
                except LeaseLostError:
                    kill_group(proc, settings.kill_grace_seconds)
                    out.write(b"\nduetime: lease lost (fencing token superseded); process group killed\n")
                    return TaskOutcome(exit_code=proc.returncode, timed_out=False, lease_lost=True)
                except Exception:  # noqa: BLE001 - a missed heartbeat is retried at the next beat
                    logger.exception("heartbeat failed")
                self.deps.queues.extend_visibility(
                    self.tier, received.receipt_handle, QUEUE_VISIBILITY_SECONDS
                )
