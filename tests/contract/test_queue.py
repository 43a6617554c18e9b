"""The tier queues: delays, visibility, receive counts, deletes, and bodies that are not run messages.

Real, short waits (moto, under the aws set, honours DelaySeconds and visibility timeouts in wall-clock
time): a delivery is polled for with ``wait_seconds=0`` until it shows, and the time it took is checked
against the promise.
"""

from __future__ import annotations

import time
from datetime import timedelta

from duetime.domain.models import RunMessage, Trigger
from duetime.domain.ports import ReceivedMessage
from tests.contract.conftest import T0, Adapters

#: slack for the store's clock against ours, seconds
SLACK = 0.05


def message(job_id: str = "queued", attempt: int = 1, tenant: str | None = "t1") -> RunMessage:
    return RunMessage(
        job_id=job_id,
        due_at=T0 + timedelta(milliseconds=123),
        attempt=attempt,
        overlap=True,
        timeout_seconds=300,
        kill_grace_seconds=2.5,
        tenant=tenant,
        tier="small",
        trigger=Trigger.SCHEDULE,
    )


def receive_within(
    adapters: Adapters, tier: str, seconds: float, *, visibility: int | None = 1
) -> tuple[list[ReceivedMessage], float]:
    """Poll ``tier`` until a delivery shows or ``seconds`` pass; returns what came and when (monotonic)."""
    deadline = time.monotonic() + seconds
    while True:
        got = adapters.queues.receive(tier, max_messages=10, wait_seconds=0, visibility_seconds=visibility)
        if got or time.monotonic() >= deadline:
            return got, time.monotonic()
        time.sleep(0.05)


