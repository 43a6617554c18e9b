"""Ports: what the services need from storage, queues, logs and the timeout handler, named by transitions.

Each port is a :class:`typing.Protocol`. The AWS adapter set (``duetime.adapters.aws``: DynamoDB, SQS, S3,
Step Functions) implements them; ``tests/contract/`` holds every adapter set to the same behaviour. Services
receive the ports through :class:`duetime.services.deps.Deps` and never see an expression, an index
attribute, a page-token encoding or an SDK error code: adapters translate the failures they expect into
the errors of :mod:`duetime.domain.errors` (a failed condition becomes the transition's own error or
``None``). Other faults of a backing service (an outage, throttling past the retries) propagate as the
SDK raised them; whoever answers a caller translates throttling (``duetime.adapters.aws.errors``).

Conventions:
- Instants are timezone-aware UTC ``datetime`` values, stored to the millisecond (what is below is dropped:
  compare stored instants, not the caller's); durations are seconds. A run is keyed by ``(job_id, due_at)``.
- A lease held until ``T`` is expired at ``now >= T`` (``lease_expires_at <= now``), the rule the sweeper's
  selection, the lease-expiry condition and the shard leases share.
- ``page_token`` values are opaque strings the store issued for the same listing (same tenant or job);
  a malformed one, or one of another listing, raises :class:`~duetime.domain.errors.PageTokenError`. The
  last page's token is None whenever the store knows it is the last (DynamoDB may hand one more token that
  leads to an empty page). ``limit`` is at least 1.
- Reads named "may lag" come from secondary indexes that follow the table by a moment on AWS (DynamoDB
  GSIs); every other read, and every conditional write, sees the latest write.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from duetime.domain.lifecycle import AttemptEnd
from duetime.domain.models import AttemptRecord, Job, JobSummary, NotificationRule, Run, RunMessage, Session
from duetime.domain.notifications import (
    Delivery,
    DeliveryAttempt,
    Incident,
    NotificationEvent,
    RunSignal,
    RunSnapshot,
)

if TYPE_CHECKING:  # a type only: importing Powertools' idempotency loads boto3 (~30 MB a process)
    from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer

    #: The persistence of ``Idempotency-Key`` records: Powertools' own port (its abstract persistence
    #: layer), so any store can back the API's idempotency (DynamoDB on AWS; a custom layer elsewhere).
    IdempotencyPersistence = BasePersistenceLayer


@dataclass(frozen=True)
class JobAdvance:
    """Claim step 2 of one job: move its ``next_fire_at`` from ``claimed`` (the value the claimer read) to
    ``next_fire_at`` (None: the job is COMPLETED), adding ``missed`` to its ``missed_slots``."""

    job_id: str
    claimed: datetime
    next_fire_at: datetime | None
    missed: int = 0
    #: the job's shard, when the claimer knows it: a store that spreads a shard over several index keys
    #: rewrites the job's key with the advance (DynamoDB: a row written before the spread moves to its own)
    shard: int | None = None


@dataclass(frozen=True)
class RunStart:
    """One start of a run's attempt (PENDING at ``attempt``, or RETRY_WAIT at ``attempt - 1`` past its
    ``retry_at`` -> RUNNING, fencing token + 1), as :meth:`RunStore.start` takes it: ``owner`` holds the lease
    until ``lease_expires_at``; ``now`` is the start instant (``started_at``, the starting deadline's test);
    ``deadline_at`` ends the attempt's time (its timeout); ``watch_at``, given, is when the sweeper looks next
    (None leaves the run's watch time as it is: a lower bound, see :meth:`RunStore.rewatch_running`);
    ``running_tenant`` counts the run under its tenant's RUNNING quota. Instants UTC."""

    job_id: str
    due_at: datetime
    attempt: int
    owner: str
    lease_expires_at: datetime
    now: datetime
    deadline_at: datetime | None = None
    watch_at: datetime | None = None
    running_tenant: str | None = None
    #: the worker session whose renewals keep the lease (a container worker's); None: the run's own lease
    session_id: str | None = None


class JobStore(Protocol):
    """Jobs, their claims, and the per-tenant counters and shard leases kept beside them."""

    def put_new_job(self, job: Job) -> None:
        """Insert ``job``. Raises JobExistsError if its id is taken."""

    def get_job(self, job_id: str) -> Job | None:
        """The job, or None; strongly consistent."""

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The stored jobs among ``job_ids`` by id (absent ones left out); strongly consistent.
        Raises ThrottledError if the store kept refusing part of the read."""

    def replace_job(self, job: Job, *, expected_version: int, expected_next_fire_at: datetime | None) -> None:
        """Write ``job`` over the stored one if its ``version`` and ``next_fire_at`` are still the expected
        ones (optimistic concurrency). Raises ConflictError otherwise."""

    def list_jobs(
        self,
        tenant: str,
        *,
        limit: int,
        page_token: str | None = None,
        state: str | None = None,
        name_prefix: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """The tenant's jobs, newest first (DELETED ones only when ``state="DELETED"``), and the next page's
        token (None on the last page). May lag for a job just created or changed state."""

    def list_job_summaries(
        self,
        tenant: str,
        *,
        limit: int,
        page_token: str | None = None,
        state: str | None = None,
        name_prefix: str | None = None,
    ) -> tuple[list[JobSummary], str | None]:
        """The same listing as :meth:`list_jobs` (same order, filters and page tokens) read from the listing
        index alone, without reading the jobs themselves: what a page of a console shows. May lag a job's
        change of state or name by a moment (DynamoDB's index is eventually consistent)."""

    def query_due(
        self, shard: int, until: datetime, *, part: int = 0, parts: int = 1, page_size: int | None = None
    ) -> Iterator[Job]:
        """Jobs of ``shard`` whose ``next_fire_at <= until``, oldest first (may lag writes by a moment).

        ``part`` of ``parts`` (a tick of several processes gives each its own part): the shard's due jobs
        split into ``parts`` disjoint parts, fixed per job, that together are all of them; this part's,
        oldest first. Which part holds a job is the store's choice (some parts may be empty).

        ``page_size``: jobs read per request (None: the store's own page); a caller that only asks whether
        anything is due passes 1 and reads one job, so the first page costs next to nothing.

        Raises:
            ValueError: ``part`` is not in ``range(parts)``.
        """

    def advance(
        self, job_id: str, *, claimed: datetime, next_fire_at: datetime | None, now: datetime, missed: int = 0
    ) -> None:
        """Claim step 2: move ``next_fire_at`` from ``claimed`` on (None: the job is COMPLETED), adding
        ``missed`` to ``missed_slots``. Raises StaleClaimError if another claimer moved it first."""

    def advance_many(self, advances: Sequence[JobAdvance], *, now: datetime) -> list[bool]:
        """Claim step 2 of several jobs (a tick's batch): for each, in order, whether it was applied (False:
        another claimer moved that job first, nothing changed for it). Each is conditional on its own; the
        embedded store applies them in one transaction, DynamoDB in one conditional UpdateItem each (it has
        no conditional batch write, and a transaction would cost twice the write units)."""

    def add_missed_slots(self, job_id: str, count: int) -> None:
        """Add ``count`` to the job's ``missed_slots`` (no-op for an absent job)."""

    def add_active_jobs(self, tenant: str, delta: int, *, limit: int | None = None) -> bool:
        """Add ``delta`` to the tenant's active-jobs counter; with ``limit``, only if it stays within it
        (False: refused, nothing changed)."""

    def count_submit(self, tenant: str, minute: datetime, *, limit: int) -> bool:
        """Count one submit in the tenant's ``minute``; False (nothing counted) when ``limit`` is reached."""

    def acquire_shard_lease(self, shard: int, *, owner: str, now: datetime, lease_seconds: float) -> bool:
        """Take or renew the tick's lease on ``shard``; False while another owner's lease is unexpired."""

    def release_shard_lease(self, shard: int, *, owner: str, now: datetime) -> None:
        """End ``owner``'s lease on ``shard`` now (no-op if another owner holds it)."""


class RunStore(Protocol):
    """Runs: each transition is one conditional write; a run that moved on meanwhile is not touched."""

    # ---- reads ---------------------------------------------------------------------------------------
    def get_run(self, job_id: str, due_at: datetime) -> Run | None:
        """The run, or None; strongly consistent."""

    def get_runs(
        self, keys: Sequence[tuple[str, datetime]], *, consistent: bool = True
    ) -> dict[tuple[str, datetime], Run]:
        """The runs of ``keys`` (``(job_id, due_at)``) that exist, keyed as asked (a worker session's look
        at the runs it holds: one BatchGetItem per 100 keys on DynamoDB); ``consistent=False`` may lag the
        latest write by a moment (half the read units on DynamoDB)."""

    def list_runs(self, job_id: str, *, limit: int = 20) -> list[Run]:
        """The job's most recent ``limit`` runs, newest due time first."""

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
        """The job's runs due in ``[since, until]``, newest first, of ``state`` (``active_only``: not
        terminal), and the next page's token."""

    def query_overdue(self, shard: int, until: datetime) -> Iterator[Run]:
        """Non-terminal runs of ``shard`` whose ``watch_at <= until``, oldest watch time first. May lag."""

    def query_active(self, job_id: str, *, before: datetime) -> list[datetime]:
        """Due times of the job's active runs (overlap-policy jobs' non-terminal runs, and runs held by a
        pause) due before ``before``, oldest first. May lag writes by a moment."""

    def query_active_after(self, job_id: str, *, after: datetime, limit: int = 1) -> list[datetime]:
        """Due times of the job's active runs due after ``after``, oldest first, at most ``limit``."""

    def query_dead_letters(
        self, tenant: str, *, limit: int = 20, page_token: str | None = None
    ) -> tuple[list[Run], str | None]:
        """The tenant's dead-lettered runs, most recently dead-lettered first, and the next page's token.
        May lag."""

    def count_running(self, tenant: str) -> int:
        """How many of the tenant's runs are RUNNING (counted only for runs started with ``running_tenant``,
        where a RUNNING quota is set). May lag."""

    # ---- transitions (DESIGN.md section 5) -----------------------------------------------------------
    def put_new_run(self, run: Run) -> None:
        """Claim step 1: insert ``run`` if its key is new. Raises AlreadyClaimedError otherwise."""

    def put_new_runs(self, runs: Sequence[Run]) -> list[bool]:
        """Claim step 1 of several runs (a tick's batch): insert each whose key is new; for each, in order,
        whether it was inserted (False: it existed, the stored one is kept). The embedded store inserts them
        in one transaction, DynamoDB with one conditional PutItem each."""

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
    ) -> Run:
        """PENDING at ``attempt`` (or RETRY_WAIT at ``attempt - 1`` past its ``retry_at``) -> RUNNING, the
        fencing token raised by one; refused for a held run and for attempt 1 past its starting deadline.
        Raises StartRejectedError otherwise."""

    def start_many(self, starts: Sequence[RunStart]) -> list[Run | Exception]:
        """:meth:`start` of several runs (a worker's poll): for each, in order, the run as now stored
        (RUNNING) or the error its own ``start`` would raise (StartRejectedError; on DynamoDB also a fault
        of that item's request, its write unknown). Each is conditional on its own; the embedded store
        applies them in one transaction (a fault of it raises, and none was applied), DynamoDB in one
        conditional UpdateItem each."""

    def rewatch_running(
        self, job_id: str, due_at: datetime, *, fencing_token: int, watch_at: datetime
    ) -> Run | None:
        """Move a RUNNING run's watch time to ``watch_at`` while it runs under ``fencing_token``; None if it
        moved on.

        A run's watch time is a lower bound of the moment the sweeper must look at it, moved later lazily:
        a start leaves it (with a KEYS_ONLY watchdog index that costs no index write) and its worker
        writes nothing to a running run's row until its attempt ends, a start moves it earlier only for a
        deadline due before it, and the sweeper, finding a RUNNING run whose lease and deadline are still
        ahead, moves it to the sooner of the two with this call. So a run that ends before its claim-time
        watch time (its due time + the pending grace) never moves."""

    def end_attempt(self, end: AttemptEnd) -> Run:
        """Apply ``end`` while the run is RUNNING under ``end.expected_token`` (and, with
        ``end.lease_expired_by``, its lease expired by then). Raises LeaseLostError otherwise."""

    def end_attempts(self, ends: Sequence[AttemptEnd]) -> list[Run | Exception]:
        """:meth:`end_attempt` of several runs (a worker's finished tasks): for each, in order, the run as
        now stored or the error its own ``end_attempt`` would raise (LeaseLostError; on DynamoDB also a
        fault of that item's request). The embedded store applies them in one transaction (a fault of it
        raises, and none was applied), DynamoDB in one conditional UpdateItem each."""

    def start_and_end(
        self, starts: Sequence[RunStart], ends: Sequence[AttemptEnd]
    ) -> tuple[list[Run | Exception], list[Run | Exception]]:
        """:meth:`end_attempts` of ``ends`` and :meth:`start_many` of ``starts`` together (a worker
        session's writes of one moment): (the starts' outcomes, the ends' outcomes), each as those methods
        give them. The embedded store applies all of them in one transaction (one commit), DynamoDB in one
        conditional UpdateItem each."""

    def skip_pending(
        self, job_id: str, due_at: datetime, *, attempt: int, reason: str, now: datetime
    ) -> Run | None:
        """PENDING at ``attempt`` -> SKIPPED with ``reason``; None if the run moved on."""

    def hold(
        self, job_id: str, due_at: datetime, *, reason: str, now: datetime, recheck_at: datetime
    ) -> Run | None:
        """A PENDING first attempt, not held -> held by ``reason`` (it becomes an active run, watched again
        at ``recheck_at``); None if the run moved on."""

    def release_held(self, run: Run, *, now: datetime, watch_at: datetime) -> Run | None:
        """``run``, still PENDING at its attempt and held as read -> no longer held, watched at
        ``watch_at``; None if the run moved on."""

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
        """Push a PENDING run's watch time to ``watch_at`` (it waits behind an overlap, its hold is still
        due, or its message is re-sent), if it is still PENDING at ``attempt`` with that ``held`` value
        (and, with ``seen_watch_at``, that watch time: of two sweepers, one re-sends). None if it moved on."""

    def release_retry(
        self, job_id: str, due_at: datetime, *, attempt: int, now: datetime, watch_at: datetime
    ) -> Run | None:
        """RETRY_WAIT at ``attempt`` -> PENDING at ``attempt + 1``, watched at ``watch_at``; None if it
        moved on."""

    def cancel(
        self, run: Run, *, reason: str, now: datetime, record: AttemptRecord | None = None
    ) -> Run | None:
        """``run``, still in its state under its fencing token -> CANCELLED, the token raised (a running
        worker's session finds it at its next beat), ``record`` appended for a RUNNING attempt. None if it
        moved on."""

    def redrive(self, run: Run, *, now: datetime, watch_at: datetime) -> Run | None:
        """A terminal ``run`` (still in its state at its attempt) -> PENDING at ``attempt + 1`` with a fresh
        attempt budget, no longer dead-lettered. None if it moved on."""

    def record_event(self, job_id: str, due_at: datetime, event: Mapping[str, Any]) -> None:
        """Append ``event`` (``at``, ``kind``, ``detail``) to the run's history (no-op for an absent run)."""


class SessionStore(Protocol):
    """Worker sessions (:class:`~duetime.domain.models.Session`, DESIGN.md section 5): one item per worker
    process, written only while it holds a run its own lease no longer covers; every write is conditional.
    (On DynamoDB they are items of the runs table under reserved keys no job id can take.)"""

    def renew_session(
        self, session_id: str, *, owner: str, runs: Sequence[str], expires_at: datetime
    ) -> Session | None:
        """Create the session, or set its ``owner``, ``runs`` and ``expires_at``, unless it is revoked: the
        session as now stored, or None (revoked: the worker is fenced from every run it held and must stop
        their tasks). An expired session that is not revoked is renewed: the sweeper revokes a session
        before it expires any of its runs, so none of them was expired."""

    def get_sessions(self, session_ids: Sequence[str]) -> dict[str, Session]:
        """The sessions of ``session_ids`` that exist (revoked ones included); strongly consistent."""

    def revoke_session(self, session_id: str, *, now: datetime) -> bool:
        """Revoke the session at ``now`` if it expired by then or does not exist (a revoked item is left, so
        a later renewal is refused); True if it is revoked now (or was before), False if it is alive
        (renewed meanwhile: nothing written)."""


class Store(JobStore, RunStore, SessionStore, Protocol):
    """Jobs, runs and worker sessions in one store (the claim writes jobs and runs)."""


#: a tier queue's visibility timeout, seconds: a delivery stays hidden this long after a receive (a worker
#: extends it while it runs the task; a worker that dies lets it reappear)
QUEUE_VISIBILITY_SECONDS = 120
#: deliveries of one message before the queue moves it to the tier's dead-letter queue
QUEUE_MAX_RECEIVE_COUNT = 10


@dataclass(frozen=True)
class ReceivedMessage:
    """One delivery of a run message.

    Attributes:
        message: the run message, or None when the body is not one (it is dropped).
        receipt_handle: the handle that deletes this delivery or extends its visibility.
        body: the raw body.
        receive_count: how many times the message has been delivered, this one included.
    """

    message: RunMessage | None
    receipt_handle: str
    body: str
    receive_count: int


class RunQueue(Protocol):
    """The tier queues that wake runs up (at-least-once delivery; the run row, not the message, is truth)."""

    def send(self, tier: str, message: RunMessage, *, delay: int = 0) -> None:
        """Deliver ``message`` on ``tier``'s queue after ``delay`` seconds (0..900), fair across tenants."""

    def send_batch(self, tier: str, messages: Sequence[tuple[RunMessage, int]]) -> None:
        """Deliver each ``(message, delay seconds)`` on ``tier``'s queue, as :meth:`send` would: on SQS with
        SendMessageBatch, 10 entries a call (SQS's limit); on the embedded queue in one transaction.

        Raises:
            QueueSendError: some entries were not sent (the others were; sending again is harmless, a
                duplicate wake-up fails its conditional start).
        """

    def receive(
        self,
        tier: str,
        *,
        max_messages: int = 1,
        wait_seconds: int = 1,
        visibility_seconds: int | None = None,
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` deliveries, waiting up to ``wait_seconds``; each stays hidden from other
        receivers for ``visibility_seconds`` (default: the queue's)."""

    def delete(self, tier: str, receipt_handle: str) -> None:
        """Delete a delivery (an expired handle is ignored: another receiver has it now)."""

    def delete_batch(self, tier: str, receipt_handles: Sequence[str]) -> None:
        """:meth:`delete` of several deliveries (SQS: DeleteMessageBatch, 10 a request; the embedded queue:
        one transaction). Stale handles are ignored, as by ``delete``; a fault raises after every request
        was tried (a delivery left undeleted comes back after its visibility timeout, and its start is
        refused)."""

    def extend_visibility(self, tier: str, receipt_handle: str, seconds: int) -> None:
        """Keep a delivery hidden ``seconds`` more (best effort)."""


class LogStore(Protocol):
    """Run logs: one final object per attempt, streamed in numbered chunks while the attempt runs."""

    def put(self, key: str, data: bytes) -> None:
        """Store the final log ``data`` (UTF-8 text) at ``key``."""

    def put_chunk(self, key: str, seq: int, data: bytes) -> None:
        """Store chunk ``seq`` (0, 1, ...) of the running attempt's log ``key``."""

    def get(self, key: str) -> bytes | None:
        """The final log at ``key``, else its chunks in order, else None."""

    def get_final(self, key: str) -> bytes | None:
        """The final log at ``key`` only, or None."""

    def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        """Bytes ``offset .. offset + length - 1`` of the object at ``key`` (one attempt's log in a log pack,
        :data:`duetime.domain.logs.PACK_PREFIX`), or None if there is no such object. Raises ValueError for a
        negative offset or length."""

    def delete_chunks(self, key: str, count: int | None = None) -> None:
        """Delete chunks ``0..count-1`` of ``key`` (all of them when ``count`` is None).
        Raises LogStoreError if some were not deleted."""


class RunExpiry(Protocol):
    """The hot window on a store without a TTL of its own (the embedded store; the local archiver)."""

    def expired_runs(self, now: datetime, *, limit: int) -> list[tuple[Run, datetime]]:
        """Up to ``limit`` finished runs whose TTL is at or before ``now``, soonest first, with their TTL."""

    def rearm_runs(self, keys: Sequence[tuple[str, datetime]], *, expires_at: datetime) -> None:
        """Push back the TTL of the runs of ``keys`` (``(job_id, due_at)``)."""

    def delete_runs(self, keys: Sequence[tuple[str, datetime]]) -> int:
        """Delete the finished runs of ``keys``; returns how many went."""


class ArchiveStore(Protocol):
    """Object storage of the run archive (:mod:`duetime.domain.archive`: its layout): S3 on AWS, files under
    the state directory locally, the same keys in both. Every object is written whole (a reader sees all
    of it or none), and writing a key again replaces it."""

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` at ``key`` (replacing what was there)."""

    def get(self, key: str) -> bytes | None:
        """The object at ``key``, or None."""

    def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        """Bytes ``offset .. offset + length - 1`` of the object at ``key``, or None if there is none."""

    def list_keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, in ascending order."""

    def list_dirs(self, prefix: str) -> list[str]:
        """The ``/``-terminated key prefixes one level under ``prefix`` (S3's common prefixes), ascending."""


@dataclass(frozen=True)
class TimeoutPlan:
    """Everything one timeout-handler execution does, decided ahead (DESIGN.md section 5).

    Attributes:
        name: the execution's name, ``<run id>-a<attempt>``: a second start for one attempt is a no-op.
        end: the fence: the attempt ends TIMED_OUT (or RETRY_WAIT) under the stuck worker's token, raised.
        retry: the next attempt's wake-up and its delay in seconds, when the backoff fits a message delay.
        triggered: the run ``on_timeout: trigger`` creates (put if new) and its wake-up.
        successor: the wake-up of the overlap successor waiting behind the run, when the fence ends it.
    """

    run: Run
    name: str
    end: AttemptEnd
    retry: tuple[RunMessage, int] | None = None
    triggered: tuple[Run, RunMessage] | None = None
    successor: RunMessage | None = None

    @property
    def dead_letters(self) -> bool:
        return self.end.dead_lettered


class TimeoutRunner(Protocol):
    """Runs timeout plans: a Step Functions state machine on AWS, or in-process (the same steps)."""

    def start(self, plan: TimeoutPlan) -> bool:
        """Start ``plan`` (idempotent by ``plan.name``). Returns False if it had already been started, and
        (where the runner applies the fence itself) if the run was already settled. A state machine learns
        the latter only as it runs: its execution then ends ``AlreadySettled`` with nothing applied."""


class LambdaInvoker(Protocol):
    """Invokes a function asynchronously (the AWS adapter: ``duetime.adapters.aws.lambda_invoker``)."""

    def invoke_event(self, function: str, payload: bytes) -> str:
        """Queue one asynchronous invocation of ``function``; returns its request id.

        Raises:
            InvokeError: Lambda refused it (its error code is ``code``).
        """


# ---- notifications (docs/design/notifications.md) ---------------------------------------------------------
@dataclass(frozen=True)
class ChangeEntry:
    """One entry of the notifications outbox: a run row's change (``old`` None: inserted) or an event the
    sweeper found (``signal``: ``late`` or ``overran``)."""

    position: int
    new: RunSnapshot | None = None
    old: RunSnapshot | None = None
    signal: RunSignal | None = None


class ChangeFeed(Protocol):
    """The run changes the notifier reads, in order, by cursor (the embedded store's outbox, filled by a
    trigger on the runs table; on AWS the runs table's stream feeds the notifier Lambda instead)."""

    def read_changes(self, *, limit: int) -> list[ChangeEntry]:
        """The oldest ``limit`` entries after the cursor."""

    def ack_changes(self, position: int) -> None:
        """Move the cursor past ``position`` (entries up to it are not read again)."""


class SignalOutbox(Protocol):
    """Where the sweeper appends the time-based events (``late``, ``overran``): the outbox locally, the
    notifications queue on AWS. At least once; a duplicate carries the same event id."""

    def append_signals(self, signals: Sequence[RunSignal]) -> None: ...


class NotificationStore(Protocol):
    """Tenant rules, recorded events, deliveries and each job's incident state."""

    def get_tenant_rules(self, tenant: str) -> tuple[list[NotificationRule], datetime | None]:
        """The tenant's default rules and when they were last set (``([], None)``: never)."""

    def put_tenant_rules(self, tenant: str, rules: Sequence[NotificationRule], *, now: datetime) -> None: ...

    def get_incident(self, job_id: str) -> Incident: ...

    def record_event(
        self, event: NotificationEvent, deliveries: Sequence[Delivery], incident: Incident
    ) -> bool:
        """Record the event, its deliveries and the job's incident after it, together; False (nothing
        written) if the event id is recorded already (a duplicate of its change)."""

    def due_deliveries(self, now: datetime, *, limit: int) -> list[Delivery]:
        """Pending deliveries whose next try is due at ``now``, oldest first."""

    def get_delivery(self, job_id: str, delivery_id: str) -> Delivery | None: ...

    def save_delivery(self, delivery: Delivery) -> None:
        """Write the delivery's new status, attempts and next try.

        Raises:
            ConflictError: (a store with concurrent notifiers: DynamoDB) another try of the delivery was
                saved since this one's was read; nothing written.
        """

    def list_events(
        self, job_id: str, *, limit: int, page_token: str | None = None
    ) -> tuple[list[tuple[NotificationEvent, list[Delivery]]], str | None]:
        """The job's events, newest first, each with its deliveries, and the next page's token."""


class DeliveryWakeups(Protocol):
    """Wakes the notifier for a delivery's next try at its ``next_attempt_at`` (the notifications queue's
    delayed messages on AWS). The embedded store needs none: the local notifier polls due deliveries."""

    def wake(self, deliveries: Sequence[Delivery], *, now: datetime) -> None: ...


class WebhookSender(Protocol):
    """POSTs one delivery: resolves the host, refuses a forbidden address (SSRF), follows no redirect."""

    def post(self, url: str, body: bytes, headers: Mapping[str, str], *, timeout: float) -> DeliveryAttempt:
        """The try's outcome (``ok`` for a 2xx); never raises for a network failure."""


class SnsPublisher(Protocol):
    """SNS topics and email (through a topic of the tenant's own)."""

    def publish(
        self, topic_arn: str, *, subject: str, message: str, attributes: Mapping[str, str]
    ) -> None: ...

    def publish_email(self, tenant: str, address: str, *, subject: str, message: str) -> None: ...

    def subscribe_email(self, tenant: str, address: str) -> None:
        """Subscribe ``address`` to ``tenant``'s email alerts (nothing if it is already)."""
