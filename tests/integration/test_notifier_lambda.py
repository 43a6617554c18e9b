"""The notifier Lambda on AWS (moto in-process): runs-table stream records -> events recorded once ->
deliveries woken through the notifications queue -> signed webhooks to a real receiver, SNS topics and
email topics per tenant; retries with backoff, SSRF refusals at delivery time (issue 17)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws import dynamodb
from duetime.adapters.aws.notifications import email_topic_name
from duetime.adapters.aws.resources import ResourceNames, notifications_queue_url
from duetime.config.deps import Deps
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.models import ContainerTask, Job, NotificationRule, Run, RunState
from duetime.services import jobs, notifier
from duetime.services.sweeper import sweep
from tests.conftest import T0, make_settings
from tests.contract.factories import attempt_end, make_job, put_run, start
from tests.helpers import LocalLambdaContext
from tests.receiver import Receiver

SECRET = "lambda-secret-0123456789"
QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:test-notifications"


def _deps(names: ResourceNames, **overrides: Any) -> Deps:
    from duetime.config.deps import deps_from_settings

    settings = make_settings(
        names,
        notifications_table=names.notifications_table,
        notifications_queue_url=notifications_queue_url(names),
        email_topic_prefix="test-email",
        notify_backoff_seconds=1,
        notify_max_backoff_seconds=2,
        **overrides,
    )
    return deps_from_settings(settings)  # the wall clock: SQS delays are real


@pytest.fixture
def deps(aws_mock: None, names: ResourceNames) -> Deps:
    # the receiver listens on loopback: the stage's setting that allows private addresses (the SSRF tests
    # below use the AWS default, refusing them)
    return _deps(names, notify_allow_private=True)


@pytest.fixture
def lambda_module(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    from duetime.local.lambda_runtime import load_module

    module = load_module("notifier")
    monkeypatch.setattr(module, "default_deps", lambda: deps)
    return module


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hook = Receiver(secret=SECRET).up()
    yield hook
    hook.down()


def _job(deps: Deps, job_id: str, rule: dict[str, Any], *, tenant: str = "t1", max_attempts: int = 3) -> Job:
    job = make_job(job_id, tenant=tenant, max_attempts=max_attempts).model_copy(
        update={"notifications": [NotificationRule.model_validate(rule)]}
    )
    deps.store.put_new_job(job)
    return job


def _hook(receiver: Receiver, *events: str) -> dict[str, Any]:
    return {"on": list(events), "webhook": {"url": receiver.url, "secret": SECRET}}


def _record(before: Run | None, after: Run, seq: int) -> dict[str, Any]:
    """The stream record DynamoDB writes for a change of a run's row (NEW_AND_OLD_IMAGES)."""

    def image(run: Run) -> dict[str, Any]:
        return dynamodb.serialize(dynamodb.run_to_item(run, retention=dynamodb.RetentionPolicy()))

    data: dict[str, Any] = {
        "Keys": {"job_id": {"S": after.job_id}, "due_at": {"S": dynamodb.to_iso(after.due_at)}},
        "NewImage": image(after),
        "SequenceNumber": f"{seq:021d}",
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    if before is not None:
        data["OldImage"] = image(before)
    return {
        "eventID": str(seq),
        "eventName": "INSERT" if before is None else "MODIFY",
        "eventSource": "aws:dynamodb",
        "dynamodb": data,
    }


def _failing_run(deps: Deps, job: Job, attempts: int = 3) -> list[dict[str, Any]]:
    """The stream records of a run of ``job`` whose ``attempts`` attempts fail (the store's real writes)."""
    store = deps.store
    records = []
    current = put_run(store, job, T0)
    records.append(_record(None, current, 1))
    now = T0
    for attempt in range(1, attempts + 1):
        running = start(store, current, now=now, attempt=attempt)
        records.append(_record(current, running, len(records) + 1))
        ended = store.end_attempt(attempt_end(running, RunState.FAILED, now=now + timedelta(seconds=1)))
        records.append(_record(running, ended, len(records) + 1))
        current, now = ended, ended.retry_at or now
    return records


def _invoke(module: ModuleType, records: list[dict[str, Any]]) -> list[str]:
    """The notifier's answer: the ids of the records it reported failed."""
    answer = module.lambda_handler({"Records": records}, LocalLambdaContext("notifier"))
    return [f["itemIdentifier"] for f in answer["batchItemFailures"]]


def _drain(module: ModuleType, deps: Deps, *, idle: float = 2.5, at_most: float = 20.0) -> int:
    """Feed the notifications queue to the notifier as its event source does (deleting what succeeded)
    until it has been empty for ``idle`` seconds (delayed wake-ups included), for ``at_most`` seconds.
    Returns the messages handled."""
    from duetime.local.lambda_service import sqs_event_record

    sqs = aws.client("sqs")
    url = deps.settings.notifications_queue_url
    handled, idle_since, began = 0, time.monotonic(), time.monotonic()
    while time.monotonic() - idle_since < idle and time.monotonic() - began < at_most:
        out = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=4, WaitTimeSeconds=1, MessageSystemAttributeNames=["All"]
        )
        messages = out.get("Messages") or []
        if not messages:
            continue
        idle_since = time.monotonic()
        failed = set(_invoke(module, [sqs_event_record(m, queue_arn=QUEUE_ARN) for m in messages]))
        for m in messages:
            if m["MessageId"] not in failed:
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        handled += len(messages)
    return handled


