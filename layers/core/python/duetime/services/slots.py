"""A job's slots: every fire time its schedule expected in a window, with what became of it ("did it run?").

A **slot** is one due time of the job's schedule. Its outcome comes from the run claimed for it, if any:

- ``ran``: the run started (any state from RUNNING on, or a retry waiting); with its run id, state and lag
  (seconds from the due time to attempt 1's start: :func:`~duetime.domain.api_models.schedule_lag`);
- ``skipped``: the run ended SKIPPED without starting, with its reason (``overlap``, ``paused``,
  ``starting_deadline_exceeded``, ``deleted``, ``schedule_changed``), or was cancelled before it started
  (``cancelled``);
- ``missed``: skipped by the catch-up policy (a SKIPPED run with reason ``missed``), or a past slot that
  never got a run (an outage longer than the catch-up window, or a slot the catch-up policy dropped
  without a run); a slot due in one of the job's last pauses (``Job.pauses``) that the resume's catch-up
  dropped is ``skipped`` (``paused``) whether it was claimed ahead or not;
- ``pending``: its run is claimed but not started yet, or it is due and not claimed yet (the tick claims
  up to a tick period ahead; a paused job's slots wait for the resume, whose catch-up policy decides);
- ``upcoming``: due later than now (reason ``paused`` while the job is paused: it runs only if resumed).

Slots before the job's last schedule change (``Job.schedule_changed_at``) are the runs recorded then (the
current schedule never produced them); from it on, the current schedule's fires, each matched with its run,
and the runs the old schedule had claimed ahead past the change (``skipped``, ``schedule_changed``).
A catch-up run of a missed slot (trigger ``backfill``) is that slot's run; runs that are not slots (manual
triggers, retries sent as runs, runs a timeout triggered) are left out (:data:`~duetime.domain.admission.SLOT_TRIGGERS`,
the triggers pause, schedule changes and catch-up apply to). A DELETED job
has no slots after its deletion. Newest first, paged like the other listings.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from duetime.domain.admission import SLOT_TRIGGERS, schedule_of
from duetime.domain.api_models import schedule_lag
from duetime.domain.errors import PageTokenError, RequestFieldError
from duetime.domain.models import Job, JobState, Run, RunState
from duetime.domain.timeutil import from_epoch_ms, to_epoch_ms
from duetime.services.deps import Deps
from duetime.services.jobs import get_job

#: the window a request without ``since`` looks back over; without ``until`` it ends now (the question is
#: "did it run?": the past; ask for ``until`` in the future to see upcoming slots too)
DEFAULT_LOOKBACK = timedelta(hours=24)
#: runs read per store page while matching slots
_RUNS_PAGE = 100
_MS = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Slot:
    """One expected fire time and its outcome (see the module docstring). Instants UTC."""

    due_at: datetime
    outcome: str
    run_id: str | None = None
    state: RunState | None = None
    reason: str | None = None
    lag_seconds: float | None = None


def _encode(job_id: str, cursor: datetime) -> str:
    """A page token: the job's id and the cursor (the last slot's due time); a token of another job's
    listing is refused. It carries nothing secret: forged, it only moves the window's end earlier."""
    return base64.urlsafe_b64encode(f"slots:{job_id}:{to_epoch_ms(cursor)}".encode()).decode().rstrip("=")


def _decode(job_id: str, token: str) -> datetime:
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        kind, owner, ms = text.split(":")
        if kind != "slots" or not ms.isascii() or not ms.isdigit() or str(int(ms)) != ms:
            raise ValueError(text)  # only the spelling _encode writes: ASCII digits, no leading zero
        cursor = from_epoch_ms(int(ms))
    except (ValueError, binascii.Error, UnicodeDecodeError, OverflowError, OSError):
        raise PageTokenError("next_token: not a token of this listing") from None
    if owner != job_id:
        raise PageTokenError("next_token: a token of another job's slots; start again without it")
    return cursor


def _fires(job: Job, since: datetime, before: datetime, boundary: datetime) -> Iterator[datetime]:
    """The current schedule's fires in ``[since, before)`` and after ``boundary``, newest first."""
    schedule = schedule_of(job)
    if schedule is None:
        return
    at = schedule.latest_at_or_before(before - _MS)
    # a schedule's first slot is strictly after the job's creation or the change that set it
    while at is not None and at >= since and at > boundary:
        yield at
        at = schedule.latest_at_or_before(at - _MS)


