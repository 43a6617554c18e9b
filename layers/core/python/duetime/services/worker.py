"""The container worker: ``duetime worker --tier small [--slots N]`` (a Fargate task in AWS, an OS process
locally).

Each run: pull a message from the tier's queue ([S0] pull, not push) -> start the run (PENDING -> RUNNING,
new fencing token, recorded under the worker's session) and delete the message (the run row holds the run
from then on) -> run the task's command in its own process group (its exit seen at once, through a pidfd;
what it left running in its group SIGKILLed then, as the kernel ends a container's PID namespace with its
main process: :func:`kill_leftovers`), streaming new output to the log store as chunks (:class:`LiveLog`)
-> enforce ``timeout_seconds`` (SIGTERM to the group, ``kill_grace_seconds``, SIGKILL) -> upload the whole
stdout+stderr to S3 (nothing when the task printed nothing: the attempt records ``log_bytes`` 0) and delete
the chunks -> finish under the fencing token. Processes a task moved out of its group (``setsid``) are out
of the worker's reach, at its exit and at its timeout alike.

Leases: the worker holds every run it runs through one **worker session**
(:class:`~duetime.services.sessions.WorkerSession`), renewed every ``heartbeat_seconds`` by the session
thread with one write whatever it runs, and a batch read of its runs' rows: a run cancelled or fenced
meanwhile (its token changed) has its task killed, and a refused renewal (the sweeper found the session
expired and revoked it) kills every task. No run row is written while its task runs.

Writes: the starts of a poll and the ends of the attempts that ended meanwhile are applied together by the
worker's session thread (one transaction and one commit on the embedded store; one conditional write each
on DynamoDB), and the started and dropped messages deleted in one batch (DeleteMessageBatch), so a burst of
short runs costs a few writes per poll instead of four per run. A failed attempt whose retry is due within
:data:`MAX_HOLD_SECONDS` is retried by the same worker from the same delivery (:meth:`Worker._take_retry`):
no wake-up message is sent, received or deleted for it.

Slots: a worker process runs up to ``slots`` tasks at once (``--slots``; default per tier, :data:`DEFAULT_SLOTS`:
small 8, medium 2, large 1; on AWS the stage's tier sizing passes its own, infra/config.py). :meth:`Worker.run_forever` is one receive loop that asks the queue for up to
its free slots' worth of messages per poll (at most 10, SQS's limit), has the session thread start them,
and hands each started run to a slot's thread (kept for the slot's next runs), which runs its task as above
with its own fencing token and log stream; the loop polls again as soon as
a slot frees up. Every slot's run has the process's owner id as its lease owner
(:func:`worker_id`). On AWS the tasks of a worker share its Fargate task's CPU and memory (the tier's
``cpu``/``memory_mib``): the defaults assume small tasks are light, and a tier whose tasks need the whole
container should run with ``--slots 1``. :meth:`Worker.poll_once` (tests, the simulation) takes at most one
message and runs it in the calling thread.

A run the session finds lost (another party owns it now, or it was cancelled) has that slot's task's
process tree killed and is not finished; its other slots go on. A duplicate message fails the
conditional start and is deleted unprocessed.

Stopping (SIGTERM from ECS, from `duetime local`, or its lifeline when the stack dies): the signal handler
only sets :attr:`Worker.stopping`, a lock-free flag, so any number of signals, arriving at any moment, are
harmless. Each slot notices it within half a second, kills its task's group and hands its run back
(``worker_stopped``); the receive loop stops polling (a long poll within its 2 s), hands back what that
poll brought, waits for its slots and returns. A hand-back that cannot reach AWS is cut off after a budget
(:func:`handle_stop_signals`), so a stopped worker always exits.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import queue
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import IO

from duetime.config.observability import logger
from duetime.domain.errors import LeaseLostError, StartRejectedError
from duetime.domain.lifecycle import (
    INTERRUPTED_REASON,
    MAX_HOLD_SECONDS,
    MAX_MESSAGE_DELAY_SECONDS,
    delay_seconds,
    hold_seconds,
    message_for,
)
from duetime.domain.logs import log_key, pack_key
from duetime.domain.models import ContainerTask, Run, RunState
from duetime.domain.ports import QUEUE_VISIBILITY_SECONDS, LogStore, ReceivedMessage
from duetime.domain.timeutil import to_iso
from duetime.services.deps import Deps
from duetime.services.runs import Finish, start_and_finish
from duetime.services.sessions import WorkerSession
from duetime.services.task_process import TaskProcess

#: Largest log uploaded per attempt, bytes; longer output keeps its head and tail.
MAX_LOG_BYTES = 4 * 1024 * 1024
#: A running task's new output is streamed as a chunk this often, seconds (or sooner: CHUNK_BYTES)...
FLUSH_SECONDS = 5.0
#: ...or as soon as this much new output has accumulated, bytes
CHUNK_BYTES = 64 * 1024
#: A long run streams at most every 1/FLUSH_AGE_DIVISOR of its age (at most MAX_FLUSH_SECONDS apart), so a
#: day-long task that prints a line a second leaves ~1,700 chunks to read back, not 17,000
FLUSH_AGE_DIVISOR = 100
MAX_FLUSH_SECONDS = 60.0
#: How long a worker told to stop may take to hand its run back once its task is dead, seconds (environment
#: variable; default STOP_BUDGET_SECONDS): beyond it the AWS calls are given up and the process exits
STOP_BUDGET_ENV = "DUETIME_WORKER_STOP_BUDGET_SECONDS"
STOP_BUDGET_SECONDS = 30.0
#: A worker told to stop whose loop has not stopped the task this long after (an AWS call of the loop is
#: retrying or hanging) has it stopped by its stop deadline's thread instead, seconds
LOOP_STUCK_SECONDS = 2.0
#: Environment variables passed from the worker to tasks (never its AWS credentials).
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME")
#: Tasks a worker of each tier runs at once unless told otherwise (``--slots``): the defaults of a worker with a
#: machine's cores to share (``duetime local``). On AWS the tier's Fargate task (small 0.25 vCPU / 512 MiB,
#: medium 1 vCPU / 2 GiB, large 4 vCPU / 8 GiB) bounds how many fit, and the stage passes its own (the tier
#: sizing's ``slots``: small 4). Small 8: a poll then takes up to 8 messages and the session records their
#: starts and ends in one commit, so a burst of short runs costs about half the fsyncs of 4 slots (bench lag,
#: N = 1,000: 0.48 against 0.9 durable commits per run, 1.84 against 2.1-2.4 ms of CPU per run)
DEFAULT_SLOTS: dict[str, int] = {"small": 8, "medium": 2, "large": 1}
#: The most messages one receive asks for (SQS's limit)
MAX_RECEIVE_MESSAGES = 10
#: Tries again of an end whose record failed (a fault of the store), with a backoff from 0.5 s doubling (at
#: most a quarter of the lease), before it is left to the sweeper (its lease expires: worker_lost)
END_RETRIES = 5
#: The most requests (a poll's starts, an ended attempt) the session thread applies in one write (one
#: transaction on the embedded store)
MAX_WRITE_BATCH = 50
#: While the session holds early deliveries, it looks this often (seconds) whether the worker was told to stop
HOLD_LOOK_SECONDS = 0.1
#: The error of an attempt handed back because its start's write failed but was applied (nothing ran it)
LOST_START_ERROR = "worker lost its start (a fault of the write)"
#: How long the message of a started (or dropped) run may wait to be deleted, seconds: the messages of the
#: starts within it go in one DeleteMessageBatch (or once there are ten). Far under the queue's visibility
#: timeout (a message a dead worker did not delete comes back after it, and its start is refused), and short
#: enough that the messages in flight at 12K starts/s (about 12K x 5 s) stay under a standard queue's
#: 120,000 in-flight limit ("Amazon SQS quotas", Amazon SQS Developer Guide)
DELETE_LINGER_SECONDS = QUEUE_VISIBILITY_SECONDS / 24
#: How often the receive loop looks for a free slot (or the stop flag) while every slot is busy, seconds
SLOT_WAIT_SECONDS = 0.1
#: how often the log thread, waiting for more ends to pack (:meth:`Worker._gather_logs`), looks whether any
#: slot still runs a task
LINGER_STEP_SECONDS = 0.02
#: a lingering log pack (``log_pack_linger_seconds``) is stored at once when it holds this many bytes or logs,
#: whatever its linger: what a worker crash can take with it stays bounded (the memory too)
PACK_MAX_BYTES = 8 * 1024 * 1024
PACK_MAX_LOGS = 1000


@dataclass(frozen=True)
class TaskOutcome:
    """How a task process ended: exit code (negative = killed by that signal) and whether we timed it out."""

    exit_code: int | None
    timed_out: bool
    lease_lost: bool
    error: str | None = None


#: the outcome of a task never started (its worker was told to stop)
_STOPPED = TaskOutcome(exit_code=None, timed_out=False, lease_lost=False, error="worker stopped")


@dataclass
class _Ended:
    """An attempt a slot ran to its end: its delivery, how to record it (None: its lease was lost, only
    the message is deleted) and the task's outcome."""

    received: ReceivedMessage
    finish: Finish | None
    outcome: TaskOutcome
    #: failed tries to record it so far (a fault of the store: tried again, with a backoff)
    tries: int = 0
    #: when it may be tried again (time.monotonic())
    ready_at: float = 0.0
    #: the run as recorded (None: its lease was lost, or not recorded yet)
    recorded: Run | None = None
    #: the fault of its last failed record
    error: Exception | None = None
    #: its final log while it is not settled: not stored yet (the log thread stores it), or stored in a log
    #: pack whose record is not known yet (kept to put it under the attempt's own key if the end is
    #: recorded by someone else: a cancel, the sweeper, the timeout handler)
    log: _PendingLog | None = None


