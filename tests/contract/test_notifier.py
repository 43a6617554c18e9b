"""The notifier over each adapter set: the same run changes (the embedded outbox's trigger, or the runs
table's stream records) give the same events, deliveries and incidents, whichever store records them.

Webhooks go to a real HTTP receiver on loopback; deliveries are tried by ``deliver_due`` (the store's
due deliveries), as the local stack's notifier does (the AWS queue's wake-ups are tested with the notifier
Lambda in tests/integration/test_notifier_lambda.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from duetime.adapters.http.webhooks import HttpWebhooks
from duetime.adapters.sqlite.sns_stub import RecordingSns
from duetime.config.settings import Settings
from duetime.domain.errors import PageTokenError
from duetime.domain.models import Job, NotificationRule, Run, RunState
from duetime.domain.notifications import RunSignal, verify_signature
from duetime.services import notifier
from duetime.services.deps import Deps, NotifyPorts
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import attempt_end, make_job, put_run, start
from tests.receiver import Receiver

SECRET = "contract-secret-16+"


class ListOutbox:
    """The sweeper's signals, kept in order (the notifier is handed them directly here)."""

    def __init__(self) -> None:
        self.signals: list[RunSignal] = []

    def append_signals(self, signals: list[RunSignal]) -> None:  # type: ignore[override]
        self.signals += signals


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hook = Receiver().up()
    yield hook
    hook.down()


@pytest.fixture
def deps(adapters: Adapters, tmp_path: Path) -> Deps:
    assert adapters.notifications is not None
    # settings only for the notifier's timeouts and backoff (5 s doubling, at most 20 s)
    settings = Settings(
        state_dir=str(tmp_path / "unused"), notify_backoff_seconds=5, notify_max_backoff_seconds=20
    )
    return Deps(
        settings=settings,
        store=adapters.store,
        queues=adapters.queues,
        logs=adapters.logs,
        clock=adapters.clock,
        notify=NotifyPorts(
            store=adapters.notifications,
            outbox=ListOutbox(),
            webhooks=HttpWebhooks(allow_private=True),
            sns=RecordingSns(tmp_path / "sns.jsonl"),
        ),
    )


def _job(
    adapters: Adapters, job_id: str, receiver: Receiver, *events: str, max_attempts: int = 3, **update: object
) -> Job:
    rule = NotificationRule.model_validate(
        {"on": list(events), "webhook": {"url": receiver.url, "secret": SECRET}}
    )
    job = make_job(job_id, max_attempts=max_attempts).model_copy(update={"notifications": [rule], **update})
    adapters.store.put_new_job(job)
    return job


def _feed(adapters: Adapters, deps: Deps, before: Run | None, after: Run) -> None:
    for old, new in adapters.changes(before, after):
        notifier.handle_change(old, new, deps)


def _run(adapters: Adapters, deps: Deps, job: Job, due_at: datetime, outcomes: list[RunState]) -> Run:
    """A run of ``job`` due at ``due_at`` whose attempts end with ``outcomes``, each change fed to the
    notifier as this adapter set's feed gives it."""
    store = adapters.store
    current = put_run(store, job, due_at)
    _feed(adapters, deps, None, current)
    now = due_at
    for attempt, outcome in enumerate(outcomes, start=1):
        adapters.clock.set(now)
        running = start(store, current, now=now, attempt=attempt)
        _feed(adapters, deps, current, running)
        now += timedelta(seconds=1)
        adapters.clock.set(now)
        ended = store.end_attempt(attempt_end(running, outcome, now=now))
        _feed(adapters, deps, running, ended)
        current = ended
        now = ended.retry_at or now
    return current


FAIL3 = [RunState.FAILED] * 3


def test_a_failing_streak_alerts_once_and_dead_letters_once_signed(
    adapters: Adapters, deps: Deps, receiver: Receiver
) -> None:
    # Given a job whose run fails its 3 attempts, with a rule on failed and dead_lettered
    job = _job(adapters, "streak", receiver, "failed", "dead_lettered")
    ended = _run(adapters, deps, job, T0, FAIL3)
    assert (ended.state, ended.dead_lettered) == (RunState.FAILED, True)
    # When the notifier tries what is due
    assert notifier.deliver_due(deps) == 2
    # Then the receiver got the first failed attempt and the dead letter, each once, signed
    got = receiver.received
    assert sorted((r.json["type"], r.json["attempt"]) for r in got) == [("dead_lettered", 3), ("failed", 1)]
    now = int(adapters.clock.now().timestamp())
    assert all(verify_signature(r.headers["duetime-signature"], r.body, SECRET, now=now) for r in got)
    # And the listing shows every event, newest first, and each delivery delivered at the first try
    events, token = notifier.list_deliveries(job.job_id, tenant="t1", deps=deps)
    assert token is None
    assert [e.occurred_at for e, _ in events] == sorted((e.occurred_at for e, _ in events), reverse=True)
    assert sorted((e.type.value, e.attempt, e.notified) for e, _ in events) == [
        ("dead_lettered", 3, "sent"),
        ("failed", 1, "sent"),
        ("failed", 2, "suppressed"),
        ("failed", 3, "suppressed"),
    ]
    delivered = [(d.status, d.tries, d.attempts[0].status_code) for _, ds in events for d in ds]
    assert delivered == [("delivered", 1, 204), ("delivered", 1, 204)]
    assert notifier.deliver_due(deps) == 0


