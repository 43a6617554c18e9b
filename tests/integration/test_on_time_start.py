"""A run starts at its due time, not up to a second after it: queue delays are whole seconds (SQS's
``DelaySeconds``), rounded down, and the worker holds a delivery that came early until its attempt may start
(the run's due time, or a retry's ``retry_at``). On the embedded (SQLite) adapters with a real clock and a
real ``run_forever`` worker."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import duetime.services.worker as worker_module
from duetime.config.deps import Deps, sqlite_deps
from duetime.config.settings import Settings
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.lifecycle import build_run, message_for
from duetime.domain.models import ContainerTask, RetryPolicy, Run, RunState, ScheduleSpec, Trigger
from duetime.services import jobs
from duetime.services.worker import Worker
from tests.helpers import running_worker as _running
from tests.helpers import wait_for as _wait

#: how late a start may be on this machine and still count as on time, seconds (a poll, a write, a spawn)
ON_TIME = 0.5


@pytest.fixture
def deps(tmp_path: Path) -> Deps:
    return sqlite_deps(
        Settings(
            state_dir=str(tmp_path / "state"),
            lease_seconds=5,
            heartbeat_seconds=0.3,
            kill_grace_seconds=1,
            pending_grace_seconds=60,
        )
    )


def _run(deps: Deps, job_id: str) -> Run:
    [run] = deps.store.list_runs(job_id)
    return run


def _early_run(deps: Deps, due: datetime) -> Run:
    """A manual run due at ``due`` of a job of its own (due far later), stored PENDING with its wake-up
    visible at once: a delivery that comes ``due - now`` seconds early."""
    job = jobs.create_job(
        CreateJobRequest(
            name="early",
            task=ContainerTask(command=["true"]),
            schedule=ScheduleSpec(expression="at(2030-01-01T00:00:00)", timezone="UTC"),
        ),
        tenant="t1",
        deps=deps,
    )
    run = build_run(job, due, now=datetime.now(UTC), watch_after_seconds=30, trigger=Trigger.MANUAL)
    deps.store.put_new_run(run)
    deps.queues.send(run.task.tier, message_for(run), delay=0)
    return run


def _at_fraction(fraction: float) -> datetime:
    """Sleep until the wall clock is ``fraction`` of the way through a second; returns the next whole
    second plus 2 s (a due time about ``3 - fraction`` seconds away)."""
    now = time.time()
    time.sleep((fraction - now % 1) % 1)
    return datetime.fromtimestamp(int(time.time()) + 3, UTC)


def test_a_run_claimed_ahead_starts_at_its_due_time_not_up_to_a_second_late(deps: Deps) -> None:
    # Given a one-off job submitted 0.8 s into a second, due 2.2 s later: claimed at once, its wake-up
    # delayed by 2 s (rounded up, 3 s: it would start 0.8 s late)
    due = _at_fraction(0.8)
    job = jobs.create_job(
        CreateJobRequest(
            name="on-time",
            task=ContainerTask(command=["true"]),
            schedule=ScheduleSpec(expression=f"at({due:%Y-%m-%dT%H:%M:%S})", timezone="UTC"),
        ),
        tenant="t1",
        deps=deps,
    )
    assert _run(deps, job.job_id).state is RunState.PENDING
    # When a worker runs
    with _running(Worker(deps, "small", owner="w1")):
        run = _wait("the run", lambda: (r := _run(deps, job.job_id)).state.terminal and r)
    # Then it started at its due time: not before, and well within the second rounding up would cost
    assert run.state is RunState.SUCCEEDED
    assert run.attempts[0].started_at is not None
    lag = (run.attempts[0].started_at - due).total_seconds()
    assert 0 <= lag < ON_TIME, f"started {lag:.3f} s after its due time"


def test_a_delivery_far_too_early_goes_back_to_the_queue_and_starts_on_time(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker that holds deliveries at most 1 s early, and a run due 2.5 s from now whose wake-up is
    # visible at once (a clock far off, a message sent too soon)
    monkeypatch.setattr(worker_module, "MAX_HOLD_SECONDS", 1.0)
    given_back: list[int] = []
    real_extend = deps.queues.extend_visibility

    def extend(tier: str, receipt_handle: str, seconds: int) -> None:
        given_back.append(seconds)
        real_extend(tier, receipt_handle, seconds)

    monkeypatch.setattr(deps.queues, "extend_visibility", extend)
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    run = _early_run(deps, due)
    tier = run.task.tier
    # When a worker runs
    with _running(Worker(deps, "small", owner="w1")):
        # Then it does not start the run early: the message goes back, invisible, the run stays PENDING
        _wait("the delivery given back", lambda: deps.queues.counts(tier)["in_flight"] == 1, timeout=5)
        time.sleep(0.5)
        assert deps.store.get_run(run.job_id, due).state is RunState.PENDING  # type: ignore[union-attr]
        # and it starts once the message comes back, at its due time
        done = _wait("the run", lambda: (r := deps.store.get_run(run.job_id, due)) and r.state.terminal and r)
    assert done.state is RunState.SUCCEEDED
    # given back once, for the whole seconds to its due time (2, rounded down from about 2.x), then held
    assert given_back == [2]
    lag = (done.attempts[0].started_at - due).total_seconds()
    assert 0 <= lag < ON_TIME, f"started {lag:.3f} s after its due time"


def test_a_retry_woken_before_its_backoff_ends_starts_at_retry_at_not_dropped(deps: Deps) -> None:
    # Given a job whose attempt 1 fails, with a 1.2 s backoff and no jitter: its retry's wake-up is delayed
    # 1 s (rounded down: 0.2 s before retry_at; rounded up it would come 0.8 s after)
    job = jobs.create_job(
        CreateJobRequest(
            name="retry",
            task=ContainerTask(command=["sh", "-c", 'test "$DUETIME_ATTEMPT" = 2']),
            retry=RetryPolicy(max_attempts=2, backoff_seconds=1.2, jitter="none"),
        ),
        tenant="t1",
        deps=deps,
    )
    # When a worker runs both attempts
    with _running(Worker(deps, "small", owner="w1")):
        run = _wait("attempt 2", lambda: (r := _run(deps, job.job_id)).state.terminal and r)
    # Then attempt 2 started at its retry time (not refused as early and left to the sweeper's release)
    assert (run.state, run.attempt) == (RunState.SUCCEEDED, 2)
    first, second = run.attempts
    assert first.finished_at is not None and second.started_at is not None
    retry_at = first.finished_at + timedelta(seconds=1.2)
    lag = (second.started_at - retry_at).total_seconds()
    assert 0 <= lag < ON_TIME, f"attempt 2 started {lag:.3f} s after retry_at"


def test_a_worker_told_to_stop_while_holding_an_early_delivery_gives_it_back_at_once(deps: Deps) -> None:
    # Given a worker holding the wake-up of a run due 4 s from now (within its hold)
    run = _early_run(deps, datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4))
    tier = run.task.tier
    worker = Worker(deps, "small", owner="w1")
    thread = threading.Thread(target=worker.run_forever, kwargs={"wait_seconds": 1}, daemon=True)
    thread.start()
    _wait("the delivery received", lambda: deps.queues.counts(tier)["in_flight"] >= 1, timeout=5)
    # When it is told to stop
    stopped = time.monotonic()
    worker.stop()
    thread.join(timeout=10)
    # Then it exits within a second, without starting the run, and the message is visible again for another
    assert not thread.is_alive()
    assert time.monotonic() - stopped < 1.0
    assert deps.store.get_run(run.job_id, run.due_at).state is RunState.PENDING  # type: ignore[union-attr]
    assert deps.queues.counts(tier)["visible"] >= 1