@dataclass
class _PendingLog:
    """An ended attempt's final log on its way (:meth:`Worker._store_logs`)."""

    #: the attempt's own key (its chunks were streamed under it)
    key: str
    data: bytes
    #: chunks streamed while it ran (deleted once the final log is safe)
    chunks: int
    #: stored in a log pack (else not stored yet)
    packed: bool = False


@dataclass
class _LingeringPack:
    """A log pack of one tenant (``log_pack_linger_seconds`` > 0) whose ends are recorded (or on their way to
    the record) while its object waits to be stored, at ``store_at`` (``time.monotonic()``) or sooner."""

    key: str
    store_at: float
    logs: list[_PendingLog] = field(default_factory=list)
    size: int = 0
    #: cleanups of its logs that came before it was stored: their chunks go once it is
    cleanups: list[_LogCleanup] = field(default_factory=list)


@dataclass
class _LogCleanup:
    """After an end's record: delete its live chunks, and first put its final log under its own key when
    the record was not the worker's (``data``), for the log thread."""

    key: str
    chunks: int
    data: bytes | None = None


@dataclass
class _Starts:
    """A poll's messages to start, handed to the session thread; ``outcomes`` (one per message, as
    :func:`start_many` gives them) are set, and each started run given its slot, before ``done``."""

    received: list[ReceivedMessage]
    #: the slots reserved for them by run_forever's loop, one per message (empty: the caller runs them)
    slots: list[Slot] = field(default_factory=list)
    outcomes: list[Run | Exception] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    #: when they may start (time.monotonic()): the session holds a delivery that came early until then
    ready_at: float = 0.0


def outcome_run_id(message: ReceivedMessage) -> str | None:
    """The run id of a delivery, for log lines (None: not a run message)."""
    return message.message.run_id if message.message is not None else None


class StopFlag:
    """A stop request, safe to set from a signal handler: one attribute write, no lock, no I/O.

    ``threading.Event.set`` takes a Condition's non-reentrant lock: a second SIGTERM arriving while the first
    handler was inside it deadlocked the worker (py-spy: ``Worker.stop -> Event.set -> Condition.__enter__``
    twice). Waiting on this flag polls instead.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Sleep until the flag is set (checked every 0.1 s) or ``timeout`` seconds pass; returns the flag."""
        deadline = time.monotonic() + timeout
        while not self._set:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.1, left))
        return True


class LiveLog:
    """Streams a running task's output to the log store as chunks (DESIGN.md section 7).

    :meth:`poll`, called from the worker's supervise loop, reads what the task wrote since the last chunk
    straight from the output file (``os.pread`` at the last flushed offset: the task's own writes and the
    file position are untouched) and stores it as the next chunk, once ``FLUSH_SECONDS`` passed since the
    last one or ``CHUNK_BYTES`` accumulated; nothing when there is nothing new, nothing after MAX_LOG_BYTES
    (the final object keeps head and tail). A failed upload is retried with the next chunk's data.
    """

    def __init__(self, logs: LogStore, key: str, out: IO[bytes], *, started: float | None = None) -> None:
        self.logs = logs
        self.key = key
        self.out = out
        self.started = time.monotonic() if started is None else started
        self.last_flush = self.started
        #: bytes of output stored as chunks so far
        self.flushed = 0
        #: chunks stored so far (the next one's number)
        self.chunks = 0

    def interval(self, now: float) -> float:
        return max(FLUSH_SECONDS, min(MAX_FLUSH_SECONDS, (now - self.started) / FLUSH_AGE_DIVISOR))

    def poll(self, now: float) -> None:
        """Store the output written since the last chunk, if it is time to."""
        if self.flushed >= MAX_LOG_BYTES:
            return
        fd = self.out.fileno()
        new = os.fstat(fd).st_size - self.flushed
        if new <= 0 or (new < CHUNK_BYTES and now - self.last_flush < self.interval(now)):
            return
        data = os.pread(fd, min(new, MAX_LOG_BYTES - self.flushed), self.flushed)
        self.last_flush = now
        try:
            self.logs.put_chunk(self.key, self.chunks, data)
        except Exception:  # noqa: BLE001 - streaming is best effort; the final object is the log of record
            logger.exception("log chunk upload failed", extra={"seq": self.chunks})
            return
        self.chunks += 1
        self.flushed += len(data)


def default_slots(tier: str) -> int:
    """The slots of a ``tier`` worker not told otherwise (:data:`DEFAULT_SLOTS`; 1 for an unknown tier)."""
    return DEFAULT_SLOTS.get(tier, 1)


def task_marker_name(pid: int, slot: int) -> str:
    """The marker file of slot ``slot``'s task in worker ``pid``: ``<pid>.task`` for slot 0 (the one a
    one-task worker uses), ``<pid>.<slot>.task`` for the others; ``<pid>.*task`` globs them all."""
    return f"{pid}.task" if slot == 0 else f"{pid}.{slot}.task"


def _task_marker(slot: int = 0) -> Path | None:
    """Where this worker notes slot ``slot``'s running task's process group (local stack only: the
    supervisor kills every such group if the worker dies, as a container's exit would)."""
    directory = os.environ.get("DUETIME_WORKER_STATE_DIR")
    return Path(directory) / task_marker_name(os.getpid(), slot) if directory else None


