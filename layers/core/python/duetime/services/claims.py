"""Claiming due runs: the hot path of DESIGN.md section 4 (no transactions).

For each due job: (1) conditional put of the run ``(job_id, due_at)``; (2) conditional advance of the job's
``next_fire_at``; (3) SendMessage to the tier's queue with ``DelaySeconds = floor(due_at - now)``. Each step is
idempotent on its own; a crash between two steps is repaired by the next tick (step 1 finds the run, step 2
advances) or by the sweeper (a PENDING run past due + grace is re-sent). A tick does each step for a batch
of due jobs at once (``settings.claim_batch_size``; :func:`claim_batch`): every item is still conditional on
its own, so a batch is only fewer commits and requests, never a wider claim.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import chain, islice
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_readable
from multiprocessing.process import BaseProcess

from duetime.config.observability import logger
from duetime.domain.admission import is_missed, next_fire_after, schedule_of, select_slots
from duetime.domain.errors import JobExistsError, PartialBatchError, QueueSendError
from duetime.domain.lifecycle import build_run, delay_seconds, message_for
from duetime.domain.models import Job, JobState, Run, RunMessage, Trigger
from duetime.domain.ports import JobAdvance
from duetime.domain.timeutil import truncate_ms
from duetime.services.deps import Deps

#: Upper bound on missed slots walked one by one when catching up; past it, only the latest is considered.
MAX_WALKED_SLOTS = 10_000

#: Most slots of one job claimed in one pass (a cron job of every minute claims 1-2 per 60 s tick; a rate(10
#: seconds) job about 8).
MAX_SLOTS_PER_PASS = 1000

#: Most slots one claim takes (one advance of the job; the next round takes the rest): a 75 s lookahead
#: holds 75 slots of the shortest schedule, ``rate(1 second)``.
MAX_SLOTS_PER_CLAIM = 100
#: Seconds a tick's claiming processes (``tick_processes`` > 1) have, together, to exit once their parts are
#: in (or they were killed past their time); one still alive then is killed, so none outlives the tick (a
#: Lambda invocation freezes what is left running)
CHILD_EXIT_SECONDS = 5.0


@dataclass(frozen=True)
class ClaimResult:
    """What one claim did.

    ``runs`` are the runs claimed (usually one; several when catch-up ``all`` backfills); ``created`` counts
    those this claim inserted (0 when an earlier claim already had); ``missed`` the slots skipped; ``error``
    the first fault of this job's claim, if any (the steps done stay done: the next tick, or the sweeper for
    a message not sent, finishes the rest).
    """

    runs: list[Run]
    created: int
    advanced: bool
    next_fire_at: datetime | None
    missed: int = 0
    error: Exception | None = None

    @property
    def run(self) -> Run | None:
        """The latest run claimed, if any."""
        return self.runs[-1] if self.runs else None


def new_run(job: Job, due_at: datetime, deps: Deps, *, trigger: Trigger, missed_slots: int = 0) -> Run:
    """A fresh PENDING run of ``job`` at ``due_at`` (:func:`duetime.domain.lifecycle.build_run`, now)."""
    return build_run(
        job,
        due_at,
        now=deps.clock.now(),
        watch_after_seconds=deps.settings.first_watch_seconds,
        trigger=trigger,
        missed_slots=missed_slots,
    )


def plan_slots(job: Job, now: datetime) -> tuple[list[datetime], int]:
    """Which slots to claim now for ``job``, oldest first, and how many missed slots to skip.

    The slots from the job's ``next_fire_at`` up to ``now`` are walked; those more than
    ``catch_up.tolerance_seconds`` late are *missed* and the catch-up policy keeps some of them
    (:func:`duetime.domain.admission.select_slots`, the same rule the start applies to runs claimed earlier);
    slots past the starting deadline are always skipped. Pure: no I/O.

    Returns:
        (slots, missed): ``slots`` may be empty (everything skipped); ``missed`` counts skipped slots
        (bounded by walking at most MAX_WALKED_SLOTS slots).
    """
    claimed = job.next_fire_at
    assert claimed is not None
    if not is_missed(claimed, now, job.catch_up) and not _past_deadline(job, claimed, now):
        return [claimed], 0
    schedule = schedule_of(job)
    if schedule is None:  # a run-now job whose claim was delayed: run it, unless past its deadline
        return ([], 1) if _past_deadline(job, claimed, now) else ([claimed], 0)
    due: list[datetime] = []
    cursor: datetime | None = claimed
    walked = 0
    while cursor is not None and cursor <= now and walked < MAX_WALKED_SLOTS:
        due.append(truncate_ms(cursor))
        walked += 1
        cursor = schedule.next_after(cursor)
    if cursor is not None and cursor <= now:  # more than we walk: jump to the latest slots
        latest = schedule.latest_at_or_before(now)
        if latest is not None:
            due = [truncate_ms(latest)]
    runnable = [d for d in due if not _past_deadline(job, d, now)]
    late = [d for d in runnable if is_missed(d, now, job.catch_up)]
    on_time = [d for d in runnable if not is_missed(d, now, job.catch_up)]
    kept, _ = select_slots(late, job.catch_up)
    keep = kept + on_time
    missed = max(walked, len(due)) - len(keep)
    return keep, missed


def _past_deadline(job: Job, due_at: datetime, now: datetime) -> bool:
    return job.starting_deadline_seconds is not None and (now - due_at).total_seconds() > (
        job.starting_deadline_seconds
    )


def claim(job: Job, deps: Deps, *, trigger: Trigger = Trigger.SCHEDULE) -> ClaimResult:
    """Claim the job's due slot(s): :func:`claim_batch` of this one job.

    Raises:
        ValueError: if the job has no ``next_fire_at``.
        the store's and queue's faults other than the expected condition failures (the next tick retries;
            each step is idempotent).
    """
    [result] = claim_batch([job], deps, trigger=trigger)
    if result.error is not None:
        raise result.error
    return result


@dataclass
class _Planned:
    """One job of a batch: its runs, the advance of its next fire, and how its steps went."""

    job: Job
    runs: list[Run]
    missed: int
    advance: JobAdvance
    inserted: list[bool | None] = field(default_factory=list)
    advanced: bool | None = False
    error: Exception | None = None
    #: a write of its runs failed: it stops before its advance (the next tick finds its runs, advances it)
    held_back: bool = False

    def fail(self, error: Exception) -> None:
        self.error = self.error or error


def _outcomes(step: Callable[[], list[bool]]) -> tuple[list[bool | None], Exception | None]:
    """A batch step's per-item outcomes, also when it failed part way (None: that item's write raised)."""
    try:
        return list(step()), None
    except PartialBatchError as exc:
        error = exc.error if isinstance(exc.error, Exception) else exc
        return exc.results, error


def claim_batch(
    jobs: Sequence[Job],
    deps: Deps,
    *,
    trigger: Trigger = Trigger.SCHEDULE,
    until: datetime | None = None,
) -> list[ClaimResult]:
    """Claim the due slot(s) of each of ``jobs`` through the three steps of DESIGN.md section 4, each step
    done for the whole batch at once (a tick claims a page of due jobs this way: on SQLite one transaction
    per step, on SQS one SendMessageBatch per 10 messages).

    Normally that is the slot in each job's ``next_fire_at`` and, with ``until`` (UTC, the lookahead's end),
    every later slot due by then, up to MAX_SLOTS_PER_CLAIM (:func:`plan_ahead`): a ``rate(10 seconds)``
    job's seven slots of a 75 s lookahead are one claim, so one advance of the job (its row and its due-index
    entry written once, not seven times). After an outage the catch-up policy picks the late slots
    (:func:`plan_slots`); catch-up runs other than the latest are recorded with trigger ``backfill``, and the
    latest with how many slots were skipped (``missed_slots``).

    Steps, each idempotent and conditional per item: (1) ``put_new_runs`` of every run; (2) ``advance_many``
    of the jobs whose runs were written: each job's ``next_fire_at`` moved from the claimed value to the
    first slot after the last one handled (removed, with the job COMPLETED, when there is none); then the
    tenants' active-jobs counters for the jobs that COMPLETED; (3) ``send_batch`` per tier of each run with
    ``DelaySeconds = floor(due - now)``, for runs this claim inserted or whose job it advanced (re-sent for
    runs an earlier, crashed claim inserted; duplicates fail the conditional start).

    A fault once a job is advanced never escapes: its messages are sent again one by one, and what still
    fails is the job's ``error`` (the sweeper re-sends a PENDING run's message past its grace period). A
    write that failed part way (DynamoDB: one request per item) stops only the jobs whose items failed.

    Returns:
        one :class:`ClaimResult` per job, in order.

    Raises:
        ValueError: if a job has no ``next_fire_at``.
        the store's faults of a step that applied nothing (the embedded store's steps are one transaction
            each): the steps done so far stay done, and claiming again repairs the rest.
    """
    now = deps.clock.now()
    batch = [_plan(job, now, deps, trigger, until=until) for job in jobs]

    # step 1: the runs
    written, error = _outcomes(lambda: deps.store.put_new_runs([run for p in batch for run in p.runs]))
    flags = iter(written)
    for p in batch:
        p.inserted = [next(flags) for _ in p.runs]
        if None in p.inserted and error is not None:
            p.fail(error)
            p.held_back = True
    # step 2: the jobs whose runs are all written
    ready = [p for p in batch if not p.held_back]
    moved, error = _outcomes(lambda: deps.store.advance_many([p.advance for p in ready], now=now))
    for p, ok in zip(ready, moved, strict=True):
        p.advanced = ok
        if ok is None and error is not None:
            p.fail(error)  # maybe advanced: its messages are sent anyway (a duplicate is harmless)
    _count_completed(batch, deps)
    # step 3: the messages, delayed from the moment they are sent
    _send(batch, deps)
    for p in batch:
        if p.missed:
            logger.info(
                "missed slots skipped",
                extra={"job_id": p.job.job_id, "missed": p.missed, "claimed": len(p.runs)},
            )
    return [
        ClaimResult(
            runs=p.runs,
            created=sum(1 for new in p.inserted if new),
            advanced=bool(p.advanced),
            next_fire_at=p.advance.next_fire_at,
            missed=p.missed,
            error=p.error,
        )
        for p in batch
    ]


def plan_ahead(job: Job, slots: list[datetime], until: datetime | None) -> list[datetime]:
    """``slots`` (a claim's slots due now, oldest first: :func:`plan_slots`) and the job's later slots due at
    or before ``until`` (UTC), at most MAX_SLOTS_PER_CLAIM in all; without ``until``, ``slots``. Pure."""
    if until is None or not slots:
        return slots
    ahead = list(slots)
    while len(ahead) < MAX_SLOTS_PER_CLAIM:
        nxt = next_fire_after(job, ahead[-1])
        if nxt is None or nxt > until:
            break
        ahead.append(nxt)
    return ahead


def _plan(
    job: Job, now: datetime, deps: Deps, trigger: Trigger, *, until: datetime | None = None
) -> _Planned:
    """The claim of ``job``'s due slot(s) at ``now`` (and of its slots due by ``until``: :func:`plan_ahead`):
    its runs and the advance of its next fire (no I/O).

    Raises:
        ValueError: the job has no ``next_fire_at``.
    """
    if job.next_fire_at is None:
        raise ValueError(f"job {job.job_id} has no next_fire_at to claim")
    claimed = job.next_fire_at
    now_slots, missed = plan_slots(job, now)
    slots = plan_ahead(job, now_slots, until)
    latest = len(now_slots) - 1  # the latest slot due now: it carries the skipped count
    runs = [
        new_run(
            job,
            due_at,
            deps,
            trigger=(Trigger.BACKFILL if i < latest and is_missed(due_at, now, job.catch_up) else trigger),
            missed_slots=missed if i == latest else 0,
        )
        for i, due_at in enumerate(slots)
    ]
    last_handled = slots[-1] if slots else max(claimed, now)
    advance = JobAdvance(job.job_id, claimed, next_fire_after(job, last_handled), missed, shard=job.shard)
    return _Planned(job, runs, missed, advance)


def plan_put_claimed(job: Job, deps: Deps) -> _Planned | None:
    """The claim a submit can store with the job itself: for a fresh ACTIVE job whose first claim, due
    within the lookahead, leaves no next fire (a run-now job; a one-off ``at(...)`` due that soon; a
    repeating job whose every slot, up to its ``end_at``, is due that soon). None
    for any other job (the job is stored, then claimed as a tick would). No I/O."""
    now = deps.clock.now()
    if job.state is not JobState.ACTIVE or job.next_fire_at is None:
        return None
    if job.next_fire_at > now + timedelta(seconds=deps.settings.tick_lookahead_seconds):
        return None
    until = now + timedelta(seconds=deps.settings.tick_lookahead_seconds)
    planned = _plan(job, now, deps, Trigger.SCHEDULE, until=until)
    if planned.advance.next_fire_at is not None or not planned.runs:
        return None
    return planned


def put_claimed(planned: _Planned, deps: Deps) -> tuple[Job, ClaimResult]:
    """Store a job already claimed (:func:`plan_put_claimed`): its runs first, then the job as its claim
    leaves it (COMPLETED, no next fire, ``missed_slots`` added), then the runs' messages. The job never
    enters the due index, and its other indexes are written once (issue 16: a one-off's claim no longer
    costs a job update and a due-index entry and removal).

    The runs carry the job's ``created_at`` (:attr:`Run.job_created_at`), so runs whose job put failed
    (a crash or fault between the writes; its id taken by a concurrent submit: :class:`JobExistsError`)
    never run: the request failed, nothing was promised, and their start skips them (``deleted``: no job,
    or a job of the same id created at another time); the ones of a taken id are skipped at once. A chosen
    id already taken is refused before this (``jobs.create_job``), so no run is written under another
    job's key.

    Returns:
        the job as stored and the claim's result (a send that failed is its ``error``: the sweeper re-sends
        the run's message past its grace).

    Raises:
        JobExistsError: the job's id is taken.
        the store's faults of the two writes (the request failed).
    """
    job, runs = planned.job, planned.runs
    now = deps.clock.now()
    try:
        planned.inserted = [bool(new) for new in deps.store.put_new_runs(runs)]
    except PartialBatchError as exc:
        # the request failed with the fault of a write (throttled: a 503 with Retry-After), not an
        # unknown error: a run that was written has no job, so its start skips it
        raise exc.error from exc
    stored = job.model_copy(
        update={
            "next_fire_at": None,
            "state": JobState.COMPLETED,
            "missed_slots": job.missed_slots + planned.missed,
            "updated_at": truncate_ms(now),
        }
    )
    try:
        deps.store.put_new_job(stored)
    except JobExistsError:
        for run, new in zip(runs, planned.inserted, strict=True):
            if new:  # the claim of a job this submit did not store: it never runs
                with suppress(Exception):
                    deps.store.skip_pending(run.job_id, run.due_at, attempt=1, reason="deleted", now=now)
        raise
    planned.advanced = True
    _send([planned], deps)
    return stored, ClaimResult(
        runs=runs,
        created=sum(bool(new) for new in planned.inserted),
        advanced=True,
        next_fire_at=None,
        missed=planned.missed,
        error=planned.error,
    )


def _count_completed(batch: list[_Planned], deps: Deps) -> None:
    """Scheduled jobs this batch COMPLETED no longer count against their tenant's active-jobs quota: one
    counter update per tenant, else one per job; one that still fails is that job's error (the counter stays
    one high)."""
    completed: dict[str, list[_Planned]] = defaultdict(list)
    for p in batch:
        if p.advanced is True and p.advance.next_fire_at is None and p.job.schedule is not None:
            completed[p.job.tenant].append(p)
    for tenant, done in sorted(completed.items()):
        try:
            deps.store.add_active_jobs(tenant, -len(done))
            continue
        except Exception:  # noqa: BLE001 - the jobs are advanced: their messages must still go
            logger.warning("active-jobs counter not updated; one job at a time", exc_info=True)
        for p in done:
            try:
                deps.store.add_active_jobs(tenant, -1)
            except Exception as exc:  # noqa: BLE001 - the counter stays one high (the quota is approximate)
                logger.exception("active-jobs counter not updated", extra={"tenant": tenant})
                p.fail(exc)


def _send(batch: list[_Planned], deps: Deps) -> None:
    """Step 3: one ``send_batch`` per tier; what it could not send is sent one by one; what still fails is
    the job's error (the sweeper re-sends it after the run's grace period)."""
    now = deps.clock.now()
    messages: dict[str, list[tuple[RunMessage, int]]] = defaultdict(list)
    owner: dict[str, _Planned] = {}
    for p in batch:
        if p.held_back:
            continue  # stopped before its advance: the next tick claims it again
        for run, new in zip(p.runs, p.inserted, strict=True):
            if new or p.advanced is not False:
                messages[p.job.task.tier].append((message_for(run), delay_seconds(run.due_at, now)))
                owner[run.run_id] = p
    for tier, entries in messages.items():
        try:
            deps.queues.send_batch(tier, entries)
            continue
        except QueueSendError as exc:
            unsent = exc.unsent
        except Exception:  # noqa: BLE001 - the embedded queue sends all or nothing
            unsent = entries
        logger.warning("batch send failed; sending one by one", exc_info=True, extra={"tier": tier})
        for message, delay in unsent:
            try:
                deps.queues.send(tier, message, delay=delay)
            except Exception as exc:  # noqa: BLE001 - left to the sweeper
                logger.exception("message not sent", extra={"run_id": message.run_id})
                owner[message.run_id].fail(exc)


@dataclass
class TickResult:
    """Counts from one tick of one shard.

    ``claimed``: runs this tick inserted; ``already_claimed``: runs an earlier claim had inserted (advanced
    or re-sent now); ``not_advanced``: claims whose job another claimer had moved on; ``errors``: jobs whose
    claim failed, plus each claiming process that crashed or hung (the next tick retries); ``missed``: slots
    catch-up skipped; ``busy``: another tick held the shard's lease (nothing done); ``run_ids``: every run
    claimed, in no particular order across processes.
    """

    shard: int
    claimed: int = 0
    already_claimed: int = 0
    not_advanced: int = 0
    errors: int = 0
    missed: int = 0
    busy: bool = False
    run_ids: list[str] = field(default_factory=list)

    def merge(self, other: TickResult) -> None:
        """Add ``other``'s counts and run ids (a child process's part of this tick) to these."""
        self.claimed += other.claimed
        self.already_claimed += other.already_claimed
        self.not_advanced += other.not_advanced
        self.errors += other.errors
        self.missed += other.missed
        self.run_ids.extend(other.run_ids)


def claim_until(
    job: Job, deps: Deps, until: datetime, *, trigger: Trigger = Trigger.SCHEDULE
) -> list[ClaimResult]:
    """Claim every slot of ``job`` due at or before ``until`` (the lookahead): :func:`claim_until_batch` of
    this one job. Used by the API for a fresh submit.

    Raises:
        the first fault of its claims (the claims before it stand; the next tick goes on from there).
    """
    results = claim_until_batch([job], deps, until, trigger=trigger)[0]
    for outcome in results:
        if outcome.error is not None:
            raise outcome.error
    return results


def claim_until_batch(
    jobs: Sequence[Job], deps: Deps, until: datetime, *, trigger: Trigger = Trigger.SCHEDULE
) -> list[list[ClaimResult]]:
    """Claim every slot of each job due at or before ``until``, in rounds of :func:`claim_batch`, each claim
    taking every slot due by ``until`` up to MAX_SLOTS_PER_CLAIM (so almost always one round): a job whose
    next fire after a round is still within ``until`` is in the next round. A job leaves the rounds when its
    next fire lies beyond ``until``, when it is finished, when another claimer moved it on (its claim covers
    the rest), or after MAX_SLOTS_PER_PASS slots. Returns each job's claims, in order."""
    results: list[list[ClaimResult]] = [[] for _ in jobs]
    current = [
        (i, job) for i, job in enumerate(jobs) if job.next_fire_at is not None and job.next_fire_at <= until
    ]
    while current:
        outcomes = claim_batch([job for _, job in current], deps, trigger=trigger, until=until)
        following: list[tuple[int, Job]] = []
        for (i, job), outcome in zip(current, outcomes, strict=True):
            results[i].append(outcome)
            nxt = outcome.next_fire_at
            more = (
                nxt is not None and nxt <= until and sum(len(r.runs) for r in results[i]) < MAX_SLOTS_PER_PASS
            )
            if outcome.advanced and outcome.error is None and more:
                following.append((i, job.model_copy(update={"next_fire_at": nxt})))
        current = following
    return results


