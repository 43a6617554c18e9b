"""One SQLite database file shared by threads and processes: connections, transactions, the schema.

The file runs in WAL mode (readers never block the writer, nor the writer them) with ``synchronous=FULL``
(a committed transaction survives a power cut) and a busy timeout, so a writer waits for the write lock
instead of failing at once. The waiting is ours, not SQLite's: its busy handler sleeps 1, 2, 5, 10 ... up to
100 ms between tries, so under contention (a worker's slots, the tick, the API processes all writing) writers
slept far longer than the lock was held (a burst of 1,000 runs started at 49/s). Threads of one process take
turns on a lock of their own, and the processes sharing the file on an ``flock`` of ``<file>-writer`` (the
kernel wakes the next waiter as soon as the holder lets go; a dead holder's lock is released with it); a
file locked by a program outside these (another ``sqlite3`` connection) is tried again every 1-5 ms (with
jitter) until the busy timeout. A Duetime process stopped (SIGSTOP) inside a transaction holds every writer
until it resumes or dies, as it would hold SQLite's own lock.
Each thread (and each process: a forked child never reuses its parent's
connection) gets its own connection, opened in autocommit mode: a plain read is its own consistent snapshot,
and a conditional write is a short ``BEGIN IMMEDIATE`` transaction (:meth:`Database.transaction`): it takes
the file's one write lock first, reads the row, checks the condition, writes, commits. No other writer, in
this process or another, can come between the read and the write.

The schema is versioned with ``PRAGMA user_version``: :data:`MIGRATIONS` lists the scripts from version 1 on,
and opening a file applies those it lacks, in order, in one write transaction (two processes opening a new
file at once: the second finds the migrations applied and does nothing).
"""

from __future__ import annotations

import fcntl
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from duetime.domain.errors import DuetimeError, ThrottledError

#: how long a writer waits for the write lock before giving up, milliseconds
BUSY_TIMEOUT_MS = 5000
#: the first and the longest pause between two tries of a lock another process holds, seconds
_RETRY_FIRST_S = 0.001
_RETRY_MAX_S = 0.005

