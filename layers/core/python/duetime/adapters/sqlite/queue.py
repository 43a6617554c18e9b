"""SQLite queues: the tier queues that wake runs up, as SQS standard queues with a redrive policy behave.

One table holds every tier's messages. A message is visible once ``visible_at`` (epoch seconds of the queue's
clock) has passed: ``send`` sets it ``delay`` seconds on (0..900), a receive hides the delivery for the
visibility timeout and gives it a fresh receipt handle, so a stale handle (the message went to another
receiver since) deletes or extends nothing. The receive that would deliver a message for the
``max_receive_count + 1``-th time moves it to the tier's dead letters instead (SQS's ``maxReceiveCount``).

Receives are fair across tenants, as SQS fair queues are: the visible messages are served round-robin by
tenant, the tenant served least recently first (one tenant's backlog does not delay another tenant's
message behind it). A receive of several messages takes them in one write transaction.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from duetime.adapters.sqlite.db import Database
from duetime.config.settings import ALL_TIERS
from duetime.domain.clock import Clock, SystemClock
from duetime.domain.errors import ThrottledError
from duetime.domain.lifecycle import MAX_MESSAGE_DELAY_SECONDS
from duetime.domain.models import RunMessage
from duetime.domain.ports import QUEUE_MAX_RECEIVE_COUNT, QUEUE_VISIBILITY_SECONDS, ReceivedMessage

#: SQS's limits: messages per receive, a long poll's wait, a visibility timeout (seconds)
MAX_RECEIVE_MESSAGES = 10
MAX_WAIT_SECONDS = 20
MAX_VISIBILITY_SECONDS = 12 * 3600
#: how often a long poll looks again, seconds
POLL_SECONDS = 0.05


class SqliteQueues:
    """The tier queues in a SQLite file (:class:`~duetime.domain.ports.RunQueue`).

    Args:
        path: the database file (it may be the store's).
        clock: the clock of delays and visibility timeouts (default: the wall clock). With a clock that does
            not move (a test's ``FixedClock``) a long poll returns at once what is visible: waiting would
            not make anything visible.
        tiers: the tier names accepted (others raise KeyError, as an unknown tier does with SQS); None: any.
        visibility_seconds: the queues' visibility timeout.
        max_receive_count: deliveries of a message before the next receive moves it to the dead letters.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock | None = None,
        tiers: Iterable[str] | None = ALL_TIERS,
        visibility_seconds: int = QUEUE_VISIBILITY_SECONDS,
        max_receive_count: int = QUEUE_MAX_RECEIVE_COUNT,
    ) -> None:
        # not durable (no fsync at commit): the run rows are the truth; a message a power cut loses is sent
        # again by the sweeper, a receive or delete lost delivers the message again (its start is refused)
        self.db = Database(path, durable=False)
        self.clock: Clock = clock or SystemClock()
        self.tiers: set[str] | None = set(tiers) if tiers is not None else None
        self.visibility_seconds = visibility_seconds
        self.max_receive_count = max_receive_count

    def close(self) -> None:
        self.db.close()

    def add_tier(self, tier: str) -> None:
        """Accept ``tier`` from now on (a new, empty queue)."""
        if self.tiers is not None:
            self.tiers.add(tier)

    def _check(self, tier: str) -> None:
        if self.tiers is not None and tier not in self.tiers:
            raise KeyError(tier)

    def _now(self) -> float:
        return self.clock.now().timestamp()

    # ---- send ----------------------------------------------------------------------------------------
    def send(self, tier: str, message: RunMessage, *, delay: int = 0) -> None:
        """Deliver ``message`` on ``tier``'s queue after ``delay`` seconds (clamped to 0..900); its tenant
        is its fairness group."""
        self.send_batch(tier, [(message, delay)])

    def send_batch(self, tier: str, messages: Sequence[tuple[RunMessage, int]]) -> None:
        """Deliver each ``(message, delay seconds)`` as :meth:`send` would, all in one transaction."""
        self._put(tier, [(m.body(), m.tenant, delay) for m, delay in messages])

    def send_raw(self, tier: str, body: str, *, tenant: str | None = None, delay: int = 0) -> None:
        """Put a message with any ``body`` on ``tier``'s queue (the bodies no sender of ours writes)."""
        self._put(tier, [(body, tenant, delay)])

    def _put(self, tier: str, entries: Sequence[tuple[str, str | None, int]]) -> None:
        """Insert ``(body, tenant, delay)`` entries on ``tier``'s queue in one transaction."""
        self._check(tier)
        if not entries:
            return
        now = self._now()
        rows = [
            (tier, tenant or "", body, now, now + max(0, min(MAX_MESSAGE_DELAY_SECONDS, int(delay))))
            for body, tenant, delay in entries
        ]
        groups = sorted({(tier, row[1]) for row in rows})
        with self.db.transaction() as conn:
            conn.executemany(
                "INSERT INTO queue_messages (tier, tenant, body, sent_at, visible_at) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            conn.executemany(
                "INSERT INTO queue_tenants (tier, tenant) VALUES (?, ?) ON CONFLICT (tier, tenant) DO NOTHING",
                groups,
            )

    # ---- receive -------------------------------------------------------------------------------------
    def receive(
        self,
        tier: str,
        *,
        max_messages: int = 1,
        wait_seconds: int = 1,
        visibility_seconds: int | None = None,
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` (1..10) deliveries, waiting up to ``wait_seconds`` (0..20) for one; each
        stays hidden for ``visibility_seconds`` (default: the queue's)."""
        self._check(tier)
        count = max(1, min(MAX_RECEIVE_MESSAGES, int(max_messages)))
        hide = self.visibility_seconds if visibility_seconds is None else visibility_seconds
        hide = max(0, min(MAX_VISIBILITY_SECONDS, int(hide)))
        deadline = time.monotonic() + max(0, min(MAX_WAIT_SECONDS, wait_seconds))
        first = self.clock.now()
        stalled = False
        while True:
            got = self._take(tier, count, hide)
            if got:
                return got
            left = deadline - time.monotonic()
            if left <= 0 or stalled:
                return []
            time.sleep(min(POLL_SECONDS, left))
            stalled = self.clock.now() == first  # the clock does not move: one more look, then return

    def _take(self, tier: str, count: int, hide: int) -> list[ReceivedMessage]:
        """Deliver up to ``count`` visible messages of ``tier``, round-robin by tenant, in one transaction."""
        now = self._now()
        if not self.db.read(
            "SELECT 1 FROM queue_messages WHERE tier = ? AND visible_at <= ? LIMIT 1", (tier, now)
        ):
            return []  # nothing visible: no write lock taken
        delivered: list[ReceivedMessage] = []
        taken: set[int] = set()
        with self.db.transaction() as conn:
            while len(delivered) < count:
                need = count - len(delivered)
                tenants = [
                    str(r[0])
                    for r in conn.execute(
                        "SELECT t.tenant FROM queue_tenants t WHERE t.tier = ? AND EXISTS (SELECT 1 FROM"
                        " queue_messages m WHERE m.tier = t.tier AND m.tenant = t.tenant AND m.visible_at <= ?)"
                        " ORDER BY t.last_served, t.tenant LIMIT ?",
                        (tier, now, need + len(taken)),
                    )
                ]
                # each tenant's oldest visible messages, then one of each tenant per round
                queues: list[list[tuple[Any, ...]]] = []
                for tenant in tenants:
                    rows = conn.execute(
                        "SELECT id, tenant, body, receive_count FROM queue_messages WHERE tier = ? AND tenant = ?"
                        " AND visible_at <= ? ORDER BY visible_at, id LIMIT ?",
                        (tier, tenant, now, need + len(taken)),
                    ).fetchall()
                    rows = [r for r in rows if int(r[0]) not in taken]
                    if rows:
                        queues.append(rows)
                picks = [q[i] for i in range(need) for q in queues if i < len(q)][:need]
                if not picks:
                    break
                moved = False
                served: list[str] = []
                for message_id, tenant, body, received in picks:
                    taken.add(int(message_id))
                    if int(received) >= self.max_receive_count:
                        self._dead_letter(conn, int(message_id), now)
                        moved = True
                        continue
                    receipt = f"{message_id}.{secrets.token_urlsafe(16)}"
                    conn.execute(
                        "UPDATE queue_messages SET receive_count = receive_count + 1, visible_at = ?, receipt = ?"
                        " WHERE id = ?",
                        (now + hide, receipt, message_id),
                    )
                    if tenant not in served:
                        served.append(str(tenant))
                    delivered.append(
                        ReceivedMessage(_parse(str(body)), receipt, str(body), int(received) + 1)
                    )
                for tenant in served:
                    conn.execute(
                        "UPDATE queue_tenants SET last_served = (SELECT MAX(last_served) + 1 FROM queue_tenants"
                        " WHERE tier = ?) WHERE tier = ? AND tenant = ?",
                        (tier, tier, tenant),
                    )
                if not moved:
                    break  # a round without dead letters took what there was
        return delivered

    @staticmethod
    def _dead_letter(conn: Any, message_id: int, now: float) -> None:
        conn.execute(
            "INSERT INTO queue_dead_letters (id, tier, tenant, body, sent_at, moved_at, receive_count)"
            " SELECT id, tier, tenant, body, sent_at, ?, receive_count FROM queue_messages WHERE id = ?",
            (now, message_id),
        )
        conn.execute("DELETE FROM queue_messages WHERE id = ?", (message_id,))

    # ---- delete, extend ------------------------------------------------------------------------------
    def delete(self, tier: str, receipt_handle: str) -> None:
        """Delete a delivery (a stale handle is ignored: another receiver has the message now)."""
        self._check(tier)
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM queue_messages WHERE tier = ? AND receipt = ?", (tier, receipt_handle))

    def delete_batch(self, tier: str, receipt_handles: Sequence[str]) -> None:
        """Delete several deliveries in one transaction (stale handles are ignored, as by :meth:`delete`)."""
        self._check(tier)
        if not receipt_handles:
            return
        with self.db.transaction() as conn:
            conn.executemany(
                "DELETE FROM queue_messages WHERE tier = ? AND receipt = ?",
                [(tier, handle) for handle in receipt_handles],
            )

    def extend_visibility(self, tier: str, receipt_handle: str, seconds: int) -> None:
        """Keep a delivery hidden ``seconds`` from now (best effort: a stale handle, or a delivery whose
        visibility already ran out, is left alone, as SQS refuses a message no longer in flight)."""
        self._check(tier)
        now = self._now()
        hide = max(0, min(MAX_VISIBILITY_SECONDS, int(seconds)))
        try:
            with self.db.transaction() as conn:
                conn.execute(
                    "UPDATE queue_messages SET visible_at = ? WHERE tier = ? AND receipt = ? AND visible_at > ?",
                    (now + hide, tier, receipt_handle, now),
                )
        except ThrottledError:
            pass  # best effort: the run row, not the message, is the truth

    # ---- inspection ----------------------------------------------------------------------------------
    def counts(self, tier: str) -> dict[str, int]:
        """``{"visible", "delayed", "in_flight", "dead"}`` message counts of ``tier`` (as SQS's attributes:
        delayed = never received and not yet visible)."""
        now = self._now()
        [(visible, delayed, in_flight)] = self.db.read(
            "SELECT COALESCE(SUM(visible_at <= ?), 0), COALESCE(SUM(visible_at > ? AND receive_count = 0), 0),"
            " COALESCE(SUM(visible_at > ? AND receive_count > 0), 0) FROM queue_messages WHERE tier = ?",
            (now, now, now, tier),
        )
        [(dead,)] = self.db.read("SELECT COUNT(*) FROM queue_dead_letters WHERE tier = ?", (tier,))
        return {
            "visible": int(visible),
            "delayed": int(delayed),
            "in_flight": int(in_flight),
            "dead": int(dead),
        }

    def dead_letters(self, tier: str) -> list[str]:
        """The bodies in ``tier``'s dead letters, oldest first."""
        return [
            str(r[0])
            for r in self.db.read("SELECT body FROM queue_dead_letters WHERE tier = ? ORDER BY id", (tier,))
        ]


def _parse(body: str) -> RunMessage | None:
    try:
        return RunMessage.model_validate_json(body)
    except ValueError:
        return None