def tick(
    shard: int,
    deps: Deps,
    *,
    owner: str | None = None,
    processes: int | None = None,
    child_timeout_seconds: float | None = None,
) -> TickResult:
    """Claim every run of ``shard`` due within the lookahead (now + tick period + margin).

    The tick first reads the shard's due index; with nothing due by ``until`` it is done, having written
    nothing (a quiet shard's tick costs its due keys' queries alone). Otherwise it takes the shard's lease
    (one tick per shard at a time; a dead tick's lease lapses after one tick period); if another tick holds
    it, this one does nothing more (``result.busy``). Correctness never depends on the lease: every claim is
    conditional, so jobs read before the lease was taken are claimed like any other (what another tick
    claimed meanwhile counts as ``already_claimed`` or not advanced; a slot past that tick's lookahead is
    claimed here, its second wake-up message rejected at the start). The due jobs are claimed in batches of
    ``settings.claim_batch_size`` (:func:`claim_until_batch`), up to ``settings.claim_concurrency`` batches
    at once (threads; claims of different jobs touch different items, and two claims of one job race only
    on conditional writes, as two ticks would). One failing job never stops the others: a batch that fails
    is claimed again job by job, and a job whose own claim fails is logged and counted; the next tick
    retries it.

    With ``processes`` (default ``settings.tick_processes``) above 1, this process holds the lease and forks
    that many child processes, child ``i`` claiming part ``i`` of the shard's due jobs
    (``store.query_due(shard, until, part=i, parts=processes)``: disjoint parts, so no job is claimed by two
    children) with its own threads as above and its own AWS clients (created after the fork:
    :mod:`duetime.adapters.aws.clients`). Each sends its :class:`TickResult` back through a pipe
    (``multiprocessing.Pipe``: Lambda has no ``/dev/shm`` for the semaphores of ``multiprocessing.Queue``
    and ``Pool``), and the counts are added up. A child that crashes, or is still claiming after
    ``child_timeout_seconds`` (default: one tick period, the lease) and is killed, adds 1 to ``errors`` and
    loses no run: the claims it made stand (each step is conditional and idempotent), and the next tick
    claims what it left due, finding any run it wrote but did not advance (``already_claimed``).

    Returns:
        the tick's counts (:class:`TickResult`).

    Raises:
        the store's faults of the first read of the due index or of taking the lease (nothing claimed), or
        of releasing it (everything claimed stands).
    """
    now = deps.clock.now()
    until = now + timedelta(seconds=deps.settings.tick_lookahead_seconds)
    result = TickResult(shard=shard)
    me = owner or f"tick-{uuid.uuid4().hex[:12]}"
    width = processes or deps.settings.tick_processes
    # the first due job, if any: with one process the claims go on from this very read; with several each
    # child reads its own part, so this read only asks whether anything is due (one job per request)
    due = iter(deps.store.query_due(shard, until, page_size=None if width == 1 else 1))
    first = next(due, None)
    if first is None:
        return result
    if not deps.store.acquire_shard_lease(
        shard, owner=me, now=deps.clock.now(), lease_seconds=deps.settings.tick_period_seconds
    ):
        result.busy = True
        return result
    try:
        if width == 1:
            result.merge(claim_due(shard, deps, until, due=chain([first], due)))
        else:
            timeout = child_timeout_seconds
            result.merge(
                _claim_in_processes(
                    shard,
                    deps,
                    until,
                    width,
                    deps.settings.tick_period_seconds if timeout is None else timeout,
                )
            )
    finally:
        deps.store.release_shard_lease(shard, owner=me, now=deps.clock.now())
    return result