def _listed(deps: Deps, job: Job) -> list[tuple[str, int, str, list[tuple[str, list[bool]]]]]:
    events, _ = notifier.list_deliveries(job.job_id, tenant=job.tenant, deps=deps)
    return sorted(
        (e.type.value, e.attempt, e.notified, [(d.status, [a.ok for a in d.attempts]) for d in ds])
        for e, ds in events
    )


def test_a_failing_streak_on_the_stream_sends_one_signed_alert_and_one_dead_letter(
    lambda_module: ModuleType, deps: Deps, receiver: Receiver
) -> None:
    # Given a job failing its 3 attempts, with a rule on failed and dead_lettered
    job = _job(deps, "streak", _hook(receiver, "failed", "dead_lettered"))
    records = _failing_run(deps, job)
    # When its stream records reach the notifier, twice (a retried batch)
    assert _invoke(lambda_module, records) == []
    assert _invoke(lambda_module, records) == []
    # Then nothing was sent from the stream's invocation (deliveries go through the queue)
    assert receiver.received == []
    # And once the queue's wake-ups are handled, the receiver verified and got each alert once
    _drain(lambda_module, deps)
    got = receiver.events()
    assert receiver.refused == 0
    assert sorted((e["type"], e["attempt"]) for e in got) == [("dead_lettered", 3), ("failed", 1)]
    assert len({e["event_id"] for e in got}) == 2
    assert _listed(deps, job) == [
        ("dead_lettered", 3, "sent", [("delivered", [True])]),
        ("failed", 1, "sent", [("delivered", [True])]),
        ("failed", 2, "suppressed", []),
        ("failed", 3, "suppressed", []),
    ]


def test_a_receiver_that_fails_then_recovers_gets_the_event_later_and_once(
    lambda_module: ModuleType, deps: Deps, receiver: Receiver
) -> None:
    job = _job(deps, "later", _hook(receiver, "dead_lettered"))
    receiver.status = 503
    assert _invoke(lambda_module, _failing_run(deps, job)) == []
    # When the receiver answers 503 for a few seconds of retries (1-2 s apart), then 204
    _drain(lambda_module, deps, at_most=3.0)
    receiver.status = 204
    _drain(lambda_module, deps)
    # Then it accepted the dead letter once, after the refused tries (each the same event id and body)
    [got] = receiver.accepted()
    assert got["type"] == "dead_lettered"
    [(_, _, _, [(status, oks)])] = [row for row in _listed(deps, job) if row[0] == "dead_lettered"]
    assert status == "delivered" and oks[-1] is True and len(oks) >= 2 and not any(oks[:-1])
    assert len(receiver.received) == len(oks)
    assert {r.body for r in receiver.received} == {receiver.received[-1].body}


