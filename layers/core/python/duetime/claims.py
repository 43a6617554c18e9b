"""Claiming due runs: the hot path of DESIGN.md section 4 (no transactions).

For each due job: (1) conditional put of the run ``(job_id, due_at)``; (2) conditional advance of the job's
``next_fire_at``; (3) SendMessage to the tier's queue with ``DelaySeconds = ceil(due_at - now)``. Each step is
idempotent on its own; a crash between two steps is repaired by the next tick (step 1 finds the run, step 2
advances) or by the sweeper (a PENDING run past due + grace is re-sent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache

from duetime.deps import Deps
from duetime.errors import AlreadyClaimedError, StaleClaimError
from duetime.models import Job, Run, RunMessage, RunState, Trigger
from duetime.observability import logger
from duetime.queue import delay_seconds
from duetime.schedules import Schedule, parse_schedule
from duetime.timeutil import truncate_ms

#: Upper bound on missed slots counted when catching up (counting walks the schedule).
MAX_COUNTED_MISSED_SLOTS = 1000


@lru_cache(maxsize=4096)
def _cached_schedule(
    expression: str, timezone: str, anchor: datetime, start_at: datetime | None, end_at: datetime | None
) -> Schedule:
    return parse_schedule(expression, timezone, anchor=anchor, start_at=start_at, end_at=end_at)


def schedule_of(job: Job) -> Schedule | None:
    """The parsed schedule of ``job`` (None for a run-now job). Parsing is cached per process."""
    if job.schedule is None:
        return None
    spec = job.schedule
    return _cached_schedule(spec.expression, spec.timezone, job.anchor, spec.start_at, spec.end_at)


def next_fire_after(job: Job, instant: datetime) -> datetime | None:
    """The job's first fire strictly after ``instant`` (UTC, ms precision), or None if it never fires again."""
    schedule = schedule_of(job)
    if schedule is None:
        return None
    nxt = schedule.next_after(instant)
    return truncate_ms(nxt) if nxt is not None else None


@dataclass(frozen=True)
class ClaimResult:
    """What one claim did. ``created`` is False when the run already existed (an earlier claim)."""

    run: Run
    created: bool
    advanced: bool
    next_fire_at: datetime | None


def new_run(job: Job, due_at: datetime, deps: Deps, *, trigger: Trigger, missed_slots: int = 0) -> Run:
    """A fresh PENDING run of ``job`` at ``due_at``, watched from ``due_at + pending_grace``."""
    now = deps.clock.now()
    return Run(
        job_id=job.job_id,
        due_at=due_at,
        tenant=job.tenant,
        shard=job.shard,
        state=RunState.PENDING,
        attempt=1,
        max_attempts=job.retry.max_attempts,
        fencing_token=0,
        trigger=trigger,
        task=job.task,
        timeout_seconds=job.timeout_seconds,
        retry=job.retry,
        watch_at=max(due_at, now) + timedelta(seconds=deps.settings.pending_grace_seconds),
        missed_slots=missed_slots,
        created_at=now,
    )


def claim(job: Job, deps: Deps, *, trigger: Trigger = Trigger.SCHEDULE) -> ClaimResult:
    """Claim the job's current ``next_fire_at`` slot through the three steps.

    Catch-up (default policy ``latest``): if the stored slot is more than one tick period in the past (the
    stack was down), the most recent slot at or before now is claimed instead and the skipped slots are
    counted on the run (``missed_slots``); the job then continues from its next future slot.

    Args:
        job: the job as read from the due index; ``job.next_fire_at`` must be set.
        deps: store, queues, settings and clock.
        trigger: recorded on the run.

    Returns:
        ClaimResult with the run (as created, or as built if it already existed) and the new next fire.

    Raises:
        ValueError: if the job has no ``next_fire_at``.
        botocore ClientError: on AWS faults other than the expected condition failures (the caller retries
            on its next tick; each step is idempotent).
    """
    if job.next_fire_at is None:
        raise ValueError(f"job {job.job_id} has no next_fire_at to claim")
    now = deps.clock.now()
    claimed = job.next_fire_at
    due_at, missed = claimed, 0
    if (now - claimed).total_seconds() > deps.settings.tick_period_seconds:
        due_at, missed = _catch_up_latest(job, claimed, now)

    run = new_run(job, due_at, deps, trigger=trigger, missed_slots=missed)
    created = True
    try:
        deps.store.put_new_run(run)  # step 1
    except AlreadyClaimedError:
        created = False

    next_fire_at = next_fire_after(job, due_at)
    advanced = True
    try:
        deps.store.advance_job(job.job_id, claimed=claimed, next_fire_at=next_fire_at, now=now)  # step 2
    except StaleClaimError:
        advanced = False

    if created or advanced:
        # step 3; re-sent too when an earlier claim crashed before it (duplicates fail the conditional start)
        deps.queues.send(
            job.task.tier,
            RunMessage(job_id=job.job_id, due_at=due_at, attempt=1),
            delay=delay_seconds(due_at, now),
        )
    logger.debug(
        "run claimed",
        extra={"run_id": run.run_id, "created": created, "advanced": advanced, "missed_slots": missed},
    )
    return ClaimResult(run=run, created=created, advanced=advanced, next_fire_at=next_fire_at)


def _catch_up_latest(job: Job, claimed: datetime, now: datetime) -> tuple[datetime, int]:
    """The most recent slot <= now and how many slots between ``claimed`` and it were skipped."""
    schedule = schedule_of(job)
    if schedule is None:
        return claimed, 0
    latest = schedule.latest_at_or_before(now)
    if latest is None or latest <= claimed:
        return claimed, 0
    latest = truncate_ms(latest)
    missed = 0
    cursor: datetime | None = claimed
    while cursor is not None and cursor < latest and missed < MAX_COUNTED_MISSED_SLOTS:
        missed += 1
        cursor = schedule.next_after(cursor)
    return latest, missed


@dataclass
class TickResult:
    """Counts from one tick of one shard."""

    shard: int
    claimed: int = 0
    already_claimed: int = 0
    not_advanced: int = 0
    errors: int = 0
    run_ids: list[str] = field(default_factory=list)


def tick(shard: int, deps: Deps) -> TickResult:
    """Claim every run of ``shard`` due within the lookahead (now + tick period + margin).

    One failing job never stops the others: its error is logged and counted and the next tick retries it.
    """
    now = deps.clock.now()
    until = now + timedelta(seconds=deps.settings.tick_lookahead_seconds)
    result = TickResult(shard=shard)
    for job in deps.store.query_due(shard, until):
        try:
            outcome = claim(job, deps)
        except Exception:  # noqa: BLE001 - isolate one job's fault from the shard
            logger.exception("claim failed", extra={"job_id": job.job_id, "shard": shard})
            result.errors += 1
            continue
        if outcome.created:
            result.claimed += 1
            result.run_ids.append(outcome.run.run_id)
        else:
            result.already_claimed += 1
        if not outcome.advanced:
            result.not_advanced += 1
    return result
