"""A retry whose backoff is short is started by the worker that ran the failed attempt, from the same
delivery: no wake-up message is sent, received or deleted for it (``Worker._take_retry``). A longer backoff,
a worker told to stop while it holds one, and poll_once still send the wake-up. On the embedded (SQLite)
adapters with a real clock."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import duetime.services.worker as worker_module
from duetime.config.deps import Deps, sqlite_deps
from duetime.config.settings import Settings
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.models import ContainerTask, RetryPolicy, Run, RunMessage, RunState
from duetime.services import jobs
from duetime.services.worker import Worker
from tests.helpers import running_worker, wait_for

#: fails its first attempt, succeeds on the second
FAILS_ONCE = ["sh", "-c", 'test "$DUETIME_ATTEMPT" -ge 2']


@pytest.fixture
def deps(tmp_path: Path) -> Deps:
    settings = Settings(
        state_dir=str(tmp_path / "state"),
        lease_seconds=5,
        heartbeat_seconds=0.3,
        kill_grace_seconds=1,
        pending_grace_seconds=60,
    )
    return sqlite_deps(settings)


def _submit(deps: Deps, command: list[str], *, backoff: float = 1, attempts: int = 3) -> str:
    job = jobs.create_job(
        CreateJobRequest(
            name="r",
            task=ContainerTask(command=command),
            retry=RetryPolicy(max_attempts=attempts, backoff_seconds=backoff, jitter="none"),
        ),
        tenant="t1",
        deps=deps,
    )
    return job.job_id


def _run(deps: Deps, job_id: str) -> Run:
    [run] = deps.store.list_runs(job_id)
    return run


def _spy(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Records the worker's sends (message attempt, delay), non-empty receives and deleted handles."""
    seen: dict[str, list[Any]] = {"sends": [], "receives": [], "deletes": []}
    queues = deps.queues
    send, receive, delete_batch = queues.send, queues.receive, queues.delete_batch

    def spy_send(tier: str, message: RunMessage, *, delay: int = 0) -> None:
        seen["sends"].append((message.attempt, delay))
        send(tier, message, delay=delay)

    def spy_receive(tier: str, **kw: Any) -> Any:
        got = receive(tier, **kw)
        if got:
            seen["receives"].append(len(got))
        return got

    def spy_delete_batch(tier: str, handles: Any) -> None:
        seen["deletes"] += list(handles)
        delete_batch(tier, handles)

    monkeypatch.setattr(queues, "send", spy_send)
    monkeypatch.setattr(queues, "receive", spy_receive)
    monkeypatch.setattr(queues, "delete_batch", spy_delete_batch)
    return seen


def _empty(deps: Deps) -> dict[str, int]:
    return {"visible": 0, "delayed": 0, "in_flight": 0, "dead": 0}


