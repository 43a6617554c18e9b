"""How long a run stays in the hot store, and what the archive holds (issue 19; pure, no I/O).

Three tiers decide when a finished run leaves the hot store (DynamoDB's TTL on AWS, the local archiver on
the embedded store) for the archive:

- every finished run: ``hot_days`` after it finished (``DUETIME_RUN_RETENTION_DAYS``, default 14);
- a FAILED, TIMED_OUT or dead-lettered run: ``failed_days`` (``DUETIME_FAILED_RUN_RETENTION_DAYS``, 90);
- the last ``keep_last`` runs of every job (``DUETIME_KEEP_LAST_RUNS``, 20) stay hot whatever their age.

The first two are a row's ``expires_at``, computed from the row at every write (the end of a run writes its
row anyway, so the tier costs no extra write unit). The third cannot be a TTL (a run's rank changes as newer
runs arrive), so it is applied lazily by the archiver: a run whose TTL came due while it is still among its
job's last ``keep_last`` is not archived but re-armed (:meth:`RetentionPolicy.rearmed`). A row written before
the tiers (TTL due + 90 days) keeps its TTL: it is honoured, not migrated.

Days are floats: ``0.001`` is 86.4 s, so the archive can be tried live.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from duetime.domain.models import Run, RunState

#: a run in one of these states is finished: it may leave the hot store
FINISHED_STATES: frozenset[RunState] = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.TIMED_OUT, RunState.CANCELLED, RunState.SKIPPED}
)
#: finished states kept hot for the failed tier
FAILED_STATES: frozenset[RunState] = frozenset({RunState.FAILED, RunState.TIMED_OUT})


def is_failure(run: Run) -> bool:
    """Whether ``run`` belongs to the failed tier: FAILED, TIMED_OUT or dead-lettered."""
    return run.state in FAILED_STATES or run.dead_lettered


@dataclass(frozen=True)
class RetentionPolicy:
    """The hot window's tiers (see the module docstring)."""

    hot_days: float = 14.0
    failed_days: float = 90.0
    keep_last: int = 20

    def __post_init__(self) -> None:
        if self.hot_days <= 0 or self.failed_days <= 0:
            raise ValueError("retention days must be positive")
        if self.keep_last < 0:
            raise ValueError("keep_last must be at least 0")

    def tier_days(self, run: Run) -> float:
        """The days ``run`` stays hot once finished: ``failed_days`` for a failure, else ``hot_days``."""
        return self.failed_days if is_failure(run) else self.hot_days

    def expires_at(self, run: Run) -> datetime:
        """When ``run``'s row may leave the hot store (its TTL): :meth:`expires_for` of its fields."""
        return self.expires_for(
            run.state, due_at=run.due_at, finished_at=run.finished_at, dead_lettered=run.dead_lettered
        )

    def expires_for(
        self, state: RunState, *, due_at: datetime, finished_at: datetime | None, dead_lettered: bool
    ) -> datetime:
        """The TTL of a run row of these fields (what an adapter computes at each write of a row).

        A finished run: its finish (or, if it never started, its due time) plus its tier's days. A run not
        finished yet: its due time plus the longer tier, a bound its end's write replaces (a run never
        reaches it unless it is stuck for that long; the archiver never archives an unfinished run)."""
        if state in FINISHED_STATES:
            failed = state in FAILED_STATES or dead_lettered
            return (finished_at or due_at) + timedelta(days=self.failed_days if failed else self.hot_days)
        return due_at + timedelta(days=max(self.hot_days, self.failed_days))

    def archivable(self, run: Run, *, now: datetime, rank: int, expires_at: datetime | None = None) -> bool:
        """Whether ``run`` leaves the hot store at ``now``: finished, its TTL (``expires_at``, default the one
        this policy gives it; a row written under an older rule keeps its own) reached, and not among its
        job's last ``keep_last`` runs (``rank`` 0 is the job's newest)."""
        if run.state not in FINISHED_STATES or rank < self.keep_last:
            return False
        return (expires_at or self.expires_at(run)) <= now

    def rearmed(self, now: datetime) -> datetime:
        """The TTL given to a run kept hot by the keep-last rule when its own came due: one hot window on,
        when it is looked at again (by then newer runs may have pushed it out of the last N)."""
        return now + timedelta(days=self.hot_days)