@pytest.mark.parametrize(
    "address", ["169.254.169.254", "fd00:ec2::254", "10.1.2.3", "127.0.0.1", "192.168.0.10"]
)
def test_a_webhook_resolving_to_a_forbidden_address_is_refused_at_delivery(
    aws_mock: None, names: ResourceNames, monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    # Given the AWS defaults (no private addresses) and a public-looking name that now resolves to a
    # metadata, link-local, private or loopback address (DNS rebinding)
    deps = _deps(names)
    from duetime.local.lambda_runtime import load_module

    module = load_module("notifier")
    monkeypatch.setattr(module, "default_deps", lambda: deps)
    connected: list[Any] = []
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, port, *a, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))],
    )
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: connected.append(a))
    job = _job(
        deps,
        "ssrf",
        {"on": ["dead_lettered"], "webhook": {"url": "https://hooks.example.com/duetime", "secret": SECRET}},
    )
    assert _invoke(module, _failing_run(deps, job)) == []
    _drain(module, deps, idle=1.0)
    # Then no connection was made and the delivery is dead-lettered at its first try, saying why
    assert connected == []
    events, _ = notifier.list_deliveries(job.job_id, tenant="t1", deps=deps)
    [delivery] = [d for e, ds in events for d in ds]
    assert (delivery.status, delivery.tries) == ("dead_lettered", 1)
    assert (delivery.attempts[0].error or "").startswith("refused: ")


def test_a_late_run_found_by_the_sweeper_is_sent_through_the_queue(
    lambda_module: ModuleType, deps: Deps, receiver: Receiver
) -> None:
    # Given a run-now job with late_after_seconds 1 that no worker takes
    request = CreateJobRequest(
        name="late",
        task=ContainerTask(command=["true"]),
        late_after_seconds=1,
        notifications=[NotificationRule.model_validate(_hook(receiver, "late"))],
    )
    job = jobs.create_job(request, tenant="t1", deps=deps)
    time.sleep(1.5)
    # When the sweeper sweeps every shard (every minute on AWS) and the notifier reads its queue
    assert sum(sweep(shard, deps).notified for shard in range(deps.settings.shard_count)) == 1
    _drain(lambda_module, deps)
    # Then one late event came, of the run's first attempt, still PENDING
    [event] = receiver.events()
    [run] = deps.store.list_runs(job.job_id)
    assert (event["type"], event["run_id"], event["state"]) == ("late", run.run_id, "PENDING")


def test_a_malformed_queue_message_fails_alone(lambda_module: ModuleType, deps: Deps) -> None:
    from duetime.local.lambda_service import sqs_event_record

    good = json.dumps({"wake": {"job_id": "gone", "delivery_id": "evt_x.rule"}})
    records = [
        sqs_event_record(
            {"MessageId": "bad", "ReceiptHandle": "r1", "Body": "not json"}, queue_arn=QUEUE_ARN
        ),
        sqs_event_record({"MessageId": "good", "ReceiptHandle": "r2", "Body": good}, queue_arn=QUEUE_ARN),
        sqs_event_record(
            {"MessageId": "both", "ReceiptHandle": "r3", "Body": '{"signal": {}, "wake": null}'},
            queue_arn=QUEUE_ARN,
        ),
    ]
    assert _invoke(lambda_module, records) == ["bad", "both"]


def test_a_failed_stream_record_fails_the_rest_of_its_batch_so_a_job_stays_in_order(
    lambda_module: ModuleType, deps: Deps, receiver: Receiver
) -> None:
    job = _job(deps, "ordered", _hook(receiver, "failed"), max_attempts=5)
    records = _failing_run(deps, job, attempts=2)
    broken = json.loads(json.dumps(records[2]))
    broken["dynamodb"]["NewImage"]["due_at"] = {"S": "not a time"}
    # When the second change of the batch cannot be read
    failed = _invoke(lambda_module, [records[0], records[1], broken, *records[3:]])
    # Then it and every record after it are reported (Lambda retries from it), and none after it handled
    assert failed == [r["dynamodb"]["SequenceNumber"] for r in [broken, *records[3:]]]
    assert _listed(deps, job) == []
    # And the batch retried whole gives each event once, in order
    assert _invoke(lambda_module, records) == []
    assert [(t, a) for t, a, _, _ in _listed(deps, job)] == [("failed", 1), ("failed", 2)]


