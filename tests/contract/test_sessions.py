"""Worker sessions (DESIGN.md section 5, ``services/sessions.py``): one lease for every run a worker holds.

A session is opened once, renewed while alive (not revoked, not expired) with the runs its worker holds,
revoked only once expired, and a revoked session is never renewed again. A run started under it records
its id and drops it when the attempt ends; the lease rule (``lifecycle.lease_held``) reads both.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from duetime.domain.errors import ConflictError
from duetime.domain.lifecycle import lease_held
from duetime.domain.models import RunState, Session
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import MS, attempt_end, make_job, put_run, start

LEASE = timedelta(seconds=30)


def _open(adapters: Adapters, session_id: str = "s-1", owner: str = "w1") -> Session:
    session = Session(session_id, owner, T0 + LEASE)
    adapters.store.open_session(session)
    return session


def test_an_opened_session_reads_back_and_its_id_cannot_be_opened_twice(adapters: Adapters) -> None:
    opened = _open(adapters)
    assert adapters.store.get_sessions(["s-1", "absent"]) == {"s-1": opened}
    with pytest.raises(ConflictError):
        adapters.store.open_session(Session("s-1", "w2", T0 + 2 * LEASE))
    assert adapters.store.get_sessions(["s-1"])["s-1"].owner == "w1"


def test_a_renewal_sets_the_runs_and_the_lease_while_the_session_is_alive(adapters: Adapters) -> None:
    _open(adapters)
    now = T0 + timedelta(seconds=10)
    renewed = adapters.store.renew_session("s-1", runs=["a.1", "b.2"], expires_at=now + LEASE, now=now)
    assert renewed == Session("s-1", "w1", now + LEASE, ("a.1", "b.2"))
    assert adapters.store.get_sessions(["s-1"]) == {"s-1": renewed}
    # an empty list of runs is stored as empty, not left as it was
    again = adapters.store.renew_session("s-1", runs=[], expires_at=now + 2 * LEASE, now=now)
    assert again is not None and again.runs == ()


@pytest.mark.parametrize("after", [timedelta(0), MS], ids=["at-expires_at", "1ms-after"])
def test_an_expired_session_is_not_renewed(adapters: Adapters, after: timedelta) -> None:
    _open(adapters)
    now = T0 + LEASE + after
    assert adapters.store.renew_session("s-1", runs=["a.1"], expires_at=now + LEASE, now=now) is None
    assert adapters.store.renew_session("absent", runs=[], expires_at=now + LEASE, now=now) is None
    assert adapters.store.get_sessions(["s-1"])["s-1"].runs == ()


def test_an_alive_session_is_not_revoked_and_an_expired_one_is_for_good(adapters: Adapters) -> None:
    _open(adapters)
    # alive one millisecond before its end: nothing written
    assert adapters.store.revoke_session("s-1", now=T0 + LEASE - MS) is False
    assert adapters.store.get_sessions(["s-1"])["s-1"].revoked_at is None
    # expired: revoked; a second revocation keeps the first instant
    assert adapters.store.revoke_session("s-1", now=T0 + LEASE) is True
    assert adapters.store.revoke_session("s-1", now=T0 + 2 * LEASE) is True
    revoked = adapters.store.get_sessions(["s-1"])["s-1"]
    assert revoked.revoked_at == T0 + LEASE
    # a worker whose clock is behind (it thinks the session alive) is still refused
    assert adapters.store.renew_session("s-1", runs=[], expires_at=T0 + 3 * LEASE, now=T0) is None
    # and a session that is gone counts as revoked
    assert adapters.store.revoke_session("absent", now=T0) is True


def test_a_run_started_under_a_session_records_it_until_its_attempt_ends(adapters: Adapters) -> None:
    _open(adapters)
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
    _open(adapters)
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
    listed = adapters.store.renew_session(
        "s-1", runs=[running.run_id], expires_at=later + LEASE, now=T0 + LEASE - MS
    )
    assert listed is not None and lease_held(running, listed, later)
    unlisted = adapters.store.renew_session("s-1", runs=[], expires_at=later + LEASE, now=later)
    assert unlisted is not None and not lease_held(running, unlisted, later)
    assert not lease_held(running, None, later)
    # an expired or revoked session holds nothing
    assert not lease_held(running, listed, later + LEASE)
    assert adapters.store.revoke_session("s-1", now=later + LEASE)
    [revoked] = adapters.store.get_sessions(["s-1"]).values()
    assert not lease_held(running, revoked, later)