def test_a_failing_once_run_is_retried_after_its_backoff_by_its_worker_once_without_a_message(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run-now job that fails its first attempt, with a 1 s backoff, and a worker with two slots
    job_id = _submit(deps, FAILS_ONCE, backoff=1)
    seen = _spy(deps, monkeypatch)
    worker = Worker(deps, "small", owner="w1", slots=2)
    # When the worker runs until the run ends
    with running_worker(worker):
        wait_for("the run to succeed", lambda: _run(deps, job_id).state is RunState.SUCCEEDED)
    # Then attempt 1 failed and attempt 2 succeeded, both on this worker, attempt 2 no sooner than its
    # retry_at (the failed attempt's end plus the 1 s backoff)
    run = _run(deps, job_id)
    first, second = run.attempts
    assert [(a.attempt, a.state, a.worker) for a in run.attempts] == [
        (1, RunState.FAILED, "w1"),
        (2, RunState.SUCCEEDED, "w1"),
    ]
    assert (run.attempt, run.fencing_token) == (2, 2)
    assert first.finished_at is not None and second.started_at is not None
    assert (second.started_at - first.finished_at).total_seconds() >= 1.0
    # And the retry cost no message: nothing sent, one delivery received and deleted (the claim's)
    assert seen["sends"] == []
    assert seen["receives"] == [1]
    assert len(seen["deletes"]) == 1
    assert deps.queues.counts("small") == _empty(deps)  # type: ignore[attr-defined]


def test_the_first_attempts_delivery_redelivered_after_the_retry_ended_does_nothing(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a failing-once run retried by its worker, now SUCCEEDED at attempt 2 under token 2
    job_id = _submit(deps, FAILS_ONCE, backoff=0.5)
    worker = Worker(deps, "small", owner="w1", slots=2)
    with running_worker(worker):
        wait_for("the run to succeed", lambda: _run(deps, job_id).state is RunState.SUCCEEDED)
    ended = _run(deps, job_id)
    # When its first attempt's wake-up comes back (a delete that never reached the queue), and a worker
    # takes it
    deps.queues.send("small", RunMessage(job_id=job_id, due_at=ended.due_at, attempt=1, tier="small"))
    assert Worker(deps, "small", owner="w2").poll_once() == 1
    # Then nothing ran or changed: the run is as it ended, and the delivery was deleted
    run = _run(deps, job_id)
    assert (run.state, run.attempt, run.fencing_token, len(run.attempts)) == (RunState.SUCCEEDED, 2, 2, 2)
    assert run.attempts == ended.attempts
    assert deps.queues.counts("small") == _empty(deps)  # type: ignore[attr-defined]


def test_a_backoff_longer_than_a_hold_sends_the_retrys_wake_up(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a failing-once run whose backoff is longer than a worker holds a start (MAX_HOLD_SECONDS)
    backoff = worker_module.MAX_HOLD_SECONDS + 1
    job_id = _submit(deps, FAILS_ONCE, backoff=backoff)
    seen = _spy(deps, monkeypatch)
    worker = Worker(deps, "small", owner="w1", slots=2)
    # When the worker runs until the run ends
    with running_worker(worker):
        wait_for("the run to succeed", lambda: _run(deps, job_id).state is RunState.SUCCEEDED)
    # Then the retry was woken by a message of attempt 2, sent delayed by its backoff (rounded down), and
    # received like the first
    assert [attempt for attempt, _ in seen["sends"]] == [2]
    assert seen["sends"][0][1] in (backoff - 1, backoff)
    assert seen["receives"] == [1, 1]
    run = _run(deps, job_id)
    assert [(a.attempt, a.state) for a in run.attempts] == [(1, RunState.FAILED), (2, RunState.SUCCEEDED)]
    assert deps.queues.counts("small") == _empty(deps)  # type: ignore[attr-defined]


def test_a_worker_told_to_stop_while_it_holds_a_retry_sends_its_wake_up_and_another_worker_runs_it(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a failing-once run with a 4 s backoff, whose first attempt a worker ran and now holds the retry of
    job_id = _submit(deps, FAILS_ONCE, backoff=4)
    seen = _spy(deps, monkeypatch)
    worker = Worker(deps, "small", owner="w1", slots=2)
    took: list[Run] = []
    real_take = worker._take_retry  # noqa: SLF001

    def take(run: Run) -> bool:
        taken = real_take(run)
        if taken:
            took.append(run)
        return taken

    monkeypatch.setattr(worker, "_take_retry", take)
    thread = threading.Thread(target=worker.run_forever, kwargs={"wait_seconds": 1}, daemon=True)
    thread.start()
    wait_for("the worker to hold the retry", lambda: len(took) == 1)
    # When it is told to stop before the backoff ends
    worker.stop()
    thread.join(timeout=20)
    assert not thread.is_alive()
    # Then the run waits in RETRY_WAIT and the retry's wake-up (attempt 2) is on the queue
    run = _run(deps, job_id)
    assert (run.state, run.attempt) == (RunState.RETRY_WAIT, 1)
    assert [attempt for attempt, _ in seen["sends"]] == [2]
    counts = deps.queues.counts("small")  # type: ignore[attr-defined]
    assert counts["visible"] + counts["delayed"] == 1
    # And another worker runs attempt 2 once the backoff has passed
    other = Worker(deps, "small", owner="w2", slots=1)
    with running_worker(other):
        wait_for("the retry to succeed", lambda: _run(deps, job_id).state is RunState.SUCCEEDED)
    run = _run(deps, job_id)
    assert [(a.attempt, a.state, a.worker) for a in run.attempts] == [
        (1, RunState.FAILED, "w1"),
        (2, RunState.SUCCEEDED, "w2"),
    ]
    assert deps.queues.counts("small") == _empty(deps)  # type: ignore[attr-defined]


def test_poll_once_sends_the_retrys_wake_up(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a failing-once run with no backoff, taken by poll_once (no session thread to hold a retry)
    job_id = _submit(deps, FAILS_ONCE, backoff=0)
    seen = _spy(deps, monkeypatch)
    worker = Worker(deps, "small", owner="w1")
    # When it polls twice
    assert worker.poll_once() == 1
    assert _run(deps, job_id).state is RunState.RETRY_WAIT
    assert worker.poll_once() == 1
    # Then the retry came by its own message, attempt 2
    assert seen["sends"] == [(2, 0)]
    run = _run(deps, job_id)
    assert [(a.attempt, a.state) for a in run.attempts] == [(1, RunState.FAILED), (2, RunState.SUCCEEDED)]
