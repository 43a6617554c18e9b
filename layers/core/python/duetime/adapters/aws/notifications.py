"""The notifier's ports on AWS: the notifications table (DynamoDB), the notifications queue (SQS) and SNS.

**The table** (``resources.notifications_table_definition``): pk ``pk``, sk ``sk``, every value a string.

===========================  ==========================================  ===========================================
item                         key                                         attributes
===========================  ==========================================  ===========================================
a tenant's default rules     ``tenant#<tenant>`` / ``rules``             ``doc`` (JSON: rules, secrets inside),
                                                                         ``updated_at``
a job's incident             ``job#<job_id>`` / ``incident``             ``doc`` (JSON: ``Incident.to_doc``)
an event id seen             ``job#<job_id>`` / ``seen#<event_id>``      (the duplicate check), TTL
an event                     ``job#<job_id>`` / ``event#<at>#<id>``      ``doc``, ``deliveries`` (their ids), TTL
a delivery                   ``job#<job_id>`` / ``delivery#<id>``        ``doc``; while pending ``due_shard`` and
                                                                         ``next_attempt_at`` (the due GSI), TTL
===========================  ==========================================  ===========================================

:meth:`DynamoNotifications.record_event` writes the seen marker (``attribute_not_exists``), the event, its
deliveries and the job's incident in one ``TransactWriteItems`` (at most 3 + 20 items: 10 job and 10 tenant
rules), so a duplicate of a change writes nothing, and the incident is written on the condition that it is
still what :meth:`~DynamoNotifications.get_incident` read (two notifiers handling two events of one job at
once, a stream record and a queued ``late``, cannot lose one's incident update: the loser's batch item
fails and is retried). TransactWriteItems is off the hot path here (one per event, not per run).

**The queue** carries two kinds of message (:class:`~duetime.domain.notifications.NotifierMessage`): the
sweeper's ``late``/``overran`` signals and each delivery's wake-up, delayed by ``DelaySeconds`` until its
next try (at most 15 minutes: a longer backoff wakes the notifier early, and it re-arms the wake-up).

**SNS**: a rule's own ``sns_topic_arn`` is published to with the tenant, job and event id as message
attributes; email goes through a topic per tenant (``<email_topic_prefix>-<tenant>``, created on first use,
SSE with SNS's AWS-managed key) on which each address is subscribed with a filter policy on the ``tenant``
and ``email`` message attributes: a tenant's topic holds only its own addresses, and each publish reaches only
the address it names.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import zlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.dynamodb import decode_page_token, deserialize, encode_page_token, serialize
from duetime.adapters.aws.resources import (
    DELIVERY_DUE_INDEX,
    DELIVERY_DUE_INDEX_PK,
    DELIVERY_DUE_INDEX_SK,
    DELIVERY_DUE_SHARDS,
    NOTIFICATIONS_PK,
    NOTIFICATIONS_SK,
    NOTIFICATIONS_TTL_ATTRIBUTE,
    SESSION_PREFIX,
    SQS_MAX_DELAY_SECONDS,
)
from duetime.domain.errors import ConflictError
from duetime.domain.models import NotificationRule
from duetime.domain.notifications import (
    Delivery,
    Incident,
    NotificationEvent,
    NotifierMessage,
    RunSignal,
    RunSnapshot,
    signal_to_doc,
    snapshot_of,
)
from duetime.domain.timeutil import to_iso

#: how long events and their deliveries are kept, days (the local set's default too)
EVENT_RETENTION_DAYS = 90
_INCIDENT = "incident"
#: incidents read and not yet written back kept at most (the condition of their next write)
_READ_CACHE = 10_000
_RULES = "rules"


def _job_pk(job_id: str) -> str:
    return f"job#{job_id}"


def _delivery_sk(delivery_id: str) -> str:
    return f"delivery#{delivery_id}"


def due_shard(delivery_id: str) -> int:
    """The due GSI's partition of a pending delivery (fixed by its id)."""
    return zlib.crc32(delivery_id.encode()) % DELIVERY_DUE_SHARDS


