"""A worker's session never holds a run nothing runs (services/sessions.py, services/worker.py): what a
fresh reviewer found the first version got wrong, each on the embedded adapters with real worker threads.

A started run's message is deleted, so the run row and the session are all that hold it: a run whose slot
failed, whose slot thread could not start, whose start's write failed but was applied, or whose message
could not be deleted must be handed back (retried at once), never left RUNNING under a live session until
its timeout. And an idle worker's session thread sleeps."""

from __future__ import annotations

import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import duetime.services.worker as worker_module
from duetime.config.deps import Deps, sqlite_deps
from duetime.config.settings import Settings
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.models import ContainerTask, Run, RunState
from duetime.services import jobs
from duetime.services.sweeper import sweep
from duetime.services.worker import Worker
from tests.helpers import running_worker, wait_for

LEASE = 2


@pytest.fixture
def sdeps(tmp_path: Path) -> Deps:
    """Embedded adapters, real time, lease 2 s, beat 0.3 s (as test_worker_slots, shorter lease)."""
    return sqlite_deps(
        Settings(
            state_dir=str(tmp_path / "state"),
            lease_seconds=LEASE,
            heartbeat_seconds=0.3,
            kill_grace_seconds=1,
            pending_grace_seconds=60,
        )
    )


def _submit(deps: Deps, command: list[str], name: str = "t") -> str:
    job = jobs.create_job(
        CreateJobRequest(name=name, task=ContainerTask(command=command), timeout_seconds=3600),
        tenant="t1",
        deps=deps,
    )
    return job.job_id


def _run(deps: Deps, job_id: str) -> Run:
    [run] = deps.store.list_runs(job_id)
    return run


def _sweep_all(deps: Deps) -> dict[str, int]:
    totals: dict[str, int] = {}
    for shard in range(deps.settings.shard_count):
        result = sweep(shard, deps)
        for name in ("leases_expired", "held_by_session", "sessions_revoked"):
            totals[name] = totals.get(name, 0) + getattr(result, name)
    return totals


# ---- an idle session thread sleeps ------------------------------------------------------------------------
def test_an_idle_worker_session_thread_does_not_spin(sdeps: Deps, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}

    class Counting(queue.SimpleQueue):  # type: ignore[type-arg]
        def get(self, block: bool = True, timeout: float | None = None) -> Any:
            if threading.current_thread().name == "session":
                calls["n"] += 1
            return super().get(block, timeout)

    class Q:
        SimpleQueue = Counting
        Empty = queue.Empty

    monkeypatch.setattr(worker_module, "queue", Q)
    worker = Worker(sdeps, "small", owner="w1", slots=2)
    with running_worker(worker):
        time.sleep(0.5)
        before = calls["n"]
        time.sleep(2)
        spins = calls["n"] - before
    # holding no run, there is nothing to beat: the thread should block on its queue (a few wake-ups at most)
    assert spins < 50, f"session thread woke {spins} times in 2 s while idle"


# ---- a slot whose delivery raises hands its run back --------------------------------------------------------
def test_a_run_whose_slot_failed_before_its_task_is_not_held_forever(
    sdeps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tempfile.TemporaryFile
    failed = threading.Event()

    def temporary_file(*a: Any, **kw: Any) -> Any:
        if threading.current_thread().name.startswith("slot-") and not failed.is_set():
            failed.set()
            raise OSError(28, "No space left on device")
        return real(*a, **kw)

    monkeypatch.setattr(worker_module.tempfile, "TemporaryFile", temporary_file)
    job_id = _submit(sdeps, ["true"])
    worker = Worker(sdeps, "small", owner="w1", slots=1)
    with running_worker(worker):
        wait_for("the slot to fail", failed.is_set)
        time.sleep(LEASE + 2)  # well past the run's own lease
        swept = _sweep_all(sdeps)
        holding = worker.session.holding()
        state = _run(sdeps, job_id).state
        run = _run(sdeps, job_id)
    # the failed slot handed the run back at once (no attempt used up) and the retry ran it
    assert holding == 0, "the session still holds (and renews) a run no slot runs"
    assert (swept["held_by_session"], state) == (0, RunState.SUCCEEDED), (swept, state)
    assert [(a.state, a.reason) for a in run.attempts] == [
        (RunState.FAILED, "worker_stopped"),
        (RunState.SUCCEEDED, None),
    ]


# ---- a slot thread that cannot start: its run is handed back ---------------------------------------------
def test_a_run_whose_slot_thread_could_not_start_is_not_held_forever(
    sdeps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start = threading.Thread.start
    failed = threading.Event()

    def start(self: threading.Thread) -> None:
        if self.name.startswith("slot-") and not failed.is_set():
            failed.set()
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    job_id = _submit(sdeps, ["true"])
    worker = Worker(sdeps, "small", owner="w1", slots=1)
    with running_worker(worker):
        wait_for("the slot thread to fail", failed.is_set)
        time.sleep(LEASE + 2)
        swept = _sweep_all(sdeps)
        holding = worker.session.holding()
        state = _run(sdeps, job_id).state
    assert holding == 0, "the session still holds a run whose message is gone and whose task never ran"
    assert (swept["held_by_session"], state) == (0, RunState.SUCCEEDED), (swept, state)


# ---- a failed delete after the start: the run still runs, nothing stays held -----------------------------
def test_process_whose_delete_failed_does_not_leave_its_run_held(
    sdeps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = _submit(sdeps, ["true"])
    real = sdeps.queues.delete_batch
    calls = {"n": 0}

    def delete_batch(tier: str, handles: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("DeleteMessageBatch throttled")
        real(tier, handles)

    monkeypatch.setattr(sdeps.queues, "delete_batch", delete_batch)
    worker = Worker(sdeps, "small", owner="w1")
    assert worker.poll_once() == 1
    # the message comes back after its visibility timeout and its start is refused then
    assert worker.session.holding() == 0, "process() left the run held by the session"
    assert _run(sdeps, job_id).state is RunState.SUCCEEDED


# ---- a start whose write failed but was applied: handed back at the session's next beat --------------------
def test_a_start_applied_despite_its_write_failing_is_handed_back_not_left_running(
    sdeps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a store whose first start is applied but reported as a fault (a timeout after the write)
    real = sdeps.store.start_many
    faulted = threading.Event()

    def start_many(starts: Any) -> list[Any]:
        outcomes = real(starts)
        if starts and not faulted.is_set():
            faulted.set()
            return [RuntimeError("read timed out")] + list(outcomes[1:])
        return outcomes

    monkeypatch.setattr(sdeps.store, "start_many", start_many)
    job_id = _submit(sdeps, ["true"])
    worker = Worker(sdeps, "small", owner="w1", slots=1)
    with running_worker(worker):
        wait_for("the faulted start", faulted.is_set)
        # Then the worker's next beat finds the run RUNNING under its session, and hands it back: retried
        # at once, long before its own lease or the timeout handler would have ended it
        run = wait_for(
            "the run to succeed",
            lambda: r if (r := _run(sdeps, job_id)).state is RunState.SUCCEEDED else None,
            timeout=LEASE,
        )
        assert worker.session.holding() == 0
    assert [(a.state, a.reason, a.attempt) for a in run.attempts] == [
        (RunState.FAILED, "worker_stopped", 1),
        (RunState.SUCCEEDED, None, 2),
    ]
