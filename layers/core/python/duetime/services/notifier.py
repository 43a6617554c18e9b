"""The notifier: turns run changes into events, applies each job's rules and noise control, records every
event, and delivers it at least once (docs/design/notifications.md). Never on the hot path: it reads the
change feed (the embedded store's outbox; the runs table's stream on AWS) and the sweeper's signals.

- :func:`process_changes` (the local stack's loop) reads the feed by cursor and calls :func:`handle_change`
  per run change; the AWS notifier Lambda calls the same :func:`handle_change` per stream record of the runs
  table, and :func:`handle_message` per message of the notifications queue (a ``late``/``overran`` signal,
  or a delivery's wake-up);
- :func:`deliver_due` / :func:`attempt_delivery` make the tries: each delivery is retried with doubling
  backoff and equal jitter until ``notify_window_seconds`` (a day) has passed since its event, then
  dead-lettered;
- :func:`prepare_rules` validates rules for the API (URLs, secrets) and carries write-only secrets over.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
from pydantic import Json, ValidationError

from duetime.config.observability import emit_metric, logger
from duetime.domain.errors import NotFoundError, RequestFieldError
from duetime.domain.models import EventType, Job, NotificationRule
from duetime.domain.notifications import (
    KEPT_ATTEMPTS,
    SIGNATURE_HEADER,
    Delivery,
    DeliveryAttempt,
    NotificationEvent,
    NotifierMessage,
    RunSignal,
    RunSnapshot,
    SecretMissingError,
    carry_secrets,
    check_webhook_url,
    decide,
    delivery_backoff,
    delivery_id,
    derive_events,
    event_body,
    event_id,
    signal_of,
    signature_header,
)
from duetime.services.deps import Deps, NotifyPorts

#: a delivery try whose error starts with this is refused for good (an SSRF-forbidden address)
REFUSED = "refused: "
#: the metric of a delivery given up on (the stack's alarm watches it)
DELIVERY_DEAD_LETTERED = "NotificationDeadLettered"
#: feed entries read per batch, deliveries tried per pass
FEED_BATCH = 100
DELIVERY_BATCH = 50


def _ports(deps: Deps) -> NotifyPorts:
    if deps.notify is None:
        raise RuntimeError("this deployment has no notifier ports (Deps.notify)")
    return deps.notify


# ---- rules -------------------------------------------------------------------------------------------
def prepare_rules(
    stored: Sequence[NotificationRule],
    sent: Sequence[NotificationRule],
    *,
    field: str,
    deps: Deps,
    tenant: str | None = None,
) -> list[NotificationRule]:
    """``sent`` rules as they are to be stored: each webhook URL checked (HTTPS, no forbidden address;
    the local stack's rules on the embedded backend), secrets sent as ``"set"`` kept from ``stored``, a new
    secret for a stored URL rotated (the old one signs too for 24 h); an ``sns_topic_arn`` must be in the
    deployment's account (``aws_account_id``, when set: the notifier may publish to no other). Given the
    ``tenant``, each email address is subscribed to the tenant's email topic now
    (:func:`subscribe_addresses`), so it confirms before its first alert.

    Raises:
        RequestFieldError: naming the rule's field (``<field>.<i>.webhook.url``, ``...secret`` or
            ``<field>.<i>.sns_topic_arn``).
    """
    account = deps.settings.aws_account_id
    for index, rule in enumerate(sent):
        if rule.webhook is not None:
            try:
                check_webhook_url(rule.webhook.url, local=deps.settings.webhooks_local)
            except ValueError as exc:
                name = f"{field}.{index}.webhook.url"
                raise RequestFieldError(f"{name}: {exc}", name) from None
        if rule.sns_topic_arn is not None and account and rule.sns_topic_arn.split(":")[4] != account:
            name = f"{field}.{index}.sns_topic_arn"
            raise RequestFieldError(
                f"{name}: must be a topic of this deployment's account ({account}); "
                "publish to another account's topic from a topic of this one",
                name,
            )
    try:
        rules = carry_secrets(stored, sent, deps.clock.now())
    except SecretMissingError as exc:
        name = f"{field}.{exc.index}.webhook.secret"
        raise RequestFieldError(f"{name}: {exc}", name) from None
    if tenant is not None:
        subscribe_addresses(tenant, rules, deps)
    return rules


def subscribe_addresses(tenant: str, rules: Sequence[NotificationRule], deps: Deps) -> None:
    """Subscribe the email addresses of ``rules`` to ``tenant``'s email topic (SNS mails each new one a
    confirmation). Best effort: an address not subscribed now is subscribed at its first alert."""
    if deps.notify is None:
        return
    for address in dict.fromkeys(a for rule in rules for a in rule.email or []):
        try:
            deps.notify.sns.subscribe_email(tenant, address)
        except Exception:  # noqa: BLE001 - never fails the request: the first alert subscribes it again
            logger.warning("email address not subscribed yet", extra={"tenant": tenant}, exc_info=True)


def get_tenant_rules(tenant: str, deps: Deps) -> tuple[list[NotificationRule], datetime | None]:
    return _ports(deps).store.get_tenant_rules(tenant)


def put_tenant_rules(tenant: str, sent: Sequence[NotificationRule], deps: Deps) -> list[NotificationRule]:
    """Replace the tenant's default rules (validated, secrets carried over as :func:`prepare_rules` does)."""
    store = _ports(deps).store
    stored, _ = store.get_tenant_rules(tenant)
    rules = prepare_rules(stored, sent, field="notifications", deps=deps, tenant=tenant)
    store.put_tenant_rules(tenant, rules, now=deps.clock.now())
    return rules