def _slot_runs(job: Job, since: datetime, before: datetime, want: int, deps: Deps) -> list[Run]:
    """Up to ``want`` of the job's slot runs due in ``[since, before)``, newest first."""
    found: list[Run] = []
    token: str | None = None
    until = before - _MS
    if until < since:
        return []
    while True:
        page, token = deps.store.query_runs(
            job.job_id, limit=_RUNS_PAGE, page_token=token, since=since, until=until
        )
        found.extend(r for r in page if r.trigger in SLOT_TRIGGERS)
        if len(found) >= want or token is None:
            return found[:want]


def _outcome(run: Run) -> Slot:
    """A recorded run's slot."""
    started = bool(run.attempts) or run.started_at is not None
    if run.state is RunState.SKIPPED:
        reason = run.error or "skipped"
        return Slot(run.due_at, "missed" if reason == "missed" else "skipped", run.run_id, run.state, reason)
    if run.state is RunState.CANCELLED and not started:
        return Slot(run.due_at, "skipped", run.run_id, run.state, "cancelled")
    if run.state is RunState.PENDING and not started:
        return Slot(run.due_at, "pending", run.run_id, run.state, run.held)
    return Slot(run.due_at, "ran", run.run_id, run.state, lag_seconds=schedule_lag(run))


def _unclaimed(job: Job, due_at: datetime, now: datetime) -> Slot:
    """A slot no run was recorded for."""
    if due_at > now:
        # a paused job's later slots run only if it is resumed in time
        return Slot(due_at, "upcoming", reason="paused" if job.state is JobState.PAUSED else None)
    if job.state is JobState.PAUSED and job.paused_at is not None and due_at >= job.paused_at:
        return Slot(due_at, "pending", reason="paused")  # the resume's catch-up policy decides
    if job.next_fire_at is not None and due_at >= job.next_fire_at:
        return Slot(due_at, "pending")  # due, not claimed yet (the tick is behind, or the stack was down)
    if any(p.paused_at <= due_at < p.resumed_at for p in job.pauses):
        return Slot(due_at, "skipped", reason="paused")  # due in a pause, dropped by the resume's catch-up
    return Slot(due_at, "missed")


def list_slots(
    job_id: str,
    *,
    tenant: str,
    deps: Deps,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 50,
    next_token: str | None = None,
) -> tuple[list[Slot], str | None]:
    """The caller's job's slots due in ``[since, until]`` (UTC; default the last 24 h up to now), newest
    first, ``limit`` to a page, and the next page's token (None on the last page).

    Raises:
        NotFoundError: the job is absent or another tenant's.
        PageTokenError: ``next_token`` is not a token of this job's slots.
        RequestFieldError: ``until`` is before ``since``.
    """
    job = get_job(job_id, tenant=tenant, deps=deps)
    now = deps.clock.now()
    until = until or now
    since = since or min(until, now) - DEFAULT_LOOKBACK
    if until < since:
        raise RequestFieldError("until: before since; the window would be empty", "until")
    before = until + _MS  # exclusive
    if next_token is not None:
        before = min(before, _decode(job.job_id, next_token))
    if job.state is JobState.DELETED:
        before = min(before, job.updated_at + _MS)
    # the current schedule's slots start at its last change (or the job's creation)
    boundary = job.schedule_changed_at or job.created_at
    fires = []
    for at in _fires(job, since, before, boundary):
        fires.append(at)
        if len(fires) > limit:
            break
    runs = _slot_runs(job, since, before, limit + 1, deps)
    by_due = {run.due_at: run for run in runs}
    dues = sorted(set(fires) | set(by_due), reverse=True)
    page = dues[:limit]
    slots = [_outcome(by_due[d]) if d in by_due else _unclaimed(job, d, now) for d in page]
    # each source gave its newest limit + 1 (or all it has), so the union's newest limit are right, and more
    # than limit of them means another page
    token = _encode(job.job_id, page[-1]) if len(dues) > limit else None
    return slots, token
