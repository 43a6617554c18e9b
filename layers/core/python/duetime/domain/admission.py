"""Whether a claimed run still runs: the rules of DESIGN.md section 5, pure (no I/O).

A run claimed ahead is a promise made early (the tick claims up to one tick period plus a margin ahead):
whatever changed its job since the claim decides, when the run is about to start, whether it still runs.

- **deleted**: the job is gone or DELETED -> ``SKIPPED`` (reason ``deleted``).
- **schedule changed**: a schedule slot due after the change whose due time is not a slot of the job's
  current schedule -> ``SKIPPED`` (``schedule_changed``). A slot the new schedule shares with the old one
  still runs, and so does one due before the change (its wake-up was only late).
- **paused**: a schedule slot of a PAUSED job is held (stays PENDING, out of the queue) until resume, when
  :func:`select_slots` over the held slots decides (the rest end ``SKIPPED``, ``paused``).
- **catch-up**: a slot is *missed* when its run would start more than ``catch_up.tolerance_seconds`` after
  its due time; the policy keeps none (``none``), the newest (``latest``) or the ``max_runs`` newest
  (``all``) of the job's missed slots; the others end ``SKIPPED`` (``missed``).

Only a run's first attempt is checked (a retry belongs to a run that already started: runs in flight
continue), and only schedule slots (trigger ``schedule`` or ``backfill``) are subject to pause, schedule
changes and catch-up: a manual run, or one a timeout handler triggered, runs unless its job is deleted.
The starting deadline (``starting_deadline_seconds``) is enforced by the conditional start itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache

from duetime.domain.models import MAX_YEAR, CatchUpPolicy, Job, JobState, JobSummary, ScheduleSpec, Trigger
from duetime.domain.schedules import Schedule, parse_schedule
from duetime.domain.timeutil import truncate_ms

#: triggers whose runs are slots of the job's schedule (pause, schedule changes and catch-up apply)
SLOT_TRIGGERS = frozenset({Trigger.SCHEDULE, Trigger.BACKFILL})


def parse_spec(spec: ScheduleSpec, anchor: datetime, *, stored: bool = False) -> Schedule:
    """The schedule a job's ``schedule`` field describes, a ``rate`` counting from ``anchor`` (UTC): the one
    way every caller parses it (submit, PATCH, claims, the start's re-check).

    Raises:
        ScheduleError: naming the ``schedule.*`` field at fault (``stored`` skips rules added for submits
            since the job was stored: see :func:`duetime.domain.schedules.parse_schedule`).
    """
    return parse_schedule(
        spec.expression,
        spec.timezone,
        anchor=anchor,
        dst_policy=spec.dst_policy,
        start_at=spec.start_at,
        end_at=spec.end_at,
        stored=stored,
    )


@lru_cache(maxsize=4096)
def _cached_schedule(spec: ScheduleSpec, anchor: datetime) -> Schedule:
    return parse_spec(spec, anchor, stored=True)


def schedule_of(job: Job | JobSummary) -> Schedule | None:
    """The parsed schedule of ``job`` (None for a run-now job). Parsing is cached per process."""
    if job.schedule is None:
        return None
    return _cached_schedule(job.schedule, job.anchor)


def next_fire_after(job: Job, instant: datetime) -> datetime | None:
    """The job's first fire strictly after ``instant`` (UTC, ms precision), or None if it never fires again
    within the instants Duetime accepts (years up to ``MAX_YEAR``, 2199: EventBridge Scheduler's range, as for
    every other instant of a job; a ``rate(100000 days)`` has none)."""
    schedule = schedule_of(job)
    if schedule is None:
        return None
    nxt = schedule.next_after(instant)
    if nxt is None or nxt.astimezone(UTC).year > MAX_YEAR:
        return None
    return truncate_ms(nxt)


class Verdict(StrEnum):
    """What to do with a run about to start."""

    START = "start"
    HOLD = "hold"
    SKIP = "skip"


#: reasons a run ends SKIPPED at its start (its ``error`` and its ``skipped`` event's reason)
DELETED = "deleted"
SCHEDULE_CHANGED = "schedule_changed"
MISSED = "missed"
PAUSED = "paused"


@dataclass(frozen=True)
class Admission:
    """The verdict on one run and, for SKIP, why (one of the reasons above)."""

    verdict: Verdict
    reason: str | None = None


def is_missed(due_at: datetime, now: datetime, policy: CatchUpPolicy) -> bool:
    """True when a run due at ``due_at`` starting at ``now`` starts more than the tolerance late."""
    return (now - due_at).total_seconds() > policy.tolerance_seconds


def _allowed(policy: CatchUpPolicy) -> int:
    """How many of the newest missed slots the policy runs."""
    return {"none": 0, "latest": 1, "all": policy.max_runs}[policy.policy]


def select_slots(slots: Sequence[datetime], policy: CatchUpPolicy) -> tuple[list[datetime], list[datetime]]:
    """Split missed (or held) ``slots`` into (kept, dropped) by the catch-up policy, each oldest first.

    ``none`` keeps nothing, ``latest`` the newest slot, ``all`` the ``max_runs`` newest.
    """
    ordered = sorted(slots)
    n = _allowed(policy)
    cut = len(ordered) - n if n < len(ordered) else 0
    return ordered[cut:], ordered[:cut]


#: most newer slots :func:`keeps_missed` walks past settled ones before it calls the slot far behind
MAX_NEWER_WALKED = 1000


def keeps_missed(
    due_at: datetime,
    now: datetime,
    policy: CatchUpPolicy,
    schedule: Schedule | None,
    settled: frozenset[datetime] = frozenset(),
) -> bool:
    """Whether the catch-up policy runs the missed slot ``due_at``, starting at ``now``.

    It does when fewer than the policy's allowance of the job's *newer* slots are missed too and still to
    be decided: a newer slot in ``settled`` (its run already started, ended or was skipped, e.g. it ran on
    time while this one's wake-up was lost, or an overlap policy skipped it while this one waited) does not
    count. Without a schedule (a run-now job) there are no newer slots: the policy ``none`` still drops it.
    """
    allowed = _allowed(policy)
    if allowed == 0:
        return False
    competing = 0
    cursor: datetime | None = due_at
    for _ in range(MAX_NEWER_WALKED):
        cursor = schedule.next_after(cursor) if schedule is not None and cursor is not None else None
        if cursor is None or not is_missed(truncate_ms(cursor), now, policy):
            return True
        if truncate_ms(cursor) not in settled:
            competing += 1
            if competing >= allowed:
                return False
    return False


def is_slot(due_at: datetime, schedule: Schedule) -> bool:
    """True when ``due_at`` (UTC, ms) is a fire time of ``schedule``."""
    nxt = schedule.next_after(due_at - timedelta(milliseconds=1))
    return nxt is not None and truncate_ms(nxt) == due_at


def obsolete_slot(job: Job, due_at: datetime, schedule: Schedule | None) -> bool:
    """True for a slot claimed for an instant after the job's last schedule change that the current
    schedule does not fire at (the old schedule's run claimed ahead)."""
    changed_at = job.schedule_changed_at
    return (
        schedule is not None
        and changed_at is not None
        and due_at > changed_at
        and not is_slot(due_at, schedule)
    )


def admit(
    *,
    job: Job | None,
    due_at: datetime,
    trigger: Trigger,
    attempt: int,
    now: datetime,
    schedule: Schedule | None,
    job_created_at: datetime | None = None,
) -> Admission:
    """The verdict on starting a run of ``job`` due at ``due_at`` now.

    Args:
        job: the run's job as stored now (None if it is gone).
        due_at: the run's due time (UTC, ms).
        trigger: why the run exists.
        attempt: the attempt about to start (only attempt 1 is checked).
        now: the start time (UTC).
        schedule: the job's parsed current schedule (None for a run-now job).
        job_created_at: the ``created_at`` of the job the run was claimed for (None: not recorded); a job
            of the same id created at another time (deleted and submitted again, or a submit that failed
            after writing its runs) does not own the run: SKIP, ``deleted``.
    """
    if attempt != 1:
        return Admission(Verdict.START)
    if job is None or job.state is JobState.DELETED:
        return Admission(Verdict.SKIP, DELETED)
    if job_created_at is not None and truncate_ms(job.created_at) != truncate_ms(job_created_at):
        return Admission(Verdict.SKIP, DELETED)
    if trigger not in SLOT_TRIGGERS:
        return Admission(Verdict.START)
    if obsolete_slot(job, due_at, schedule):
        return Admission(Verdict.SKIP, SCHEDULE_CHANGED)
    if job.state is JobState.PAUSED:
        return Admission(Verdict.HOLD, PAUSED)
    if schedule is None:  # a run-now job: its one run is never dropped for lateness
        return Admission(Verdict.START)
    if is_missed(due_at, now, job.catch_up) and not keeps_missed(due_at, now, job.catch_up, schedule):
        return Admission(Verdict.SKIP, MISSED)
    return Admission(Verdict.START)