def rules_of(job: Job, deps: Deps) -> list[tuple[str, NotificationRule]]:
    """The rules that apply to ``job``: its own, then its tenant's (unless it does not inherit them); a
    target both name is the job's rule only."""
    found: list[tuple[str, NotificationRule]] = [("job", rule) for rule in job.notifications]
    if job.inherit_tenant_notifications:
        tenant_rules, _ = _ports(deps).store.get_tenant_rules(job.tenant)
        keys = {rule.key for _, rule in found}
        found += [("tenant", rule) for rule in tenant_rules if rule.key not in keys]
    return found


# ---- events ------------------------------------------------------------------------------------------
def process_changes(deps: Deps, *, limit: int = FEED_BATCH) -> int:
    """Read one batch of the change feed, handle each entry, then move the cursor past it (a crash in
    between handles the batch again: each event's id is recorded once). Returns the entries read."""
    feed = _ports(deps).feed
    if feed is None:
        return 0
    entries = feed.read_changes(limit=limit)
    for entry in entries:
        if entry.signal is not None:
            handle_signal(entry.signal, deps)
        elif entry.new is not None:
            handle_change(entry.old, entry.new, deps)
    if entries:
        feed.ack_changes(entries[-1].position)
    return len(entries)


def handle_change(old: RunSnapshot | None, new: RunSnapshot, deps: Deps) -> list[NotificationEvent]:
    """The events of one run change (:func:`~duetime.domain.notifications.derive_events`), each handled."""
    events = []
    for signal in derive_events(old, new):
        event = handle_signal(signal, deps)
        if event is not None:
            events.append(event)
    return events


def handle_signal(signal: RunSignal, deps: Deps) -> NotificationEvent | None:
    """Record one event (noise control decides what is sent) with its deliveries; None if it gives no event
    (a success without an open incident, a job gone) or was recorded already (a duplicate)."""
    ports = _ports(deps)
    job = deps.store.get_job(signal.job_id)
    if job is None:
        return None
    now = deps.clock.now()
    rules = rules_of(job, deps)
    origin = {rule.key: where for where, rule in rules}
    muted = job.mute_until is not None and now < job.mute_until
    incident = ports.store.get_incident(job.job_id)
    decision = decide(signal, [rule for _, rule in rules], incident, now=now, muted=muted)
    if decision.kind is None:
        return None
    if decision.send:
        notified = "sent"
    elif decision.held:
        notified = "muted" if muted else "suppressed"
    else:
        notified = "no_rules"
    event = NotificationEvent(
        event_id=event_id(signal.job_id, signal.due_at, signal.attempt, decision.kind),
        type=EventType(decision.kind),
        tenant=job.tenant,
        job_id=job.job_id,
        job_name=job.name,
        run_id=signal.run_id,
        due_at=signal.due_at,
        attempt=signal.attempt,
        state=signal.state,
        reason=signal.reason,
        exit_code=signal.exit_code,
        started_at=signal.started_at,
        finished_at=signal.finished_at,
        count=signal.count,
        occurred_at=now,
        notified=notified,
    )
    body = event_body(event.payload()).decode()
    deliveries = [
        Delivery(
            delivery_id=delivery_id(event.event_id, rule.key),
            event_id=event.event_id,
            tenant=job.tenant,
            job_id=job.job_id,
            rule_key=rule.key,
            origin=origin[rule.key],
            kind=rule.kind,
            target=rule.target,
            next_attempt_at=now,
            created_at=now,
            body=body,
        )
        for rule in decision.send
    ]
    if not ports.store.record_event(event, deliveries, decision.incident):
        _wake_again(event, [rule for _, rule in rules], deps)
        return None
    if ports.wakeups is not None and deliveries:
        ports.wakeups.wake(deliveries, now=now)
    logger.info(
        "notification event",
        extra={"event_id": event.event_id, "type": event.type, "job_id": job.job_id, "notified": notified},
    )
    return event


