"""A tenant's schedule lag per minute over a recent window, from the runs the stack already writes.

No rollup is kept: :func:`tenant_lag` reads the tenant's jobs (pages of the job listing) and each job's runs
due in the window (one Query per job and page of runs), then buckets them by minute. The reads grow with the
tenant's jobs, so at most ``max_jobs`` jobs are read (the newest first); :class:`TenantLag` says whether the
figures cover every job.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from duetime.domain.models import Run, RunState
from duetime.services.deps import Deps
from duetime.services.jobs import list_jobs

#: jobs the window's runs are read from at most (one Query each, at least)
MAX_JOBS = 500
#: runs of one job read per Query
_RUNS_PAGE = 100
#: Queries of runs made side by side
_READERS = 8
_FAILED = frozenset({RunState.FAILED, RunState.TIMED_OUT})


@dataclass(frozen=True)
class MinuteLag:
    """One minute of the window (``minute``: its start, UTC).

    ``started``: runs whose first attempt started in the minute; ``failed``: runs that ended FAILED or
    TIMED_OUT in it; ``p50_seconds``/``p99_seconds``: nearest-rank percentiles of the schedule lag (seconds
    from due time to the first attempt's start) of the runs started in it, None when none started.
    """

    minute: datetime
    started: int = 0
    failed: int = 0
    p50_seconds: float | None = None
    p99_seconds: float | None = None


@dataclass(frozen=True)
class TenantLag:
    """The window's minutes, oldest first, and what they were computed from."""

    since: datetime
    until: datetime
    minutes: list[MinuteLag] = field(default_factory=list)
    jobs_read: int = 0
    complete: bool = True  # False: the tenant has more than ``max_jobs`` jobs, the others were not read

    @property
    def started(self) -> int:
        return sum(m.started for m in self.minutes)

    @property
    def failed(self) -> int:
        return sum(m.failed for m in self.minutes)


def _rank(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def _first_start(run: Run) -> datetime | None:
    first = next((a for a in run.attempts if a.attempt == 1 and a.started_at is not None), None)
    return first.started_at if first is not None else run.started_at


def bucket(runs: Iterable[Run], *, since: datetime, until: datetime) -> list[MinuteLag]:
    """Per-minute figures of ``runs`` for the minutes from ``since`` (floored to its minute) to ``until``,
    oldest first (pure: the runs' own times decide)."""
    start = since.replace(second=0, microsecond=0)
    count = max(1, math.ceil((until - start).total_seconds() / 60))
    lags: list[list[float]] = [[] for _ in range(count)]
    failed = [0] * count

    def index(at: datetime) -> int | None:
        i = int((at - start).total_seconds() // 60)
        return i if 0 <= i < count and since <= at <= until else None

    for run in runs:
        started = _first_start(run)
        if started is not None and (i := index(started)) is not None:
            lags[i].append((started - run.due_at).total_seconds())
        if run.state in _FAILED and run.finished_at is not None and (i := index(run.finished_at)) is not None:
            failed[i] += 1
    out = []
    for i in range(count):
        values = sorted(lags[i])
        out.append(
            MinuteLag(
                minute=start + timedelta(minutes=i),
                started=len(values),
                failed=failed[i],
                p50_seconds=_rank(values, 0.50),
                p99_seconds=_rank(values, 0.99),
            )
        )
    return out


def tenant_lag(
    *, tenant: str, deps: Deps, window: timedelta = timedelta(hours=1), max_jobs: int = MAX_JOBS
) -> TenantLag:
    """The caller's per-minute lag, runs started and runs failed over the last ``window`` up to now.

    Reads the tenant's jobs (not DELETED ones), newest first, up to ``max_jobs``, and each one's runs due
    from ``window`` + 1 h before now (a run started in the window may have been due earlier, up to a
    retry's wait) up to now.
    """
    until = deps.clock.now()
    since = until - window
    jobs_found = []
    token: str | None = None
    complete = True
    while True:
        page, token = list_jobs(tenant=tenant, deps=deps, limit=100, next_token=token)
        jobs_found.extend(page)
        if token is None:
            break
        if len(jobs_found) >= max_jobs:
            complete = False
            break
    if len(jobs_found) > max_jobs:
        jobs_found, complete = jobs_found[:max_jobs], False

    def runs_of(job_id: str) -> list[Run]:
        found: list[Run] = []
        page_token: str | None = None
        while True:
            runs, page_token = deps.store.query_runs(
                job_id, limit=_RUNS_PAGE, page_token=page_token, since=since - timedelta(hours=1), until=until
            )
            found.extend(runs)
            if page_token is None:
                return found

    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        runs = [run for found in pool.map(runs_of, [j.job_id for j in jobs_found]) for run in found]
    return TenantLag(
        since=since,
        until=until,
        minutes=bucket(runs, since=since, until=until),
        jobs_read=len(jobs_found),
        complete=complete,
    )