def _claim_in_processes(
    shard: int, deps: Deps, until: datetime, processes: int, timeout: float
) -> TickResult:
    """Fork ``processes`` children, child ``i`` claiming part ``i`` of the shard (:func:`claim_due`); wait at
    most ``timeout`` seconds for all; their counts added up, plus 1 error per child that could not be
    forked (its part waits for the next tick), crashed, or was killed for running past the timeout."""
    context = multiprocessing.get_context("fork")  # the children inherit deps; no re-import, no pickling
    result = TickResult(shard=shard)
    children: dict[Connection, BaseProcess] = {}
    for part in range(processes):
        receiver, sender = context.Pipe(duplex=False)
        forked = context.Process(
            target=_claim_part,
            args=(sender, shard, deps, until, part, processes),
            name=f"tick-{shard}-{part}",
            daemon=True,
        )
        try:
            forked.start()
        except OSError:  # out of processes or memory: the other parts are still claimed
            logger.exception("claiming process not started", extra={"shard": shard, "part": part})
            result.errors += 1
            receiver.close()
            continue
        finally:
            sender.close()  # the child's end: its exit (or crash) ends our reads
        children[receiver] = forked
    deadline = time.monotonic() + timeout
    pending = dict(children)
    while pending and (left := deadline - time.monotonic()) > 0:
        for ready in wait_readable(list(pending), timeout=left):
            assert isinstance(ready, Connection)
            child = pending.pop(ready)
            try:
                part_result = ready.recv()
            except (EOFError, OSError):  # died before it sent its counts
                part_result = None
            if isinstance(part_result, TickResult):
                result.merge(part_result)
            else:
                logger.error("claiming process lost", extra={"shard": shard, "claimer": child.name})
                result.errors += 1
    for child in pending.values():
        logger.error("claiming process killed: past its time", extra={"shard": shard, "claimer": child.name})
        child.kill()
        result.errors += 1
    # one deadline for every child's exit (a child still alive after it is killed: none outlives the tick)
    exit_by = time.monotonic() + CHILD_EXIT_SECONDS
    for receiver, child in children.items():
        child.join(timeout=max(0.0, exit_by - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join(timeout=1)
        receiver.close()
    return result


def _claim_part(sender: Connection, shard: int, deps: Deps, until: datetime, part: int, parts: int) -> None:
    """A child process of a tick: claim part ``part`` of ``parts`` of the shard and send the counts."""
    try:
        outcome = claim_due(shard, deps, until, part=part, parts=parts)
    except Exception:  # noqa: BLE001 - the parent counts it as an error; the next tick retries
        logger.exception("claiming process failed", extra={"shard": shard, "part": part})
        outcome = TickResult(shard=shard, errors=1)
    sender.send(outcome)
    sender.close()


def claim_due(
    shard: int,
    deps: Deps,
    until: datetime,
    *,
    part: int = 0,
    parts: int = 1,
    due: Iterator[Job] | None = None,
) -> TickResult:
    """Claim the runs of ``shard`` due by ``until`` (UTC), of part ``part`` of ``parts`` of its due jobs
    (``store.query_due``; or ``due``, that query already begun), without the shard's lease (:func:`tick`
    holds it): batches of ``settings.claim_batch_size``, up to ``settings.claim_concurrency`` at once
    (threads).

    Returns:
        the counts (``busy`` never set).

    Raises:
        the store's faults of querying the due index (the claims made so far stand).
    """
    result = TickResult(shard=shard)

    def claim_one(job: Job) -> list[ClaimResult] | None:
        try:
            return claim_until(job, deps, until)
        except Exception:  # noqa: BLE001 - isolate one job's fault from the shard
            logger.exception("claim failed", extra={"job_id": job.job_id, "shard": shard})
            return None

    def claim_chunk(chunk: list[Job]) -> list[list[ClaimResult] | None]:
        try:
            return list(claim_until_batch(chunk, deps, until))
        except Exception:  # noqa: BLE001 - one job's fault must not cost the others their claims
            if len(chunk) == 1:
                logger.exception("claim failed", extra={"job_id": chunk[0].job_id, "shard": shard})
                return [None]
            # the steps done stay done (each is idempotent): claim each job alone, isolating the fault
            logger.warning("batch claim failed; claiming its jobs one by one", exc_info=True)
            return [claim_one(job) for job in chunk]

    def add(outcomes: list[ClaimResult] | None) -> None:
        if outcomes is None:
            result.errors += 1
            return
        if any(outcome.error is not None for outcome in outcomes):
            result.errors += 1
        for outcome in outcomes:
            result.claimed += outcome.created
            result.already_claimed += len(outcome.runs) - outcome.created
            result.missed += outcome.missed
            result.run_ids.extend(r.run_id for r in outcome.runs)
            result.not_advanced += 0 if outcome.advanced else 1

    def chunks() -> Iterator[list[Job]]:
        jobs = due if due is not None else iter(deps.store.query_due(shard, until, part=part, parts=parts))
        while chunk := list(islice(jobs, deps.settings.claim_batch_size)):
            yield chunk

    width = deps.settings.claim_concurrency
    if width == 1:
        for chunk in chunks():
            for outcomes in claim_chunk(chunk):
                add(outcomes)
    else:
        with ThreadPoolExecutor(max_workers=width, thread_name_prefix=f"claim-{shard}") as pool:
            pending: set[Future[list[list[ClaimResult] | None]]] = set()
            for chunk in chunks():
                if len(pending) >= 2 * width:  # bounded: the due index may hold many pages
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        for outcomes in future.result():
                            add(outcomes)
                pending.add(pool.submit(claim_chunk, chunk))
            for future in pending:
                for outcomes in future.result():
                    add(outcomes)
    return result
