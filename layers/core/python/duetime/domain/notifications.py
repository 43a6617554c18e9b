"""Notifications, the pure part: rules, the events a run change gives, event ids, signatures, URL checks and
noise control (docs/design/notifications.md).

Nothing here does I/O: the notifier (:mod:`duetime.services.notifier`) reads changes and rules through the
ports, calls these functions, and delivers what they decide.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from duetime.domain.models import (
    FAILURE_EVENTS,
    MIN_SECRET_BYTES,
    ROTATION_SECONDS,
    SECRET_SET,
    SUCCEEDED,
    EventType,
    Instant,
    NotificationRule,
    StoredModel,
    WebhookTarget,
    run_id_for,
)
from duetime.domain.timeutil import to_iso


def carry_secrets(
    stored: Sequence[NotificationRule], sent: Sequence[NotificationRule], now: datetime
) -> list[NotificationRule]:
    """``sent`` rules as they are stored, matched by webhook URL with the ``stored`` ones:

    - a secret sent as ``"set"`` keeps the stored rule's secret (and its rotation);
    - a new secret for a URL that had another one starts a rotation: the old secret still signs deliveries
      for :data:`ROTATION_SECONDS`;
    - the same secret again changes nothing.

    Raises:
        ValueError: ``("notifications.<i>.webhook.secret", message)`` for a ``"set"`` with nothing stored.
    """
    by_url = {r.webhook.url: r.webhook for r in stored if r.webhook is not None}
    out: list[NotificationRule] = []
    for index, rule in enumerate(sent):
        hook = rule.webhook
        if hook is None:
            out.append(rule)
            continue
        old = by_url.get(hook.url)
        if hook.secret == SECRET_SET:
            if old is None:
                raise SecretMissingError(index)
            hook = old
        elif old is not None and old.secret != hook.secret:
            hook = WebhookTarget.from_stored(
                {
                    "url": hook.url,
                    "secret": hook.secret,
                    "previous_secret": old.secret,
                    "previous_valid_until": now + timedelta(seconds=ROTATION_SECONDS),
                }
            )
        elif old is not None:
            hook = old
        out.append(rule.model_copy(update={"webhook": hook}))
    return out


class SecretMissingError(ValueError):
    """A rule sent ``"secret": "set"`` for a webhook URL that has no stored secret."""

    def __init__(self, index: int) -> None:
        self.index = index
        super().__init__(
            f"no secret is stored for this webhook URL: send the secret (at least {MIN_SECRET_BYTES} bytes)"
        )


# ---- URL checks (SSRF) -------------------------------------------------------------------------------
#: EC2's instance metadata service on IPv6 (IPv4's, 169.254.169.254, is link-local)
_METADATA_V6 = ipaddress.ip_address("fd00:ec2::254")


def address_refusal(address: str, *, allow_private: bool) -> str | None:
    """Why a webhook may not be sent to IP ``address`` (None: it may).

    Link-local (169.254.0.0/16, fe80::/10) and EC2 metadata (fd00:ec2::254) addresses are always refused;
    loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), shared, reserved, multicast and unspecified
    ones unless ``allow_private`` (the local stack)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_link_local or ip == _METADATA_V6:
        return f"{address} is a link-local or instance-metadata address"
    if allow_private:
        return None
    if ip.is_loopback:
        return f"{address} is a loopback address"
    if ip.is_private or ip.is_reserved or ip.is_multicast or ip.is_unspecified or not ip.is_global:
        return f"{address} is a private or reserved address"
    return None


