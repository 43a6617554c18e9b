"""Signal-safe workers: signal handlers only set a flag, so repeated SIGTERMs are harmless, and a `duetime local`
killed with SIGKILL leaves no process behind (its children follow it through their lifeline).

A stack's processes are found by what marks them, not by name: every process `duetime local` starts carries
``DUETIME_PARENT_PID=<its pid>`` in its environment (``/proc/<pid>/environ``), the tasks of these tests carry a
marker variable of their own, and anything below any of them in the process tree counts too. A process is the
same one only while its start time (``/proc/<pid>/stat`` field 22) is unchanged, so a reused pid never counts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from duetime.config.settings import CONTAINER_TIERS
from duetime.local.lifeline import PARENT_PID_ENV
from tests.e2e.conftest import Stack, start_stack, stop_stack

pytestmark = pytest.mark.e2e

#: the environment variable that marks the tasks of one test's jobs
MARK_ENV = "DUETIME_TEST_MARK"
#: a stack SIGKILLed with every tier busy must be gone this long after
GONE_WITHIN_SECONDS = 10.0


def _stat(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (state, ppid, ...), or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _identity(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot): with the pid, it names one process."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _alive(pid: int, started: int) -> bool:
    """Whether the process ``(pid, started)`` still runs (a zombie has exited: it only awaits its reaping)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == started


def stack_processes(stack_pid: int, mark: str) -> dict[int, int]:
    """``{pid: start time}`` of every live process of the stack ``stack_pid``: below it in the process tree,
    marked ``DUETIME_PARENT_PID=<stack_pid>`` (moto's server, workers, Lambda function processes: also once
    orphaned), or marked ``MARK_ENV=<mark>`` (the tasks), and everything below any of those."""
    wanted = {f"{PARENT_PID_ENV}={stack_pid}".encode(), f"{MARK_ENV}={mark}".encode()}
    children: dict[int, list[int]] = {}
    roots = {stack_pid}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        fields = _stat(pid)
        if fields is None or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(pid)
        with contextlib.suppress(OSError):
            if wanted & set((entry / "environ").read_bytes().split(b"\0")):
                roots.add(pid)
    found: dict[int, int] = {}
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        started = _identity(pid)
        if started is None:
            continue
        if pid != stack_pid:
            found[pid] = started
        todo.extend(children.get(pid, []))
    return found


def _sleep_job(tier: str, mark: str) -> dict:
    return {
        "name": f"signals-{tier}",
        "task": {"kind": "container", "command": ["sleep", "300"], "tier": tier, "env": {MARK_ENV: mark}},
    }


