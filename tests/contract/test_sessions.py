"""Worker sessions (DESIGN.md section 5, ``services/sessions.py``): one lease for every run a worker holds.

A session is created by its first renewal, renewed with the runs its worker holds until it is revoked,
revoked only once expired (or if it was never written), and a revoked session is never renewed again. A run started under it records
its id and drops it when the attempt ends; the lease rule (``lifecycle.lease_held``) reads both.
"""

from __future__ import annotations

from datetime import timedelta

from duetime.domain.lifecycle import lease_held
from duetime.domain.models import RunState, Session
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import MS, attempt_end, make_job, put_run, start

LEASE = timedelta(seconds=30)


def _renew(
    adapters: Adapters, runs: list[str], expires_at: object, session_id: str = "s-1"
) -> Session | None:
    return adapters.store.renew_session(session_id, owner="w1", runs=runs, expires_at=expires_at)  # type: ignore[arg-type]


def test_a_first_renewal_creates_the_session_and_later_ones_set_its_runs_and_lease(
    adapters: Adapters,
) -> None:
    assert adapters.store.get_sessions(["s-1"]) == {}
    created = _renew(adapters, ["a.1"], T0 + LEASE)
    assert created == Session("s-1", "w1", T0 + LEASE, ("a.1",))
    assert adapters.store.get_sessions(["s-1", "absent"]) == {"s-1": created}
    later = T0 + timedelta(seconds=10)
    renewed = _renew(adapters, ["a.1", "b.2"], later + LEASE)
    assert renewed == Session("s-1", "w1", later + LEASE, ("a.1", "b.2"))
    # an empty list of runs is stored as empty, not left as it was
    again = _renew(adapters, [], later + 2 * LEASE)
    assert again is not None and again.runs == ()
    assert adapters.store.get_sessions(["s-1"]) == {"s-1": again}


def test_an_expired_session_not_yet_revoked_is_renewed(adapters: Adapters) -> None:
    # (the sweeper revokes a session before it expires any of its runs: none was expired yet)
    _renew(adapters, ["a.1"], T0 + LEASE)
    late = T0 + 2 * LEASE
    renewed = _renew(adapters, ["a.1"], late + LEASE)
    assert renewed is not None and renewed.alive(late)


def test_an_alive_session_is_not_revoked_and_an_expired_one_is_for_good(adapters: Adapters) -> None:
    _renew(adapters, ["a.1"], T0 + LEASE)
    # alive one millisecond before its end: nothing written
    assert adapters.store.revoke_session("s-1", now=T0 + LEASE - MS) is False
    assert adapters.store.get_sessions(["s-1"])["s-1"].revoked_at is None
    # expired: revoked; a second revocation keeps the first instant
    assert adapters.store.revoke_session("s-1", now=T0 + LEASE) is True
    assert adapters.store.revoke_session("s-1", now=T0 + 2 * LEASE) is True
    revoked = adapters.store.get_sessions(["s-1"])["s-1"]
    assert (revoked.revoked_at, revoked.runs) == (T0 + LEASE, ("a.1",))
    # and it is never renewed again
    assert _renew(adapters, [], T0 + 3 * LEASE) is None
    assert adapters.store.get_sessions(["s-1"])["s-1"] == revoked


def test_a_renewal_after_the_sweeper_read_the_session_expired_wins_over_the_revocation(
    adapters: Adapters,
) -> None:
    job = make_job("renewed-meanwhile")
    running = start(
        adapters.store,
        put_run(adapters.store, job, T0),
        now=T0,
        lease_expires_at=T0 + LEASE,
        session_id="s-1",
    )
    _renew(adapters, [running.run_id], T0 + LEASE)
    now = T0 + LEASE
    # the sweeper reads the session expired (and the run's own lease passed): not held
    [seen] = adapters.store.get_sessions(["s-1"]).values()
    assert not lease_held(running, seen, now)
    # the worker renews it before the sweeper's revocation: the revocation is refused, nothing written
    renewed = _renew(adapters, [running.run_id], now + LEASE)
    assert renewed is not None
    assert adapters.store.revoke_session("s-1", now=now) is False
    assert adapters.store.get_sessions(["s-1"]) == {"s-1": renewed}
    assert lease_held(running, renewed, now)
    assert adapters.store.get_run(job.job_id, T0) == running


def test_a_session_never_written_is_revoked_for_good(adapters: Adapters) -> None:
    # (its worker ran only short tasks, or died before its first renewal)
    assert adapters.store.revoke_session("never", now=T0) is True
    [revoked] = adapters.store.get_sessions(["never"]).values()
    assert (revoked.session_id, revoked.revoked_at, revoked.alive(T0 - LEASE)) == ("never", T0, False)
    assert _renew(adapters, ["a.1"], T0 + LEASE, session_id="never") is None


def test_a_run_started_under_a_session_records_it_until_its_attempt_ends(adapters: Adapters) -> None:
    job = make_job("in-session")
    run = put_run(adapters.store, job, T0)
    running = start(adapters.store, run, now=T0, lease_expires_at=T0 + LEASE, session_id="s-1")
    assert running.session_id == "s-1"
    assert adapters.store.get_runs([(job.job_id, T0), ("absent", T0)]) == {(job.job_id, T0): running}
    ended = adapters.store.end_attempt(attempt_end(running, RunState.FAILED, now=T0 + MS, reason="exit_code"))
    assert ended.state is RunState.RETRY_WAIT and ended.session_id is None
    # a retry started without a session (a Lambda dispatcher's) records none
    again = start(adapters.store, ended, now=ended.retry_at or T0, attempt=2)
    assert again.session_id is None


def test_the_lease_rule_reads_the_runs_own_lease_then_its_session(adapters: Adapters) -> None:
    job = make_job("lease-rule")
    running = start(
        adapters.store,
        put_run(adapters.store, job, T0),
        now=T0,
        lease_expires_at=T0 + LEASE,
        session_id="s-1",
    )
    later = T0 + LEASE + timedelta(seconds=5)
    # its own lease ahead: held, whatever the session
    assert lease_held(running, None, T0 + LEASE - MS)
    # past it: held only by a live session that listed the run at its last renewal
    listed = _renew(adapters, [running.run_id], later + LEASE)
    assert listed is not None and lease_held(running, listed, later)
    unlisted = _renew(adapters, [], later + LEASE)
    assert unlisted is not None and not lease_held(running, unlisted, later)
    assert not lease_held(running, None, later)
    # an expired or revoked session holds nothing
    assert not lease_held(running, listed, later + LEASE)
    _renew(adapters, [running.run_id], later + LEASE)
    assert adapters.store.revoke_session("s-1", now=later + LEASE)
    [revoked] = adapters.store.get_sessions(["s-1"]).values()
    assert not lease_held(running, revoked, later)