def check_webhook_url(url: str, *, local: bool) -> str:
    """``url`` if a rule may POST to it: HTTPS (plain HTTP only to a loopback host, and only when ``local``),
    no credentials in it, and a host that is not a refused address literal (:func:`address_refusal`; a
    name is checked again on its resolved address at each delivery).

    Raises:
        ValueError: why not.
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        raise ValueError("needs a host")
    if parts.username or parts.password:
        raise ValueError("must not hold credentials")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        raise ValueError("has an invalid port") from None
    loopback = host == "localhost" or _is_loopback_literal(host)
    if parts.scheme == "http":
        if not (local and loopback):
            raise ValueError(
                "must be https (plain http only to a loopback host on the local stack)"
                if local
                else "must be https"
            )
    elif parts.scheme != "https":
        raise ValueError("must be https")
    if host == "localhost" and not local:
        raise ValueError("localhost is a loopback address")
    literal = ip_literal(host)
    if literal is not None:
        why = address_refusal(str(literal), allow_private=local)
        if why is not None:
            raise ValueError(why if str(literal) == host else f"{host} is {literal}: {why}")
    return url


def ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` is written as, or None for a name: the standard forms, and the legacy IPv4 forms
    a resolver also reads as an address (inet_aton(3): ``2852039166``, ``0xA9FEA9FE``, ``0251.0376.0251.0376``,
    ``169.254.43518``), so ``https://2852039166/`` is refused as 169.254.169.254 is."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not host or any(c not in "0123456789abcdefx." for c in host.lower()):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _is_loopback_literal(host: str) -> bool:
    literal = ip_literal(host)
    return literal is not None and literal.is_loopback


# ---- run changes and the events they give --------------------------------------------------------------
@dataclass(frozen=True)
class RunSnapshot:
    """The fields of a run row the events are derived from (a change feed's old and new images).

    Instants are ISO text, as the rows hold them."""

    job_id: str
    due_at: datetime
    tenant: str
    state: str
    attempt: int = 1
    dead_lettered: bool = False
    error: str | None = None
    exit_code: int | None = None
    missed_slots: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: the run's last ended attempt's record (state, reason, exit_code, attempt, started_at, finished_at)
    last_attempt: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RunSignal:
    """One event a run change (or the sweeper) gives: a rule event type, or :data:`SUCCEEDED`."""

    kind: str
    job_id: str
    due_at: datetime
    tenant: str
    attempt: int
    state: str
    reason: str | None = None
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: ``missed``: how many slots it stands for
    count: int = 1

    @property
    def run_id(self) -> str:
        return run_id_for(self.job_id, self.due_at)

    @property
    def event_id(self) -> str:
        return event_id(self.job_id, self.due_at, self.attempt, self.kind)


def event_id(job_id: str, due_at: datetime, attempt: int, kind: str) -> str:
    """The event's id, the same for every duplicate of the change it comes from (the receivers'
    idempotency key): ``evt_`` and 32 hex digits of SHA-256 over (job, due time, attempt, kind)."""
    digest = hashlib.sha256(f"{job_id}|{to_iso(due_at)}|{attempt}|{kind}".encode()).hexdigest()
    return f"evt_{digest[:32]}"


#: SKIPPED reasons that make a slot ``missed``
MISSED_REASONS = frozenset({"missed", "starting_deadline_exceeded"})


def derive_events(old: RunSnapshot | None, new: RunSnapshot) -> list[RunSignal]:
    """The events one change of a run row gives (``old`` None: the row was inserted).

    - an attempt ended FAILED (to RETRY_WAIT or FAILED): ``failed``; TIMED_OUT: ``timed_out``;
    - the run ended dead-lettered: ``dead_lettered`` too;
    - SUCCEEDED: the internal :data:`SUCCEEDED` signal (the notifier turns it into ``recovered`` after a
      failing streak);
    - SKIPPED for a reason in :data:`MISSED_REASONS`, or a run claimed after ``missed_slots`` slots its
      catch-up skipped unclaimed (an outage): ``missed``.

    A change that leaves the state as it was gives nothing, so duplicates and unrelated writes (a watch time
    moved) are ignored; a duplicate of a change gives the same events with the same ids.
    """
    if old is not None and old.state == new.state and old.attempt == new.attempt:
        return []
    out: list[RunSignal] = []

    def signal(kind: str, **extra: Any) -> RunSignal:
        values: dict[str, Any] = {
            "kind": kind,
            "job_id": new.job_id,
            "due_at": new.due_at,
            "tenant": new.tenant,
            "attempt": new.attempt,
            "state": new.state,
            "reason": new.error,
            "exit_code": new.exit_code,
            "started_at": new.started_at,
            "finished_at": new.finished_at,
        }
        values.update(extra)
        return RunSignal(**values)

    if old is None and new.missed_slots > 0:
        out.append(signal(EventType.MISSED.value, reason="catch_up", count=new.missed_slots, attempt=0))
    if new.state == "SKIPPED":
        if (new.error or "") in MISSED_REASONS:
            out.append(signal(EventType.MISSED.value))
        return out
    if new.state not in EVENT_STATES:
        return out
    if new.state in ("RETRY_WAIT", "FAILED", "TIMED_OUT"):
        ended = dict(new.last_attempt or {})
        state = str(ended.get("state") or new.state)
        attempt = int(ended.get("attempt") or new.attempt)
        detail = {
            "attempt": attempt,
            "state": new.state,
            "reason": ended.get("reason") or new.error,
            "exit_code": ended.get("exit_code", new.exit_code),
            "started_at": _instant(ended.get("started_at")) or new.started_at,
            "finished_at": _instant(ended.get("finished_at")) or new.finished_at,
        }
        if state == "TIMED_OUT":
            out.append(signal(EventType.TIMED_OUT.value, **detail))
        elif state == "FAILED":
            out.append(signal(EventType.FAILED.value, **detail))
        if new.dead_lettered:
            out.append(signal(EventType.DEAD_LETTERED.value, **detail))
    elif new.state == "SUCCEEDED":
        out.append(signal(SUCCEEDED))
    return out


def _instant(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


#: the run states a change to which may give an event (:func:`derive_events`); a change to another state
#: gives none unless it inserts a run with ``missed_slots`` (the AWS stream's filter is built from these)
EVENT_STATES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "SKIPPED", "RETRY_WAIT")


def snapshot_of(data: Mapping[str, Any]) -> RunSnapshot:
    """A :class:`RunSnapshot` of a run row's fields: the embedded outbox's projection (its last ended
    attempt as ``last_attempt``, JSON text or a mapping) or a whole row, e.g. a runs-table stream image
    (its ``attempts`` list, the last one taken). Instants are ISO text or datetimes.

    Raises:
        KeyError, ValueError: ``data`` is not a run row (no ``job_id``, no ISO ``due_at``).
    """
    due = _instant(data["due_at"])
    if due is None:
        raise ValueError("a run row needs a due_at")
    last = data.get("last_attempt")
    if isinstance(last, str):
        last = json.loads(last)
    if last is None and isinstance(data.get("attempts"), list) and data["attempts"]:
        last = data["attempts"][-1]
    return RunSnapshot(
        job_id=str(data["job_id"]),
        due_at=due,
        tenant=str(data.get("tenant") or ""),
        state=str(data.get("state") or ""),
        attempt=int(data.get("attempt") or 1),
        dead_lettered=bool(data.get("dead_lettered")),
        error=data.get("error"),
        exit_code=data.get("exit_code"),
        missed_slots=int(data.get("missed_slots") or 0),
        started_at=_instant(data.get("started_at")),
        finished_at=_instant(data.get("finished_at")),
        last_attempt=last if isinstance(last, Mapping) else None,
    )


def signal_to_doc(signal: RunSignal) -> dict[str, Any]:
    """``signal`` as JSON-ready fields (the outbox's and the notifications queue's message body)."""
    return {
        "kind": signal.kind,
        "job_id": signal.job_id,
        "due_at": to_iso(signal.due_at),
        "tenant": signal.tenant,
        "attempt": signal.attempt,
        "state": signal.state,
        "reason": signal.reason,
        "exit_code": signal.exit_code,
        "started_at": to_iso(signal.started_at) if signal.started_at else None,
        "finished_at": to_iso(signal.finished_at) if signal.finished_at else None,
        "count": signal.count,
    }


def signal_of(doc: Mapping[str, Any]) -> RunSignal:
    """The signal :func:`signal_to_doc` wrote.

    Raises:
        KeyError, ValueError: a field is missing or malformed."""
    due = _instant(doc["due_at"])
    if due is None:
        raise ValueError("a signal needs a due_at")
    return RunSignal(
        kind=str(doc["kind"]),
        job_id=str(doc["job_id"]),
        due_at=due,
        tenant=str(doc["tenant"]),
        attempt=int(doc["attempt"]),
        state=str(doc["state"]),
        reason=doc.get("reason"),
        exit_code=doc.get("exit_code"),
        started_at=_instant(doc.get("started_at")),
        finished_at=_instant(doc.get("finished_at")),
        count=int(doc.get("count") or 1),
    )


# ---- noise control ---------------------------------------------------------------------------------------
@dataclass
class Incident:
    """A job's notification state: whether a failing streak is open, and when each rule last alerted of each
    event type in it (rule key -> event type -> ISO instant)."""

    open: bool = False
    opened_at: datetime | None = None
    sent: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return {
            "open": self.open,
            "opened_at": to_iso(self.opened_at) if self.opened_at else None,
            "sent": self.sent,
        }

    @classmethod
    def of(cls, doc: Mapping[str, Any] | None) -> Incident:
        if not doc:
            return cls()
        return cls(
            open=bool(doc.get("open")),
            opened_at=_instant(doc.get("opened_at")),
            sent={k: dict(v) for k, v in (doc.get("sent") or {}).items()},
        )


@dataclass(frozen=True)
class Decision:
    """What the notifier does with one event: the event type it is recorded as (None: nothing to record),
    the rules it is sent to, and why the others are not (rule key -> ``muted`` | ``suppressed``)."""

    kind: str | None
    send: tuple[NotificationRule, ...] = ()
    held: Mapping[str, str] = field(default_factory=dict)
    incident: Incident = field(default_factory=Incident)


def decide(
    signal: RunSignal,
    rules: Sequence[NotificationRule],
    incident: Incident,
    *,
    now: datetime,
    muted: bool,
) -> Decision:
    """Noise control for one event (pure): which of ``rules`` it is sent to, and the job's incident after it.

    - a failure event (``failed``, ``dead_lettered``, ``timed_out``) opens an incident; each rule alerts of
      each of those types once per incident, and again only ``remind_every_seconds`` after its last alert;
    - a success closes an open incident as ``recovered`` (sent to the rules on it); without one it is
      nothing;
    - ``late``, ``overran`` and ``missed`` concern one run each and are always sent;
    - ``muted`` (the job's ``mute_until`` is ahead): the event is recorded and the incident kept, nothing
      is sent.
    """
    after = Incident(
        open=incident.open, opened_at=incident.opened_at, sent={k: dict(v) for k, v in incident.sent.items()}
    )
    if signal.kind == SUCCEEDED:
        if not incident.open:
            return Decision(kind=None, incident=after)
        kind = EventType.RECOVERED
        after = Incident()
    else:
        kind = EventType(signal.kind)
        if kind in FAILURE_EVENTS and not after.open:
            after.open, after.opened_at, after.sent = True, now, {}
    send: list[NotificationRule] = []
    held: dict[str, str] = {}
    for rule in rules:
        if kind not in rule.on:
            continue
        if muted:
            held[rule.key] = "muted"
            continue
        if kind in FAILURE_EVENTS:
            last = after.sent.get(rule.key, {}).get(kind.value)
            if last is not None:
                due = rule.remind_every_seconds is not None and now >= _instant(last) + timedelta(  # type: ignore[operator]
                    seconds=rule.remind_every_seconds
                )
                if not due:
                    held[rule.key] = "suppressed"
                    continue
            after.sent.setdefault(rule.key, {})[kind.value] = to_iso(now)
        send.append(rule)
    return Decision(kind=kind.value, send=tuple(send), held=held, incident=after)


# ---- signatures ---------------------------------------------------------------------------------------
SIGNATURE_HEADER = "Duetime-Signature"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """Hex HMAC-SHA256 of ``"<timestamp>.<body>"`` with ``secret``."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(secrets: Sequence[str], timestamp: int, body: bytes) -> str:
    """``t=<unix seconds>,v1=<hex>[,v1=<hex>]``: one ``v1`` per secret (two during a rotation)."""
    return ",".join([f"t={timestamp}", *(f"v1={sign(s, timestamp, body)}" for s in secrets)])


def verify_signature(header: str, body: bytes, secret: str, *, now: int, tolerance: int = 300) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` at a time within ``tolerance`` s of ``now``."""
    parts = [p.partition("=") for p in header.split(",")]
    stamps = [v for k, _, v in parts if k == "t"]
    if len(stamps) != 1 or not (stamps[0].isascii() and stamps[0].isdigit()):  # int() raises on "²"
        return False
    if abs(now - int(stamps[0])) > tolerance:
        return False
    expected = sign(secret, int(stamps[0]), body)
    return any(hmac.compare_digest(expected, v) for k, _, v in parts if k == "v1")


def event_body(event: Mapping[str, Any]) -> bytes:
    """The bytes a webhook delivery POSTs (compact JSON, keys sorted: the same bytes on every attempt)."""
    return json.dumps(event, separators=(",", ":"), sort_keys=True).encode()


# ---- what the notifier records -----------------------------------------------------------------------------
class NotificationEvent(StoredModel):
    """One event of a job, as recorded (listed by ``GET /jobs/{id}/deliveries``, muted or not).

    ``notified``: ``sent`` (deliveries were made for it), ``muted`` (the job's ``mute_until`` was ahead),
    ``suppressed`` (noise control: the incident had already alerted every rule on it), ``no_rules``."""

    event_id: str
    type: EventType
    tenant: str
    job_id: str
    job_name: str
    run_id: str
    due_at: Instant
    attempt: int
    state: str
    reason: str | None = None
    exit_code: int | None = None
    started_at: Instant | None = None
    finished_at: Instant | None = None
    count: int = 1
    occurred_at: Instant
    notified: str = "sent"

    def payload(self) -> dict[str, Any]:
        """What every target receives (a webhook's JSON body; SNS's message): the event id is the
        receiver's idempotency key."""
        data = self.model_dump(mode="json", exclude={"notified"})
        data["run_path"] = f"/runs/{self.run_id}"
        return data


class DeliveryAttempt(StoredModel):
    """One try of a delivery: when, and what came back."""

    at: Instant
    ok: bool
    status_code: int | None = None
    error: str | None = None
    duration_ms: int | None = None


class Delivery(StoredModel):
    """One event to one rule's target, until it is delivered or dead-lettered.

    ``status``: ``pending`` (the next try at ``next_attempt_at``), ``delivered``, ``dead_lettered`` (tried
    for the whole retry window, or refused for good: an address the SSRF rules forbid), ``cancelled`` (its
    rule was removed before it could be delivered)."""

    delivery_id: str
    event_id: str
    tenant: str
    job_id: str
    rule_key: str
    #: where the rule lives: ``job`` or ``tenant``
    origin: str
    kind: str
    target: str
    status: str = "pending"
    #: every try made so far
    tries: int = 0
    #: the newest :data:`KEPT_ATTEMPTS` tries
    attempts: list[DeliveryAttempt] = Field(default_factory=list)
    next_attempt_at: Instant | None = None
    created_at: Instant
    finished_at: Instant | None = None
    #: the event's payload, as every attempt sends it (JSON text)
    body: str


def delivery_id(event: str, rule_key: str) -> str:
    """A delivery's id: the same for every duplicate of its event (so a replayed change adds none)."""
    return f"{event}.{rule_key}"


#: the tries a delivery keeps (the newest)
KEPT_ATTEMPTS = 20
#: how long a delivery is retried, seconds, then dead-lettered
DELIVERY_WINDOW_SECONDS = 24 * 3600
#: the first retry's backoff ceiling and the longest, seconds
DELIVERY_BACKOFF_SECONDS = 5.0
DELIVERY_MAX_BACKOFF_SECONDS = 3600.0


def delivery_backoff(tries: int, *, base: float, cap: float, unit: float) -> float:
    """The wait before try ``tries + 1`` (``tries`` >= 1 done), seconds: equal jitter
    ``uniform(c/2, c)`` (``unit`` in [0, 1) picks it) with ``c = min(cap, base * 2^(tries-1))``."""
    ceiling = min(cap, base * (2.0 ** min(tries - 1, 40)))
    return ceiling / 2 + unit * ceiling / 2


# ---- the notifier's queue (AWS) ----------------------------------------------------------------------------
class DeliveryRef(BaseModel):
    """Which delivery a wake-up is for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: Annotated[str, Field(min_length=1, max_length=256)]
    delivery_id: Annotated[str, Field(min_length=1, max_length=256)]
    #: the tries the delivery had when this wake-up was sent: a wake-up for another count is stale (a
    #: duplicate of an earlier one) and is dropped, so a delivery has one chain of tries
    tries: Annotated[int, Field(ge=0)] | None = None


class NotifierMessage(BaseModel):
    """A message of the notifications queue: the sweeper's ``late``/``overran`` ``signal``
    (:func:`signal_to_doc`'s fields) or the ``wake`` of a delivery whose next try is due."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    signal: dict[str, Any] | None = None
    wake: DeliveryRef | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> NotifierMessage:
        if (self.signal is None) == (self.wake is None):
            raise ValueError("needs exactly one of signal, wake")
        return self

    @classmethod
    def wake_for(cls, delivery: Delivery) -> NotifierMessage:
        return cls(
            wake=DeliveryRef(job_id=delivery.job_id, delivery_id=delivery.delivery_id, tries=delivery.tries)
        )
