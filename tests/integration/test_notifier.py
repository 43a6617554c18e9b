"""The notifier on the embedded adapters: the outbox trigger, event derivation, rules, webhook deliveries to
a real HTTP receiver, retries and dead letters (a fixed clock; real SQLite files)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime.config.deps import Deps, sqlite_deps
from duetime.config.settings import Settings
from duetime.domain.api_models import CreateJobRequest, UpdateJobRequest
from duetime.domain.clock import FixedClock
from duetime.domain.models import ContainerTask, NotificationRule, RetryPolicy, ScheduleSpec
from duetime.domain.notifications import verify_signature
from duetime.services import jobs, notifier
from duetime.services.sweeper import sweep
from duetime.services.worker import Worker
from tests.conftest import T0
from tests.receiver import Receiver

SECRET = "s3cret-s3cret-s3cret"


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def deps(tmp_path: Path, clock: FixedClock) -> Deps:
    settings = Settings(
        state_dir=str(tmp_path / "state"), notify_backoff_seconds=5, notify_max_backoff_seconds=20
    )
    return sqlite_deps(settings, clock)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hook = Receiver().up()
    yield hook
    hook.down()


def _rule(receiver: Receiver, *events: str, **extra: Any) -> NotificationRule:
    return NotificationRule.model_validate(
        {"on": list(events), "webhook": {"url": receiver.url, "secret": SECRET}, **extra}
    )


def _submit(deps: Deps, command: str, rules: list[NotificationRule], **kw: Any) -> str:
    request = CreateJobRequest(
        name="nightly",
        task=ContainerTask(command=["sh", "-c", command]),
        retry=RetryPolicy(max_attempts=3, backoff_seconds=1, jitter="none"),
        notifications=rules,
        **kw,
    )
    return jobs.create_job(request, tenant="t1", deps=deps).job_id


def _pump(deps: Deps) -> None:
    """The local stack's notifier pass: read the whole feed, try every due delivery."""
    while notifier.process_changes(deps):
        pass
    notifier.deliver_due(deps)


def _run_attempts(deps: Deps, clock: FixedClock, attempts: int) -> None:
    worker = Worker(deps, "small", owner="w1")
    for _ in range(attempts):
        assert worker.poll_once(wait_seconds=2) == 1
        clock.advance(5)  # past the 1 s backoff (the wake-up's delay)


def test_a_run_failing_every_attempt_sends_one_signed_dead_lettered_delivery(
    deps: Deps, clock: FixedClock, receiver: Receiver
) -> None:
    # Given a job failing its 3 attempts, with a rule on dead_lettered only
    job_id = _submit(deps, "exit 3", [_rule(receiver, "dead_lettered")])
    _run_attempts(deps, clock, 3)
    # When the notifier reads the feed and delivers (twice: nothing is sent again)
    _pump(deps)
    _pump(deps)
    # Then exactly one delivery came, of a dead_lettered event of that run
    assert len(receiver.received) == 1
    [got] = receiver.received
    body = got.json
    [run] = deps.store.list_runs(job_id)
    assert (body["type"], body["job_id"], body["run_id"], body["attempt"]) == (
        "dead_lettered",
        job_id,
        run.run_id,
        3,
    )
    assert (body["state"], body["tenant"], body["job_name"], body["run_path"]) == (
        "FAILED",
        "t1",
        "nightly",
        f"/runs/{run.run_id}",
    )
    assert body["event_id"].startswith("evt_") and got.headers["duetime-event-id"] == body["event_id"]
    # And its signature verifies with the secret (and not with another)
    header = got.headers["duetime-signature"]
    now = int(clock.now().timestamp())
    assert verify_signature(header, got.body, SECRET, now=now)
    assert not verify_signature(header, got.body, "another-secret-of-16", now=now)
    # And the listing shows every event: the three failed attempts (no rule on them) and the dead letter,
    # delivered at the first try
    listed = notifier.list_deliveries(job_id, tenant="t1", deps=deps)[0]
    assert sorted((e.type.value, e.attempt, e.notified) for e, _ in listed) == [
        ("dead_lettered", 3, "sent"),
        ("failed", 1, "no_rules"),
        ("failed", 2, "no_rules"),
        ("failed", 3, "no_rules"),
    ]
    [delivery] = next(d for e, d in listed if e.type == "dead_lettered")
    assert (delivery.status, len(delivery.attempts), delivery.attempts[0].status_code) == (
        "delivered",
        1,
        204,
    )


def test_a_failing_streak_alerts_once_then_recovered_once_after_a_fix(
    deps: Deps, clock: FixedClock, receiver: Receiver
) -> None:
    # Given a job whose 3 attempts fail, with a rule on failed and recovered
    job_id = _submit(deps, "exit 1", [_rule(receiver, "failed", "recovered")])
    _run_attempts(deps, clock, 3)
    _pump(deps)
    # Then the streak alerted once (the first failed attempt), the other two were recorded, suppressed
    assert [e["type"] for e in receiver.events()] == ["failed"]
    listed = notifier.list_deliveries(job_id, tenant="t1", deps=deps)[0]
    assert sorted((e.attempt, e.notified) for e, _ in listed if e.type == "failed") == [
        (1, "sent"),
        (2, "suppressed"),
        (3, "suppressed"),
    ]
    # When the command is fixed and the job triggered (its run succeeds)
    jobs.update_job(job_id, UpdateJobRequest(task=ContainerTask(command=["true"])), tenant="t1", deps=deps)
    jobs.trigger_job(job_id, tenant="t1", deps=deps)
    _run_attempts(deps, clock, 1)
    _pump(deps)
    # Then exactly one recovered came; another success sends nothing
    assert [e["type"] for e in receiver.events()] == ["failed", "recovered"]
    clock.advance(60)
    jobs.trigger_job(job_id, tenant="t1", deps=deps)
    _run_attempts(deps, clock, 1)
    _pump(deps)
    assert [e["type"] for e in receiver.events()] == ["failed", "recovered"]


