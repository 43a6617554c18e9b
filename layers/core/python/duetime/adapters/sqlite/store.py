"""SQLite store: jobs, runs, tenant counters, submit counters and shard leases in one database file.

The same semantics as :class:`duetime.adapters.aws.dynamodb.DynamoStore`, transition for transition: each
state change is one conditional write, and a failed condition becomes the same error (``AlreadyClaimedError``,
``StaleClaimError``, ``StartRejectedError``, ``LeaseLostError``, ``ConflictError``, ``JobExistsError``) or
``None`` ("the run moved on"). A job or a run is one row: its JSON document (``model_dump(mode="json")``,
instants as fixed-width UTC text) plus real, indexed columns for every access path. The run's sparse index
columns (``watch_shard``, ``active_job``, ``running_tenant``, ``dead_letter_tenant``) are set and removed by
the same transitions that set and remove DynamoDB's index attributes, so a run is in the same listings here
as there; the index sort keys (``watch_at``, ``dead_lettered_at``) are the run's own fields.

A conditional write runs inside ``BEGIN IMMEDIATE`` (:meth:`Database.transaction`): read the row, check the
condition in Python on the stored values (instants compared as their stored text, as DynamoDB compares
them), write the row. The transaction holds the file's write lock from its first statement, so no writer of
any thread or process comes between the read and the write.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from duetime.adapters.sqlite.db import Database
from duetime.domain.clock import Clock, SystemClock
from duetime.domain.errors import (
    AlreadyClaimedError,
    ChangedMeanwhileError,
    JobExistsError,
    LeaseLostError,
    PageTokenError,
    StaleClaimError,
    StartRejectedError,
)
from duetime.domain.lifecycle import AttemptEnd
from duetime.domain.models import (
    SESSION_RETAIN_SECONDS,
    AttemptRecord,
    Job,
    JobState,
    JobSummary,
    Run,
    RunState,
    Session,
    Trigger,
)
from duetime.domain.ports import JobAdvance, RunStart
from duetime.domain.retention import RetentionPolicy
from duetime.domain.timeutil import from_iso, to_iso

# the run's index-only attributes (DynamoDB's names, kept as columns, never in the document)
WATCH_SHARD = "watch_shard"
ACTIVE_JOB = "active_job"
RUNNING_TENANT = "running_tenant"
DEAD_LETTER_TENANT = "dead_letter_tenant"
_INDEX_KEYS = (WATCH_SHARD, ACTIVE_JOB, RUNNING_TENANT, DEAD_LETTER_TENANT)

#: attributes a run drops when it becomes terminal (it leaves the watch index, the lease ends)
TERMINAL_REMOVALS = (
    WATCH_SHARD,
    "watch_at",
    ACTIVE_JOB,
    RUNNING_TENANT,
    "held",
    "lease_owner",
    "lease_expires_at",
    "session_id",
    "retry_at",
)

#: a submit counter's lifetime after the start of its minute, seconds (as the DynamoDB item's TTL)
SUBMIT_COUNTER_TTL_SECONDS = 120
#: rows read per page by the iterators (query_due, query_overdue)
PAGE_SIZE = 500
#: ids per ``IN (...)`` of get_jobs, get_runs and get_sessions
_IDS_PER_READ = 500


def _ttl(retention: RetentionPolicy, doc: Mapping[str, Any], due_at: datetime) -> int:
    """A run row's ``expires_at`` (epoch seconds) by the hot window's tiers (DynamoDB's TTL)."""
    finished = doc.get("finished_at")
    return int(
        retention.expires_for(
            RunState(str(doc["state"])),
            due_at=due_at,
            finished_at=from_iso(str(finished)) if finished else None,
            dead_lettered=bool(doc.get("dead_lettered")),
        ).timestamp()
    )


def _session_purge_at(expires_at: datetime) -> int:
    """When a session ending at ``expires_at`` may be deleted (epoch seconds)."""
    return int(expires_at.timestamp()) + SESSION_RETAIN_SECONDS


def _plain(value: Any) -> Any:
    """A value as a stored document holds it: instants as ``to_iso`` text, enums as their values, models
    as their JSON form."""
    if isinstance(value, datetime):
        return to_iso(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _part_of(job_id: str, parts: int) -> int:
    """Which of ``parts`` parts of a tick job ``job_id`` is in (:meth:`SqliteStore.query_due`)."""
    return int.from_bytes(hashlib.blake2b(job_id.encode(), digest_size=8).digest(), "big") % parts


def _iso(value: datetime | None) -> str | None:
    return to_iso(value) if value is not None else None


def _le(stored: Any, bound: str) -> bool:
    """DynamoDB's ``attr <= :bound`` on a stored instant: false when the attribute is absent."""
    return isinstance(stored, str) and stored <= bound


@dataclass
class _RunRow:
    """A run row as read inside a transaction: the document and the index-only attributes."""

    doc: dict[str, Any]
    index: dict[str, Any]

    def get(self, name: str) -> Any:
        return self.index.get(name) if name in _INDEX_KEYS else self.doc.get(name)

    def edit(
        self,
        *,
        sets: Mapping[str, Any] | None = None,
        removes: Sequence[str] = (),
        adds: Mapping[str, int] | None = None,
        appends: Mapping[str, list[Any]] | None = None,
    ) -> None:
        """DynamoDB's ``SET``/``REMOVE``/``ADD``/``list_append``, on the document or the index columns."""
        for name, value in (sets or {}).items():
            target = self.index if name in _INDEX_KEYS else self.doc
            if value is None:
                target.pop(name, None)
            else:
                target[name] = _plain(value)
        for name, items in (appends or {}).items():
            self.doc[name] = list(self.doc.get(name) or []) + [_plain(i) for i in items]
        for name in removes:
            (self.index if name in _INDEX_KEYS else self.doc).pop(name, None)
        for name, delta in (adds or {}).items():
            self.doc[name] = int(self.doc.get(name) or 0) + delta


def _run_index(run: Run) -> dict[str, Any]:
    """The index attributes a new run carries (as ``run_to_item`` sets them)."""
    index: dict[str, Any] = {}
    if not run.state.terminal and run.watch_at is not None:
        index[WATCH_SHARD] = run.shard
    if not run.state.terminal and (run.overlap.enforced or run.held is not None):
        index[ACTIVE_JOB] = run.job_id
    if run.dead_lettered:
        index[DEAD_LETTER_TENANT] = run.tenant
    return index


_Edit = tuple[Callable[[_RunRow], bool], Callable[[_RunRow], None]]

#: a run row's columns written back (the key last: job_id, due_at)
_UPDATE_RUN = (
    "UPDATE runs SET watch_shard = ?, watch_at = ?, active_job = ?, running_tenant = ?,"
    " dead_letter_tenant = ?, dead_lettered_at = ?, expires_at = ?, doc = ?"
    " WHERE job_id = ? AND due_at = ?"
)
#: ...only if the row is still as it was read (document and index columns; IS: NULL equals NULL)
_UNCHANGED = " AND doc = ? AND watch_shard IS ? AND active_job IS ? AND running_tenant IS ? AND dead_letter_tenant IS ?"


def _start_edit(item: RunStart) -> _Edit:
    """The condition and change of :meth:`SqliteStore.start` for ``item``."""
    attempt, owner, now = item.attempt, item.owner, item.now
    lease_expires_at, deadline_at, watch_at = item.lease_expires_at, item.deadline_at, item.watch_at
    running_tenant, session_id = item.running_tenant, item.session_id
    now_s = to_iso(now)

    def condition(row: _RunRow) -> bool:
        state, stored_attempt = row.get("state"), row.get("attempt")
        startable = (state == RunState.PENDING.value and stored_attempt == attempt) or (
            state == RunState.RETRY_WAIT.value
            and stored_attempt == attempt - 1
            and _le(row.get("retry_at"), now_s)
        )
        deadline = row.get("start_deadline_at")
        in_time = (
            deadline is None
            or (isinstance(deadline, str) and deadline >= now_s)
            or attempt > 1  # retries are past it by design, also straight from RETRY_WAIT
        )
        return startable and in_time and row.get("held") is None

    def change(row: _RunRow) -> None:
        sets: dict[str, Any] = {
            "state": RunState.RUNNING,
            "attempt": attempt,
            "lease_owner": owner,
            "lease_expires_at": lease_expires_at,
            "started_at": now,
        }
        if watch_at is not None:  # else the watch time stays (a lower bound: the sweeper moves it later)
            sets["watch_at"] = watch_at
        if deadline_at is not None:
            sets["deadline_at"] = deadline_at
        if running_tenant is not None:
            sets[RUNNING_TENANT] = running_tenant
        if session_id is not None:
            sets["session_id"] = session_id
        row.edit(
            sets=sets,
            removes=(["session_id"] if session_id is None else [])
            + ["retry_at", "finished_at", "exit_code", "error", "result", "result_truncated"],
            adds={"fencing_token": 1},
        )

    return condition, change


def _end_edit(end: AttemptEnd) -> _Edit:
    """The condition and change of :meth:`SqliteStore.end_attempt` for ``end``."""
    lease_by = _iso(end.lease_expired_by)

    def condition(row: _RunRow) -> bool:
        if row.get("state") != RunState.RUNNING.value or row.get("fencing_token") != end.expected_token:
            return False
        return lease_by is None or _le(row.get("lease_expires_at"), lease_by)

    def change(row: _RunRow) -> None:
        sets: dict[str, Any] = {"finished_at": end.finished_at, "state": end.state}
        removes: list[str] = []
        for name, value in (("exit_code", end.exit_code), ("error", end.error), ("log_key", end.log_key)):
            if value is None:
                removes.append(name)
            else:
                sets[name] = value
        if end.timeout_action is not None:
            sets["timeout_action"] = end.timeout_action
        if end.timeout_outcome is not None:
            sets["timeout_outcome"] = end.timeout_outcome
        if end.state is RunState.RETRY_WAIT:
            sets.update(retry_at=end.retry_at, watch_at=end.watch_at)
            if end.max_attempts is not None:
                sets["max_attempts"] = end.max_attempts
            removes.extend(["lease_owner", "lease_expires_at", "session_id", "deadline_at", RUNNING_TENANT])
        else:
            if end.dead_lettered:
                sets.update(
                    dead_lettered=True, dead_lettered_at=end.finished_at, dead_letter_tenant=end.tenant
                )
            removes.extend(TERMINAL_REMOVALS)
        if end.result_json is not None:
            sets["result"] = json.loads(end.result_json)
        if end.result_truncated:
            sets["result_truncated"] = True
        if end.timeout_execution is not None:
            sets["timeout_execution"] = end.timeout_execution
        row.edit(
            sets=sets,
            removes=removes,
            adds={"fencing_token": 1} if end.bump_token else None,
            appends={"attempts": [end.record]},
        )

    return condition, change


class SqliteStore:
    """Jobs and runs in a SQLite file (the embedded store; :class:`~duetime.domain.ports.Store`).

    Several store objects, threads and processes may share one file.

    Args:
        path: the database file (created, and its schema migrated, if needed).
        clock: the clock of housekeeping only (:meth:`purge_expired`); every transition takes its instants as
            arguments, as the port says.
        retention: the hot window's tiers, which set each run row's ``expires_at`` (DynamoDB's TTL on runs);
            the local archiver (:mod:`duetime.services.archiver`) moves rows past it to the archive.
    """

    def __init__(
        self, path: str | Path, *, clock: Clock | None = None, retention: RetentionPolicy | None = None
    ) -> None:
        self.db = Database(path)
        self.clock: Clock = clock or SystemClock()
        self.retention = retention or RetentionPolicy()
        self._token_key: bytes | None = None

    def close(self) -> None:
        """Close the file's connections (the store opens new ones when used again)."""
        self.db.close()

    # ---- jobs ----------------------------------------------------------------------------------------
    @staticmethod
    def _job_columns(job: Job) -> tuple[Any, ...]:
        doc = job.model_dump(mode="json")
        return (
            job.job_id,
            job.tenant,
            to_iso(job.created_at),
            job.shard,
            _iso(job.next_fire_at),
            json.dumps(doc, separators=(",", ":")),
        )

    def put_new_job(self, job: Job) -> None:
        """Insert ``job``. Raises JobExistsError if its id is taken."""
        with self.db.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO jobs (job_id, tenant, created_at, shard, next_fire_at, doc) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (job_id) DO NOTHING",
                self._job_columns(job),
            )
            if cur.rowcount == 0:
                raise JobExistsError(f"job {job.job_id!r} already exists")

    def get_job(self, job_id: str) -> Job | None:
        """The job, or None if absent."""
        rows = self.db.read("SELECT doc FROM jobs WHERE job_id = ?", (job_id,))
        return Job.from_stored(json.loads(rows[0][0])) if rows else None

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The stored jobs among ``job_ids`` (absent ones left out), by id."""
        jobs = (
            Job.from_stored(json.loads(doc))
            for (doc,) in self._read_in("SELECT doc FROM jobs", "job_id", job_ids)
        )
        return {job.job_id: job for job in jobs}

    def _read_in(self, select: str, column: str, ids: Sequence[str]) -> Iterator[tuple[Any, ...]]:
        """The rows of ``select ... WHERE column IN (ids)``, ids deduplicated and asked
        :data:`_IDS_PER_READ` at a time."""
        unique = list(dict.fromkeys(ids))
        for first in range(0, len(unique), _IDS_PER_READ):
            batch = unique[first : first + _IDS_PER_READ]
            marks = ",".join("?" * len(batch))
            yield from self.db.read(f"{select} WHERE {column} IN ({marks})", batch)

    def replace_job(self, job: Job, *, expected_version: int, expected_next_fire_at: datetime | None) -> None:
        """Write ``job`` over the stored one if its ``version`` and ``next_fire_at`` are the expected ones.

        Raises:
            ConflictError: the job changed since it was read (or is gone); read it again.
        """
        with self.db.transaction() as conn:
            row = conn.execute("SELECT doc FROM jobs WHERE job_id = ?", (job.job_id,)).fetchone()
            stored = json.loads(row[0]) if row else {}
            if (
                row is None
                or stored.get("version") != expected_version
                or stored.get("next_fire_at") != _iso(expected_next_fire_at)
            ):
                raise ChangedMeanwhileError(f"job {job.job_id!r} changed meanwhile; read it and try again")
            columns = self._job_columns(job)
            # fields this version does not know (a newer version wrote them) stay in the document
            doc = {**stored, **json.loads(columns[-1])}
            conn.execute(
                "UPDATE jobs SET tenant = ?, created_at = ?, shard = ?, next_fire_at = ?, doc = ? WHERE job_id = ?",
                (*columns[1:-1], json.dumps(doc, separators=(",", ":")), job.job_id),
            )

    def list_jobs(
        self,
        tenant: str,
        *,
        limit: int,
        page_token: str | None = None,
        state: str | None = None,
        name_prefix: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """The tenant's jobs, newest first (``created_at``, then job id, descending), DELETED ones only when
        ``state="DELETED"``; and the next page's token (None on the last page)."""
        docs, token = self._list_job_docs(tenant, limit, page_token, state, name_prefix)
        return [Job.from_stored(doc) for doc in docs], token

    def list_job_summaries(
        self,
        tenant: str,
        *,
        limit: int,
        page_token: str | None = None,
        state: str | None = None,
        name_prefix: str | None = None,
    ) -> tuple[list[JobSummary], str | None]:
        """:meth:`list_jobs`' page as summaries (the same query; only the summary's fields are validated)."""
        docs, token = self._list_job_docs(tenant, limit, page_token, state, name_prefix)
        return [JobSummary.from_stored(doc) for doc in docs], token

    def _list_job_docs(
        self, tenant: str, limit: int, page_token: str | None, state: str | None, name_prefix: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        _check_limit(limit)
        after = self._decode_token(page_token, listing="jobs", scope=tenant, parts=2)
        sql = "SELECT doc, created_at, job_id FROM jobs WHERE tenant = ?"
        params: list[Any] = [tenant]
        if after is not None:
            sql += " AND (created_at, job_id) < (?, ?)"
            params.extend(after)
        if state:
            sql += " AND json_extract(doc, '$.state') = ?"
            params.append(state)
        else:
            sql += " AND json_extract(doc, '$.state') IS NOT ?"
            params.append(JobState.DELETED.value)
        if name_prefix:
            sql += " AND substr(json_extract(doc, '$.name'), 1, ?) = ?"
            params.extend([len(name_prefix), name_prefix])
        sql += " ORDER BY created_at DESC, job_id DESC LIMIT ?"
        params.append(limit + 1)
        rows = self.db.read(sql, params)
        docs = [json.loads(r[0]) for r in rows[:limit]]
        token = None
        if len(rows) > limit:
            last = rows[limit - 1]
            token = self._encode_token("jobs", tenant, [str(last[1]), str(last[2])])
        return docs, token

    def query_due(
        self, shard: int, until: datetime, *, part: int = 0, parts: int = 1, page_size: int | None = None
    ) -> Iterator[Job]:
        """Jobs of ``shard`` whose ``next_fire_at <= until``, oldest first (then by job id), read
        ``page_size`` rows at a time (None: ``PAGE_SIZE``).

        ``part`` of ``parts``: the jobs whose id hashes (BLAKE2b, stable across processes) to ``part`` mod
        ``parts`` (one file has no partitions to spread; the parts only split a tick's work).

        Raises:
            ValueError: ``part`` is not in ``range(parts)``.
        """
        if not 0 <= part < parts:
            raise ValueError(f"part {part} is not one of {parts} parts")
        for job in self._query_due(shard, until, max(1, page_size or PAGE_SIZE)):
            if parts == 1 or _part_of(job.job_id, parts) == part:
                yield job

    def _query_due(self, shard: int, until: datetime, page_size: int) -> Iterator[Job]:
        last: tuple[str, str] | None = None
        while True:
            sql = (
                "SELECT doc, next_fire_at, job_id FROM jobs WHERE shard = ? AND next_fire_at IS NOT NULL"
                " AND next_fire_at <= ?"
            )
            params: list[Any] = [shard, to_iso(until)]
            if last is not None:
                sql += " AND (next_fire_at, job_id) > (?, ?)"
                params.extend(last)
            rows = self.db.read(sql + " ORDER BY next_fire_at, job_id LIMIT ?", [*params, page_size])
            for row in rows:
                yield Job.from_stored(json.loads(row[0]))
            if len(rows) < page_size:
                return
            last = (str(rows[-1][1]), str(rows[-1][2]))

    def _update_job(self, job_id: str, change: Callable[[dict[str, Any]], bool]) -> bool:
        """Apply ``change`` to the job's document if it exists and ``change`` accepts it (returns True)."""
        with self.db.transaction() as conn:
            return self._update_job_in(conn, job_id, change)

    @staticmethod
    def _update_job_in(
        conn: sqlite3.Connection, job_id: str, change: Callable[[dict[str, Any]], bool]
    ) -> bool:
        """:meth:`_update_job` inside the caller's transaction."""
        row = conn.execute("SELECT doc FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            return False
        doc = json.loads(row[0])
        if not change(doc):
            return False
        job = Job.from_stored(doc)
        conn.execute(
            "UPDATE jobs SET shard = ?, next_fire_at = ?, doc = ? WHERE job_id = ?",
            (job.shard, _iso(job.next_fire_at), json.dumps(doc, separators=(",", ":")), job_id),
        )
        return True

    @staticmethod
    def _advancing(advance: JobAdvance, now: datetime) -> Callable[[dict[str, Any]], bool]:
        """The document change of claim step 2 for ``advance`` (False: the job moved on; unchanged)."""
        claimed_at = to_iso(advance.claimed)

        def change(doc: dict[str, Any]) -> bool:
            if doc.get("next_fire_at") != claimed_at:
                return False
            doc["updated_at"] = to_iso(now)
            if advance.missed:
                doc["missed_slots"] = int(doc.get("missed_slots") or 0) + advance.missed
            if advance.next_fire_at is None:
                doc["next_fire_at"] = None
                doc["state"] = JobState.COMPLETED.value
            else:
                doc["next_fire_at"] = to_iso(advance.next_fire_at)
            return True

        return change

    def advance(
        self, job_id: str, *, claimed: datetime, next_fire_at: datetime | None, now: datetime, missed: int = 0
    ) -> None:
        """Claim step 2: move ``next_fire_at`` from ``claimed`` on (None: the job is COMPLETED), adding
        ``missed`` to ``missed_slots``.

        Raises:
            StaleClaimError: ``next_fire_at`` is no longer ``claimed`` (another claimer moved it first).
        """
        [applied] = self.advance_many([JobAdvance(job_id, claimed, next_fire_at, missed)], now=now)
        if not applied:
            raise StaleClaimError(f"job {job_id!r} was already advanced past {to_iso(claimed)}")

    def advance_many(self, advances: Sequence[JobAdvance], *, now: datetime) -> list[bool]:
        """Claim step 2 of several jobs in one transaction: for each, in order, whether it was applied
        (False: its ``next_fire_at`` is no longer the one claimed; that job is unchanged)."""
        if not advances:
            return []
        with self.db.transaction() as conn:
            return [self._update_job_in(conn, a.job_id, self._advancing(a, now)) for a in advances]

    def add_missed_slots(self, job_id: str, count: int) -> None:
        """Add ``count`` to the job's ``missed_slots`` (no-op for an absent job)."""

        def change(doc: dict[str, Any]) -> bool:
            doc["missed_slots"] = int(doc.get("missed_slots") or 0) + count
            return True

        self._update_job(job_id, change)

    # ---- tenant quotas -------------------------------------------------------------------------------
    def add_active_jobs(self, tenant: str, delta: int, *, limit: int | None = None) -> bool:
        """Add ``delta`` to the tenant's active-jobs counter; with ``limit``, only if it stays within it.

        As in DynamoDB (``attribute_not_exists(active_jobs) OR active_jobs < limit - delta + 1``), a tenant
        without a counter yet is always let in. Returns False when refused (nothing changed).
        """
        with self.db.transaction() as conn:
            row = conn.execute(
                "SELECT active_jobs FROM tenant_counters WHERE tenant = ?", (tenant,)
            ).fetchone()
            if limit is not None and row is not None and not int(row[0]) < limit - delta + 1:
                return False
            conn.execute(
                "INSERT INTO tenant_counters (tenant, active_jobs) VALUES (?, ?)"
                " ON CONFLICT (tenant) DO UPDATE SET active_jobs = active_jobs + excluded.active_jobs",
                (tenant, delta),
            )
            return True

    def active_jobs(self, tenant: str) -> int:
        """The tenant's active-jobs counter (0 without one)."""
        rows = self.db.read("SELECT active_jobs FROM tenant_counters WHERE tenant = ?", (tenant,))
        return int(rows[0][0]) if rows else 0

    def count_submit(self, tenant: str, minute: datetime, *, limit: int) -> bool:
        """Count one submit in the tenant's ``minute``; False (nothing counted) when ``limit`` is reached.

        The counter lives ``SUBMIT_COUNTER_TTL_SECONDS`` after its minute began; counters past that are
        deleted as later minutes are counted. Committed without an fsync: a power cut may forget the last
        counts of a minute (the tenant may then submit a few more in it), never a job.
        """
        start = int(minute.timestamp())
        with self.db.transaction(durable=False) as conn:
            key = (tenant, to_iso(minute))
            row = conn.execute(
                "SELECT submits FROM submit_counters WHERE tenant = ? AND minute = ?", key
            ).fetchone()
            if row is not None and not int(row[0]) < limit:
                return False
            conn.execute(
                "INSERT INTO submit_counters (tenant, minute, submits, expires_at) VALUES (?, ?, 1, ?)"
                " ON CONFLICT (tenant, minute) DO UPDATE SET submits = submits + 1, expires_at = excluded.expires_at",
                (*key, start + SUBMIT_COUNTER_TTL_SECONDS),
            )
            conn.execute("DELETE FROM submit_counters WHERE expires_at < ?", (start,))
            return True

    # ---- shard leases --------------------------------------------------------------------------------
    def acquire_shard_lease(self, shard: int, *, owner: str, now: datetime, lease_seconds: float) -> bool:
        """Take (or renew) the tick's lease on ``shard`` until ``now + lease_seconds``; False while another
        owner's lease is unexpired (``expires_at > now``)."""
        with self.db.transaction() as conn:
            row = conn.execute(
                "SELECT owner, expires_at FROM shard_leases WHERE shard = ?", (shard,)
            ).fetchone()
            if row is not None and not (str(row[1]) <= to_iso(now) or row[0] == owner):
                return False
            conn.execute(
                "INSERT INTO shard_leases (shard, owner, expires_at, lease_token) VALUES (?, ?, ?, 1)"
                " ON CONFLICT (shard) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at,"
                " lease_token = lease_token + 1",
                (shard, owner, to_iso(now + timedelta(seconds=lease_seconds))),
            )
            return True

    def release_shard_lease(self, shard: int, *, owner: str, now: datetime) -> None:
        """End ``owner``'s lease on ``shard`` now (no-op if another owner holds it)."""
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE shard_leases SET expires_at = ? WHERE shard = ? AND owner = ?",
                (to_iso(now), shard, owner),
            )

    # ---- runs: reads ---------------------------------------------------------------------------------
    @staticmethod
    def _run(doc: str) -> Run:
        return Run.from_stored(json.loads(doc))

    def get_run(self, job_id: str, due_at: datetime) -> Run | None:
        """The run, or None."""
        rows = self.db.read("SELECT doc FROM runs WHERE job_id = ? AND due_at = ?", (job_id, to_iso(due_at)))
        return self._run(rows[0][0]) if rows else None

    def get_runs(
        self, keys: Sequence[tuple[str, datetime]], *, consistent: bool = True
    ) -> dict[tuple[str, datetime], Run]:
        """The runs of ``keys`` that exist, keyed as asked (always the latest: ``consistent`` is moot)."""
        wanted = {(job_id, to_iso(due_at)): (job_id, due_at) for job_id, due_at in keys}
        found: dict[tuple[str, datetime], Run] = {}
        pairs = list(wanted)
        for first in range(0, len(pairs), _IDS_PER_READ):
            batch = pairs[first : first + _IDS_PER_READ]
            marks = ",".join(["(?, ?)"] * len(batch))
            rows = self.db.read(
                f"SELECT job_id, due_at, doc FROM runs WHERE (job_id, due_at) IN (VALUES {marks})",
                [part for pair in batch for part in pair],
            )
            for job_id, due_at, doc in rows:
                found[wanted[(job_id, due_at)]] = self._run(doc)
        return found

    def list_runs(self, job_id: str, *, limit: int = 20) -> list[Run]:
        """The job's most recent ``limit`` runs, newest due time first."""
        rows = self.db.read(
            "SELECT doc FROM runs WHERE job_id = ? ORDER BY due_at DESC LIMIT ?", (job_id, max(0, limit))
        )
        return [self._run(r[0]) for r in rows]

    def query_runs(
        self,
        job_id: str,
        *,
        limit: int,
        page_token: str | None = None,
        state: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        active_only: bool = False,
    ) -> tuple[list[Run], str | None]:
        """The job's runs due in ``[since, until]``, newest first, of ``state`` (``active_only``: those in
        the watch index, i.e. not terminal), and the next page's token."""
        _check_limit(limit)
        after = self._decode_token(page_token, listing="runs", scope=job_id, parts=1)
        sql = "SELECT doc, due_at FROM runs WHERE job_id = ?"
        params: list[Any] = [job_id]
        if since is not None:
            sql += " AND due_at >= ?"
            params.append(to_iso(since))
        if until is not None:
            sql += " AND due_at <= ?"
            params.append(to_iso(until))
        if after is not None:
            sql += " AND due_at < ?"
            params.append(after[0])
        if state:
            sql += " AND json_extract(doc, '$.state') = ?"
            params.append(state)
        if active_only:
            sql += " AND watch_shard IS NOT NULL"
        rows = self.db.read(sql + " ORDER BY due_at DESC LIMIT ?", [*params, limit + 1])
        runs = [self._run(r[0]) for r in rows[:limit]]
        token = self._encode_token("runs", job_id, [str(rows[limit - 1][1])]) if len(rows) > limit else None
        return runs, token

    def query_overdue(self, shard: int, until: datetime) -> Iterator[Run]:
        """Non-terminal runs of ``shard`` whose ``watch_at <= until``, oldest watch time first."""
        last: tuple[str, str, str] | None = None
        while True:
            sql = (
                "SELECT doc, watch_at, job_id, due_at FROM runs WHERE watch_shard = ? AND watch_at IS NOT NULL"
                " AND watch_at <= ?"
            )
            params: list[Any] = [shard, to_iso(until)]
            if last is not None:
                sql += " AND (watch_at, job_id, due_at) > (?, ?, ?)"
                params.extend(last)
            rows = self.db.read(sql + " ORDER BY watch_at, job_id, due_at LIMIT ?", [*params, PAGE_SIZE])
            for row in rows:
                yield self._run(row[0])
            if len(rows) < PAGE_SIZE:
                return
            last = (str(rows[-1][1]), str(rows[-1][2]), str(rows[-1][3]))

    def query_active(self, job_id: str, *, before: datetime) -> list[datetime]:
        """Due times of the job's active runs due before ``before``, oldest first."""
        rows = self.db.read(
            "SELECT due_at FROM runs WHERE active_job = ? AND due_at < ? ORDER BY due_at",
            (job_id, to_iso(before)),
        )
        return [from_iso(str(r[0])) for r in rows]

    def query_active_after(self, job_id: str, *, after: datetime, limit: int = 1) -> list[datetime]:
        """Due times of the job's active runs due after ``after``, oldest first, at most ``limit``."""
        rows = self.db.read(
            "SELECT due_at FROM runs WHERE active_job = ? AND due_at > ? ORDER BY due_at LIMIT ?",
            (job_id, to_iso(after), max(0, limit)),
        )
        return [from_iso(str(r[0])) for r in rows]

    def query_dead_letters(
        self, tenant: str, *, limit: int = 20, page_token: str | None = None
    ) -> tuple[list[Run], str | None]:
        """The tenant's dead-lettered runs, most recently dead-lettered first, and the next page's token."""
        _check_limit(limit)
        after = self._decode_token(page_token, listing="dead_letters", scope=tenant, parts=3)
        sql = (
            "SELECT doc, dead_lettered_at, job_id, due_at FROM runs WHERE dead_letter_tenant = ?"
            " AND dead_lettered_at IS NOT NULL"
        )
        params: list[Any] = [tenant]
        if after is not None:
            sql += " AND (dead_lettered_at, job_id, due_at) < (?, ?, ?)"
            params.extend(after)
        rows = self.db.read(
            sql + " ORDER BY dead_lettered_at DESC, job_id DESC, due_at DESC LIMIT ?", [*params, limit + 1]
        )
        runs = [self._run(r[0]) for r in rows[:limit]]
        token = None
        if len(rows) > limit:
            last = rows[limit - 1]
            token = self._encode_token("dead_letters", tenant, [str(last[1]), str(last[2]), str(last[3])])
        return runs, token

    def count_running(self, tenant: str) -> int:
        """How many of the tenant's runs are RUNNING (those started with ``running_tenant``)."""
        rows = self.db.read("SELECT COUNT(*) FROM runs WHERE running_tenant = ?", (tenant,))
        return int(rows[0][0])

    # ---- runs: writes --------------------------------------------------------------------------------
    def _row_values(self, row: _RunRow) -> tuple[Any, ...]:
        """The columns of ``row`` as ``_save_run`` writes them (the key last)."""
        doc, index = row.doc, row.index
        due_at = from_iso(str(doc["due_at"]))
        return (
            index.get(WATCH_SHARD),
            doc.get("watch_at"),
            index.get(ACTIVE_JOB),
            index.get(RUNNING_TENANT),
            index.get(DEAD_LETTER_TENANT),
            doc.get("dead_lettered_at"),
            _ttl(self.retention, doc, due_at),
            json.dumps(doc, separators=(",", ":")),
            str(doc["job_id"]),
            to_iso(due_at),
        )

    def _save_run(self, conn: sqlite3.Connection, row: _RunRow, *, insert: bool = False) -> bool:
        values = self._row_values(row)
        if insert:
            cur = conn.execute(
                "INSERT INTO runs (watch_shard, watch_at, active_job, running_tenant, dead_letter_tenant,"
                " dead_lettered_at, expires_at, doc, job_id, due_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (job_id, due_at) DO NOTHING",
                values,
            )
        else:
            cur = conn.execute(_UPDATE_RUN, values)
        return cur.rowcount == 1

    def put_new_run(self, run: Run) -> None:
        """Claim step 1: insert ``run`` if ``(job_id, due_at)`` is new.

        Raises:
            AlreadyClaimedError: the run already exists (the stored one is kept).
        """
        [inserted] = self.put_new_runs([run])
        if not inserted:
            raise AlreadyClaimedError(f"run {run.run_id} already exists")

    def put_new_runs(self, runs: Sequence[Run]) -> list[bool]:
        """Claim step 1 of several runs in one transaction: for each, in order, whether it was inserted
        (False: ``(job_id, due_at)`` existed; the stored run is kept)."""
        if not runs:
            return []
        rows = [_RunRow(run.model_dump(mode="json"), _run_index(run)) for run in runs]
        with self.db.transaction() as conn:
            return [self._save_run(conn, row, insert=True) for row in rows]

    def _update_run(
        self,
        job_id: str,
        due_at: datetime,
        condition: Callable[[_RunRow], bool],
        change: Callable[[_RunRow], None],
    ) -> Run | None:
        """One conditional write: read the run, check ``condition``, apply ``change``, write it back; the
        run as it now is, or None when the run is absent or the condition did not hold (nothing written)."""
        with self.db.transaction() as conn:
            return self._update_run_in(conn, job_id, due_at, condition, change)

    def _update_runs(self, edits: Sequence[tuple[str, datetime, _Edit]]) -> list[Run | Exception | None]:
        """Several conditional writes in one transaction, each as :meth:`_update_run` (the run as it now
        is, or None: absent, or its condition did not hold; or the error deciding it raised, say a row that
        does not read as a run: that item is left as it was, the others are written).

        The write lock is held for the writes only: each row is read, checked, changed and validated
        before the transaction, from the latest committed state, and written inside it only if it is still
        exactly what was read (its document and index columns compared in the UPDATE's WHERE); a row that
        changed meanwhile, or whose condition did not hold when read, is read and decided again inside the
        transaction. So the outcome is what the one-transaction read-check-write gives, and the other
        writers of the file (the stack's other processes) wait for SQL and the commit, not for this
        process's Python (which competes for its GIL with its other threads).
        """
        if not edits:
            return []
        keys = [(job_id, to_iso(due_at)) for job_id, due_at, _ in edits]
        seen: dict[tuple[str, str], tuple[Any, ...]] = {}
        for start in range(0, len(keys), _IDS_PER_READ // 2):
            chunk = keys[start : start + _IDS_PER_READ // 2]
            marks = ", ".join("(?, ?)" for _ in chunk)
            for got in self.db.read(
                # a join with the keys, not "(job_id, due_at) IN (VALUES ...)": SQLite scans the whole table
                # for a row-value IN, but looks each key up in the primary key for the join
                f"WITH keys (job_id, due_at) AS (VALUES {marks})"  # noqa: S608 - placeholders only
                " SELECT runs.job_id, runs.due_at, doc, watch_shard, active_job, running_tenant,"
                " dead_letter_tenant FROM keys JOIN runs ON runs.job_id = keys.job_id AND runs.due_at = keys.due_at",
                [part for key in chunk for part in key],
            ):
                seen[(str(got[0]), str(got[1]))] = tuple(got[2:])
        planned: list[tuple[tuple[Any, ...], Run, tuple[Any, ...]] | None] = []
        for key, (_, _, (condition, change)) in zip(keys, edits, strict=True):
            found = seen.get(key)
            plan = None
            if found is not None:
                try:
                    index = {k: v for k, v in zip(_INDEX_KEYS, found[1:], strict=True) if v is not None}
                    row = _RunRow(json.loads(found[0]), index)
                    if condition(row):
                        change(row)
                        # a change that would make the row unreadable is not written
                        run = Run.from_stored(row.doc)
                        plan = (found, run, self._row_values(row))
                except Exception:  # noqa: BLE001 - decided again in the transaction, where its error is its outcome
                    plan = None
            planned.append(plan)
        with self.db.transaction() as conn:
            results: list[Run | Exception | None] = []
            for (job_id, due_at, (condition, change)), plan in zip(edits, planned, strict=True):
                if plan is not None:
                    read, run, values = plan
                    if conn.execute(_UPDATE_RUN + _UNCHANGED, (*values, *read)).rowcount == 1:
                        results.append(run)
                        continue
                conn.execute("SAVEPOINT item")
                try:
                    results.append(self._update_run_in(conn, job_id, due_at, condition, change))
                except sqlite3.OperationalError:
                    raise  # the file's fault (busy, I/O): the whole transaction's
                except Exception as exc:  # noqa: BLE001 - this item's outcome; the others are written
                    conn.execute("ROLLBACK TO item")
                    results.append(exc)
                conn.execute("RELEASE item")
            return results

    def _update_run_in(
        self,
        conn: sqlite3.Connection,
        job_id: str,
        due_at: datetime,
        condition: Callable[[_RunRow], bool],
        change: Callable[[_RunRow], None],
    ) -> Run | None:
        """:meth:`_update_run` inside the caller's transaction ``conn``."""
        found = conn.execute(
            "SELECT doc, watch_shard, active_job, running_tenant, dead_letter_tenant FROM runs"
            " WHERE job_id = ? AND due_at = ?",
            (job_id, to_iso(due_at)),
        ).fetchone()
        if found is None:
            return None
        index = {k: v for k, v in zip(_INDEX_KEYS, found[1:], strict=True) if v is not None}
        row = _RunRow(json.loads(found[0]), index)
        if not condition(row):
            return None
        change(row)
        run = Run.from_stored(row.doc)  # a change that would make the row unreadable is not written
        self._save_run(conn, row)
        return run

    def start(
        self,
        job_id: str,
        due_at: datetime,
        *,
        attempt: int,
        owner: str,
        lease_expires_at: datetime,
        now: datetime,
        deadline_at: datetime | None = None,
        watch_at: datetime | None = None,
        running_tenant: str | None = None,
        session_id: str | None = None,
    ) -> Run:
        """PENDING at ``attempt`` (or RETRY_WAIT at ``attempt - 1`` past its ``retry_at``) -> RUNNING, the
        fencing token raised by one; refused for a held run, and past its starting deadline while the stored
        attempt is 1 (DynamoStore's condition reads the stored attempt).

        Raises:
            StartRejectedError: neither holds: a duplicate, stale or early message. Drop it.
        """
        [started] = self.start_many(
            [
                RunStart(
                    job_id,
                    due_at,
                    attempt,
                    owner,
                    lease_expires_at,
                    now,
                    deadline_at=deadline_at,
                    watch_at=watch_at,
                    running_tenant=running_tenant,
                    session_id=session_id,
                )
            ]
        )
        if isinstance(started, Exception):
            raise started
        return started

    def start_many(self, starts: Sequence[RunStart]) -> list[Run | Exception]:
        """:meth:`start` of each of ``starts`` in one transaction: the run as now stored, or the
        StartRejectedError its own start would raise. A fault of the transaction (ThrottledError) raises;
        then none was applied."""
        return self.start_and_end(starts, ())[0]

    def start_and_end(
        self, starts: Sequence[RunStart], ends: Sequence[AttemptEnd]
    ) -> tuple[list[Run | Exception], list[Run | Exception]]:
        """:meth:`end_attempts` of ``ends`` and :meth:`start_many` of ``starts`` in one transaction (the
        ends first): (the starts' outcomes, the ends' outcomes). A fault of the transaction raises; then
        none was applied."""
        runs = self._update_runs(
            [(end.job_id, end.due_at, _end_edit(end)) for end in ends]
            + [(item.job_id, item.due_at, _start_edit(item)) for item in starts]
        )
        ended: list[Run | Exception] = [
            run
            if run is not None
            else LeaseLostError(
                f"stale fencing token {end.expected_token} on {end.job_id}@{to_iso(end.due_at)}"
            )
            for end, run in zip(ends, runs[: len(ends)], strict=True)
        ]
        started: list[Run | Exception] = [
            run
            if run is not None
            else StartRejectedError(
                f"run {item.job_id}@{to_iso(item.due_at)} attempt {item.attempt} cannot start"
                " (duplicate, stale or early)"
            )
            for item, run in zip(starts, runs[len(ends) :], strict=True)
        ]
        return started, ended

    def rewatch_running(
        self, job_id: str, due_at: datetime, *, fencing_token: int, watch_at: datetime
    ) -> Run | None:
        """Move a RUNNING run's watch time to ``watch_at`` while it runs under ``fencing_token``; None if it
        moved on."""
        return self._update_run(
            job_id,
            due_at,
            lambda row: (
                row.get("state") == RunState.RUNNING.value and row.get("fencing_token") == fencing_token
            ),
            lambda row: row.edit(sets={"watch_at": watch_at}),
        )

    def end_attempt(self, end: AttemptEnd) -> Run:
        """Apply ``end`` while the run is RUNNING under ``end.expected_token`` (and, with
        ``end.lease_expired_by``, its ``lease_expires_at <= end.lease_expired_by``).

        Raises:
            LeaseLostError: the token is stale, the run is not RUNNING, or (``end.lease_expired_by``) its
                lease had not ended by then; nothing was applied.
        """
        [ended] = self.end_attempts([end])
        if isinstance(ended, Exception):
            raise ended
        return ended

    def end_attempts(self, ends: Sequence[AttemptEnd]) -> list[Run | Exception]:
        """:meth:`end_attempt` of each of ``ends`` in one transaction: the run as now stored, or the
        LeaseLostError its own end would raise. A fault of the transaction (ThrottledError) raises; then
        none was applied."""
        return self.start_and_end((), ends)[1]

    def skip_pending(
        self, job_id: str, due_at: datetime, *, attempt: int, reason: str, now: datetime
    ) -> Run | None:
        """PENDING at ``attempt`` -> SKIPPED with ``reason`` as its error; None if the run moved on."""
        return self._update_run(
            job_id,
            due_at,
            lambda row: row.get("state") == RunState.PENDING.value and row.get("attempt") == attempt,
            lambda row: row.edit(
                sets={"state": RunState.SKIPPED, "finished_at": now, "error": reason},
                removes=TERMINAL_REMOVALS,
                appends={"events": [{"at": now, "kind": "skipped", "detail": {"reason": reason}}]},
            ),
        )

    def hold(
        self, job_id: str, due_at: datetime, *, reason: str, now: datetime, recheck_at: datetime
    ) -> Run | None:
        """A PENDING first attempt, not held -> held by ``reason`` (an active run, watched again at
        ``recheck_at``); None if the run moved on or is held already."""
        return self._update_run(
            job_id,
            due_at,
            lambda row: (
                row.get("state") == RunState.PENDING.value
                and row.get("attempt") == 1
                and row.get("held") is None
            ),
            lambda row: row.edit(
                sets={"held": reason, "watch_at": recheck_at, ACTIVE_JOB: job_id},
                appends={"events": [{"at": now, "kind": "held", "detail": {"reason": reason}}]},
            ),
        )

    def release_held(self, run: Run, *, now: datetime, watch_at: datetime) -> Run | None:
        """``run``, still PENDING at its attempt and held as read -> no longer held, watched at ``watch_at``
        (still an active run only under an overlap policy); None if it moved on."""
        return self._update_run(
            run.job_id,
            run.due_at,
            lambda row: (
                row.get("state") == RunState.PENDING.value
                and row.get("attempt") == run.attempt
                and row.get("held") == run.held
            ),
            lambda row: row.edit(
                sets={"watch_at": watch_at},
                removes=["held"] if run.overlap.enforced else ["held", ACTIVE_JOB],
                appends={"events": [{"at": now, "kind": "released", "detail": {"reason": "resumed"}}]},
            ),
        )

    def defer_pending(
        self,
        job_id: str,
        due_at: datetime,
        *,
        attempt: int,
        watch_at: datetime,
        held: str | None = None,
        seen_watch_at: datetime | None = None,
    ) -> Run | None:
        """Move a PENDING run's watch time to ``watch_at`` if it is still PENDING at ``attempt``, held by
        ``held`` (None: not held) and, given ``seen_watch_at``, still watched at that time."""
        seen = _iso(seen_watch_at)
        return self._update_run(
            job_id,
            due_at,
            lambda row: (
                row.get("state") == RunState.PENDING.value
                and row.get("attempt") == attempt
                and row.get("held") == held
                and (seen is None or row.get("watch_at") == seen)
            ),
            lambda row: row.edit(sets={"watch_at": watch_at}),
        )

    def release_retry(
        self, job_id: str, due_at: datetime, *, attempt: int, now: datetime, watch_at: datetime
    ) -> Run | None:
        """RETRY_WAIT at ``attempt`` -> PENDING at ``attempt + 1``, watched at ``watch_at``; None if it
        moved on."""
        return self._update_run(
            job_id,
            due_at,
            lambda row: row.get("state") == RunState.RETRY_WAIT.value and row.get("attempt") == attempt,
            lambda row: row.edit(
                sets={"state": RunState.PENDING, "attempt": attempt + 1, "watch_at": watch_at},
                removes=["retry_at"],
            ),
        )

    def cancel(
        self, run: Run, *, reason: str, now: datetime, record: AttemptRecord | None = None
    ) -> Run | None:
        """``run``, still in its state under its fencing token -> CANCELLED, the token raised, ``record``
        appended; None if it moved on."""
        appends: dict[str, list[Any]] = {
            "events": [{"at": now, "kind": "cancelled", "detail": {"reason": reason}}]
        }
        if record is not None:
            appends["attempts"] = [record]
        return self._update_run(
            run.job_id,
            run.due_at,
            lambda row: row.get("state") == run.state.value and row.get("fencing_token") == run.fencing_token,
            lambda row: row.edit(
                sets={"state": RunState.CANCELLED, "finished_at": now, "error": reason},
                removes=TERMINAL_REMOVALS,
                adds={"fencing_token": 1},
                appends=appends,
            ),
        )

    def redrive(self, run: Run, *, now: datetime, watch_at: datetime) -> Run | None:
        """``run`` (still in its state at its attempt) -> PENDING at ``attempt + 1`` with a fresh budget of
        its ``retry.max_attempts``, out of the dead letters, watched again (and active under an overlap
        policy). None if it moved on."""
        sets: dict[str, Any] = {
            "state": RunState.PENDING,
            "attempt": run.attempt + 1,
            "max_attempts": run.attempt + run.retry.max_attempts,
            "budget_from_attempt": run.attempt + 1,
            "dead_lettered": False,
            "trigger": Trigger.RETRY,
            "watch_at": watch_at,
            WATCH_SHARD: run.shard,
        }
        if run.overlap.enforced:
            sets[ACTIVE_JOB] = run.job_id
        removes = [
            "dead_lettered_at",
            DEAD_LETTER_TENANT,
            "finished_at",
            "exit_code",
            "error",
            "timeout_action",
            "timeout_outcome",
        ]
        event = {"at": now, "kind": "redriven", "detail": {"attempt": run.attempt + 1}}
        return self._update_run(
            run.job_id,
            run.due_at,
            lambda row: row.get("state") == run.state.value and row.get("attempt") == run.attempt,
            lambda row: row.edit(sets=sets, removes=removes, appends={"events": [event]}),
        )

    def record_event(self, job_id: str, due_at: datetime, event: Mapping[str, Any]) -> None:
        """Append ``event`` (``at``, ``kind``, ``detail``) to the run's history (no-op for an absent run)."""
        self._update_run(
            job_id, due_at, lambda row: True, lambda row: row.edit(appends={"events": [dict(event)]})
        )

    # ---- worker sessions -----------------------------------------------------------------------------
    @staticmethod
    def _session(row: tuple[Any, ...]) -> Session:
        session_id, owner, expires_at, revoked_at, runs = row
        return Session(
            session_id,
            owner,
            from_iso(expires_at),
            tuple(json.loads(runs)),
            from_iso(revoked_at) if revoked_at is not None else None,
        )

    def renew_session(
        self, session_id: str, *, owner: str, runs: Sequence[str], expires_at: datetime
    ) -> Session | None:
        """Create or renew the session unless it is revoked; None if revoked."""
        with self.db.transaction() as conn:
            row = conn.execute(
                "INSERT INTO sessions (session_id, owner, expires_at, revoked_at, runs, purge_at)"
                " VALUES (?, ?, ?, NULL, ?, ?) ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner,"
                " expires_at = excluded.expires_at, runs = excluded.runs, purge_at = excluded.purge_at"
                " WHERE revoked_at IS NULL"
                " RETURNING session_id, owner, expires_at, revoked_at, runs",
                (
                    session_id,
                    owner,
                    to_iso(expires_at),
                    json.dumps(list(runs)),
                    _session_purge_at(expires_at),
                ),
            ).fetchone()
        return self._session(row) if row is not None else None

    def get_sessions(self, session_ids: Sequence[str]) -> dict[str, Session]:
        """The sessions of ``session_ids`` that exist, by id."""
        rows = self._read_in(
            "SELECT session_id, owner, expires_at, revoked_at, runs FROM sessions", "session_id", session_ids
        )
        return {row[0]: self._session(row) for row in rows}

    def revoke_session(self, session_id: str, *, now: datetime) -> bool:
        """Revoked at ``now`` if expired by then or absent (a revoked row is left); True if revoked (now or
        before), False if alive."""
        now_s = to_iso(now)
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO sessions (session_id, owner, expires_at, revoked_at, runs, purge_at)"
                " VALUES (?, '', ?, ?, '[]', ?) ON CONFLICT (session_id) DO UPDATE SET revoked_at = ?"
                " WHERE revoked_at IS NULL AND expires_at <= ?",
                (session_id, now_s, now_s, _session_purge_at(now), now_s, now_s),
            )
            row = conn.execute(
                "SELECT revoked_at FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
        return row is not None and row[0] is not None

    # ---- the hot window (the local archiver; DynamoDB's TTL on AWS) -----------------------------------
    def expired_runs(self, now: datetime, *, limit: int) -> list[tuple[Run, datetime]]:
        """Up to ``limit`` finished runs whose ``expires_at`` is at or before ``now``, soonest expiry first,
        each with its expiry (a row written under an older rule keeps its own)."""
        rows = self.db.read(
            "SELECT doc, expires_at FROM runs WHERE expires_at <= ?"
            " AND json_extract(doc, '$.state') IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'SKIPPED')"
            " ORDER BY expires_at LIMIT ?",
            (int(now.timestamp()), max(0, limit)),
        )
        return [(self._run(r[0]), from_epoch_s(int(r[1]))) for r in rows]

    def rearm_runs(self, keys: Sequence[tuple[str, datetime]], *, expires_at: datetime) -> None:
        """Push back the ``expires_at`` of the runs of ``keys`` (the keep-last-N rule)."""
        epoch = int(expires_at.timestamp())
        with self.db.transaction() as conn:
            conn.executemany(
                "UPDATE runs SET expires_at = ? WHERE job_id = ? AND due_at = ?",
                [(epoch, job_id, to_iso(due_at)) for job_id, due_at in keys],
            )

    def delete_runs(self, keys: Sequence[tuple[str, datetime]]) -> int:
        """Delete the finished runs of ``keys`` from the hot store (once archived); returns how many went.
        A run that is not finished is left alone."""
        with self.db.transaction() as conn:
            gone = 0
            for job_id, due_at in keys:
                gone += conn.execute(
                    "DELETE FROM runs WHERE job_id = ? AND due_at = ? AND json_extract(doc, '$.state')"
                    " IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'SKIPPED')",
                    (job_id, to_iso(due_at)),
                ).rowcount
        return gone

    # ---- housekeeping --------------------------------------------------------------------------------
    def purge_expired(self, now: datetime | None = None) -> int:
        """Delete the runs past their retention (DynamoDB's TTL) and expired submit counters; returns how
        many runs went."""
        epoch = int((now or self.clock.now()).timestamp())
        with self.db.transaction() as conn:
            gone = conn.execute("DELETE FROM runs WHERE expires_at <= ?", (epoch,)).rowcount
            conn.execute("DELETE FROM submit_counters WHERE expires_at <= ?", (epoch,))
            conn.execute("DELETE FROM sessions WHERE purge_at <= ?", (epoch,))
        return int(gone)

    # ---- page tokens ---------------------------------------------------------------------------------
    def _key(self) -> bytes:
        """The file's page-token key (made with the schema: tokens of another file are refused too)."""
        if self._token_key is None:
            rows = self.db.read("SELECT value FROM meta WHERE key = 'page_token_key'")
            self._token_key = bytes.fromhex(str(rows[0][0]))
        return self._token_key

    def _encode_token(self, listing: str, scope: str, last: list[str]) -> str:
        """An opaque token: the listing, its scope (tenant or job) and the last key, signed."""
        body = json.dumps({"l": listing, "s": scope, "k": last}, separators=(",", ":")).encode()
        mac = hmac.new(self._key(), body, hashlib.sha256).digest()[:16]
        return f"{_b64(body)}.{_b64(mac)}"

    def _decode_token(self, token: str | None, *, listing: str, scope: str, parts: int) -> list[str] | None:
        """The last key inside ``token``, if this file issued it for this listing and scope.

        Raises:
            PageTokenError: forged, corrupted, or issued for another listing, tenant or job.
        """
        if not token:
            return None
        try:
            text, _, sig = token.partition(".")
            body, mac = _unb64(text), _unb64(sig)
            if not hmac.compare_digest(mac, hmac.new(self._key(), body, hashlib.sha256).digest()[:16]):
                raise ValueError("bad signature")
            data = json.loads(body)
            if not isinstance(data, dict) or data.get("l") != listing or data.get("s") != scope:
                raise ValueError("another listing")
            key = data.get("k")
            if not isinstance(key, list) or len(key) != parts or not all(isinstance(k, str) for k in key):
                raise ValueError("malformed key")
            return [str(k) for k in key]
        except (ValueError, TypeError, binascii.Error):
            raise PageTokenError() from None


def from_epoch_s(epoch: int) -> datetime:
    """An aware UTC datetime of epoch seconds."""
    return datetime.fromtimestamp(epoch, tz=UTC)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