def _wake_again(event: NotificationEvent, rules: Sequence[NotificationRule], deps: Deps) -> None:
    """A duplicate of a recorded event: wake its deliveries still pending again (the first handling may
    have stopped between recording them and waking them). A wake-up of a delivery not due is re-armed, of
    one delivered meanwhile dropped; two wake-ups of one try may both post (at least once: the receiver
    dedupes by event id), and only one of them is saved (``save_delivery``), so one chain of tries goes on."""
    ports = _ports(deps)
    if ports.wakeups is None:
        return
    found = [
        ports.store.get_delivery(event.job_id, delivery_id(event.event_id, rule.key))
        for rule in rules
        if event.type in rule.on
    ]
    pending = [d for d in found if d is not None and d.status == "pending"]
    if pending:
        ports.wakeups.wake(pending, now=deps.clock.now())


class NotifierMessageRecord(SqsRecordModel):
    """An SQS record of the notifications queue whose body is a :class:`NotifierMessage` (Powertools parser
    model). A body that is not one fails the record alone; SQS moves it to the DLQ after its receives."""

    body: Json[NotifierMessage]


def handle_message(message: NotifierMessage, deps: Deps) -> None:
    """One message of the notifications queue (AWS): a ``late``/``overran`` signal the sweeper appended
    (:func:`handle_signal`), or a delivery's wake-up (:func:`wake_delivery`)."""
    if message.signal is not None:
        handle_signal(signal_of(message.signal), deps)
    elif message.wake is not None:
        wake_delivery(message.wake.job_id, message.wake.delivery_id, deps, tries=message.wake.tries)


def list_deliveries(
    job_id: str, *, tenant: str, deps: Deps, limit: int = 20, next_token: str | None = None
) -> tuple[list[tuple[NotificationEvent, list[Delivery]]], str | None]:
    """The caller's job's events, newest first, each with its deliveries and their tries.

    Raises:
        NotFoundError: the job is not the caller's.
        PageTokenError: ``next_token`` is not one of this job's listing.
    """
    job = deps.store.get_job(job_id)
    if job is None or job.tenant != tenant:
        raise NotFoundError("job", job_id)
    return _ports(deps).store.list_events(job_id, limit=limit, page_token=next_token)


# ---- deliveries ----------------------------------------------------------------------------------------
def deliver_due(deps: Deps, *, limit: int = DELIVERY_BATCH) -> int:
    """Try every delivery that is due now (up to ``limit``). Returns how many were tried."""
    due = _ports(deps).store.due_deliveries(deps.clock.now(), limit=limit)
    for delivery in due:
        attempt_delivery(delivery, deps)
    return len(due)