class DynamoNotifications:
    """:class:`~duetime.domain.ports.NotificationStore` on the notifications table.

    Args:
        table: its physical name.
        retention_days: how long events and deliveries are kept (their TTL from when they occurred).
    """

    def __init__(self, table: str, *, retention_days: float = EVENT_RETENTION_DAYS) -> None:
        self.table = table
        self.retention = timedelta(days=retention_days)
        # each job's incident as this process last read it (the condition of the next write of it)
        self._read: dict[str, str | None] = {}
        self._lock = threading.Lock()

    @property
    def _ddb(self) -> Any:
        return aws.client("dynamodb")

    def _key(self, pk: str, sk: str) -> dict[str, Any]:
        return {NOTIFICATIONS_PK: {"S": pk}, NOTIFICATIONS_SK: {"S": sk}}

    def _get(self, pk: str, sk: str) -> dict[str, Any] | None:
        item = self._ddb.get_item(TableName=self.table, Key=self._key(pk, sk), ConsistentRead=True).get(
            "Item"
        )
        return deserialize(item) if item else None

    # ---- tenants' rules ------------------------------------------------------------------------------
    def get_tenant_rules(self, tenant: str) -> tuple[list[NotificationRule], datetime | None]:
        item = self._get(f"tenant#{tenant}", _RULES)
        if item is None:
            return [], None
        rules = [NotificationRule.from_stored(r) for r in json.loads(item["doc"])]
        return rules, datetime.fromisoformat(str(item["updated_at"]))

    def put_tenant_rules(self, tenant: str, rules: Sequence[NotificationRule], *, now: datetime) -> None:
        doc = json.dumps([r.model_dump(mode="json", exclude_none=True) for r in rules])
        self._ddb.put_item(
            TableName=self.table,
            Item=serialize(
                {
                    NOTIFICATIONS_PK: f"tenant#{tenant}",
                    NOTIFICATIONS_SK: _RULES,
                    "doc": doc,
                    "updated_at": now,
                }
            ),
        )

    # ---- incidents and events ------------------------------------------------------------------------
    def get_incident(self, job_id: str) -> Incident:
        item = self._get(_job_pk(job_id), _INCIDENT)
        doc = str(item["doc"]) if item else None
        with self._lock:
            if len(self._read) >= _READ_CACHE:  # reads left by events that recorded nothing
                self._read.clear()
            self._read[job_id] = doc
        return Incident.of(json.loads(doc) if doc else None)

    def _expires(self, at: datetime) -> int:
        return int((at + self.retention).timestamp())

    def _delivery_item(self, delivery: Delivery) -> dict[str, Any]:
        item: dict[str, Any] = {
            NOTIFICATIONS_PK: _job_pk(delivery.job_id),
            NOTIFICATIONS_SK: _delivery_sk(delivery.delivery_id),
            "doc": delivery.model_dump_json(),
            "tries": delivery.tries,
            NOTIFICATIONS_TTL_ATTRIBUTE: self._expires(delivery.created_at),
        }
        if delivery.status == "pending" and delivery.next_attempt_at is not None:
            item[DELIVERY_DUE_INDEX_PK] = due_shard(delivery.delivery_id)
            item[DELIVERY_DUE_INDEX_SK] = to_iso(delivery.next_attempt_at)
        return serialize(item)

    def record_event(
        self, event: NotificationEvent, deliveries: Sequence[Delivery], incident: Incident
    ) -> bool:
        """See the port; raises :class:`~duetime.domain.errors.ConflictError` when the job's incident changed
        since this process read it (nothing written: handle the change again)."""
        pk = _job_pk(event.job_id)
        expires = self._expires(event.occurred_at)
        with self._lock:
            known = event.job_id in self._read
            prior = self._read.pop(event.job_id, None)
        doc = json.dumps(incident.to_doc())
        incident_put: dict[str, Any] = {
            "TableName": self.table,
            "Item": serialize({NOTIFICATIONS_PK: pk, NOTIFICATIONS_SK: _INCIDENT, "doc": doc}),
        }
        if known and prior is None:
            incident_put["ConditionExpression"] = "attribute_not_exists(#pk)"
            incident_put["ExpressionAttributeNames"] = {"#pk": NOTIFICATIONS_PK}
        elif known:
            incident_put["ConditionExpression"] = "#doc = :prior"
            incident_put["ExpressionAttributeNames"] = {"#doc": "doc"}
            incident_put["ExpressionAttributeValues"] = {":prior": {"S": prior}}
        items: list[dict[str, Any]] = [
            {
                "Put": {
                    "TableName": self.table,
                    "Item": serialize(
                        {
                            NOTIFICATIONS_PK: pk,
                            NOTIFICATIONS_SK: f"seen#{event.event_id}",
                            NOTIFICATIONS_TTL_ATTRIBUTE: expires,
                        }
                    ),
                    "ConditionExpression": "attribute_not_exists(#pk)",
                    "ExpressionAttributeNames": {"#pk": NOTIFICATIONS_PK},
                }
            },
            {"Put": incident_put},
            {
                "Put": {
                    "TableName": self.table,
                    "Item": serialize(
                        {
                            NOTIFICATIONS_PK: pk,
                            NOTIFICATIONS_SK: f"event#{to_iso(event.occurred_at)}#{event.event_id}",
                            "doc": event.model_dump_json(),
                            "deliveries": [d.delivery_id for d in deliveries] or None,
                            NOTIFICATIONS_TTL_ATTRIBUTE: expires,
                        }
                    ),
                }
            },
            *({"Put": {"TableName": self.table, "Item": self._delivery_item(d)}} for d in deliveries),
        ]
        try:
            self._ddb.transact_write_items(TransactItems=items)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise
            reasons = [r.get("Code") for r in exc.response.get("CancellationReasons") or []]
            if reasons and reasons[0] == "ConditionalCheckFailed":
                return False
            if len(reasons) > 1 and reasons[1] == "ConditionalCheckFailed":
                raise ConflictError(f"job {event.job_id}'s incident changed meanwhile") from None
            raise
        return True

    # ---- deliveries ----------------------------------------------------------------------------------
    def due_deliveries(self, now: datetime, *, limit: int) -> list[Delivery]:
        found: list[Delivery] = []
        for shard in range(DELIVERY_DUE_SHARDS):
            page = self._ddb.query(
                TableName=self.table,
                IndexName=DELIVERY_DUE_INDEX,
                KeyConditionExpression="#s = :s AND #n <= :now",
                ExpressionAttributeNames={"#s": DELIVERY_DUE_INDEX_PK, "#n": DELIVERY_DUE_INDEX_SK},
                ExpressionAttributeValues={":s": {"N": str(shard)}, ":now": {"S": to_iso(now)}},
                Limit=limit,
            )
            found += [Delivery.from_stored(json.loads(deserialize(i)["doc"])) for i in page.get("Items", [])]
        found.sort(key=lambda d: (d.next_attempt_at or now, d.delivery_id))
        return found[:limit]

    def get_delivery(self, job_id: str, delivery_id: str) -> Delivery | None:
        item = self._get(_job_pk(job_id), _delivery_sk(delivery_id))
        return Delivery.from_stored(json.loads(item["doc"])) if item else None

    def save_delivery(self, delivery: Delivery) -> None:
        """See the port; raises :class:`~duetime.domain.errors.ConflictError` (nothing written) for the
        outcome of a try when another try of the delivery was saved meanwhile (two wake-ups of it in
        flight, e.g. a message handled and then redelivered): the later one stops there, so a delivery
        never has two chains of tries. A cancellation (its rule gone) makes no try and is always saved."""
        newer = "#tries <= :tries" if delivery.status == "cancelled" else "#tries < :tries"
        try:
            self._ddb.put_item(
                TableName=self.table,
                Item=self._delivery_item(delivery),
                ConditionExpression=f"attribute_not_exists(#tries) OR {newer}",
                ExpressionAttributeNames={"#tries": "tries"},
                ExpressionAttributeValues={":tries": {"N": str(delivery.tries)}},
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise
            raise ConflictError(f"delivery {delivery.delivery_id} was tried meanwhile") from None

    def list_events(
        self, job_id: str, *, limit: int, page_token: str | None = None
    ) -> tuple[list[tuple[NotificationEvent, list[Delivery]]], str | None]:
        pk = _job_pk(job_id)
        start = decode_page_token(
            page_token, expected=(NOTIFICATIONS_PK, NOTIFICATIONS_SK), must_match={NOTIFICATIONS_PK: pk}
        )
        args: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#pk = :pk AND begins_with(#sk, :event)",
            "ExpressionAttributeNames": {"#pk": NOTIFICATIONS_PK, "#sk": NOTIFICATIONS_SK},
            "ExpressionAttributeValues": {":pk": {"S": pk}, ":event": {"S": "event#"}},
            "ScanIndexForward": False,
            "ConsistentRead": True,
        }
        if start is not None:
            args["ExclusiveStartKey"] = start
        rows: list[dict[str, Any]] = []
        while len(rows) <= limit:  # one more than the page: whether a next page exists
            page = self._ddb.query(**args, Limit=limit + 1 - len(rows))
            rows += [deserialize(i) for i in page.get("Items", [])]
            if "LastEvaluatedKey" not in page:
                break
            args["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        shown = rows[:limit]
        by_id = self._deliveries(job_id, [d for row in shown for d in row.get("deliveries") or []])
        items = [
            (
                NotificationEvent.from_stored(json.loads(row["doc"])),
                sorted(
                    (by_id[d] for d in row.get("deliveries") or [] if d in by_id), key=lambda d: d.delivery_id
                ),
            )
            for row in shown
        ]
        token = None
        if len(rows) > limit:
            last = shown[-1]
            token = encode_page_token(
                {NOTIFICATIONS_PK: {"S": pk}, NOTIFICATIONS_SK: {"S": str(last[NOTIFICATIONS_SK])}}
            )
        return items, token

    def _deliveries(self, job_id: str, delivery_ids: Sequence[str]) -> dict[str, Delivery]:
        out: dict[str, Delivery] = {}
        keys = [self._key(_job_pk(job_id), _delivery_sk(d)) for d in dict.fromkeys(delivery_ids)]
        for start in range(0, len(keys), 100):
            pending: dict[str, Any] = {
                self.table: {"Keys": keys[start : start + 100], "ConsistentRead": True}
            }
            while pending:
                answer = self._ddb.batch_get_item(RequestItems=pending)
                for item in answer.get("Responses", {}).get(self.table, []):
                    delivery = Delivery.from_stored(json.loads(deserialize(item)["doc"]))
                    out[delivery.delivery_id] = delivery
                pending = answer.get("UnprocessedKeys") or {}
        return out


class SqsNotifierQueue:
    """:class:`~duetime.domain.ports.SignalOutbox` and :class:`~duetime.domain.ports.DeliveryWakeups` on the
    notifications queue (message bodies: :class:`~duetime.domain.notifications.NotifierMessage`)."""

    def __init__(self, queue_url: str) -> None:
        self.queue_url = queue_url

    def _send(self, entries: Sequence[tuple[NotifierMessage, int]]) -> None:
        sqs = aws.client("sqs")
        for start in range(0, len(entries), 10):
            chunk = entries[start : start + 10]
            answer = sqs.send_message_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {
                        "Id": str(n),
                        "MessageBody": message.model_dump_json(exclude_none=True),
                        "DelaySeconds": delay,
                    }
                    for n, (message, delay) in enumerate(chunk)
                ],
            )
            if answer.get("Failed"):
                failed = answer["Failed"][0]
                raise RuntimeError(
                    f"SQS refused a notifier message: {failed.get('Code')} {failed.get('Message')}"
                )

    def append_signals(self, signals: Sequence[RunSignal]) -> None:
        self._send([(NotifierMessage(signal=signal_to_doc(s)), 0) for s in signals])

    def wake(self, deliveries: Sequence[Delivery], *, now: datetime) -> None:
        entries = []
        for delivery in deliveries:
            at = delivery.next_attempt_at or now
            delay = min(SQS_MAX_DELAY_SECONDS, max(0, math.ceil((at - now).total_seconds())))
            entries.append((NotifierMessage.wake_for(delivery), delay))
        self._send(entries)


