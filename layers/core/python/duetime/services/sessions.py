"""A worker's session: one lease for every run it holds, renewed once per heartbeat interval (DESIGN.md
section 5, "Worker sessions").

A container worker opens a session (:class:`~duetime.domain.models.Session`) before its first start and
records its id on each run it starts (``Run.session_id``). Every ``heartbeat_seconds`` it renews it: one
conditional write listing the run ids it holds, whatever their number (a per-run heartbeat wrote each run's
row instead, and a 60 s run cost 8 write units more than a 1 s run). In the same beat it reads its runs'
rows (one batch read, read units only) to learn which were cancelled or fenced (their state or fencing token
changed), and marks those lost: their slots kill the tasks and do not finish them.

The sweeper expires a RUNNING run of a session only once both the run's own lease (from its start) has
passed and the session no longer holds it (:func:`~duetime.domain.lifecycle.lease_held`): expired, revoked,
gone, or its last renewal did not list the run. An expired session is revoked first, so:

- a renewal the store refuses (revoked or expired) fences the worker from every run it held: all are marked
  lost at once, and the next start opens a new session;
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
from duetime.domain.models import Run, RunState, Session
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
        #: the open session's id (None: none open; the next start opens one)
        self.session_id: str | None = None
        #: by ``monotonic``: when the lease of the last successful renewal (or the open) ends
        self._valid_until = 0.0
        #: by ``monotonic``: when the next renewal is due
        self.next_beat = 0.0
        self.renewals = 0

    # ---- the session's id, for the starts -------------------------------------------------------------
    def open(self) -> str:
        """The open session's id, opening a new session first if none is (or its lease ended by the
        worker's clock). Raises what the store raised (a start then fails: its message comes back)."""
        mono = self._monotonic()
        if self.session_id is not None and mono < self._valid_until:
            return self.session_id
        if self.session_id is not None:
            self._fence_all("its session's lease ended without a renewal")
        session_id = self._new_id()
        lease = self.deps.settings.lease_seconds
        self.deps.store.open_session(
            Session(session_id, self.owner, self.deps.clock.now() + timedelta(seconds=lease))
        )
        self.session_id = session_id
        self._valid_until = mono + lease
        self.next_beat = mono + self.deps.settings.heartbeat_seconds
        logger.info("worker session opened", extra={"session_id": session_id, "owner": self.owner})
        return session_id

    # ---- the runs it holds ----------------------------------------------------------------------------
    def hold(self, run: Run) -> None:
        """Count a run just started under the session as held (listed at the next renewal)."""
        with self._lock:
            self._held[run.run_id] = _Held(run.job_id, run.due_at, run.attempt, run.fencing_token)
            self._lost.pop(run.run_id, None)

    def release(self, run_id: str) -> None:
        """The run's attempt ended (recorded, refused as stale, or given up): no longer held."""
        with self._lock:
            self._held.pop(run_id, None)
            self._lost.pop(run_id, None)

    def holding(self) -> int:
        with self._lock:
            return len(self._held)

    def lost(self, run_id: str) -> Lost | None:
        """Why the held run ``run_id`` is no longer the worker's, or None while it is: marked lost by a beat,
        or the session's lease ended by the worker's own clock without a renewal (a long pause, or the
        store unreachable for a whole lease)."""
        with self._lock:
            lost = self._lost.get(run_id)
            if lost is None and run_id in self._held and self._monotonic() >= self._valid_until:
                lost = self._lost[run_id] = Lost("its session's lease ended without a renewal")
            return lost

    def _fence_all(self, why: str) -> None:
        with self._lock:
            for run_id in self._held:
                self._lost.setdefault(run_id, Lost(why))
        self.session_id = None

    # ---- the beat -------------------------------------------------------------------------------------
    def due(self) -> bool:
        """Whether a renewal is due (an open session's ``next_beat`` has come)."""
        return self.session_id is not None and self._monotonic() >= self.next_beat

    def beat(self) -> None:
        """Renew the session, listing the held runs, then read them and mark those lost whose state or
        fencing token changed (cancelled, fenced by the timeout handler, expired by the sweeper). A refused
        renewal marks every held run lost and closes the session (the next start opens another); a fault
        is logged and the renewal tried again after :data:`RENEW_RETRY_SECONDS`. Never raises."""
        session_id = self.session_id
        if session_id is None:
            return
        mono = self._monotonic()
        settings = self.deps.settings
        with self._lock:
            held = dict(self._held)
        now = self.deps.clock.now()
        try:
            renewed = self.deps.store.renew_session(
                session_id,
                runs=sorted(held),
                expires_at=now + timedelta(seconds=settings.lease_seconds),
                now=now,
            )
        except Exception as exc:  # noqa: BLE001 - retried soon; the lease's end by our clock is the limit
            self._log_failure("renewing the worker session failed", exc)
            self.next_beat = mono + min(RENEW_RETRY_SECONDS, settings.heartbeat_seconds)
            return
        if renewed is None:
            logger.warning(
                "worker session revoked or expired: every task it runs is stopped",
                extra={"session_id": session_id, "runs": len(held)},
            )
            self._fence_all("its session was revoked (the sweeper found it expired)")
            return
        self.renewals += 1
        self._valid_until = mono + settings.lease_seconds
        self.next_beat = mono + settings.heartbeat_seconds
        if held:
            self._look(held)

    def _look(self, held: dict[str, _Held]) -> None:
        """Read the held runs; mark lost those no longer RUNNING under the worker's token."""
        try:
            rows = self.deps.store.get_runs([(h.job_id, h.due_at) for h in held.values()])
        except Exception as exc:  # noqa: BLE001 - looked at again at the next beat
            self._log_failure("reading the worker's runs failed", exc)
            return
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