def test_a_message_sent_without_delay_is_received_as_sent(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    sent = message()
    adapters.queues.send(tier, sent)
    [got] = adapters.queues.receive(tier, wait_seconds=1, visibility_seconds=1)
    assert (got.message, got.receive_count) == (sent, 1)
    assert RunMessage.model_validate_json(got.body) == sent
    assert got.receipt_handle


def test_a_batch_send_delivers_every_message_each_after_its_own_delay(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    now_ones = [message(f"batch-{i}", tenant=None if i == 3 else f"t{i % 2}") for i in range(12)]
    later = message("batch-later")
    adapters.queues.send_batch(tier, [(m, 0) for m in now_ones] + [(later, 2)])  # 13: two SQS batches
    got: list[ReceivedMessage] = []
    started = time.monotonic()
    while len(got) < 12 and time.monotonic() - started < 5:
        got += adapters.queues.receive(tier, max_messages=10, wait_seconds=0, visibility_seconds=30)
    assert sorted((g.message.job_id, g.receive_count) for g in got if g.message) == sorted(
        (m.job_id, 1) for m in now_ones
    )
    # the delayed one shows only after its delay
    again, at = receive_within(adapters, tier, 4)
    assert [g.message.job_id for g in again if g.message] == ["batch-later"]
    assert at - started >= 2 - SLACK
    adapters.queues.send_batch(tier, [])  # nothing to send: no error


def test_a_message_without_a_tenant_is_delivered_too(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    sent = message(tenant=None)
    adapters.queues.send(tier, sent)
    [got] = adapters.queues.receive(tier, wait_seconds=1, visibility_seconds=1)
    assert got.message == sent


def test_a_delayed_message_is_not_received_before_its_delay(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    sent_at = time.monotonic()
    adapters.queues.send(tier, message(), delay=2)
    assert adapters.queues.receive(tier, wait_seconds=0, visibility_seconds=1) == []
    got, at = receive_within(adapters, tier, 3.5)
    assert [g.message for g in got] == [message()]
    assert at - sent_at >= 2 - SLACK


def test_messages_go_to_their_own_tier_only(adapters: Adapters) -> None:
    small, large = adapters.new_tier(), adapters.new_tier()
    adapters.queues.send(small, message("on-small"))
    adapters.queues.send(large, message("on-large"))
    assert [g.message.job_id for g in adapters.queues.receive(large, wait_seconds=1) if g.message] == [
        "on-large"
    ]
    assert [g.message.job_id for g in adapters.queues.receive(small, wait_seconds=1) if g.message] == [
        "on-small"
    ]


def test_several_messages_are_each_delivered_once(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    sent = [message(attempt=n) for n in (1, 2, 3)]
    for m in sent:
        adapters.queues.send(tier, m)
    got: list[ReceivedMessage] = []
    for _ in range(10):  # a queue may hand out fewer than max_messages at a time
        got += adapters.queues.receive(tier, max_messages=10, wait_seconds=0, visibility_seconds=30)
        if len(got) >= len(sent):
            break
    assert sorted(g.message.attempt for g in got if g.message) == [1, 2, 3]
    assert adapters.queues.receive(tier, max_messages=10, wait_seconds=0) == []


def test_a_received_message_is_hidden_for_its_visibility_then_comes_back_counted(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    adapters.queues.send(tier, message("comes-back"))
    adapters.queues.send(tier, message("kept-hidden"))
    first: list[ReceivedMessage] = []
    while len(first) < 2:
        first += adapters.queues.receive(tier, max_messages=10, wait_seconds=1, visibility_seconds=1)
    received_at = time.monotonic()
    by_job = {g.message.job_id: g for g in first if g.message}
    assert {g.receive_count for g in first} == {1}
    # a second receiver within the visibility timeout gets nothing
    assert adapters.queues.receive(tier, max_messages=10, wait_seconds=0) == []
    # the worker of "kept-hidden" extends its visibility; the other one lets it lapse
    adapters.queues.extend_visibility(tier, by_job["kept-hidden"].receipt_handle, 30)
    again, at = receive_within(adapters, tier, 3)
    assert at - received_at >= 1 - SLACK
    assert [(g.message.job_id, g.receive_count) for g in again if g.message] == [("comes-back", 2)]
    assert again[0].receipt_handle != by_job["comes-back"].receipt_handle


def test_a_deleted_message_does_not_come_back(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    adapters.queues.send(tier, message())
    [got] = adapters.queues.receive(tier, wait_seconds=1, visibility_seconds=1)
    adapters.queues.delete(tier, got.receipt_handle)
    adapters.queues.delete(tier, got.receipt_handle)  # a second delete of the same delivery: ignored
    late, _ = receive_within(adapters, tier, 1.3)
    assert late == []


def test_a_delete_with_a_lapsed_handle_does_not_raise(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    adapters.queues.send(tier, message())
    [first] = adapters.queues.receive(tier, wait_seconds=1, visibility_seconds=0)
    [second] = adapters.queues.receive(tier, wait_seconds=1, visibility_seconds=30)
    assert second.receive_count == 2
    adapters.queues.delete(tier, first.receipt_handle)  # another receiver has it now: no error
    adapters.queues.delete(tier, second.receipt_handle)


def test_extend_visibility_to_zero_makes_the_message_visible_at_once(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    adapters.queues.send(tier, message())
    [got] = adapters.queues.receive(tier, wait_seconds=1, visibility_seconds=30)
    adapters.queues.extend_visibility(tier, got.receipt_handle, 0)
    [again] = adapters.queues.receive(tier, wait_seconds=1, visibility_seconds=30)
    assert (again.message, again.receive_count) == (message(), 2)


def test_extend_visibility_with_a_bad_handle_is_best_effort(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    adapters.queues.extend_visibility(tier, "no-such-receipt-handle", 10)


def test_a_body_that_is_not_a_run_message_comes_back_with_message_none(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    bodies = [
        "not json at all",
        '{"job_id": "x"}',
        '{"job_id": "x", "due_at": "2026-11-29T12:00:00Z", "attempt": 0}',
    ]
    for body in bodies:
        adapters.send_raw(tier, body)
    got: list[ReceivedMessage] = []
    for _ in range(10):
        got += adapters.queues.receive(tier, max_messages=10, wait_seconds=0, visibility_seconds=30)
        if len(got) >= len(bodies):
            break
    assert sorted(g.body for g in got) == sorted(bodies)
    assert all(g.message is None and g.receive_count == 1 for g in got)
    for g in got:  # such a delivery can still be deleted (it is dropped)
        adapters.queues.delete(tier, g.receipt_handle)
    assert adapters.queues.receive(tier, max_messages=10, wait_seconds=0) == []
