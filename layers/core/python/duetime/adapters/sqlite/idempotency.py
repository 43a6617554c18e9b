"""Powertools idempotency records in the embedded SQLite file: ``Idempotency-Key`` without DynamoDB.

:class:`SqlitePersistenceLayer` is a Powertools persistence layer (``BasePersistenceLayer``) with the
semantics of Powertools' own ``DynamoDBPersistenceLayer``, record for record. It keeps one row per
idempotency key in ``idempotency_records`` in the same file the store and queues use:

- ``id``: the hashed key (``<function>#<hash>``); ``status``: ``INPROGRESS`` or ``COMPLETED``;
- ``expiration``: when the record expires, epoch **seconds** (the DynamoDB item's TTL attribute);
- ``in_progress_expiration``: when an ``INPROGRESS`` record may be taken over, epoch **milliseconds** (set
  only when Powertools knows the Lambda's remaining time; else NULL: the record holds until ``expiration``);
- ``data``: the function's JSON response; ``validation``: the payload hash (with payload validation on).

The conditional put (``save_inprogress``) succeeds only if no record with the key exists, or it has
expired (``expiration < now``), or it is ``INPROGRESS`` with an ``in_progress_expiration`` in the past:
DynamoDB's ``ConditionExpression``. Here it is a ``BEGIN IMMEDIATE`` transaction
(:meth:`Database.transaction`): the write lock of the whole file is taken before the row is read, so no
writer of any thread or process comes between the check and the write, and of two racing callers exactly
one inserts; the other gets ``IdempotencyItemAlreadyExistsError`` carrying the winner's record. Expired
records are treated as absent: a read does not return them, a put overwrites them, and each put deletes the
expired rows (DynamoDB's TTL deletion, done eagerly).

The table is created on first use (``CREATE TABLE IF NOT EXISTS`` in a write transaction), not by a schema
migration, so it does not change the file's ``user_version``.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import (
    STATUS_CONSTANTS,
    DataRecord,
)

from duetime.adapters.sqlite.db import Database

logger = logging.getLogger(__name__)

TABLE = "idempotency_records"

#: created on first use, in one write transaction (idempotent: a second process finds them made)
SCHEMA: tuple[str, ...] = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        expiration INTEGER NOT NULL,
        in_progress_expiration INTEGER,
        data TEXT,
        validation TEXT
    )""",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_expiry ON {TABLE} (expiration)",
)

_COLUMNS = "id, status, expiration, in_progress_expiration, data, validation"
_INPROGRESS = STATUS_CONSTANTS["INPROGRESS"]


def _now() -> tuple[int, int]:
    """Now as Powertools reads it (local ``datetime.now()``): epoch seconds and epoch milliseconds."""
    now = dt.datetime.now().timestamp()
    return int(now), int(now * 1000)


def _to_record(row: tuple[Any, ...]) -> DataRecord:
    key, status, expiration, in_progress_expiration, data, validation = row
    return DataRecord(
        idempotency_key=key,
        status=status,
        expiry_timestamp=expiration,
        in_progress_expiry_timestamp=in_progress_expiration,
        response_data=data or "",
        payload_hash=validation or "",
    )


class SqlitePersistenceLayer(BasePersistenceLayer):
    """Idempotency records in the SQLite file at ``path`` (shared by threads and processes).

    Args:
        path: the database file; the store's own schema is applied on open (:class:`Database`) and the
            ``idempotency_records`` table is created if absent.

    Raises:
        StateFileError: the file cannot be used (see :class:`Database`).
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.db = Database(path)
        with self.db.transaction() as conn:
            for statement in SCHEMA:
                conn.execute(statement)

    # ---- BasePersistenceLayer ------------------------------------------------------------------------
    def _get_record(self, idempotency_key: str) -> DataRecord:
        """The unexpired record with this key (expired ones are as good as absent).

        Raises:
            IdempotencyItemNotFoundError: no such record, or it has expired.
        """
        now, _ = _now()
        rows = self.db.read(
            f"SELECT {_COLUMNS} FROM {TABLE} WHERE id = ? AND expiration >= ?", (idempotency_key, now)
        )
        if not rows:
            raise IdempotencyItemNotFoundError
        return _to_record(rows[0])

    def _put_record(self, data_record: DataRecord) -> None:
        """Insert ``data_record`` unless an unexpired record holds its key (atomically, across processes).

        Raises:
            IdempotencyItemAlreadyExistsError: the key is held; ``old_data_record`` is the holder.
            IdempotencyValidationError: the key is held by a record of a different payload.
        """
        now, now_ms = _now()
        validation = data_record.payload_hash if self.payload_validation_enabled else None
        with self.db.transaction() as conn:
            # DynamoDB's TTL deletion, eagerly: what has expired is gone (this key's row too, if expired)
            conn.execute(f"DELETE FROM {TABLE} WHERE expiration < ?", (now,))
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM {TABLE} WHERE id = ?", (data_record.idempotency_key,)
            ).fetchone()
            # held: unexpired (those are deleted above), and not INPROGRESS past its in-progress expiry
            held = (
                _to_record(row)
                if row is not None and not (row[1] == _INPROGRESS and row[3] is not None and row[3] < now_ms)
                else None
            )
            if held is None:
                conn.execute(
                    f"INSERT OR REPLACE INTO {TABLE} ({_COLUMNS}) VALUES (?, ?, ?, ?, NULL, ?)",
                    (
                        data_record.idempotency_key,
                        data_record.status,
                        data_record.expiry_timestamp,
                        data_record.in_progress_expiry_timestamp,
                        validation or None,
                    ),
                )
                logger.debug("Put record for idempotency key: %s", data_record.idempotency_key)
                return
        # the transaction has committed (the expired rows are gone); answer as DynamoDB's layer does
        logger.debug(
            "Failed to put record for already existing idempotency key: %s with status: %s",
            data_record.idempotency_key,
            held.status,
        )
        self._validate_payload(data_payload=data_record, stored_data_record=held)
        self._save_to_cache(data_record=held)
        raise IdempotencyItemAlreadyExistsError(old_data_record=held)

    def _update_record(self, data_record: DataRecord) -> None:
        """Write the record's status, expiry and response (and payload hash, with validation on); creates
        the row if it is gone, as DynamoDB's ``UpdateItem`` does."""
        logger.debug("Updating record for idempotency key: %s", data_record.idempotency_key)
        validate = self.payload_validation_enabled
        with self.db.transaction() as conn:
            conn.execute(
                f"INSERT INTO {TABLE} ({_COLUMNS}) VALUES (?, ?, ?, NULL, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET status = excluded.status,"
                " expiration = excluded.expiration, data = excluded.data"
                + (", validation = excluded.validation" if validate else ""),
                (
                    data_record.idempotency_key,
                    data_record.status,
                    data_record.expiry_timestamp,
                    data_record.response_data,
                    (data_record.payload_hash or None) if validate else None,
                ),
            )

    def _delete_record(self, data_record: DataRecord) -> None:
        """Remove the record (the function raised: a retry with the key runs it again)."""
        logger.debug("Deleting record for idempotency key: %s", data_record.idempotency_key)
        with self.db.transaction() as conn:
            conn.execute(f"DELETE FROM {TABLE} WHERE id = ?", (data_record.idempotency_key,))

    def close(self) -> None:
        """Close this layer's connections (a later call opens new ones)."""
        self.db.close()