def worker_id() -> str:
    """``<hostname>:<pid>:<random>``, recorded as the lease owner (of every run the process's slots hold)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def task_env(run: Run, base: dict[str, str] | None = None) -> dict[str, str]:
    """The task's environment: a few of the worker's variables (``base``: those of :data:`PASSED_ENV` it
    has, read once by the caller; default: read now), the task's ``env``, and the DUETIME_* ids."""
    env = dict(base) if base is not None else {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
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


class ExitWaiter:
    """Waits for a task's main process to exit, woken the moment it does, then ends what is left of its
    process group (:func:`kill_leftovers`) before the exit code is returned, so before the worker records
    the attempt's end.

    ``TaskProcess.wait(timeout)`` polls with sleeps that double up to 50 ms (as Popen's), so a task that
    takes 4 ms is seen to have ended at about 7.5 ms, and a burst of short tasks spends most of its slots'
    time asleep. On Linux (5.3+) this waits on the process's pidfd (``os.pidfd_open``) with ``select.poll``
    instead, and kills the leftovers while the exited process is still unreaped (a zombie holds its pid, so
    the group id cannot have been reused); elsewhere it falls back to ``TaskProcess.wait`` and kills them
    just after. The pidfd is closed once the exit was seen (or when the object goes).
    """

    def __init__(self, proc: TaskProcess) -> None:
        self.proc = proc
        self._fd: int | None = None
        self._poller: select.poll | None = None
        try:
            self._fd = os.pidfd_open(proc.pid)
            self._poller = select.poll()
            self._poller.register(self._fd, select.POLLIN)
        except (AttributeError, OSError):  # no pidfd here (or the child was reaped): the process's own wait
            self.close()

    def wait(self, timeout: float) -> int | None:
        """The exit code once the process has exited (waiting up to ``timeout`` seconds), else None."""
        if self._poller is not None and self.proc.returncode is None:
            if not self._poller.poll(max(0, math.ceil(timeout * 1000))):
                return None
            self.close()
            kill_leftovers(self.proc.pid)  # the exited leader is a zombie until the wait below
            return self.proc.wait()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        kill_leftovers(self.proc.pid)
        return code

    def close(self) -> None:
        """Close the pidfd (once; ``wait`` then falls back to ``TaskProcess.wait``)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self._poller = None, None

    def __del__(self) -> None:
        self.close()


def kill_leftovers(pgid: int) -> None:
    """SIGKILL every process left in the process group ``pgid`` of a task whose main process exited (the
    task's session and group leader: pgid == its pid, :mod:`duetime.services.task_process`).

    A task ends when its main process exits, as a container does: a container's main process is PID 1 of
    its own PID namespace (Kubernetes, "Share Process Namespace between Containers in a Pod": without
    ``shareProcessNamespace`` each container has its own), and when that process terminates "the kernel
    terminates all of the processes in the namespace via a SIGKILL signal" (pid_namespaces(7),
    https://man7.org/linux/man-pages/man7/pid_namespaces.7.html). A worker has no namespace of its own per
    task, so the task's process group stands in for it: without this, a task's ``cmd &`` (reparented to
    init) would outlive its run, its timeout, the worker and the stack. Out of reach: processes that left
    the group (``setsid``, ``setpgid``: a daemonizing program, a shell with job control ``set -m``), which a
    process group cannot follow. A group already empty is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_group(proc: TaskProcess, grace_seconds: float) -> None:
    """SIGTERM the process group of ``proc``, wait up to ``grace_seconds``, then SIGKILL it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        pass
    kill_leftovers(proc.pid)  # what outlived the grace: the same SIGKILL of the group as a task's exit
    proc.wait()


def stop_note(code: int | None, grace_seconds: float) -> str:
    """How a task stopped by :func:`kill_group` ended, for the last line of its log: ``code`` is its
    ``returncode`` (negative: the signal that ended it, as :mod:`subprocess` gives it). A task that traps
    SIGTERM and exits by itself reports its own exit code, even 0: the note says that is not a success (the
    attempt ends by the reason it was stopped for: timed out, cancelled, lease lost, worker stopped)."""
    if code is None or code == -signal.SIGKILL:
        return f"process group killed (SIGKILL after the {grace_seconds:g} s grace)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"process group killed ({name})"
    return f"SIGTERM sent to the process group; the task exited with code {code} (not a success)"


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


class Slot:
    """One of a worker's task slots: the task it runs now, read by the stop deadline's thread.

    Written by the slot's own thread only (under the GIL, one attribute at a time); the receive loop takes
    and frees slots under :attr:`Worker._slots_lock`.
    """

    __slots__ = (
        "busy",
        "failures",
        "inbox",
        "index",
        "live",
        "task",
        "task_ended_at",
        "task_killing",
        "thread",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        #: the started runs handed to the slot's thread by the receive loop (None: the thread exits)
        self.inbox: queue.SimpleQueue[tuple[Run, ReceivedMessage] | None] = queue.SimpleQueue()
        #: taken by the receive loop for a message, until its thread is done with it
        self.busy = False
        #: the running task's process, None between tasks
        self.task: TaskProcess | None = None
        #: when the slot's last task ended (time.monotonic())
        self.task_ended_at = 0.0
        #: the slot's thread is stopping its task (SIGTERM, grace, SIGKILL)
        self.task_killing = False
        #: the running attempt's log stream (set by _execute around _run_task)
        self.live: LiveLog | None = None
        #: the slot's thread (run_forever), started with its first run and kept for the next ones (its
        #: store connections with it)
        self.thread: threading.Thread | None = None
        #: failed deliveries in a row (an AWS error escaped), for the slot's backoff
        self.failures = 0


class Worker:
    """One worker process's loop over one tier's queue, running up to ``slots`` tasks at once.

    Args:
        deps: settings, store, queues, logs, clock.
        tier: the container tier whose queue it pulls from.
        owner: lease owner id (default :func:`worker_id`), the same for every slot.
        slots: tasks run at once by :meth:`run_forever` (None or 0: :func:`default_slots` of the tier).
    """

    def __init__(self, deps: Deps, tier: str, *, owner: str | None = None, slots: int | None = None) -> None:
        if slots is not None and slots < 0:
            raise ValueError(f"slots must be 0 (the tier's default) or more, not {slots}")
        self.deps = deps
        self.tier = tier
        self.owner = owner or worker_id()
        self.slots = slots or default_slots(tier)
        #: set by :meth:`stop` (the signal handlers): the loop and every slot stop at their next look
        self.stopping = StopFlag()
        self._slots = [Slot(i) for i in range(self.slots)]
        self._slots_lock = threading.Lock()
        #: set by a slot's thread when it frees its slot (the receive loop may poll again)
        self._freed = threading.Event()
        #: the slot of the calling thread (a slot thread's own; slot 0 for poll_once's caller)
        self._here = threading.local()
        #: the worker's variables passed to every task (PASSED_ENV), read once
        self._base_env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        #: the polls' starts handed to the session thread and not yet known done (run_forever's loop)
        self._outstanding: list[_Starts] = []
        #: a fault of a poll's start, for the loop's backoff (set by the session thread)
        self._start_fault: Exception | None = None
        #: the writes waiting for the session thread (run_forever): the polls' starts, the slots' ends
        #: (None: it exits)
        self._writes: queue.SimpleQueue[_Starts | _Ended | None] = queue.SimpleQueue()
        #: run_forever's slots hand their ends with a log to the log thread (:meth:`_log_loop`), which stores
        #: the logs and passes the ends on; poll_once and process store each log themselves
        self._packing = False
        self._logs: queue.SimpleQueue[_Ended | _LogCleanup | None] = queue.SimpleQueue()
        self._log_thread: threading.Thread | None = None
        #: ends handed to the log thread and not yet passed on to the session (guarded by _slots_lock)
        self._log_backlog = 0
        #: the log thread's open lingering pack of each tenant, and every pack not stored yet by the own key
        #: of each log it holds (log_pack_linger_seconds > 0; the log thread's alone)
        self._lingering: dict[str, _LingeringPack] = {}
        self._unstored: dict[str, _LingeringPack] = {}
        #: own keys of lingering logs that were stored nowhere (their pack and their own PUT failed): their
        #: chunks stay, as their log, when their cleanup comes
        self._keep_chunks: set[str] = set()
        #: the lease on every run the worker holds, renewed once per heartbeat interval (sessions.py)
        self.session = WorkerSession(deps, self.owner)
        #: whether the slots renew the session themselves (poll_once, process: no session thread runs)
        self._beats_inline = True
        #: receipt handles of started and dropped messages not deleted yet, with when they were added
        #: (time.monotonic()): deleted ten at a time, or after DELETE_LINGER_SECONDS
        self._deletes: list[tuple[str, float]] = []

    # ---- the receive loop ------------------------------------------------------------------------------
    def run_forever(self, *, wait_seconds: int = 2) -> None:
        """Poll and process until :meth:`stop` (or SIGTERM via the CLI), up to :attr:`slots` runs at once.

        Each poll asks for as many messages as there are free slots (at most 10); a slot's thread runs its
        task and hands the ended attempt on. Every write of the worker's runs goes through its session
        thread (:meth:`_session_loop`), which takes whatever is waiting (the polls' starts, the slots'
        ends) and applies it together (:func:`duetime.services.runs.start_and_finish`: one transaction,
        one commit, on the embedded store), then deletes the ended and dropped messages in one batch: a
        burst of short runs costs a few writes per poll, not four per run. Transient AWS errors back off.
        Told to stop, it waits for its slots (each hands its run back), lets the session thread record
        what is left, and returns."""
        failures = 0
        self._writes = queue.SimpleQueue()  # nothing left from an earlier run_forever
        self._logs = queue.SimpleQueue()
        self._log_backlog = 0
        self._lingering, self._unstored = {}, {}
        self._outstanding, self._start_fault = [], None
        session = threading.Thread(target=self._session_loop, name="session", daemon=True)
        self._beats_inline = False
        session.start()
        self._log_thread = threading.Thread(target=self._log_loop, name="logs", daemon=True)
        self._log_thread.start()
        self._packing = True
        try:
            while not self.stopping.is_set():
                free = self._free_slots()
                if not free:
                    self._freed.wait(SLOT_WAIT_SECONDS)
                    self._freed.clear()
                    continue
                try:
                    received = self.deps.queues.receive(
                        self.tier,
                        max_messages=min(len(free), MAX_RECEIVE_MESSAGES),
                        wait_seconds=wait_seconds,
                    )
                    if self.stopping.is_set():
                        # told to stop while the poll was out: never start a task only to stop it at once;
                        # the messages go back to the queue for another worker
                        for message in received:
                            self._give_back(message)
                        break
                    self._start_and_dispatch(received, free)
                    failures = 0
                except Exception as exc:  # noqa: BLE001 - a worker must outlive transient faults
                    failures += 1
                    if self.stopping.is_set():
                        break  # told to stop meanwhile (the stack going down took the endpoint with it)
                    self._log_failure("worker poll failed", exc)
                    self.stopping.wait(min(30.0, 0.5 * 2 ** min(failures, 6)))
        finally:
            for request in self._outstanding:  # the session gives each started run its slot (or frees it)
                while not request.done.wait(0.2) and session.is_alive():
                    pass
            self._wait_for_slots()
            self._packing = False
            self._logs.put(None)  # the log thread passes on what it holds, then exits
            while self._log_thread.is_alive():
                self._log_thread.join(0.2)
            self._writes.put(None)
            while session.is_alive():
                session.join(0.2)
            self._beats_inline = True
            while True:  # settlements the session handed over as the log thread exited
                try:
                    left = self._logs.get_nowait()
                except queue.Empty:
                    break
                if isinstance(left, _LogCleanup):
                    self._clean(left)
                elif isinstance(left, _Ended):  # the log thread died holding it: record it here
                    self._store_each([left])
                    self._apply([left])

    def _start_and_dispatch(self, received: list[ReceivedMessage], free: list[Slot]) -> None:
        """Hand the messages of one poll to the session thread, each with a free slot reserved for it, and
        return at once (the loop polls again for the slots still free while the session writes): the
        session starts them together with whatever else it has to write and gives each started run its
        slot; a refused start frees its slot and its message is deleted. Raises the fault of an earlier
        poll's start, if there was one since the last call (for the loop's backoff; those messages come
        back after their visibility timeout)."""
        for poison in received:
            if poison.message is None:
                # not a run message: leave it; the queue moves it to the tier's DLQ after maxReceiveCount
                logger.error("poison message", extra={"tier": self.tier, "body": poison.body[:500]})
        requests: dict[datetime | None, _Starts] = {}
        # the wall clock first: a pause between the two reads then lengthens a hold, never shortens it
        clock = self.deps.clock.now()
        now = time.monotonic()
        for received_run, slot in zip((r for r in received if r.message is not None), free, strict=False):
            assert received_run.message is not None
            wait = hold_seconds(received_run.message, clock)
            if wait > MAX_HOLD_SECONDS:  # back on the queue until it may be held (as its delay: rounded down)
                self._give_back(received_run, after=delay_seconds(received_run.message.ready_at, clock))
                continue
            # deliveries that may start at one instant start together (those ready now: one request)
            ready = received_run.message.ready_at if wait > 0 else None
            request = requests.setdefault(ready, _Starts([], ready_at=now + wait))
            request.received.append(received_run)
            request.slots.append(slot)
        if requests:
            with self._slots_lock:
                for request in requests.values():
                    for slot in request.slots:
                        slot.busy = True
            self._outstanding = [r for r in self._outstanding if not r.done.is_set()] + list(
                requests.values()
            )
            for request in requests.values():
                self._writes.put(request)
        fault, self._start_fault = self._start_fault, None
        if fault is not None:
            raise fault

    def _free_slots(self) -> list[Slot]:
        with self._slots_lock:
            return [slot for slot in self._slots if not slot.busy]

    def _dispatch(self, slot: Slot, run: Run, message: ReceivedMessage) -> None:
        """Give the started ``run`` to ``slot`` (reserved for it: busy) and its thread."""
        if slot.thread is None:
            thread = threading.Thread(
                target=self._slot_loop, args=(slot,), name=f"slot-{slot.index}", daemon=True
            )
            try:
                thread.start()
            except BaseException:
                self._release(slot)
                raise
            slot.thread = thread
        slot.inbox.put((run, message))

    def _handed_back(self, run: Run, *, error: str = "worker stopped") -> Finish:
        """The end of ``run``'s attempt, started but not run (or not to its end: its slot failed), as a worker
        told to stop records it: the run goes back to its queue at once without using up an attempt (at most
        MAX_FREE_INTERRUPTIONS times)."""
        return Finish(
            run,
            run.fencing_token,
            RunState.FAILED,
            error=error,
            reason=INTERRUPTED_REASON,
            ended_at=self.deps.clock.now(),
        )

    def _hand_back(self, message: ReceivedMessage, run: Run, *, error: str = "worker stopped") -> _Ended:
        """The end that hands ``run`` back (:meth:`_handed_back`), its task never run (or not to its end)."""
        return _Ended(message, self._handed_back(run, error=error), _STOPPED)

    def _release(self, slot: Slot) -> None:
        """Free ``slot`` (the loop may poll for it again)."""
        with self._slots_lock:
            slot.busy = False
        self._freed.set()

    def _slot_loop(self, slot: Slot) -> None:
        """A slot's thread: each started run handed to it, end to end, until told to exit (None)."""
        self._here.slot = slot
        while True:
            item = slot.inbox.get()
            if item is None:
                return
            run, message = item
            ended: _Ended | None = None
            try:
                if self.stopping.is_set():
                    # told to stop since the start: hand the run back without starting its task
                    ended = self._hand_back(message, run)
                else:
                    ended = self._deliver(run, message)
                if ended is not None:
                    (self._logs if ended.log is not None else self._writes).put(ended)
                slot.failures = 0
            except Exception as exc:  # noqa: BLE001 - a slot must outlive transient faults
                slot.failures += 1
                if ended is None:
                    # the run started and its message is gone: hand it back now (retried at once), never
                    # leave it held by the session with nothing running it
                    self._writes.put(self._hand_back(message, run, error=f"worker failed: {exc}"))
                if not self.stopping.is_set():
                    self._log_failure("worker slot failed", exc)
                    self.stopping.wait(min(30.0, 0.5 * 2 ** min(slot.failures, 6)))
            finally:
                self._release(slot)

    def _wait_for_slots(self) -> None:
        """Wait until every slot's thread is done (told to stop, each kills its task and hands its run back
        within its grace; one stuck on AWS is the stop deadline's to end), then let the threads exit."""
        for slot in self._slots:
            thread = slot.thread
            if thread is None:
                continue
            slot.inbox.put(None)
            while thread.is_alive():
                thread.join(0.2)
            slot.thread = None

    def _session_loop(self) -> None:
        """The session thread: applies the worker's writes, all those waiting at once (the polls' starts,
        the slots' ends), until the loop is done (None). An end whose record failed (a fault of the store:
        nothing was applied on the embedded store; on DynamoDB a repeat of an applied end is refused as
        stale) is tried again after a backoff, up to END_RETRIES times while its lease lasts. A poll's starts
        that came early wait until they may start (``ready_at``), or until the worker is told to stop (then
        :meth:`_apply` gives their messages back)."""
        waiting: list[_Starts | _Ended] = []  # held starts and ends to try again, each until its ready_at
        session = self.session
        while True:
            now = time.monotonic()
            timeout = max(0.0, min(item.ready_at for item in waiting) - now) if waiting else None
            if timeout is not None and any(isinstance(item, _Starts) for item in waiting):
                timeout = min(timeout, HOLD_LOOK_SECONDS)
            if session.holding():  # the session's beat is due then (by the session's clock)
                beat_in = max(0.0, session.next_beat - session.now())
                timeout = beat_in if timeout is None else min(timeout, beat_in)
            if self._deletes:  # and the waiting deletes then
                flush_in = max(0.0, self._deletes[0][1] + DELETE_LINGER_SECONDS - now)
                timeout = flush_in if timeout is None else min(timeout, flush_in)
            batch: list[_Starts | _Ended] = []
            done = False
            try:
                first = self._writes.get(timeout=timeout)
            except queue.Empty:
                pass  # a held start or a retry is due
            else:
                if first is None:
                    done = True
                else:
                    batch.append(first)
            while not done and len(batch) < MAX_WRITE_BATCH:
                try:
                    more = self._writes.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    done = True
                    break
                batch.append(more)
            now = time.monotonic()
            stopping = self.stopping.is_set()
            ready: list[_Starts | _Ended] = []
            held: list[_Starts | _Ended] = []
            for item in waiting + batch:
                starts = isinstance(item, _Starts)
                # exiting, everything is applied once more (held starts are given back)
                leaving = done or (stopping and starts)
                due = item.ready_at <= now and not (starts and self._still_early(item))  # type: ignore[arg-type]
                (ready if leaving or due else held).append(item)
            waiting = held + list(self._apply(ready) if ready else [])
            if session.due():
                self._hand_back_orphans(session.beat())
            self._flush_deletes(force=done)
            if done:
                return

    def _still_early(self, request: _Starts) -> bool:
        """Whether a held start may not start yet by the clock its attempts' times are on (a pause, or the
        wall clock stepped back, since the hold was timed): if so it is held again, for what is left."""
        wait = max(
            (
                hold_seconds(r.message, self.deps.clock.now())
                for r in request.received
                if r.message is not None
            ),
            default=0.0,
        )
        if wait > 0:
            request.ready_at = time.monotonic() + wait
        return wait > 0

    def _apply(self, batch: list[_Starts | _Ended]) -> list[_Ended]:
        """One write of the session: ``batch``'s starts and ends together; returns the ends to try again."""
        starts = [item for item in batch if isinstance(item, _Starts)]
        ends = [item for item in batch if isinstance(item, _Ended)]
        given_back: list[_Starts] = []
        if self.stopping.is_set() and starts:
            # told to stop: never start a task only to stop it at once; the messages go back
            for request in starts:
                for message in request.received:
                    self._give_back(message)
                request.outcomes = [StartRejectedError("worker stopping")] * len(request.received)
            starts, given_back = [], starts
        again: list[_Ended] = []
        try:
            again = self._write(starts, ends)
        except Exception as exc:  # noqa: BLE001 - the runs are found by the sweeper once their leases end
            self._log_failure("recording the worker's runs failed", exc)
            for request in starts:
                if len(request.outcomes) != len(request.received):
                    request.outcomes = [exc] * len(request.received)
        finally:
            for request in starts + given_back:
                if len(request.outcomes) != len(request.received):
                    request.outcomes = [RuntimeError("not started")] * len(request.received)
                self._hand_out(request)
                request.done.set()
        lease = self.deps.settings.lease_seconds
        now = time.monotonic()
        for ended in again:
            ended.tries += 1
            ended.ready_at = now + min(lease / 4, 0.25 * 2**ended.tries)
        kept = [e for e in again if e.tries <= END_RETRIES and not self.stopping.is_set()]
        self._settle_logs(ends, kept)
        for ended in again:
            if ended not in kept:
                self._release_run(ended)
                logger.warning(
                    "finished run not recorded: its lease will expire and the sweeper settles it",
                    extra={"run_id": ended.finish.run.run_id if ended.finish else None, "tries": ended.tries},
                )
        return kept

    def _hand_out(self, request: _Starts) -> None:
        """Give each run of ``request`` that started its reserved slot; free the others' slots (and note a
        fault for the loop's backoff)."""
        for slot, message, outcome in zip(request.slots, request.received, request.outcomes, strict=False):
            if isinstance(outcome, Run):
                try:
                    self._dispatch(slot, outcome, message)
                except Exception as exc:  # noqa: BLE001 - no thread (the slot is free): the run goes back
                    self._log_failure("starting a slot failed", exc)
                    self._writes.put(self._hand_back(message, outcome, error=f"worker failed: {exc}"))
                continue
            if not isinstance(outcome, StartRejectedError):
                self._start_fault = self._start_fault or outcome
            self._release(slot)

    def _give_back(self, message: ReceivedMessage, *, after: int = 0) -> None:
        """Put ``message`` back on the queue, visible again in ``after`` seconds; a retry this worker held
        (:meth:`_take_retry`: no delivery of its own) is sent as its wake-up, delayed until it may start."""
        if not message.receipt_handle and message.message is not None:
            try:
                wake = message.message
                self.deps.queues.send(
                    wake.tier or self.tier, wake, delay=delay_seconds(wake.ready_at, self.deps.clock.now())
                )
            except Exception as exc:  # noqa: BLE001 - the sweeper releases it after its watch time
                self._log_failure("sending a held retry's wake-up failed", exc)
            return
        try:
            self.deps.queues.extend_visibility(self.tier, message.receipt_handle, after)
        except Exception as exc:  # noqa: BLE001 - it comes back after its visibility timeout anyway
            self._log_failure("giving a message back failed", exc)

    def _take_retry(self, run: Run) -> bool:
        """Whether this worker starts ``run``'s next attempt itself (asked by the session thread about each
        end it records as RETRY_WAIT): when the backoff ends within :data:`MAX_HOLD_SECONDS` and a slot is
        free, the slot is reserved and the retry held with the early deliveries (:meth:`_session_loop`) until
        its ``retry_at``, then started under the same conditional start as a wake-up message's (RETRY_WAIT
        at the failed attempt, past ``retry_at``), so no message is sent, received or deleted for it. The
        failed attempt's delivery is deleted as usual: should this worker die meanwhile, the run's watch time
        (``retry_at`` + ``first_watch_seconds``) has the sweeper release it, as for a lost wake-up. Told to
        stop, the held retry's wake-up is sent (:meth:`_give_back`). Only in :meth:`run_forever` (its
        session thread holds starts); poll_once and process send the wake-up."""
        if self._beats_inline or self.stopping.is_set() or run.retry_at is None:
            return False
        wake = message_for(run, attempt=run.attempt + 1, retry_at=run.retry_at)
        wait = hold_seconds(wake, self.deps.clock.now())
        if wait > MAX_HOLD_SECONDS:
            return False
        with self._slots_lock:
            slot = next((s for s in self._slots if not s.busy), None)
            if slot is None:
                return False
            slot.busy = True
        request = _Starts([ReceivedMessage(wake, "", wake.body(), 0)], slots=[slot])
        request.ready_at = time.monotonic() + wait
        self._writes.put(request)  # taken by this (the session) thread's next round
        logger.info("retry held by its worker", extra={"run_id": run.run_id, "wait_seconds": round(wait, 3)})
        return True

    def _log_failure(self, what: str, exc: Exception) -> None:
        if self.deps.unreachable(exc):
            logger.warning(f"{what}: store unreachable or busy", extra={"tier": self.tier, "error": str(exc)})
        else:
            logger.exception(what, extra={"tier": self.tier})

    def stop(self) -> None:
        """Ask the loop to stop: only sets a flag (safe in a signal handler, any number of times)."""
        self.stopping.set()

    def poll_once(self, *, wait_seconds: int = 0) -> int:
        """Receive at most one message and process it in the calling thread (slot 0). Returns how many
        messages were received."""
        received = self.deps.queues.receive(self.tier, max_messages=1, wait_seconds=wait_seconds)
        for message in received:
            if self.stopping.is_set():
                # told to stop while the poll was out: never start a task only to stop it at once (its
                # effects would happen twice); the message goes back to the queue for another worker
                self.deps.queues.extend_visibility(self.tier, message.receipt_handle, 0)
                continue
            self.process(message)
        return len(received)

    @property
    def task_slots(self) -> tuple[Slot, ...]:
        """Every slot (the stop deadline's thread reads their tasks)."""
        return tuple(self._slots)

    def _slot(self) -> Slot:
        """The calling thread's slot."""
        slot: Slot | None = getattr(self._here, "slot", None)
        return slot if slot is not None else self._slots[0]

    # ---- one delivery ----------------------------------------------------------------------------------
    def process(self, received: ReceivedMessage) -> Run | None:
        """Handle one delivery end to end in the calling thread: start, run, finish, delete. Returns the
        run as finished, or None if it was dropped or its lease was lost."""
        if received.message is None:
            # not a run message: leave it; SQS moves it to the tier's DLQ after maxReceiveCount deliveries
            logger.error("poison message", extra={"tier": self.tier, "body": received.body[:500]})
            return None
        wait = hold_seconds(received.message, self.deps.clock.now())
        if wait > 0:
            # early: this thread holds nothing (no timer; the simulation's clock is not the wall's), the
            # delivery goes back until its attempt may start (rounded up); run_forever holds it instead
            self._give_back(received, after=min(MAX_MESSAGE_DELAY_SECONDS, math.ceil(wait)))
            return None
        request = _Starts([received])
        self._write([request], [])
        [outcome] = request.outcomes
        if isinstance(outcome, StartRejectedError):
            return None
        if isinstance(outcome, Exception):
            raise outcome
        ended = self._deliver(outcome, received)
        if ended is None:
            return None
        if self._write([], [ended]) and ended.error is not None:
            # not recorded, and not tried again here: no longer held, so the sweeper settles the run once its
            # own lease passes
            self._release_run(ended)
            raise ended.error
        return ended.recorded

    def _deliver(self, run: Run, received: ReceivedMessage) -> _Ended | None:
        """Run a started run's task (the calling slot's), with this thread's log keys."""
        # this thread's keys only: the other slots log their own runs
        logger.thread_safe_append_keys(run_id=run.run_id, attempt=run.attempt)
        try:
            return self._execute(run, received)
        finally:
            logger.thread_safe_remove_keys(["run_id", "attempt"])

    def _execute(self, run: Run, received: ReceivedMessage) -> _Ended:
        """Run the task, store its log, and say how the attempt ended (recorded by :meth:`_write`)."""
        token = run.fencing_token
        key = log_key(run.job_id, run.run_id, run.attempt)
        written: str | None = key  # the log key the finish records
        slot = self._slot()
        size: int | None = None  # bytes of the final log (0: nothing printed, nothing stored)
        with tempfile.TemporaryFile() as out:
            slot.live = live = LiveLog(self.deps.logs, key, out)
            try:
                outcome = self._run_task(run, token, out, received)
            finally:
                slot.live = None
            task_ended = self.deps.clock.now()
            data = read_log(out)
        pending: _PendingLog | None = None
        if not outcome.lease_lost and (data or live.chunks) and self._log_thread_takes():
            # the log thread stores it, with the others that end meanwhile (:meth:`_store_logs`)
            pending, size = _PendingLog(key, data, live.chunks), len(data)
        else:
            written, size = self._store_own(key, data, live.chunks)
        if outcome.lease_lost:
            logger.warning(f"{outcome.error or 'lease lost'}: task stopped, not finishing")
            return _Ended(received, None, outcome)
        if outcome.timed_out:
            state, reason = RunState.TIMED_OUT, "timeout"
            error: str | None = f"timed out after {run.timeout_seconds} s"
        elif outcome.exit_code == 0 and outcome.error is None:
            state, reason, error = RunState.SUCCEEDED, None, None
        else:
            state, reason = (
                RunState.FAILED,
                INTERRUPTED_REASON if outcome.error == "worker stopped" else "exit_code",
            )
            error = outcome.error or f"exit code {outcome.exit_code}"
        finish = Finish(
            run,
            token,
            state,
            ended_at=task_ended,
            exit_code=outcome.exit_code,
            error=error,
            log_key=written,
            reason=reason,
            log_bytes=size,
        )
        return _Ended(received, finish, outcome, log=pending)

    def _log_thread_takes(self) -> bool:
        """Whether this end's log goes to the log thread (and counts in its backlog): only in run_forever,
        while the thread lives and holds fewer than :attr:`slots` ends. Else the slot stores it itself (its
        own key) and stays busy meanwhile: a slow object store slows the worker's intake, it never leaves
        ends waiting past their leases in an unbounded queue."""
        thread = self._log_thread
        if not self._packing or thread is None or not thread.is_alive():
            return False
        with self._slots_lock:
            if self._log_backlog >= self.slots:
                return False
            self._log_backlog += 1
        return True

    def _store_own(self, key: str, data: bytes, chunks: int) -> tuple[str | None, int | None]:
        """Store an attempt's final log under its own key (none for an empty log without chunks), then delete
        its chunks: (the key its end records, the log's size). An upload that fails leaves the chunks as its
        log (its own key, size unknown), or no log if it streamed none."""
        try:
            if data or chunks:
                self.deps.logs.put(key, data)
        except Exception as exc:  # noqa: BLE001 - a log upload failure must not lose the outcome
            if self.deps.unreachable(exc):
                logger.warning("log upload failed: store unreachable or busy", extra={"error": str(exc)})
            else:
                logger.exception("log upload failed")
            return (key if chunks else None), None
        if chunks:
            self._delete_chunks(key, chunks)
        return key, len(data)

    def _delete_chunks(self, key: str, chunks: int) -> None:
        try:
            self.deps.logs.delete_chunks(key, count=chunks)
        except Exception:  # noqa: BLE001 - leftover chunks only cost storage (they expire)
            logger.warning("log chunks not deleted", exc_info=True, extra={"chunks": chunks})

    # ---- the log thread ----------------------------------------------------------------------------------
    def _log_loop(self) -> None:
        """The log thread (run_forever): stores the final logs of the slots' ends, those that end together
        as one log pack per tenant (:meth:`_store_logs`), and passes the ends on to the session thread, which
        records them; then settles each packed log once its record is known (:class:`_LogCleanup`). All the
        worker's log I/O at the end of an attempt happens here: never on the session thread, so a slow
        object store never holds back a start."""
        try:
            while True:
                try:
                    first = self._logs.get(timeout=self._lingering_wait())
                except queue.Empty:  # a lingering pack is due
                    self._store_lingering(due_only=True)
                    continue
                if first is None:
                    return
                if isinstance(first, _LogCleanup):
                    self._clean(first)
                    continue
                batch: list[_Ended] = [first]
                done = False
                try:
                    done = self._gather_logs(batch)
                    if self.deps.settings.log_pack_linger_seconds > 0:
                        self._linger_logs(batch)
                    else:
                        self._store_logs(batch)
                except Exception as exc:  # noqa: BLE001 - the thread must outlive it: its ends still get recorded
                    self._log_failure("storing logs failed", exc)
                    self._store_each(batch)
                with self._slots_lock:
                    self._log_backlog -= len(batch)
                for ended in batch:
                    self._writes.put(ended)
                self._store_lingering(due_only=True)
                if done:
                    return
        finally:  # told to stop (or a fault): what lingers is stored before the thread exits
            try:
                self._store_lingering(due_only=False)
            except Exception as exc:  # noqa: BLE001 - their chunks, if any, stay their logs
                self._log_failure("storing lingering logs failed", exc)
                self._keep_chunks.update(self._unstored)
            finally:  # nothing is left waiting for a pack once the thread is gone
                self._lingering.clear()
                self._unstored.clear()

    def _lingering_wait(self) -> float | None:
        """Seconds until the first lingering pack is due (None: none lingers)."""
        if not self._lingering:
            return None
        return max(0.0, min(pack.store_at for pack in self._lingering.values()) - time.monotonic())

    def _linger_logs(self, batch: list[_Ended]) -> None:
        """``log_pack_linger_seconds`` > 0: add the final logs of ``batch`` to their tenant's lingering pack
        (opened by the first, stored ``log_pack_linger_seconds`` later, or at once when full), each end naming
        its byte range (``log_pack``, ``log_offset``) so it is recorded at once, before its pack is stored.
        The trade (DESIGN.md section 7): one PUT for the ends of many seconds, but a just-ended run's log is
        read from its chunks, or not at all, until its pack is stored, and a worker killed meanwhile takes the
        final logs of the runs it ended in the linger with it (those that streamed chunks keep them: their output
        up to the last chunk)."""
        linger = self.deps.settings.log_pack_linger_seconds
        for ended in batch:
            log, finish = ended.log, ended.finish
            if log is None or finish is None or log.packed:
                continue
            tenant = finish.run.tenant
            pack = self._lingering.get(tenant)
            if pack is not None and pack.size + len(log.data) > PACK_MAX_BYTES:  # it would overflow
                self._close_pack(tenant)
                pack = None
            if pack is None:
                pack = self._lingering[tenant] = _LingeringPack(
                    self._new_pack_key(), time.monotonic() + linger
                )
            ended.finish = replace(finish, log_pack=pack.key, log_offset=pack.size)
            pack.logs.append(log)
            pack.size += len(log.data)
            log.packed = True
            self._unstored[log.key] = pack
            if pack.size >= PACK_MAX_BYTES or len(pack.logs) >= PACK_MAX_LOGS:  # full: stored at once
                self._close_pack(tenant)

    def _new_pack_key(self) -> str:
        """A fresh log pack key under today's day (UTC): ``logs/packs/<day>/<HHMMSS>-<uuid>.log``."""
        now = self.deps.clock.now()
        return pack_key(f"{now:%Y-%m-%d}", f"{now:%H%M%S}-{uuid.uuid4().hex}")

    def _close_pack(self, tenant: str) -> None:
        """Take ``tenant``'s lingering pack out of the open ones and store it."""
        self._store_lingering_pack(self._lingering.pop(tenant))

    def _store_lingering(self, *, due_only: bool) -> None:
        """Store the lingering packs that are due (all of them unless ``due_only``)."""
        now = time.monotonic()
        for tenant, pack in list(self._lingering.items()):
            if not due_only or pack.store_at <= now:
                self._close_pack(tenant)

    def _store_lingering_pack(self, pack: _LingeringPack) -> None:
        """One PUT of a lingering pack; if it fails, each of its logs under the attempt's own key (where a
        reader looks when the pack is not there). Then the cleanups that waited for it: chunks are deleted
        only once the final log they stand for is stored."""
        try:
            self.deps.logs.put(pack.key, b"".join(log.data for log in pack.logs))
        except Exception as exc:  # noqa: BLE001 - each attempt's log is then stored on its own
            self._log_failure("log pack upload failed", exc)
            for log in pack.logs:
                written, _ = self._store_own(log.key, log.data, 0)
                if written is None and log.data:
                    self._keep_chunks.add(log.key)  # its chunks, if any, stay its log
        for log in pack.logs:
            self._unstored.pop(log.key, None)
        for cleanup in pack.cleanups:
            self._clean(cleanup)

    def _gather_logs(self, batch: list[_Ended]) -> bool:
        """Add to ``batch`` the ends that wait, and those that come within ``log_pack_window_seconds`` while
        other slots still run a task (their logs then go out together); cleanups that come meanwhile are done
        at once. Returns True if told to exit (None). With ``log_pack_linger_seconds`` it waits for none: the
        lingering pack takes the ends of the next seconds without holding back this one's record."""
        settings = self.deps.settings
        window = 0.0 if settings.log_pack_linger_seconds > 0 else settings.log_pack_window_seconds
        deadline = time.monotonic() + window
        while len(batch) < MAX_WRITE_BATCH:
            with self._slots_lock:
                running = any(slot.busy for slot in self._slots)
            wait = running and not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0
            try:
                more = (
                    self._logs.get(timeout=min(left, LINGER_STEP_SECONDS))
                    if wait
                    else self._logs.get_nowait()
                )
            except queue.Empty:
                if wait:
                    continue
                return False
            if more is None:
                return True
            if isinstance(more, _LogCleanup):
                self._clean(more)
            else:
                batch.append(more)
        return False

    def _store_logs(self, batch: list[_Ended]) -> None:
        """Store the final logs of ``batch``: a tenant's only one under the attempt's own key (its chunks then
        deleted), several of a tenant as one log pack (:func:`~duetime.domain.logs.pack_key`; each end names
        its byte range: ``log_pack``, ``log_offset``) whose chunks are deleted once the end is recorded
        (:meth:`_settle_logs`). A pack that cannot be stored falls back to one object per attempt."""
        by_tenant: dict[str, list[_Ended]] = {}
        for ended in batch:
            if ended.log is not None and ended.finish is not None:
                by_tenant.setdefault(ended.finish.run.tenant, []).append(ended)
        for group in by_tenant.values():
            if len(group) == 1 or not self._store_pack(group):
                self._store_each(group)

    def _store_each(self, batch: list[_Ended]) -> None:
        """Each log of ``batch`` not stored in a pack under its own key (:meth:`_store_own`), also as the
        fallback of a pack that failed or a :meth:`_store_logs` that raised."""
        for ended in batch:
            log = ended.log
            if log is None or log.packed or ended.finish is None:
                continue
            try:
                written, size = self._store_own(log.key, log.data, log.chunks)
            except Exception:  # noqa: BLE001 - with chunks, they stay the attempt's log
                written, size = (log.key if log.chunks else None), None
            ended.finish = replace(ended.finish, log_key=written, log_bytes=size)
            ended.log = None

    def _store_pack(self, group: list[_Ended]) -> bool:
        """One log pack of ``group``'s logs; False (nothing changed) if it could not be stored."""
        logs = [e.log for e in group if e.log is not None]
        key = self._new_pack_key()
        try:
            self.deps.logs.put(key, b"".join(log.data for log in logs))
        except Exception as exc:  # noqa: BLE001 - each attempt's log is then stored on its own
            self._log_failure("log pack upload failed", exc)
            return False
        offsets = itertools.accumulate((len(log.data) for log in logs[:-1]), initial=0)
        for ended, log, offset in zip(group, logs, offsets, strict=True):
            assert ended.finish is not None
            ended.finish = replace(ended.finish, log_pack=key, log_offset=offset)
            log.packed = True
        return True

    def _settle_logs(self, ends: list[_Ended], kept: list[_Ended]) -> None:
        """After a write of the session: each packed log whose end is now known (recorded by the worker, or
        by someone else, or given up) is settled by the log thread: its chunks deleted, and first, unless the
        worker's record stands, its log put under the attempt's own key (the key the other record names)."""
        for ended in ends:
            log = ended.log
            if log is None or not log.packed or ended in kept:
                continue
            ended.log = None
            own = None if isinstance(ended.recorded, Run) else log.data
            cleanup = _LogCleanup(log.key, log.chunks, own)
            if self._log_thread is not None and self._log_thread.is_alive():
                self._logs.put(cleanup)
            else:
                self._clean(cleanup)

    def _clean(self, cleanup: _LogCleanup) -> None:
        pack = self._unstored.get(cleanup.key)
        if pack is not None and cleanup.chunks:  # its final log lingers: the chunks wait for it
            pack.cleanups.append(cleanup)
            return
        if cleanup.key in self._keep_chunks:  # its final log was stored nowhere: the chunks are its log
            self._keep_chunks.discard(cleanup.key)
            cleanup = replace(cleanup, chunks=0)
        if cleanup.data is not None:
            try:
                self.deps.logs.put(cleanup.key, cleanup.data)
            except Exception as exc:  # noqa: BLE001 - with chunks, they stay the attempt's log
                self._log_failure("log upload failed", exc)
                return
        if cleanup.chunks:
            self._delete_chunks(cleanup.key, cleanup.chunks)

    def _write(self, starts: list[_Starts], batch: list[_Ended]) -> list[_Ended]:
        """Apply the starts of ``starts`` and the ends of ``batch`` together (:func:`start_and_finish`),
        then delete in one batch the messages of every start applied or refused (a started run's message is
        no longer needed: the run row and the worker session hold it from then on; a duplicate or stale one
        is dropped). The starts are made under the worker session and held by it;
        an end recorded (or refused as stale) is released. Sets each request's outcomes and each end's
        ``recorded`` (the run as finished, or None: its lease was lost); returns the ends whose record
        failed (a fault: they stay held, and are tried again)."""
        messages = [r for request in starts for r in request.received]
        finishing = [e for e in batch if e.finish is not None]
        session_id = self.session.session_id
        since = self.session.now()  # the runs' own leases start no earlier than this
        started, ended = start_and_finish(
            [m.message for m in messages if m.message is not None],
            [e.finish for e in finishing if e.finish is not None],
            self.deps,
            owner=self.owner,
            session_id=session_id,
            takes_retry=None if self._beats_inline else self._take_retry,
        )
        handles: list[str] = []
        at = 0
        for request in starts:
            request.outcomes = started[at : at + len(request.received)]
            at += len(request.received)
            for message, outcome in zip(request.received, request.outcomes, strict=True):
                if isinstance(outcome, Run):
                    self.session.hold(outcome, since=since)
                    handles.append(message.receipt_handle)
                elif isinstance(outcome, StartRejectedError):
                    logger.info(
                        "duplicate or stale message dropped", extra={"run_id": outcome_run_id(message)}
                    )
                    handles.append(message.receipt_handle)
                elif message.message is not None:
                    # a fault: the start may have been applied; the session's next beat finds out
                    run_message = message.message
                    self.session.unsure(run_message.job_id, run_message.due_at, run_message.attempt, message)
        outcomes = dict(zip((id(e) for e in finishing), ended, strict=True))
        failed: list[_Ended] = []
        for item in batch:
            end = outcomes.get(id(item))
            if isinstance(end, Exception) and not isinstance(end, LeaseLostError):
                self._log_failure("recording a finished run failed", end)
                item.error = end
                failed.append(item)  # unknown whether it was recorded: still held, tried again
                continue
            item.recorded = end if isinstance(end, Run) else None
            self._release_run(item)
            if item.finish is not None:
                self._echo(item.finish, end)
        now = time.monotonic()
        # (a retry this worker held has no delivery of its own: no handle)
        self._deletes.extend((handle, now) for handle in handles if handle)
        # the started and dropped messages go out ten at a time, or once the oldest has waited
        # DELETE_LINGER_SECONDS; at once without a session thread (poll_once)
        self._flush_deletes(force=self._beats_inline)
        return failed

    def _flush_deletes(self, *, force: bool = False) -> None:
        """Delete the messages waiting for it (:attr:`_deletes`) in one batch: now if ``force`` or the
        oldest has waited :data:`DELETE_LINGER_SECONDS`, or there are a request's worth. A message not
        deleted comes back after its visibility timeout and its start is refused (the run moved on)."""
        if not self._deletes:
            return
        oldest = self._deletes[0][1]
        if not (
            force
            or len(self._deletes) >= MAX_RECEIVE_MESSAGES
            or time.monotonic() - oldest >= DELETE_LINGER_SECONDS
        ):
            return
        handles, self._deletes = [h for h, _ in self._deletes], []
        try:
            self.deps.queues.delete_batch(self.tier, handles)
        except Exception as exc:  # noqa: BLE001 - they come back, and are dropped by the conditional start
            self._log_failure("deleting messages failed", exc)

    def _orphan_ends(self, orphans: list[tuple[object, Run]]) -> list[_Ended]:
        """The hand-back ends of starts found applied after their write's fault (nothing runs them): each
        run goes back to its queue at once."""
        ends = []
        for ref, run in orphans:
            assert isinstance(ref, ReceivedMessage)
            logger.warning(
                "a start whose write failed was applied: handed back", extra={"run_id": run.run_id}
            )
            ends.append(self._hand_back(ref, run, error=LOST_START_ERROR))
        return ends

    def _hand_back_orphans(self, orphans: list[tuple[object, Run]]) -> None:
        """:meth:`_orphan_ends` recorded with the session thread's next write."""
        for ended in self._orphan_ends(orphans):
            self._writes.put(ended)

    def beat_inline(self) -> None:
        """The session's beat without a session thread (poll_once, process, the simulation's worker): the
        hand-backs of starts found applied are recorded at once."""
        ends = self._orphan_ends(self.session.beat())
        if ends:
            self._write([], ends)

    def _release_run(self, ended: _Ended) -> None:
        """The worker session no longer holds ``ended``'s run (its end is known, or given up)."""
        run_id = outcome_run_id(ended.received)
        if run_id is not None:
            self.session.release(run_id)

    def _echo(self, finish: Finish, outcome: Run | Exception | None) -> None:
        # a success at DEBUG: one line per run is most of a burst's log volume and of its logging CPU
        # (about 65 us a line); the run row and the RunStarted/ScheduleLag metrics have it
        log = logger.debug if finish.outcome is RunState.SUCCEEDED else logger.info
        log("run finished", extra={"state": finish.outcome.value, "exit_code": finish.exit_code})
        if os.environ.get("DUETIME_WORKER_ECHO"):
            run = finish.run
            shown = (
                outcome.state.value
                if isinstance(outcome, Run)
                else f"{finish.outcome.value} (rejected: stale token)"
            )
            # the reason when the exit code is not all of it (worker_stopped: not counted as an attempt)
            why = f", {finish.reason}" if finish.reason not in (None, "exit_code") else ""
            print(
                f"worker[{self.tier}]: run {run.run_id} attempt {run.attempt} -> {shown} "
                f"(exit {finish.exit_code}{why})",
                flush=True,
            )

    def _run_task(self, run: Run, token: int, out: IO[bytes], received: ReceivedMessage) -> TaskOutcome:
        task = run.task
        if not isinstance(task, ContainerTask):  # a Lambda task belongs to the dispatcher, not a worker
            out.write(b"duetime: a Lambda task cannot run on a container worker\n")
            return TaskOutcome(
                exit_code=None, timed_out=False, lease_lost=False, error="not a container task"
            )
        try:
            with tempfile.TemporaryFile() if task.stdin else open(os.devnull, "rb") as stdin:  # noqa: SIM115
                if task.stdin:
                    stdin.write(task.stdin.encode())
                    stdin.seek(0)
                # an argv list, no shell unless the job asked for one
                proc = TaskProcess(
                    task.command, env=task_env(run, self._base_env), stdin=stdin.fileno(), out=out.fileno()
                )
        except (OSError, ValueError) as exc:
            out.write(f"duetime: cannot start {task.command[0]!r}: {exc}\n".encode())
            return TaskOutcome(exit_code=127, timed_out=False, lease_lost=False, error=f"cannot start: {exc}")
        slot = self._slot()
        slot.task_killing, slot.task = False, proc
        marker = _task_marker(slot.index)
        try:
            if marker is not None:
                marker.write_text(str(proc.pid))  # the task's process group: reaped if this worker dies
            return self._supervise(run, token, out, received, proc)
        finally:
            if proc.returncode is None:  # an exception left it running: it must not outlive its supervision
                kill_group(proc, 0)
            slot.task_ended_at = time.monotonic()
            slot.task = None
            if marker is not None:
                marker.unlink(missing_ok=True)

    def _supervise(
        self, run: Run, token: int, out: IO[bytes], received: ReceivedMessage, proc: TaskProcess
    ) -> TaskOutcome:
        """Wait for the task, streaming its output and enforcing its deadline; stop it if the run is lost
        (the worker session's beat found it cancelled or fenced, or its lease ended by the worker's clock)
        or the worker is told to stop (looked at every 0.5 s). Runs in the task's slot's thread: its run,
        token and process only."""
        exited = ExitWaiter(proc)
        try:
            return self._watch(run, token, out, received, proc, exited)
        finally:
            exited.close()

    def _watch(
        self,
        run: Run,
        token: int,
        out: IO[bytes],
        received: ReceivedMessage,
        proc: TaskProcess,
        exited: ExitWaiter,
    ) -> TaskOutcome:
        """:meth:`_supervise`'s loop, waiting on ``exited``: every half second it looks whether the worker
        session still holds the run (:meth:`WorkerSession.lost`: cancelled, fenced, or the session's lease
        ended); without a session thread (poll_once, process) it renews the session itself when due."""
        settings = self.deps.settings
        deadline = time.monotonic() + run.timeout_seconds
        live = self._slot().live
        session = self.session
        while True:
            now = time.monotonic()
            code = exited.wait(min(max(0.0, deadline - now), 0.5))
            if code is not None:
                if code < 0 and self.stopping.is_set():  # killed by the stop deadline (the loop was held up)
                    out.write(b"\nduetime: worker stopping (SIGTERM); process group killed\n")
                    return TaskOutcome(
                        exit_code=code, timed_out=False, lease_lost=False, error="worker stopped"
                    )
                return TaskOutcome(exit_code=code, timed_out=False, lease_lost=False)
            now = time.monotonic()
            if self.stopping.is_set():
                self._kill(proc, settings.kill_grace_seconds)
                note = stop_note(proc.returncode, settings.kill_grace_seconds)
                out.write(f"\nduetime: worker stopping (SIGTERM); {note}\n".encode())
                return TaskOutcome(
                    exit_code=proc.returncode, timed_out=False, lease_lost=False, error="worker stopped"
                )
            if now >= deadline:
                self._kill(proc, run.on_timeout.kill_grace_seconds)
                note = stop_note(proc.returncode, run.on_timeout.kill_grace_seconds)
                out.write(f"\nduetime: timed out after {run.timeout_seconds} s; {note}\n".encode())
                return TaskOutcome(exit_code=proc.returncode, timed_out=True, lease_lost=False)
            if self._beats_inline and session.due():
                self.beat_inline()
            lost = session.lost(run.run_id)
            if lost is not None:
                self._kill(proc, settings.kill_grace_seconds)
                note = stop_note(proc.returncode, settings.kill_grace_seconds)
                why = (
                    f"run cancelled ({lost.cancelled})"
                    if lost.cancelled is not None
                    else f"lease lost ({lost.why})"
                )
                out.write(f"\nduetime: {why}; {note}\n".encode())
                return TaskOutcome(
                    exit_code=proc.returncode,
                    timed_out=False,
                    lease_lost=True,
                    error="run cancelled" if lost.cancelled is not None else None,
                )
            if live is not None:
                live.poll(time.monotonic())

    def _kill(self, proc: TaskProcess, grace_seconds: float) -> None:
        self._slot().task_killing = True  # the stop deadline's thread leaves it to this slot's loop
        kill_group(proc, grace_seconds)


def stop_budget_seconds() -> float:
    """The hand-back budget of a worker told to stop: ``$DUETIME_WORKER_STOP_BUDGET_SECONDS`` or the default."""
    try:
        return max(0.0, float(os.environ.get(STOP_BUDGET_ENV, STOP_BUDGET_SECONDS)))
    except ValueError:
        return STOP_BUDGET_SECONDS


def handle_stop_signals(worker: Worker, *, budget_seconds: float | None = None) -> None:
    """Make SIGTERM and SIGINT stop ``worker`` (a worker process's main thread calls this once).

    The handlers only set the worker's stop flag: no lock, no logging, no I/O, so a second and a third
    signal (ECS's SIGTERM, the local stack's, its lifeline's) are harmless wherever they land. The slots do
    the rest: each kills its task (its grace) and hands its run back; then the loop returns and it exits.

    A daemon thread (:func:`_stop_deadline`) makes sure a stopped worker does exit: ``budget_seconds``
    (default :func:`stop_budget_seconds`) after the stop was asked for and every task is dead, a worker still
    trying to reach AWS (the local stack's moto server died with it, say) exits anyway and the sweeper fails
    the attempts ``worker_lost``; if a slot has not begun to kill its task LOOP_STUCK_SECONDS after the stop
    (an AWS call of that slot hangs), that thread SIGTERMs the task's group, then SIGKILLs it after
    ``kill_grace_seconds``. The worker never exits leaving a task running.
    """

    def on_signal(_signum: int, _frame: object) -> None:
        worker.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    budget = stop_budget_seconds() if budget_seconds is None else budget_seconds
    threading.Thread(target=_stop_deadline, args=(worker, budget), name="stop-deadline", daemon=True).start()


def _exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited, without reaping it (its TaskProcess still waits for it)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already
    except (AttributeError, OSError):
        return False  # no waitid here: the grace decides


@dataclass
class _Stopping:
    """The stop deadline's view of one slot's task: which process, when it was SIGTERMed/SIGKILLed by it."""

    pid: int
    kill_at: float | None = None
    killed_at: float | None = None


def _stop_deadline(worker: Worker, budget: float) -> None:
    """The stop deadline of a worker process (a daemon thread of :func:`handle_stop_signals`), over all of
    its slots: a task whose slot has not begun to stop it LOOP_STUCK_SECONDS after the stop gets SIGTERM,
    then SIGKILL after its grace (or once it exited); ``budget`` seconds after the last task ended (or the
    stop, if later) the process exits, whatever its slots still wait for."""
    while not worker.stopping.is_set():
        time.sleep(0.5)
    asked = time.monotonic()
    term_at = asked + LOOP_STUCK_SECONDS
    seen: dict[int, _Stopping] = {}
    while True:
        now = time.monotonic()
        ends = [asked]
        all_ended = True
        for slot in worker.task_slots:
            task = slot.task
            if task is None:
                ends.append(slot.task_ended_at)
                continue
            mine = seen.get(slot.index)
            if mine is None or mine.pid != task.pid:
                seen[slot.index] = mine = _Stopping(task.pid)
            if mine.killed_at is not None:
                ends.append(mine.killed_at)
                continue
            all_ended = False
            if mine.kill_at is None and now >= term_at and not slot.task_killing:
                # the slot would have begun to stop its task by now: an AWS call holds it up; do what it would
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(task.pid, signal.SIGTERM)
                mine.kill_at = now + worker.deps.settings.kill_grace_seconds
            elif mine.kill_at is not None and (now >= mine.kill_at or _exited(task.pid)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(task.pid, signal.SIGKILL)  # as kill_group: whatever is left of its group
                mine.killed_at = now
        if all_ended and now >= max(ends) + budget:
            with contextlib.suppress(OSError):
                os.write(2, f"duetime worker: not stopped {budget:g} s after its task; exiting\n".encode())
            os._exit(1)
        time.sleep(0.2)