def test_a_success_after_the_streak_is_recovered_once(
    adapters: Adapters, deps: Deps, receiver: Receiver
) -> None:
    job = _job(adapters, "recovers", receiver, "dead_lettered", "recovered")
    failed = _run(adapters, deps, job, T0, FAIL3)
    # When the next run succeeds, and the one after it too
    fixed = _run(adapters, deps, job, T0 + timedelta(minutes=5), [RunState.SUCCEEDED])
    _run(adapters, deps, job, T0 + timedelta(minutes=10), [RunState.SUCCEEDED])
    notifier.deliver_due(deps)
    # Then one dead_lettered, then one recovered, of the first successful run
    assert [(e["type"], e["run_id"]) for e in receiver.events()] == [
        ("dead_lettered", failed.run_id),
        ("recovered", fixed.run_id),
    ]
    assert adapters.notifications is not None
    assert adapters.notifications.get_incident(job.job_id).open is False


def test_a_muted_job_records_its_events_and_sends_nothing(
    adapters: Adapters, deps: Deps, receiver: Receiver
) -> None:
    job = _job(adapters, "muted", receiver, "failed", "dead_lettered", mute_until=T0 + timedelta(hours=1))
    _run(adapters, deps, job, T0, FAIL3)
    assert notifier.deliver_due(deps) == 0
    assert receiver.received == []
    events, _ = notifier.list_deliveries(job.job_id, tenant="t1", deps=deps)
    assert sorted((e.type.value, e.attempt, e.notified, len(ds)) for e, ds in events) == [
        ("dead_lettered", 3, "muted", 0),
        ("failed", 1, "muted", 0),
        ("failed", 2, "muted", 0),
        ("failed", 3, "muted", 0),
    ]
    # the incident stays open while muted: a success afterwards is still `recovered` (recorded, muted)
    assert adapters.notifications is not None
    assert adapters.notifications.get_incident(job.job_id).open is True


def test_a_duplicate_change_records_and_delivers_its_event_once(
    adapters: Adapters, deps: Deps, receiver: Receiver
) -> None:
    # Given a run whose only attempt fails for good
    job = _job(adapters, "dup", receiver, "dead_lettered", max_attempts=1)
    store = adapters.store
    run = put_run(store, job, T0)
    running = start(store, run, now=T0)
    ended = store.end_attempt(attempt_end(running, RunState.FAILED, now=T0 + timedelta(seconds=1)))
    changes = adapters.changes(None, run) + adapters.changes(run, running) + adapters.changes(running, ended)
    # When every change is handled twice (a stream batch retried, the outbox read again after a crash)
    for _ in range(2):
        for old, new in changes:
            notifier.handle_change(old, new, deps)
        notifier.deliver_due(deps)
    # Then the dead letter was recorded once and delivered once
    [got] = receiver.events()
    assert got["type"] == "dead_lettered"
    events, _ = notifier.list_deliveries(job.job_id, tenant="t1", deps=deps)
    assert sorted((e.type.value, len(ds)) for e, ds in events) == [("dead_lettered", 1), ("failed", 0)]
    assert next(e.event_id for e, _ in events if e.type == "dead_lettered") == got["event_id"]


def test_a_receiver_down_gets_the_event_later_once(
    adapters: Adapters, deps: Deps, receiver: Receiver
) -> None:
    job = _job(adapters, "later", receiver, "dead_lettered")
    _run(adapters, deps, job, T0, FAIL3)
    receiver.down()
    for _ in range(3):
        notifier.deliver_due(deps)
        adapters.clock.advance(30)
    assert adapters.notifications is not None
    [pending] = adapters.notifications.due_deliveries(adapters.clock.now(), limit=10)
    assert (pending.status, pending.tries) == ("pending", 3)
    receiver.up()
    for _ in range(3):
        notifier.deliver_due(deps)
        adapters.clock.advance(30)
    [got] = receiver.events()
    [delivery] = [d for _, ds in notifier.list_deliveries(job.job_id, tenant="t1", deps=deps)[0] for d in ds]
    assert (delivery.delivery_id, delivery.status, [a.ok for a in delivery.attempts]) == (
        pending.delivery_id,
        "delivered",
        [False, False, False, True],
    )
    assert got["event_id"] == delivery.event_id


def test_events_are_listed_newest_first_by_pages(adapters: Adapters, deps: Deps, receiver: Receiver) -> None:
    job = _job(adapters, "paged", receiver, "failed", max_attempts=5)
    _run(adapters, deps, job, T0, FAIL3)  # three failed attempts, not dead-lettered: three events
    first, token = notifier.list_deliveries(job.job_id, tenant="t1", deps=deps, limit=2)
    assert [e.attempt for e, _ in first] == [3, 2] and token is not None
    second, end = notifier.list_deliveries(job.job_id, tenant="t1", deps=deps, limit=2, next_token=token)
    assert ([e.attempt for e, _ in second], end) == ([1], None)
    whole, _ = notifier.list_deliveries(job.job_id, tenant="t1", deps=deps, limit=3)
    assert [e.event_id for e, _ in whole] == [e.event_id for e, _ in first + second]
    other = _job(adapters, "other", receiver, "failed")
    with pytest.raises(PageTokenError):
        notifier.list_deliveries(other.job_id, tenant="t1", deps=deps, next_token=token)


def test_tenant_rules_are_stored_with_their_secrets(adapters: Adapters, receiver: Receiver) -> None:
    store = adapters.notifications
    assert store is not None
    assert store.get_tenant_rules("t1") == ([], None)
    rule = NotificationRule.model_validate(
        {"on": ["failed"], "webhook": {"url": receiver.url, "secret": SECRET}, "remind_every_seconds": 3600}
    )
    store.put_tenant_rules("t1", [rule], now=T0)
    assert store.get_tenant_rules("t1") == ([rule], T0)
    assert store.get_tenant_rules("t2") == ([], None)