def test_a_receiver_down_gets_every_event_once_it_is_back_and_no_event_twice(
    deps: Deps, clock: FixedClock, receiver: Receiver
) -> None:
    # Given the receiver down, and three jobs failing for good
    receiver.down()
    job_ids = [_submit(deps, "exit 2", [_rule(receiver, "dead_lettered", "failed")]) for _ in range(3)]
    _run_attempts(deps, clock, 9)
    # When the notifier tries for 2 minutes of the clock (every try refused)
    for _ in range(24):
        _pump(deps)
        clock.advance(5)
    assert receiver.received == []
    # And the receiver comes back on its port
    receiver.up()
    for _ in range(10):
        _pump(deps)
        clock.advance(5)
    # Then it got each job's failed and dead_lettered once, and no event id twice
    ids = [e["event_id"] for e in receiver.events()]
    assert len(ids) == len(set(ids)) == 6
    assert sorted((e["job_id"], e["type"]) for e in receiver.events()) == sorted(
        (j, t) for j in job_ids for t in ("dead_lettered", "failed")
    )
    # And each delivery shows its refused tries before the one that worked
    for job_id in job_ids:
        for _, deliveries in notifier.list_deliveries(job_id, tenant="t1", deps=deps)[0]:
            for delivery in deliveries:
                assert delivery.status == "delivered"
                assert [a.ok for a in delivery.attempts][-1] is True
                assert len(delivery.attempts) >= 4 and not any(a.ok for a in delivery.attempts[:-1])


def test_a_delivery_failing_for_the_whole_window_is_dead_lettered(
    deps: Deps, clock: FixedClock, receiver: Receiver
) -> None:
    # Given a receiver that answers 500 to everything, and the default backoff (5 s doubling up to an hour)
    deps.settings = deps.settings.model_copy(update={"notify_max_backoff_seconds": 3600.0})
    receiver.status = 500
    job_id = _submit(
        deps,
        "exit 1",
        [_rule(receiver, "dead_lettered")],
    )
    _run_attempts(deps, clock, 3)
    _pump(deps)
    # When a day of retries passes
    for _ in range(24 * 60 + 10):
        clock.advance(60)
        notifier.deliver_due(deps)
    # Then the delivery is dead-lettered within the day, after about 30 tries, each an HTTP 500
    [delivery] = next(d for e, d in notifier.list_deliveries(job_id, tenant="t1", deps=deps)[0] if d)
    assert delivery.status == "dead_lettered"
    assert delivery.finished_at is not None
    assert delivery.finished_at - delivery.created_at <= timedelta(days=1)
    assert delivery.finished_at - delivery.created_at >= timedelta(hours=23)
    assert 25 <= delivery.tries <= 60 and len(delivery.attempts) == 20
    assert {a.status_code for a in delivery.attempts} == {500}
    assert notifier.deliver_due(deps) == 0


def _sweep_all(deps: Deps) -> int:
    return sum(sweep(shard, deps).notified for shard in range(deps.settings.shard_count))


def test_a_run_not_started_late_after_seconds_after_due_is_late_once(
    deps: Deps, clock: FixedClock, receiver: Receiver
) -> None:
    # Given a run-now job with late_after_seconds 5 and no worker taking it
    job_id = _submit(deps, "true", [_rule(receiver, "late")], late_after_seconds=5)
    [run] = deps.store.list_runs(job_id)
    # Then it is watched no later than its late instant (5 s after due, not the 30 s first look)
    assert run.late_at == run.due_at + timedelta(seconds=5) and run.watch_at == run.late_at
    # When the sweeper looks 4 s after due: not late yet
    clock.advance(4)
    assert _sweep_all(deps) == 0
    # And again at 5 s and later
    clock.advance(1)
    assert _sweep_all(deps) == 1
    for _ in range(3):
        clock.advance(30)
        assert _sweep_all(deps) == 0
    _pump(deps)
    # Then one late event is delivered, of attempt 1, PENDING
    [event] = receiver.events()
    assert (event["type"], event["run_id"], event["attempt"], event["state"]) == (
        "late",
        run.run_id,
        1,
        "PENDING",
    )
    assert event["reason"] == "not started 5 s after its due time"


def test_a_run_started_in_time_is_not_late(deps: Deps, clock: FixedClock, receiver: Receiver) -> None:
    job_id = _submit(deps, "true", [_rule(receiver, "late")], late_after_seconds=5)
    clock.advance(1)
    assert Worker(deps, "small", owner="w1").poll_once(wait_seconds=2) == 1
    clock.advance(60)
    assert _sweep_all(deps) == 0
    _pump(deps)
    assert receiver.received == [] and deps.store.list_runs(job_id)[0].state == "SUCCEEDED"


def test_a_paused_jobs_held_run_is_not_late(deps: Deps, clock: FixedClock, receiver: Receiver) -> None:
    job_id = _submit(
        deps,
        "true",
        [_rule(receiver, "late")],
        late_after_seconds=5,
        schedule=ScheduleSpec(expression="rate(1 minute)"),
    )
    jobs.pause_job(job_id, tenant="t1", deps=deps)
    clock.advance(70)  # its claimed slot came due while paused: the start holds it
    Worker(deps, "small", owner="w1").poll_once(wait_seconds=1)
    assert deps.store.list_runs(job_id)[0].held == "paused"
    clock.advance(10)
    assert _sweep_all(deps) == 0