def attempt_delivery(
    delivery: Delivery, deps: Deps, *, unit: Callable[[], float] = random.random
) -> Delivery:
    """One try of ``delivery`` to its rule's target as the rule now stands (a rotated secret signs at once);
    the delivery as saved after it: ``delivered``, ``pending`` with its next try (backoff with equal
    jitter, ``unit`` drawing it), ``dead_lettered`` (the window passed, or the address is forbidden) or
    ``cancelled`` (the rule is gone)."""
    ports = _ports(deps)
    now = deps.clock.now()
    rule = _current_rule(delivery, deps)
    if rule is None:
        done = delivery.model_copy(
            update={"status": "cancelled", "next_attempt_at": None, "finished_at": now}
        )
        ports.store.save_delivery(done)
        return done
    attempt = _send(delivery, rule, now, deps).model_copy(update={"at": now})
    attempts = [*delivery.attempts, attempt][-KEPT_ATTEMPTS:]
    tries = delivery.tries + 1
    settings = deps.settings
    update: dict[str, Any] = {"attempts": attempts, "tries": tries}
    if attempt.ok:
        update |= {"status": "delivered", "next_attempt_at": None, "finished_at": now}
    else:
        wait = delivery_backoff(
            tries,
            base=settings.notify_backoff_seconds,
            cap=settings.notify_max_backoff_seconds,
            unit=unit(),
        )
        next_at = now + timedelta(seconds=wait)
        window_end = delivery.created_at + timedelta(seconds=settings.notify_window_seconds)
        if (attempt.error or "").startswith(REFUSED) or next_at > window_end:
            update |= {"status": "dead_lettered", "next_attempt_at": None, "finished_at": now}
            emit_metric(DELIVERY_DEAD_LETTERED)
            logger.warning(
                "notification delivery dead-lettered",
                extra={
                    "delivery_id": delivery.delivery_id,
                    "target": delivery.target,
                    "error": attempt.error,
                },
            )
        else:
            update["next_attempt_at"] = next_at
    saved = delivery.model_copy(update=update)
    ports.store.save_delivery(saved)
    if saved.status == "pending" and ports.wakeups is not None:
        ports.wakeups.wake([saved], now=now)
    return saved


def wake_delivery(job_id: str, delivery_id: str, deps: Deps, *, tries: int | None = None) -> Delivery | None:
    """A wake-up for one delivery (the AWS notifier's queue message): try it if it is pending and due; one
    woken early (a backoff longer than the queue's 15-minute delay) is woken again for its time. A wake-up
    sent when the delivery had another count of ``tries`` is stale (a duplicate) and dropped. The delivery
    after it, or None if there is nothing to try (delivered meanwhile, gone, a stale wake-up)."""
    ports = _ports(deps)
    delivery = ports.store.get_delivery(job_id, delivery_id)
    if delivery is None or delivery.status != "pending" or delivery.next_attempt_at is None:
        return None
    if tries is not None and tries != delivery.tries:
        logger.info("stale delivery wake-up dropped", extra={"delivery_id": delivery_id, "tries": tries})
        return None
    now = deps.clock.now()
    if delivery.next_attempt_at > now + timedelta(seconds=1):
        if ports.wakeups is not None:
            ports.wakeups.wake([delivery], now=now)
        return delivery
    return attempt_delivery(delivery, deps)


def _current_rule(delivery: Delivery, deps: Deps) -> NotificationRule | None:
    if delivery.origin == "tenant":
        rules, _ = _ports(deps).store.get_tenant_rules(delivery.tenant)
    else:
        job = deps.store.get_job(delivery.job_id)
        rules = job.notifications if job is not None else []
    return next((rule for rule in rules if rule.key == delivery.rule_key), None)


def _send(delivery: Delivery, rule: NotificationRule, now: datetime, deps: Deps) -> DeliveryAttempt:
    ports = _ports(deps)
    body = delivery.body.encode()
    if rule.webhook is not None:
        timestamp = int(now.timestamp())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "Duetime-Notifier/1",
            "Duetime-Event-Id": delivery.event_id,
            SIGNATURE_HEADER: signature_header(rule.webhook.secrets(now), timestamp, body),
        }
        return ports.webhooks.post(
            rule.webhook.url, body, headers, timeout=deps.settings.notify_timeout_seconds
        )
    subject = _subject(delivery)
    try:
        if rule.sns_topic_arn is not None:
            ports.sns.publish(
                rule.sns_topic_arn,
                subject=subject,
                message=delivery.body,
                attributes={
                    "tenant": delivery.tenant,
                    "job_id": delivery.job_id,
                    "event_id": delivery.event_id,
                },
            )
        else:
            for address in rule.email or []:
                ports.sns.publish_email(delivery.tenant, address, subject=subject, message=delivery.body)
    except Exception as exc:  # noqa: BLE001 - any failure of the publish is a failed try, retried
        return DeliveryAttempt(at=now, ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
    return DeliveryAttempt(at=now, ok=True)


def _subject(delivery: Delivery) -> str:
    try:
        event = NotificationEvent.from_stored(json.loads(delivery.body))
    except (ValidationError, ValueError):
        return "Duetime notification"
    return f"Duetime: {event.job_name} {event.type.value.replace('_', ' ')} (run {event.run_id})"[:100]