def test_email_goes_to_a_topic_per_tenant_filtered_to_each_address(
    lambda_module: ModuleType, deps: Deps
) -> None:
    # Given two tenants' jobs each emailing its own address on dead_lettered
    one = _job(deps, "mail-1", {"on": ["dead_lettered"], "email": ["ops@one.example"]}, tenant="one")
    two = _job(deps, "mail-2", {"on": ["dead_lettered"], "email": ["ops@two.example"]}, tenant="two")
    records = _failing_run(deps, one) + [
        {**r, "eventID": f"2-{r['eventID']}", "dynamodb": {**r["dynamodb"], "SequenceNumber": f"9{i:020d}"}}
        for i, r in enumerate(_failing_run(deps, two))
    ]
    assert _invoke(lambda_module, records) == []
    _drain(lambda_module, deps)
    # Then each tenant has its own topic, holding only its own address, filtered to its tenant and address
    sns = aws.client("sns")
    for tenant, address in (("one", "ops@one.example"), ("two", "ops@two.example")):
        arn = next(
            t["TopicArn"]
            for t in sns.list_topics()["Topics"]
            if t["TopicArn"].endswith(":" + email_topic_name("test-email", tenant))
        )
        subscriptions = sns.list_subscriptions_by_topic(TopicArn=arn)["Subscriptions"]
        assert [(s["Protocol"], s["Endpoint"]) for s in subscriptions] == [("email", address)]
        policy = sns.get_subscription_attributes(SubscriptionArn=subscriptions[0]["SubscriptionArn"])
        assert json.loads(policy["Attributes"]["FilterPolicy"]) == {"tenant": [tenant], "email": [address]}
    for job in (one, two):
        [(_, _, _, [(status, _)])] = [row for row in _listed(deps, job) if row[0] == "dead_lettered"]
        assert status == "delivered"


def test_a_rules_own_topic_receives_the_event_with_its_tenant_attribute(
    lambda_module: ModuleType, deps: Deps
) -> None:
    # Given a user's topic with a queue subscribed (raw delivery), and a rule publishing to it
    sns, sqs = aws.client("sns"), aws.client("sqs")
    topic = sns.create_topic(Name="users-alerts")["TopicArn"]
    url = sqs.create_queue(QueueName="users-alerts-inbox")["QueueUrl"]
    inbox = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=inbox, Attributes={"RawMessageDelivery": "true"})
    job = _job(deps, "topic", {"on": ["dead_lettered"], "sns_topic_arn": topic})
    assert _invoke(lambda_module, _failing_run(deps, job)) == []
    _drain(lambda_module, deps)
    [message] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    body = json.loads(message["Body"])
    assert (body["type"], body["job_id"], body["tenant"]) == ("dead_lettered", "topic", "t1")
    assert message["MessageAttributes"]["tenant"]["StringValue"] == "t1"
    assert message["MessageAttributes"]["event_id"]["StringValue"] == body["event_id"]


def _event(job_id: str, kind: str, attempt: int) -> Any:
    from duetime.domain.notifications import NotificationEvent, event_id

    return NotificationEvent(
        event_id=event_id(job_id, T0, attempt, kind),
        type=kind,
        tenant="t1",
        job_id=job_id,
        job_name="j",
        run_id="run-x",
        due_at=T0,
        attempt=attempt,
        state="FAILED",
        occurred_at=T0,
    )


def test_an_incident_changed_since_it_was_read_is_not_overwritten(deps: Deps) -> None:
    from duetime.adapters.aws.notifications import DynamoNotifications
    from duetime.domain.errors import ConflictError
    from duetime.domain.notifications import Incident

    table = deps.settings.notifications_table or ""
    mine, theirs = DynamoNotifications(table), DynamoNotifications(table)
    # Given two notifiers that read the same job's incident (none yet)
    assert mine.get_incident("racy") == theirs.get_incident("racy") == Incident()
    # When one records a failure that opens it
    assert theirs.record_event(_event("racy", "failed", 1), [], Incident(open=True, opened_at=T0))
    # Then the other's write of the incident it read is refused, and writes nothing
    with pytest.raises(ConflictError):
        mine.record_event(_event("racy", "late", 2), [], Incident())
    assert mine.get_incident("racy") == Incident(open=True, opened_at=T0)
    # And once read again, its event is recorded
    assert mine.record_event(_event("racy", "late", 2), [], Incident(open=True, opened_at=T0))
    events, _ = mine.list_events("racy", limit=10)
    assert sorted(e.type.value for e, _ in events) == ["failed", "late"]