def kill9_with_every_tier_busy(workdir: Path) -> float:
    """Start a stack with two workers per tier, one busy in each, SIGKILL it; returns how long its last
    process took to go (fails if any is left after GONE_WITHIN_SECONDS)."""
    mark = uuid.uuid4().hex
    workdir.mkdir(parents=True, exist_ok=True)
    # the moto backend: moto's server is one more process that must go with the stack
    stack = start_stack(workdir, "--tick-seconds", "1", "--workers", "2", backend="moto")
    seen: dict[int, int] = {}
    try:
        # Given a stack whose every tier runs a task (its other worker long-polling its queue)
        job_ids = []
        for tier in CONTAINER_TIERS:
            status, job = stack.request("POST", "/jobs", _sleep_job(tier, mark))
            assert status == 201, job
            job_ids.append(job["job_id"])
        owners = [stack.wait_run(j, {"RUNNING"}, timeout=60)[0]["lease_owner"] for j in job_ids]
        deadline = time.monotonic() + 10  # a run is RUNNING a moment before its worker starts the task
        while True:
            seen = stack_processes(stack.proc.pid, mark)
            tasks = _marked(seen, mark)
            if len(tasks) == len(CONTAINER_TIERS) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(tasks) == len(CONTAINER_TIERS), tasks
        workers = {int(owner.split(":")[1]) for owner in owners}
        assert workers <= set(seen), (workers, seen)
        assert len(seen) >= 1 + 2 * len(CONTAINER_TIERS) + len(tasks), seen  # moto, the workers, the tasks
        # When `duetime local` is killed with SIGKILL (no cleanup of its own runs)
        os.kill(stack.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        stack.proc.wait(timeout=10)
        # Then every process it started, and every task they ran, is gone within 10 s
        left = seen
        while time.monotonic() - killed < GONE_WITHIN_SECONDS:
            seen.update(stack_processes(stack.proc.pid, mark))  # one started meanwhile counts too
            left = {pid: t for pid, t in seen.items() if _alive(pid, t)}
            if not left:
                return time.monotonic() - killed
            time.sleep(0.1)
        raise AssertionError(
            f"alive {GONE_WITHIN_SECONDS:g} s after SIGKILL: {_describe(left)}\n"
            + "".join(stack.output[-30:])
        )
    finally:
        if stack.proc.poll() is None:
            stack.proc.kill()
            stack.proc.wait()
        for pid, started in seen.items():  # never leave a process behind for the next test
            if _alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _marked(processes: dict[int, int], mark: str) -> list[int]:
    found = []
    for pid in processes:
        with contextlib.suppress(OSError):
            if f"{MARK_ENV}={mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
    return found


def _describe(processes: dict[int, int]) -> str:
    parts = []
    for pid in processes:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            parts.append(f"{pid} (ppid {(_stat(pid) or ['?', '?'])[1]}): {cmd}")
    return "; ".join(parts)


def test_a_stack_sigkilled_three_times_with_every_tier_busy_leaves_no_process_behind(tmp_path: Path) -> None:
    took = [kill9_with_every_tier_busy(tmp_path / f"round{i}") for i in range(3)]
    print(f"last process of the stack gone after: {', '.join(f'{t:.1f} s' for t in took)}")


@pytest.fixture(scope="module")
def one_worker_stack(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    stack = start_stack(tmp_path_factory.mktemp("signals"), "--tick-seconds", "1", "--workers", "1")
    yield stack  # type: ignore[misc]
    stop_stack(stack)


def test_three_sigterms_within_100_ms_stop_a_worker_within_its_grace_and_its_run_goes_back(
    one_worker_stack: Stack,
) -> None:
    stack = one_worker_stack
    # Given a worker running a task
    job = {
        "name": "signals",
        "task": {"kind": "container", "command": ["sh", "-c", "echo begun; sleep 2; echo done"]},
        "retry": {"max_attempts": 1},
    }
    status, created = stack.request("POST", "/jobs", job)
    assert status == 201, created
    [run] = stack.wait_run(created["job_id"], {"RUNNING"}, timeout=30)
    pid = int(run["lease_owner"].split(":")[1])
    started = _identity(pid)
    assert started is not None
    # When it gets three SIGTERMs within 100 ms (ECS's, the stack's, a lifeline's: all at once)
    sent = time.monotonic()
    for _ in range(3):
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.04)
    # Then it exits within its grace (kill_grace_seconds: 10 s), having stopped its task
    while _alive(pid, started) and time.monotonic() - sent < 10:
        time.sleep(0.05)
    took = time.monotonic() - sent
    assert not _alive(pid, started), "the worker ignored its SIGTERMs"
    print(f"worker exited {took:.2f} s after the first of three SIGTERMs")
    # And its run went back without using up its one attempt (worker_stopped), and ran again to the end
    [run] = stack.wait_run(created["job_id"], {"SUCCEEDED"}, timeout=40)
    assert [(a["attempt"], a.get("reason")) for a in run["attempts"]] == [(1, "worker_stopped"), (2, None)], (
        run
    )
    status, log = stack.request("GET", f"/runs/{run['run_id']}/logs?attempt=1")
    assert status == 200 and log.startswith("begun\n") and "worker stopping (SIGTERM)" in log
    assert "done" not in log
