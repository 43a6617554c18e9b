"""The embedded notifications set: the outbox a trigger on ``runs`` fills (the change feed), the sweeper's
signals, tenants' rules, events, deliveries and incidents, in the stack's SQLite file (schema 3).

See docs/design/notifications.md. Every method is one transaction; :meth:`record_event` writes the event, its
deliveries and the job's incident together, or nothing when the event id is recorded already.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from duetime.adapters.sqlite.db import Database
from duetime.domain.errors import PageTokenError
from duetime.domain.models import NotificationRule
from duetime.domain.notifications import (
    Delivery,
    Incident,
    NotificationEvent,
    RunSignal,
    signal_of,
    signal_to_doc,
    snapshot_of,
)
from duetime.domain.ports import ChangeEntry
from duetime.domain.timeutil import to_iso

#: how long recorded events and their deliveries are kept, days (the runs' retention by default)
EVENT_RETENTION_DAYS = 90


def _instant(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value).replace("Z", "+00:00"))


class SqliteNotifications:
    """:class:`~duetime.domain.ports.ChangeFeed`, :class:`~duetime.domain.ports.SignalOutbox` and
    :class:`~duetime.domain.ports.NotificationStore` on the stack's SQLite file."""

    def __init__(self, path: str | Path, *, retention_days: float = EVENT_RETENTION_DAYS) -> None:
        self.db = Database(path)
        self.retention = timedelta(days=retention_days)

    # ---- the change feed ---------------------------------------------------------------------------
    def read_changes(self, *, limit: int) -> list[ChangeEntry]:
        rows = self.db.read(
            "SELECT id, kind, old, new FROM notification_outbox"
            " WHERE id > (SELECT position FROM notification_cursor WHERE id = 1)"
            " ORDER BY id LIMIT ?",
            (limit,),
        )
        out: list[ChangeEntry] = []
        for position, kind, old, new in rows:
            if kind == "signal":
                out.append(ChangeEntry(position=int(position), signal=signal_of(json.loads(new))))
            else:
                out.append(
                    ChangeEntry(
                        position=int(position),
                        old=snapshot_of(json.loads(old)) if old else None,
                        new=snapshot_of(json.loads(new)),
                    )
                )
        return out

    def ack_changes(self, position: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE notification_cursor SET position = ? WHERE id = 1 AND position < ?",
                (position, position),
            )
            conn.execute("DELETE FROM notification_outbox WHERE id <= ?", (position,))

    def append_signals(self, signals: Sequence[RunSignal]) -> None:
        if not signals:
            return
        with self.db.transaction() as conn:
            conn.executemany(
                "INSERT INTO notification_outbox (kind, old, new) VALUES ('signal', NULL, ?)",
                [(json.dumps(signal_to_doc(s)),) for s in signals],
            )

    # ---- tenants' rules ------------------------------------------------------------------------------
    def get_tenant_rules(self, tenant: str) -> tuple[list[NotificationRule], datetime | None]:
        rows = self.db.read("SELECT updated_at, doc FROM tenant_notifications WHERE tenant = ?", (tenant,))
        if not rows:
            return [], None
        return [NotificationRule.from_stored(r) for r in json.loads(rows[0][1])], _instant(rows[0][0])

    def put_tenant_rules(self, tenant: str, rules: Sequence[NotificationRule], *, now: datetime) -> None:
        doc = json.dumps([r.model_dump(mode="json", exclude_none=True) for r in rules])
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO tenant_notifications (tenant, updated_at, doc) VALUES (?, ?, ?)"
                " ON CONFLICT (tenant) DO UPDATE SET updated_at = excluded.updated_at, doc = excluded.doc",
                (tenant, to_iso(now), doc),
            )

    # ---- events, deliveries, incidents ---------------------------------------------------------------
    def get_incident(self, job_id: str) -> Incident:
        rows = self.db.read("SELECT doc FROM notification_incidents WHERE job_id = ?", (job_id,))
        return Incident.of(json.loads(rows[0][0]) if rows else None)

    def record_event(
        self, event: NotificationEvent, deliveries: Sequence[Delivery], incident: Incident
    ) -> bool:
        expires = int((event.occurred_at + self.retention).timestamp())
        with self.db.transaction() as conn:
            added = conn.execute(
                "INSERT OR IGNORE INTO notification_events (event_id, job_id, occurred_at, expires_at, doc)"
                " VALUES (?, ?, ?, ?, ?)",
                (event.event_id, event.job_id, to_iso(event.occurred_at), expires, event.model_dump_json()),
            ).rowcount
            if not added:
                return False
            conn.executemany(
                "INSERT OR IGNORE INTO notification_deliveries (delivery_id, event_id, next_attempt_at, doc)"
                " VALUES (?, ?, ?, ?)",
                [(d.delivery_id, d.event_id, _due(d), d.model_dump_json()) for d in deliveries],
            )
            conn.execute(
                "INSERT INTO notification_incidents (job_id, doc) VALUES (?, ?)"
                " ON CONFLICT (job_id) DO UPDATE SET doc = excluded.doc",
                (event.job_id, json.dumps(incident.to_doc())),
            )
        return True

    def due_deliveries(self, now: datetime, *, limit: int) -> list[Delivery]:
        rows = self.db.read(
            "SELECT doc FROM notification_deliveries WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= ?"
            " ORDER BY next_attempt_at LIMIT ?",
            (to_iso(now), limit),
        )
        return [Delivery.from_stored(json.loads(r[0])) for r in rows]

    def get_delivery(self, job_id: str, delivery_id: str) -> Delivery | None:
        rows = self.db.read("SELECT doc FROM notification_deliveries WHERE delivery_id = ?", (delivery_id,))
        return Delivery.from_stored(json.loads(rows[0][0])) if rows else None

    def save_delivery(self, delivery: Delivery) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE notification_deliveries SET next_attempt_at = ?, doc = ? WHERE delivery_id = ?",
                (_due(delivery), delivery.model_dump_json(), delivery.delivery_id),
            )

    def list_events(
        self, job_id: str, *, limit: int, page_token: str | None = None
    ) -> tuple[list[tuple[NotificationEvent, list[Delivery]]], str | None]:
        after = _decode(page_token, job_id)
        sql = "SELECT event_id, occurred_at, doc FROM notification_events WHERE job_id = ?"
        params: list[Any] = [job_id]
        if after is not None:
            sql += " AND (occurred_at, event_id) < (?, ?)"
            params += after
        sql += " ORDER BY occurred_at DESC, event_id DESC LIMIT ?"
        params.append(limit + 1)
        rows = self.db.read(sql, params)
        page = rows[:limit]
        ids = [str(r[0]) for r in page]
        by_event: dict[str, list[Delivery]] = {i: [] for i in ids}
        if ids:
            marks = ", ".join("?" for _ in ids)
            for (doc,) in self.db.read(
                f"SELECT doc FROM notification_deliveries WHERE event_id IN ({marks}) ORDER BY delivery_id",  # noqa: S608
                ids,
            ):
                delivery = Delivery.from_stored(json.loads(doc))
                by_event[delivery.event_id].append(delivery)
        items = [(NotificationEvent.from_stored(json.loads(r[2])), by_event[str(r[0])]) for r in page]
        token = _encode(job_id, [str(page[-1][1]), str(page[-1][0])]) if len(rows) > limit else None
        return items, token

    def purge(self, now: datetime) -> None:
        """Drop events (and their deliveries) past their retention."""
        with self.db.transaction() as conn:
            epoch = int(now.timestamp())
            conn.execute(
                "DELETE FROM notification_deliveries WHERE event_id IN"
                " (SELECT event_id FROM notification_events WHERE expires_at <= ?)",
                (epoch,),
            )
            conn.execute("DELETE FROM notification_events WHERE expires_at <= ?", (epoch,))


def _due(delivery: Delivery) -> str | None:
    if delivery.status != "pending" or delivery.next_attempt_at is None:
        return None
    return to_iso(delivery.next_attempt_at)


def _encode(job_id: str, last: list[str]) -> str:
    body = json.dumps({"j": job_id, "k": last}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(body).decode().rstrip("=")


def _decode(token: str | None, job_id: str) -> list[str] | None:
    if not token:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if not isinstance(data, dict) or data.get("j") != job_id:
            raise ValueError("another job's token")
        key = data.get("k")
        if not isinstance(key, list) or len(key) != 2 or not all(isinstance(k, str) for k in key):
            raise ValueError("malformed")
        return [str(k) for k in key]
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise PageTokenError() from None
