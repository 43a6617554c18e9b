"""A worker's session: one lease for every run it holds, renewed once per heartbeat interval (DESIGN.md
section 5, "Worker sessions").

A container worker has one session id at a time (``Run.session_id`` of each run it starts). A run's own
lease (``lease_seconds`` from its start) covers it first; only a run held longer than that less two
heartbeat intervals needs the session. So every ``heartbeat_seconds``, while it holds runs, the worker reads
their rows (one batch read, read units only) to learn which were cancelled or fenced (their state or
fencing token changed), marking those lost: their slots kill the tasks and do not finish them; and only if
some held run needs it, it writes the session (created at its first renewal) with the ids of every run it
holds: one write per worker per interval, whatever it runs (the per-run heartbeat it replaced wrote each
run's row; a 60 s run cost 8 write units more than a 1 s run). A worker that only runs short tasks never
writes its session.

The sweeper expires a RUNNING run of a session only once both the run's own lease (from its start) has
passed and the session no longer holds it (:func:`~duetime.domain.lifecycle.lease_held`): expired, revoked,
gone, or its last renewal did not list the run. An expired session is revoked first, so:

- a renewal the store refuses (revoked) fences the worker from every run it held: all are marked lost at
  once, and its next starts are under a new session id;
- a worker that cannot renew (store unreachable) stops its tasks once its own clock passes the end of its
  last renewal's lease (:meth:`WorkerSession.lost`): it cannot know whether the sweeper expired them. A
  worker resumed after a SIGSTOP longer than the lease finds this before its first write, within the half
  second its slots look.

Thread safety: :meth:`hold`, :meth:`release`, :meth:`lost` and :meth:`beat` may be called from any thread
(the worker's session thread starts and renews; its slot threads look and release).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from duetime.config.observability import logger
from duetime.domain.models import Run, RunState, run_id_for
from duetime.services.deps import Deps

#: a renewal that failed (a fault of the store) is tried again this soon, seconds (within the lease)
RENEW_RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class Lost:
    """Why a run the worker held is no longer its own: ``cancelled`` is the run's cancel reason when it was
    cancelled under the worker's token (else None: fenced, expired, or the session ended)."""

    why: str
    cancelled: str | None = None


@dataclass(frozen=True)
class _Held:
    job_id: str
    due_at: datetime
    attempt: int
    fencing_token: int
    #: by the session's ``monotonic``: when the run's own lease ends (``lease_seconds`` after its start)
    until: float