def test_a_wake_up_handled_twice_makes_one_chain_of_tries(
    lambda_module: ModuleType, deps: Deps, receiver: Receiver
) -> None:
    from duetime.domain.errors import ConflictError

    # Given a delivery whose receiver answers 503 (a retry is scheduled after each try)
    job = _job(deps, "twice", _hook(receiver, "dead_lettered"))
    receiver.status = 503
    assert _invoke(lambda_module, _failing_run(deps, job)) == []
    assert deps.notify is not None
    [delivery] = [d for _, ds in deps.notify.store.list_events(job.job_id, limit=10)[0] for d in ds]
    # When two notifiers try it from the same read (a wake-up handled, then redelivered before it was
    # deleted)
    first = notifier.attempt_delivery(delivery, deps)
    assert (first.status, first.tries) == ("pending", 1)
    with pytest.raises(ConflictError):
        notifier.attempt_delivery(delivery, deps)
    # Then the stored delivery is the first try's, and only its wake-up re-arms it
    stored = deps.notify.store.get_delivery(job.job_id, delivery.delivery_id)
    assert stored is not None and stored.model_dump(mode="json") == first.model_dump(mode="json")


def test_an_email_rule_subscribes_its_addresses_when_it_is_saved(deps: Deps) -> None:
    # Given a job and tenant defaults with email rules, saved through the services the API calls
    rule = NotificationRule.model_validate({"on": ["failed"], "email": ["ops@one.example"]})
    jobs.create_job(
        CreateJobRequest(name="mailed", task=ContainerTask(command=["true"]), notifications=[rule]),
        tenant="one",
        deps=deps,
    )
    notifier.put_tenant_rules(
        "one", [NotificationRule.model_validate({"on": ["late"], "email": ["boss@one.example"]})], deps
    )
    # Then both addresses are subscribed to the tenant's topic before any alert (SNS mails a confirmation)
    sns = aws.client("sns")
    [arn] = [
        t["TopicArn"]
        for t in sns.list_topics()["Topics"]
        if t["TopicArn"].endswith(":" + email_topic_name("test-email", "one"))
    ]
    subscribed = sns.list_subscriptions_by_topic(TopicArn=arn)["Subscriptions"]
    assert sorted(s["Endpoint"] for s in subscribed) == ["boss@one.example", "ops@one.example"]


def test_a_stale_wake_up_is_dropped_without_a_try(
    lambda_module: ModuleType, deps: Deps, receiver: Receiver
) -> None:
    from duetime.domain.notifications import NotifierMessage
    from duetime.local.lambda_service import sqs_event_record

    # Given a delivery tried once already (receiver answering 503), and the wake-up of its first try
    # coming back (a duplicate, or a message that failed and reappeared)
    job = _job(deps, "stale", _hook(receiver, "dead_lettered"))
    receiver.status = 503
    assert _invoke(lambda_module, _failing_run(deps, job)) == []
    assert deps.notify is not None
    [delivery] = [d for _, ds in deps.notify.store.list_events(job.job_id, limit=10)[0] for d in ds]
    stale = NotifierMessage.wake_for(delivery).model_dump_json()
    tried = notifier.attempt_delivery(delivery, deps)
    assert tried.tries == 1 and len(receiver.received) == 1
    # When the stale wake-up is handled
    record = sqs_event_record({"MessageId": "old", "ReceiptHandle": "r", "Body": stale}, queue_arn=QUEUE_ARN)
    assert _invoke(lambda_module, [record]) == []
    # Then nothing was tried and the delivery is as its one chain left it
    assert len(receiver.received) == 1
    stored = deps.notify.store.get_delivery(job.job_id, delivery.delivery_id)
    assert stored is not None and stored.tries == 1