#: one write lock per database file and process: its threads take turns here instead of polling SQLite's
#: (keyed by pid too: a forked child must not inherit a lock one of its parent's threads held)
_WRITE_LOCKS: dict[tuple[int, str], threading.Lock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


#: per process and database file: the descriptor of its writer lock file (``<file>-writer``)
_LOCK_FILES: dict[tuple[int, str], int] = {}


def _lock_file(real_path: str) -> int:
    """This process's descriptor of ``real_path``'s writer lock file (opened once)."""
    key = (os.getpid(), real_path)
    fd = _LOCK_FILES.get(key)
    if fd is None:
        with _WRITE_LOCKS_GUARD:
            fd = _LOCK_FILES.get(key)
            if fd is None:
                fd = _LOCK_FILES[key] = os.open(
                    f"{real_path}-writer", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
                )
    return fd


def _write_lock(real_path: str) -> threading.Lock:
    key = (os.getpid(), real_path)
    lock = _WRITE_LOCKS.get(key)
    if lock is not None:
        return lock
    with _WRITE_LOCKS_GUARD:
        lock = _WRITE_LOCKS.get(key)
        if lock is None:
            lock = _WRITE_LOCKS[key] = threading.Lock()
        return lock


def _snapshot(row: str) -> str:
    """SQL of the outbox's projection of a runs row (``NEW`` or ``OLD``): the fields events are derived
    from (:class:`~duetime.domain.notifications.RunSnapshot`), its last ended attempt included."""
    fields = (
        "state",
        "attempt",
        "dead_lettered",
        "error",
        "exit_code",
        "missed_slots",
        "started_at",
        "finished_at",
        "tenant",
    )
    pairs = ", ".join(f"'{f}', json_extract({row}.doc, '$.{f}')" for f in fields)
    return (
        f"json_object('job_id', {row}.job_id, 'due_at', {row}.due_at, {pairs}, "
        f"'last_attempt', json(json_extract({row}.doc, '$.attempts[#-1]')))"
    )


#: Forward migrations: ``MIGRATIONS[n]`` takes the schema from version ``n`` to ``n + 1``. Append, never edit.
#: Instants are fixed-width UTC text (``timeutil.to_iso``), so text order is time order, as in DynamoDB.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        # settings of the file itself, e.g. the key that signs page tokens
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "INSERT INTO meta (key, value) VALUES ('page_token_key', lower(hex(randomblob(32))))",
        # ---- jobs: the document, plus the columns of its access paths ----
        # due: (shard, next_fire_at) for jobs with a future fire; by tenant: (tenant, created_at)
        """CREATE TABLE jobs (
            job_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            created_at TEXT NOT NULL,
            shard INTEGER,
            next_fire_at TEXT,
            doc TEXT NOT NULL
        )""",
        "CREATE INDEX jobs_due ON jobs (shard, next_fire_at, job_id) WHERE next_fire_at IS NOT NULL",
        "CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at, job_id)",
        # ---- runs: keyed (job_id, due_at); the sparse index columns are kept as DynamoDB keeps its ----
        # watch: (watch_shard, watch_at) of non-terminal runs; active: (active_job, due_at) of overlap-policy
        # and held runs; running: (running_tenant, due_at); dead letters: (dead_letter_tenant,
        # dead_lettered_at); expires_at: the retention (epoch seconds)
        """CREATE TABLE runs (
            job_id TEXT NOT NULL,
            due_at TEXT NOT NULL,
            watch_shard INTEGER,
            watch_at TEXT,
            active_job TEXT,
            running_tenant TEXT,
            dead_letter_tenant TEXT,
            dead_lettered_at TEXT,
            expires_at INTEGER NOT NULL,
            doc TEXT NOT NULL,
            PRIMARY KEY (job_id, due_at)
        ) WITHOUT ROWID""",
        "CREATE INDEX runs_watch ON runs (watch_shard, watch_at, job_id, due_at)"
        " WHERE watch_shard IS NOT NULL AND watch_at IS NOT NULL",
        "CREATE INDEX runs_active ON runs (active_job, due_at) WHERE active_job IS NOT NULL",
        "CREATE INDEX runs_running ON runs (running_tenant, due_at) WHERE running_tenant IS NOT NULL",
        "CREATE INDEX runs_dead_letters ON runs (dead_letter_tenant, dead_lettered_at, job_id, due_at)"
        " WHERE dead_letter_tenant IS NOT NULL AND dead_lettered_at IS NOT NULL",
        "CREATE INDEX runs_expiry ON runs (expires_at)",
        # ---- counters and leases ----
        "CREATE TABLE tenant_counters (tenant TEXT PRIMARY KEY, active_jobs INTEGER NOT NULL)",
        """CREATE TABLE submit_counters (
            tenant TEXT NOT NULL,
            minute TEXT NOT NULL,
            submits INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            PRIMARY KEY (tenant, minute)
        ) WITHOUT ROWID""",
        "CREATE INDEX submit_counters_expiry ON submit_counters (expires_at)",
        """CREATE TABLE shard_leases (
            shard INTEGER PRIMARY KEY,
            owner TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            lease_token INTEGER NOT NULL
        )""",
        # ---- queues: one table of messages for every tier, and each tier's dead letters ----
        # visible_at: epoch seconds of the queue's clock; receipt: the current delivery's handle
        """CREATE TABLE queue_messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            tier TEXT NOT NULL,
            tenant TEXT NOT NULL,
            body TEXT NOT NULL,
            sent_at REAL NOT NULL,
            visible_at REAL NOT NULL,
            receive_count INTEGER NOT NULL DEFAULT 0,
            receipt TEXT UNIQUE
        )""",
        "CREATE INDEX queue_messages_by_tenant ON queue_messages (tier, tenant, visible_at, id)",
        "CREATE INDEX queue_messages_visible ON queue_messages (tier, visible_at)",
        # the round-robin: when each tenant of a tier was last served (0: never)
        """CREATE TABLE queue_tenants (
            tier TEXT NOT NULL,
            tenant TEXT NOT NULL,
            last_served INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (tier, tenant)
        ) WITHOUT ROWID""",
        """CREATE TABLE queue_dead_letters (
            id INTEGER PRIMARY KEY,
            tier TEXT NOT NULL,
            tenant TEXT NOT NULL,
            body TEXT NOT NULL,
            sent_at REAL NOT NULL,
            moved_at REAL NOT NULL,
            receive_count INTEGER NOT NULL
        )""",
        "CREATE INDEX queue_dead_letters_tier ON queue_dead_letters (tier, id)",
    ),
    (
        # ---- worker sessions: the lease on every run a worker holds (DESIGN.md section 5) ----
        # runs: the JSON list of the run ids held at the last renewal; purge_at: epoch seconds (a day after
        # the session's end, as the DynamoDB item's TTL)
        """CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            revoked_at TEXT,
            runs TEXT NOT NULL,
            purge_at INTEGER NOT NULL
        ) WITHOUT ROWID""",
        "CREATE INDEX sessions_purge ON sessions (purge_at)",
    ),
    (
        # ---- notifications (docs/design/notifications.md) ----
        # the outbox: a trigger on runs appends each state change that can give an event (old and new
        # images, projected to the fields events are derived from); the sweeper appends late/overran
        # signals (kind 'signal'); the notifier reads it by cursor (notification_cursor) and prunes it
        """CREATE TABLE notification_outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,
            old TEXT,
            new TEXT NOT NULL
        )""",
        "CREATE TABLE notification_cursor (id INTEGER PRIMARY KEY CHECK (id = 1), position INTEGER NOT NULL)",
        "INSERT INTO notification_cursor (id, position) VALUES (1, 0)",
        f"""CREATE TRIGGER runs_outbox_insert AFTER INSERT ON runs
            WHEN json_extract(NEW.doc, '$.state') = 'SKIPPED'
              OR coalesce(json_extract(NEW.doc, '$.missed_slots'), 0) > 0
            BEGIN INSERT INTO notification_outbox (kind, old, new) VALUES ('change', NULL, {_snapshot("NEW")}); END""",
        f"""CREATE TRIGGER runs_outbox_update AFTER UPDATE OF doc ON runs
            WHEN json_extract(NEW.doc, '$.state') IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'SKIPPED', 'RETRY_WAIT')
              AND (json_extract(OLD.doc, '$.state') IS NOT json_extract(NEW.doc, '$.state')
                   OR json_extract(OLD.doc, '$.attempt') IS NOT json_extract(NEW.doc, '$.attempt'))
            BEGIN INSERT INTO notification_outbox (kind, old, new)
                VALUES ('change', {_snapshot("OLD")}, {_snapshot("NEW")}); END""",
        # tenants' default rules (webhook secrets inside: the API never answers them)
        """CREATE TABLE tenant_notifications (
            tenant TEXT PRIMARY KEY,
            updated_at TEXT NOT NULL,
            doc TEXT NOT NULL
        )""",
        # each job's incident (noise control)
        "CREATE TABLE notification_incidents (job_id TEXT PRIMARY KEY, doc TEXT NOT NULL)",
        # recorded events (muted or sent), newest first per job; expires_at: epoch seconds (retention)
        """CREATE TABLE notification_events (
            event_id TEXT PRIMARY KEY,
            job_id TEXT NOT NULL,
            occurred_at TEXT NOT NULL,
            expires_at INTEGER NOT NULL,
            doc TEXT NOT NULL
        )""",
        "CREATE INDEX notification_events_by_job ON notification_events (job_id, occurred_at, event_id)",
        "CREATE INDEX notification_events_expiry ON notification_events (expires_at)",
        # deliveries: pending ones by their next try
        """CREATE TABLE notification_deliveries (
            delivery_id TEXT PRIMARY KEY,
            event_id TEXT NOT NULL,
            next_attempt_at TEXT,
            doc TEXT NOT NULL
        )""",
        "CREATE INDEX notification_deliveries_by_event ON notification_deliveries (event_id)",
        "CREATE INDEX notification_deliveries_due ON notification_deliveries (next_attempt_at)"
        " WHERE next_attempt_at IS NOT NULL",
    ),
)