class WorkerSession:
    """The session of one worker process (see the module docstring).

    Args:
        deps: settings (``lease_seconds``: the session's lease; ``heartbeat_seconds``: how often it is
            renewed), the store (its :class:`~duetime.domain.ports.SessionStore` and ``get_runs``), the clock
            (the instants it writes).
        owner: the worker's id (the runs' ``lease_owner``).
        monotonic: seconds of a clock that never steps back, for the worker's own view of its lease's end
            (default :func:`time.monotonic`; the simulation passes its simulated clock).
        new_id: a new session id (default a random ``uuid4().hex``; the simulation's are reproducible).
    """

    def __init__(
        self,
        deps: Deps,
        owner: str,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self.deps = deps
        self.owner = owner
        self._monotonic = monotonic
        self._new_id = new_id
        self._lock = threading.Lock()
        #: the runs started under the session and not yet ended, by run id
        self._held: dict[str, _Held] = {}
        #: held runs found lost (fenced, cancelled, or the session ended), by run id, until released
        self._lost: dict[str, Lost] = {}
        #: starts whose outcome is unknown (a fault of that write), by run id: (key, attempt, session id, ref)
        self._unsure: dict[str, tuple[str, datetime, int, str, object]] = {}
        #: the id the worker's starts record (a new one after a refused renewal)
        self.session_id = new_id()
        #: by ``monotonic``: when the lease of the last successful renewal ends (0: never renewed)
        self._valid_until = 0.0
        #: by ``monotonic``: when the next beat is due (while runs are held)
        self.next_beat = 0.0
        #: renewals written so far (a worker running only short tasks writes none)
        self.renewals = 0

    def now(self) -> float:
        """The session's ``monotonic`` clock, seconds (a start's ``since``)."""
        return self._monotonic()

    # ---- the runs it holds ----------------------------------------------------------------------------
    def hold(self, run: Run, *, since: float | None = None) -> None:
        """Count a run just started under the session as held; ``since`` (by ``monotonic``, default now) is
        when its start was asked for: its own lease runs ``lease_seconds`` from no later than that. The first
        run held after none were puts the next beat one interval ahead."""
        mono = self._monotonic()
        until = (mono if since is None else since) + self.deps.settings.lease_seconds
        with self._lock:
            if not self._held:
                self.next_beat = mono + self.deps.settings.heartbeat_seconds
            self._held[run.run_id] = _Held(run.job_id, run.due_at, run.attempt, run.fencing_token, until)
            self._lost.pop(run.run_id, None)

    def release(self, run_id: str) -> None:
        """The run's attempt ended (recorded, refused as stale, or given up): no longer held."""
        with self._lock:
            self._held.pop(run_id, None)
            self._lost.pop(run_id, None)

    def holding(self) -> int:
        """How many runs the session holds, counting the starts whose outcome is not known yet."""
        with self._lock:
            return len(self._held) + len(self._unsure)

    def unsure(self, job_id: str, due_at: datetime, attempt: int, ref: object) -> None:
        """A start of ``attempt`` under the current session whose outcome is unknown (a fault of its write:
        it may have been applied). The next beat reads the run: if it is RUNNING under this session at
        that attempt, nothing runs it, and :meth:`beat` returns ``ref`` with it so the worker hands it back
        (never left held by a session that lists it to no one)."""
        with self._lock:
            self._unsure[run_id_for(job_id, due_at)] = (job_id, due_at, attempt, self.session_id, ref)

    def lost(self, run_id: str) -> Lost | None:
        """Why the held run ``run_id`` is no longer the worker's, or None while it is: marked lost by a beat,
        or, by the worker's own clock, both its own lease and the session's last renewal ended (a long
        pause, or the store unreachable for a whole lease): it cannot know whether the sweeper expired it."""
        with self._lock:
            lost = self._lost.get(run_id)
            held = self._held.get(run_id)
            if lost is None and held is not None and self._monotonic() >= max(self._valid_until, held.until):
                lost = self._lost[run_id] = Lost("its lease ended without a renewal of its session")
            return lost

    def _fence_all(self, why: str) -> None:
        with self._lock:
            for run_id in self._held:
                self._lost.setdefault(run_id, Lost(why))
        self.session_id = self._new_id()
        self._valid_until = 0.0

    # ---- the beat -------------------------------------------------------------------------------------
    def due(self) -> bool:
        """Whether a beat is due: runs are held (or starts unsure) and ``next_beat`` has come."""
        return self.holding() > 0 and self._monotonic() >= self.next_beat

    def beat(self) -> list[tuple[object, Run]]:
        """Look at the held runs and, if one needs it, renew the session (see the module docstring): mark
        lost the runs whose state or fencing token changed (cancelled, fenced by the timeout handler,
        expired by the sweeper); a refused renewal (revoked) marks every held run lost and takes a new
        session id. A fault is logged and the beat tried again after :data:`RENEW_RETRY_SECONDS`. Never
        raises. Returns the starts found applied after all (:meth:`unsure`): each one's ``ref`` and the run
        as stored, for the worker to hand back."""
        mono = self._monotonic()
        settings = self.deps.settings
        with self._lock:
            held, unsure = dict(self._held), dict(self._unsure)
        if not held and not unsure:
            return []
        self.next_beat = mono + settings.heartbeat_seconds
        orphans = self._look(held, unsure)
        if not any(h.until - mono < 2 * settings.heartbeat_seconds for h in held.values()):
            return orphans  # every held run's own lease lasts two more beats: no write needed yet
        session_id = self.session_id
        try:
            renewed = self.deps.store.renew_session(
                session_id,
                owner=self.owner,
                runs=sorted(held),
                expires_at=self.deps.clock.now() + timedelta(seconds=settings.lease_seconds),
            )
        except Exception as exc:  # noqa: BLE001 - tried again soon; the lease's end by our clock is the limit
            self._log_failure("renewing the worker session failed", exc)
            self.next_beat = mono + min(RENEW_RETRY_SECONDS, settings.heartbeat_seconds)
            return orphans
        if renewed is None:
            logger.warning(
                "worker session revoked: every task it runs is stopped",
                extra={"session_id": session_id, "runs": len(held)},
            )
            self._fence_all("its session was revoked (the sweeper found it expired)")
            return orphans
        self.renewals += 1
        self._valid_until = mono + settings.lease_seconds
        return orphans

    def _look(
        self, held: dict[str, _Held], unsure: dict[str, tuple[str, datetime, int, str, object]]
    ) -> list[tuple[object, Run]]:
        """Read the held runs and the unsure starts' runs; mark lost the held ones no longer RUNNING under
        the worker's token; return the unsure starts that were applied (RUNNING under their session at
        their attempt, lease owner this worker), forgetting the others."""
        keys = [(h.job_id, h.due_at) for h in held.values()] + [(u[0], u[1]) for u in unsure.values()]
        try:
            # eventually consistent (half the read units): a read a moment stale only delays a kill to the
            # next beat (the fencing token, not this read, keeps a stale worker's finish out); an unsure
            # start is read consistently, as a stale read of it would leave an applied start unnoticed
            rows = self.deps.store.get_runs(keys, consistent=bool(unsure))
        except Exception as exc:  # noqa: BLE001 - looked at again at the next beat
            self._log_failure("reading the worker's runs failed", exc)
            return []
        orphans: list[tuple[object, Run]] = []
        for run_id, (job_id, due_at, attempt, session_id, ref) in unsure.items():
            row = rows.get((job_id, due_at))
            with self._lock:
                self._unsure.pop(run_id, None)
            if (
                row is not None
                and row.state is RunState.RUNNING
                and row.attempt == attempt
                and row.session_id == session_id
                and row.lease_owner == self.owner
                and run_id not in held
            ):
                orphans.append((ref, row))
        for run_id, mine in held.items():
            row = rows.get((mine.job_id, mine.due_at))
            if row is not None and row.state is RunState.RUNNING and row.fencing_token == mine.fencing_token:
                continue
            lost = Lost(
                "fencing token superseded" if row is not None else "the run is gone",
                cancelled=_cancel_reason(row, mine),
            )
            with self._lock:
                if run_id in self._held:
                    self._lost.setdefault(run_id, lost)
        return orphans

    def _log_failure(self, what: str, exc: Exception) -> None:
        if self.deps.unreachable(exc):
            logger.warning(f"{what}: store unreachable or busy", extra={"error": str(exc)})
        else:
            logger.exception(what)


def _cancel_reason(row: Run | None, mine: _Held) -> str | None:
    """The cancel reason if ``row`` says the attempt was cancelled under the worker's token, else None."""
    if row is None or row.state is not RunState.CANCELLED:
        return None
    if not any(
        a.attempt == mine.attempt and a.fencing_token == mine.fencing_token and a.state is RunState.CANCELLED
        for a in row.attempts
    ):
        return None
    return row.error or "cancelled"