#: SNS topic names: letters, digits, ``-`` and ``_``, at most 256
_TOPIC_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def email_topic_name(prefix: str, tenant: str) -> str:
    """The tenant's email topic: ``<prefix>-<tenant, made safe, 40 chars at most>-<12 hex of its SHA-256>``
    (the hash keeps two tenants that read alike apart)."""
    digest = hashlib.sha256(tenant.encode()).hexdigest()[:12]
    return f"{prefix}-{_TOPIC_UNSAFE.sub('-', tenant)[:40]}-{digest}"


def _ascii_subject(subject: str) -> str:
    """SNS subjects: ASCII without control characters, under 100 characters."""
    text = "".join(c if 32 <= ord(c) < 127 else "?" for c in subject)
    return text[:99] or "Duetime notification"


class SnsTopics:
    """:class:`~duetime.domain.ports.SnsPublisher` on SNS.

    Args:
        email_topic_prefix: the name prefix of the tenants' email topics (the notifier's role may create,
            subscribe to and publish to topics with this prefix only).
    """

    def __init__(self, email_topic_prefix: str) -> None:
        self.prefix = email_topic_prefix
        # (tenant, address) pairs subscribed in this process: the topic's ARN
        self._subscribed: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    @property
    def _sns(self) -> Any:
        return aws.client("sns")

    def publish(self, topic_arn: str, *, subject: str, message: str, attributes: Mapping[str, str]) -> None:
        self._sns.publish(
            TopicArn=topic_arn,
            Subject=_ascii_subject(subject),
            Message=message,
            MessageAttributes={k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()},
        )

    def email_topic(self, tenant: str, address: str) -> str:
        """The ARN of ``tenant``'s email topic with ``address`` subscribed (filtered to its own messages);
        created and subscribed if not yet (SNS then mails the address a confirmation: it receives alerts
        once it confirms)."""
        with self._lock:
            found = self._subscribed.get((tenant, address))
        if found is not None:
            return found
        arn = str(
            self._sns.create_topic(
                Name=email_topic_name(self.prefix, tenant),
                Attributes={"KmsMasterKeyId": "alias/aws/sns", "DisplayName": "Duetime"},
                Tags=[{"Key": "duetime-tenant", "Value": tenant[:256]}],
            )["TopicArn"]
        )
        subscribed = False
        pages = self._sns.get_paginator("list_subscriptions_by_topic").paginate(TopicArn=arn)
        for page in pages:
            if any(
                s.get("Protocol") == "email" and s.get("Endpoint") == address for s in page["Subscriptions"]
            ):
                subscribed = True
                break
        if not subscribed:
            self._sns.subscribe(
                TopicArn=arn,
                Protocol="email",
                Endpoint=address,
                Attributes={
                    "FilterPolicyScope": "MessageAttributes",
                    "FilterPolicy": json.dumps({"tenant": [tenant], "email": [address]}),
                },
            )
        with self._lock:
            self._subscribed[(tenant, address)] = arn
        return arn

    def subscribe_email(self, tenant: str, address: str) -> None:
        self.email_topic(tenant, address)

    def publish_email(self, tenant: str, address: str, *, subject: str, message: str) -> None:
        self.publish(
            self.email_topic(tenant, address),
            subject=subject,
            message=message,
            attributes={"tenant": tenant, "email": address},
        )


# ---- the runs table's stream ---------------------------------------------------------------------------------
def change_of_stream_record(record: Mapping[str, Any]) -> tuple[RunSnapshot | None, RunSnapshot] | None:
    """The (old, new) run snapshots of a runs-table stream record (DynamoDB's wire format, the view
    ``NEW_AND_OLD_IMAGES``); None for a record that is not a run's insert or update (a removal, a worker
    session's item)."""
    data = record.get("dynamodb") or {}
    new_image = data.get("NewImage")
    if record.get("eventName") not in ("INSERT", "MODIFY") or not new_image:
        return None
    new = deserialize(new_image)
    if str(new.get("job_id", "")).startswith(SESSION_PREFIX):
        return None
    old_image = data.get("OldImage")
    return (snapshot_of(deserialize(old_image)) if old_image else None), snapshot_of(new)