#: the schema version this code writes
SCHEMA_VERSION = len(MIGRATIONS)


class StateFileError(DuetimeError):
    """The state file cannot be used: not a database (corrupted), not readable or writable (permissions, a
    read-only file system), or its schema is newer than this code. The message names the file."""


class SchemaTooNewError(StateFileError):
    """The file's schema is newer than this code knows (a newer version wrote it): not opened."""


class _Holder:
    """One thread's connection; once that thread has ended, the next new thread of the process takes it
    over (a server's thread per request opens no connection of its own: opening one costs about 2 ms)."""

    __slots__ = ("__weakref__", "connection", "owner", "pid")

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.pid = os.getpid()
        self.owner: weakref.ref[threading.Thread] = weakref.ref(threading.current_thread())

    def free(self) -> bool:
        """Whether its thread has ended (the connection may be taken over)."""
        owner = self.owner()
        return owner is None or not owner.is_alive()

    def close(self) -> None:
        try:
            self.connection.close()
        except sqlite3.Error:
            pass

    def __del__(self, getpid: Callable[[], int] = os.getpid) -> None:
        # a forked child must not close its parent's connection; getpid bound early: at interpreter exit
        # the module's globals (os) may already be gone
        if self.pid == getpid():
            self.close()


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class Database:
    """A SQLite file: one connection per thread (and per process), the schema migrated on open.

    Args:
        path: the database file (created with its directory if absent).
        busy_timeout_ms: how long a writer waits for the write lock.
        durable: commit with ``synchronous=FULL`` (the WAL is fsynced at each commit: a commit survives a
            power cut; about 0.5 ms a commit here); False: ``synchronous=NORMAL`` (no fsync at commit: a
            commit survives a crash of the process, not a power cut, until the next durable commit or
            checkpoint syncs the WAL). Only writes whose loss the store recovers from may be non-durable:
            the queues' (a lost send is re-sent by the sweeper from the run row, a lost receive or delete
            delivers the message again and its start is refused).
    """

    def __init__(
        self, path: str | Path, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS, durable: bool = True
    ) -> None:
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        self.durable = durable
        self._real_path = os.path.realpath(self.path)
        self._local = threading.local()
        #: every connection this object opened in this process, each with the thread using it
        self._holders: list[_Holder] = []
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _lock_file(self._real_path)  # the writers' lock file: a directory that refuses it fails here
            self.migrate()
        except StateFileError:
            raise
        except ThrottledError as exc:
            raise StateFileError(f"{self.path}: locked by another process for too long ({exc})") from None
        except (sqlite3.DatabaseError, OSError) as exc:
            self.close()
            raise StateFileError(f"{self.path}: cannot be used as Duetime's state file: {exc}") from None

    # ---- connections ---------------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        # autocommit (isolation_level=None): transactions are explicit; check_same_thread=False only so that
        # close() may close every thread's connection; each connection is used by its own thread only
        # no SQLite busy handler (busy_timeout 0): _execute waits, in short steps (see the module's docstring)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0)
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        mode = self._execute(conn, "PRAGMA journal_mode = WAL", (), deadline).fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            conn.close()
            raise sqlite3.OperationalError(f"{self.path}: WAL mode refused (journal_mode={mode!r})")
        conn.execute(f"PRAGMA synchronous = {'FULL' if self.durable else 'NORMAL'}")
        return conn

    def connection(self) -> sqlite3.Connection:
        """This thread's connection: the one of an ended thread of this process if there is one, else a
        new one (so also in a forked process)."""
        holder: _Holder | None = getattr(self._local, "holder", None)
        if holder is None or holder.pid != os.getpid():
            holder = self._take_over()
            if holder is None:
                holder = _Holder(self._open())
                with self._lock:
                    self._holders.append(holder)
            self._local.holder = holder
        return holder.connection

    def _take_over(self) -> _Holder | None:
        """The connection of an ended thread of this process, now the calling thread's (None: none)."""
        pid = os.getpid()
        with self._lock:
            self._holders = [h for h in self._holders if h.pid == pid]  # a forked child's are its parent's
            for holder in self._holders:
                if holder.free():
                    holder.owner = weakref.ref(threading.current_thread())
                    break
            else:
                return None
        if holder.connection.in_transaction:  # its thread ended inside one (it cannot have committed)
            holder.connection.execute("ROLLBACK")
        return holder

    def close(self) -> None:
        """Close every thread's connection (a later call opens new ones)."""
        with self._lock:
            holders = [h for h in self._holders if h.pid == os.getpid()]
            self._holders = []
        for holder in holders:
            holder.close()
        self._local = threading.local()

    # ---- transactions --------------------------------------------------------------------------------
    def _execute(
        self, conn: sqlite3.Connection, sql: str, params: Sequence[Any], deadline: float
    ) -> sqlite3.Cursor:
        """``conn.execute``, tried again while the file is busy (locked by another process) until
        ``deadline`` (``time.monotonic()``), pausing 1 ms, then longer, up to 5 ms, with jitter.

        Raises:
            sqlite3.OperationalError: still busy at the deadline, or any other error at once.
        """
        pause = _RETRY_FIRST_S
        while True:
            try:
                return conn.execute(sql, params)
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(pause * (0.5 + random.random()))  # noqa: S311 - jitter, not security
            pause = min(_RETRY_MAX_S, pause * 2)

    @contextmanager
    def transaction(self, *, durable: bool | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction: ``BEGIN IMMEDIATE`` takes the write lock at once, so what is read inside is
        what is overwritten (no writer comes between). Commits on exit, rolls back on an exception. Keep it
        short: every other writer waits for it. This process's threads queue on one lock first.
        ``durable``: commit with (True) or without (False) an fsync, for this transaction only (None: as
        the database's ``durable`` says).

        Raises:
            ThrottledError: the write lock stayed taken for the whole busy timeout.
            RuntimeError: called inside another transaction of this thread.
        """
        conn = self.connection()
        if conn.in_transaction:
            raise RuntimeError("transactions do not nest")
        timeout = self.busy_timeout_ms / 1000
        deadline = time.monotonic() + timeout
        lock = _write_lock(self._real_path)
        if not lock.acquire(timeout=timeout):
            raise ThrottledError(
                f"{self.path.name}: this process's writers kept the write lock for {timeout:g} s"
            )
        writer = _lock_file(self._real_path)
        try:
            # the stack's processes take turns in the kernel's queue (flock): a waiter sleeps until the
            # holder lets go and is woken at once, fairly; polling SQLite's lock instead let one process's
            # threads pass the lock among themselves while the other process slept between tries
            fcntl.flock(writer, fcntl.LOCK_EX)
        except BaseException:
            lock.release()
            raise
        switch = durable is not None and durable != self.durable
        try:
            if switch:
                conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            try:
                self._execute(conn, "BEGIN IMMEDIATE", (), deadline)
            except sqlite3.OperationalError as exc:
                if _is_busy(exc):
                    raise ThrottledError(f"{self.path.name}: the write lock stayed taken: {exc}") from None
                raise
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            try:
                self._execute(conn, "COMMIT", (), max(deadline, time.monotonic() + timeout))
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if _is_busy(exc):
                    raise ThrottledError(f"{self.path.name}: commit refused: {exc}") from None
                raise
        finally:
            if switch:
                conn.execute(f"PRAGMA synchronous = {'FULL' if self.durable else 'NORMAL'}")
            fcntl.flock(writer, fcntl.LOCK_UN)
            lock.release()

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """All rows of one read statement (one consistent snapshot); waits while the file is busy.

        Raises:
            ThrottledError: the file stayed busy for the whole busy timeout (another process recovering it).
        """
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        try:
            return list(self._execute(self.connection(), sql, params, deadline).fetchall())
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise ThrottledError(f"{self.path.name}: busy for too long: {exc}") from None
            raise

    # ---- schema --------------------------------------------------------------------------------------
    def schema_version(self) -> int:
        return int(self.read("PRAGMA user_version")[0][0])

    def migrate(self) -> None:
        """Apply the migrations the file lacks, in order, in one write transaction.

        Raises:
            SchemaTooNewError: the file's schema is newer than :data:`SCHEMA_VERSION`.
        """
        if self.schema_version() == SCHEMA_VERSION:
            return
        with self.transaction() as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])  # again, under the write lock
            if version > SCHEMA_VERSION:
                raise SchemaTooNewError(
                    f"{self.path}: schema version {version}, this code knows up to {SCHEMA_VERSION}"
                )
            for statements in MIGRATIONS[version:]:
                for statement in statements:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
