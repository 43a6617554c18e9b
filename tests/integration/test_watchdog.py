"""The watchdog's lazy watch times, through the real services on moto (the RunStore's ``rewatch_running`` is
held to both adapter sets in tests/contract/test_fencing.py).

A run's watch time is a lower bound of when the sweeper must look at it (``Settings.first_watch_seconds``:
the sooner of the pending grace and the lease, after its due time): a start leaves it and a worker writes
nothing to a running run's row (its session's beats only read it), so a run that ends sooner never moves
in the watchdog index; the sweeper moves it when it comes.
Settings of these tests: lease 30 s, beat interval (``heartbeat_seconds``) 10 s, pending grace 60 s.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from duetime.domain.api_models import CreateJobRequest
from duetime.domain.lifecycle import message_for
from duetime.domain.models import ContainerTask, Run, RunState
from duetime.services import jobs, runs
from duetime.services.deps import Deps
from duetime.services.sessions import WorkerSession
from duetime.services.sweeper import sweep
from tests.conftest import T0

FIRST_LOOK = T0 + timedelta(seconds=30)  # min(pending grace 60, lease 30) after the due time (T0)


def _submitted(deps: Deps, **kw: Any) -> Run:
    """A run-now job's run, claimed at submit (due T0), PENDING with its message sent."""
    job = jobs.create_job(
        CreateJobRequest(name="w", task=ContainerTask(command=["true"]), **kw), tenant="t1", deps=deps
    )
    [run] = deps.store.list_runs(job.job_id)
    return run


def _sweep_all(deps: Deps) -> dict[str, int]:
    totals: dict[str, int] = {}
    for shard in range(deps.settings.shard_count):
        result = sweep(shard, deps)
        for name in ("resent", "leases_expired", "rewatched", "timeouts_handled"):
            totals[name] = totals.get(name, 0) + getattr(result, name)
    return totals


def _messages(deps: Deps) -> int:
    return len(deps.queues.receive("small", max_messages=10, wait_seconds=0, visibility_seconds=0))


def test_a_run_that_ends_before_its_first_look_never_moves_in_the_watchdog(deps: Deps, clock) -> None:
    run = _submitted(deps)
    assert run.watch_at == FIRST_LOOK
    session = WorkerSession(deps, "w1", monotonic=lambda: clock.now().timestamp())
    started = runs.start(message_for(run), deps, owner="w1", session_id=session.session_id)
    session.hold(started)
    # the start sets the lease but leaves the watch time
    assert started.watch_at == FIRST_LOOK and started.lease_expires_at == T0 + timedelta(seconds=30)
    # the worker's beat reads the run and writes nothing (its own lease lasts two more beats)
    clock.advance(10)
    assert session.beat() == [] and session.lost(started.run_id) is None
    assert session.renewals == 0 and _row_writes(deps, started) == started
    clock.advance(5)
    ended = runs.finish(started, deps, fencing_token=started.fencing_token, outcome=RunState.SUCCEEDED)
    assert ended.state is RunState.SUCCEEDED
    clock.advance(60)
    assert list(deps.store.query_overdue(run.shard, clock.now())) == []


def test_a_run_started_late_is_rewatched_at_its_lease_end_and_a_dead_worker_found_within_lease_and_a_sweep(
    deps: Deps, clock
) -> None:
    # Given a run (no worker session: its own lease only) started 20 s after its due time: lease to T0 + 50,
    # the claim's watch time (its first look, T0 + 30) left as it was
    run = _submitted(deps)
    clock.advance(20)
    started = runs.start(message_for(run), deps, owner="w1")
    assert (started.lease_expires_at, started.watch_at) == (T0 + timedelta(seconds=50), FIRST_LOOK)
    # At its first look the run is still running under a live lease: watched again at the lease's end
    clock.advance(10)
    assert _sweep_all(deps) == {"resent": 0, "leases_expired": 0, "rewatched": 1, "timeouts_handled": 0}
    now = deps.store.get_run(run.job_id, run.due_at)
    assert now is not None and now.state is RunState.RUNNING and now.watch_at == T0 + timedelta(seconds=50)
    # The worker dies: nothing happens before its lease ends, the attempt fails then
    clock.advance(19.999)
    assert _sweep_all(deps)["leases_expired"] == 0
    clock.advance(0.001)
    assert _sweep_all(deps)["leases_expired"] == 1
    lost = deps.store.get_run(run.job_id, run.due_at)
    assert lost is not None and lost.state is RunState.RETRY_WAIT
    assert [(a.attempt, a.reason) for a in lost.attempts] == [(1, "worker_lost")]


def test_a_worker_that_dies_early_in_a_run_is_found_at_its_lease_end(deps: Deps, clock) -> None:
    run = _submitted(deps)
    runs.start(message_for(run), deps, owner="w1")  # lease to T0 + 30, the first look too
    clock.advance(29.999)
    assert _sweep_all(deps)["leases_expired"] == 0
    clock.advance(0.001)
    assert _sweep_all(deps) == {"resent": 0, "leases_expired": 1, "rewatched": 0, "timeouts_handled": 0}


def test_a_pending_run_at_its_first_look_is_resent_only_once_its_grace_has_passed(deps: Deps, clock) -> None:
    run = _submitted(deps)
    assert _messages(deps) == 1  # the submit's wake-up
    # At its first look (30 s) it is still PENDING, within its pending grace (60 s): watched again then
    clock.advance(30)
    assert _sweep_all(deps) == {"resent": 0, "leases_expired": 0, "rewatched": 1, "timeouts_handled": 0}
    waiting = deps.store.get_run(run.job_id, run.due_at)
    assert waiting is not None and waiting.watch_at == T0 + timedelta(seconds=60)
    assert _messages(deps) == 1
    # Once the grace has passed its message is re-sent
    clock.advance(30)
    assert _sweep_all(deps)["resent"] == 1
    assert _messages(deps) == 2


def test_a_start_whose_timeout_handler_is_due_before_the_first_look_watches_for_it(deps: Deps, clock) -> None:
    # timeout 5 s: the handler is due at start + 5 + the job's kill grace (its default, 10 s) + one beat
    # interval (10 s) = T0 + 25, before the first look (T0 + 30)
    run = _submitted(deps, timeout_seconds=5)
    started = runs.start(message_for(run), deps, owner="w1")
    assert run.on_timeout.kill_grace_seconds == 10
    assert started.watch_at == T0 + timedelta(seconds=25)
    # a long timeout leaves the first look as it is
    other = _submitted(deps, timeout_seconds=3600)
    assert runs.start(message_for(other), deps, owner="w1").watch_at == FIRST_LOOK


def _first_found(deps: Deps, clock, key: str, until: float) -> float:
    """Seconds after T0 of the first sweep (one a second) that counts ``key``; inf if none by ``until``."""
    while (clock.now() - T0).total_seconds() <= until:
        if _sweep_all(deps)[key]:
            return (clock.now() - T0).total_seconds()
        clock.advance(1)
    return float("inf")


def test_a_dead_worker_of_a_resent_run_is_found_at_its_lease_end(deps: Deps, clock) -> None:
    run = _submitted(deps)
    clock.advance(30)
    assert _sweep_all(deps)["rewatched"] == 1  # first look: watched again at T0 + 60
    clock.advance(30)
    assert _sweep_all(deps)["resent"] == 1  # the grace has passed: re-sent, watched within 30 s
    clock.advance(1)
    started = runs.start(message_for(run), deps, owner="w1")  # the worker dies at once
    assert started.lease_expires_at == T0 + timedelta(seconds=91)
    assert started.watch_at is not None and started.watch_at <= started.lease_expires_at
    assert _first_found(deps, clock, "leases_expired", 200) == 91


def test_the_timeout_handler_of_a_resent_run_starts_on_time(deps: Deps, clock) -> None:
    run = _submitted(deps, timeout_seconds=5)
    clock.advance(30)
    _sweep_all(deps)
    clock.advance(30)
    assert _sweep_all(deps)["resent"] == 1
    clock.advance(1)
    started = runs.start(message_for(run), deps, owner="w1")  # its worker is stuck (lease to T0 + 91)
    assert started.deadline_at is not None
    due = runs.handler_due_at(started.deadline_at, started.on_timeout.kill_grace_seconds, deps)
    assert due == T0 + timedelta(seconds=86)
    assert _first_found(deps, clock, "timeouts_handled", 200) == 86


def test_with_a_pending_grace_longer_than_the_lease_a_run_waiting_is_still_looked_at_each_first_watch(
    aws_mock: None, names: Any, clock
) -> None:
    from duetime.config.deps import deps_from_settings
    from tests.conftest import make_settings

    deps = deps_from_settings(make_settings(names, pending_grace_seconds=300), clock)
    run = _submitted(deps)
    clock.advance(30)
    assert _sweep_all(deps)["rewatched"] == 1  # watched again 30 s on, not at the grace's end
    assert deps.store.get_run(run.job_id, run.due_at).watch_at == T0 + timedelta(seconds=60)  # type: ignore[union-attr]
    clock.advance(1)
    assert runs.start(message_for(run), deps, owner="w1").state is RunState.RUNNING  # lease to T0 + 61
    assert _first_found(deps, clock, "leases_expired", 400) == 61


# ---- runs held by a worker session (services/sessions.py) ------------------------------------------------
def _in_session(deps: Deps, clock, count: int = 1) -> tuple[WorkerSession, list[Run]]:
    """``count`` run-now runs started by one worker session and held by it."""
    session = WorkerSession(deps, "w1", monotonic=lambda: clock.now().timestamp())
    session_id = session.session_id
    started = []
    for _ in range(count):
        run = runs.start(message_for(_submitted(deps)), deps, owner="w1", session_id=session_id)
        session.hold(run)
        started.append(run)
    return session, started


def _row_writes(deps: Deps, run: Run) -> Run:
    now = deps.store.get_run(run.job_id, run.due_at)
    assert now is not None
    return now


def test_a_long_run_held_by_a_live_session_is_never_written_while_it_runs(deps: Deps, clock) -> None:
    # Given a run held by a worker session that beats every interval (10 s)
    session, [run] = _in_session(deps, clock)
    # When 10 minutes pass, the sweeper looking every 10 s
    for _ in range(60):
        clock.advance(10)
        session.beat()
        for shard in range(deps.settings.shard_count):
            result = sweep(shard, deps)
            assert (result.leases_expired, result.rewatched, result.sessions_revoked) == (0, 0, 0)
    # Then the run's row is as its start wrote it (not written at all, not even a rewatch), still RUNNING
    # under its token
    assert _row_writes(deps, run) == run
    # (the first beat only reads the run: its own lease of 30 s lasted two more beats)
    assert session.renewals == 59 and session.lost(run.run_id) is None


def test_a_dead_workers_session_is_revoked_and_every_run_it_held_fails_within_the_lease_and_a_sweep(
    deps: Deps, clock
) -> None:
    # Given a worker session holding two runs, renewed at T0 + 15 s (their own leases end within two
    # beats), then the worker dies
    session, held = _in_session(deps, clock, count=2)
    clock.advance(15)
    session.beat()
    assert session.renewals == 1
    # Then nothing happens before the session's lease (30 s from the renewal) ends...
    clock.advance(29.999)
    assert sum(sweep(s, deps).leases_expired for s in range(deps.settings.shard_count)) == 0
    # ...and at its end the session is revoked once and both runs fail (worker_lost), tokens raised
    clock.advance(0.001)
    results = [sweep(s, deps) for s in range(deps.settings.shard_count)]
    assert sum(r.leases_expired for r in results) == 2
    assert sum(r.sessions_revoked for r in results) == 1
    for run in held:
        now = _row_writes(deps, run)
        assert now.state is RunState.RETRY_WAIT or now.state.terminal
        assert now.fencing_token == run.fencing_token + 1 and now.session_id is None
        assert now.attempts[0].reason == "worker_lost"
        assert now.error == "worker lost: its session was not renewed"
    # And the worker, were it only paused, has its renewal refused and every run marked lost
    old_id = session.session_id
    clock.advance(10)
    session.beat()
    assert all(session.lost(run.run_id) is not None for run in held)
    assert session.session_id != old_id  # its next starts are under a new session


def test_a_run_its_live_session_no_longer_lists_fails_alone(deps: Deps, clock) -> None:
    # Given a session holding two runs, one of which its worker lost track of (say, a start whose outcome
    # it never learned): its renewals list only the other
    session, [kept, forgotten] = _in_session(deps, clock, count=2)
    session.release(forgotten.run_id)
    # When the forgotten run's own lease (30 s from its start) has passed, the session renewing all along
    for _ in range(4):
        clock.advance(10)
        session.beat()
    results = [sweep(s, deps) for s in range(deps.settings.shard_count)]
    # Then only the forgotten run fails; the session is not revoked and still holds the other
    assert (sum(r.leases_expired for r in results), sum(r.sessions_revoked for r in results)) == (1, 0)
    assert _row_writes(deps, forgotten).attempts[0].reason == "worker_lost"
    assert _row_writes(deps, kept) == kept
    session.beat()
    assert session.lost(kept.run_id) is None


def test_a_cancelled_run_is_marked_lost_at_its_sessions_next_beat(deps: Deps, clock) -> None:
    session, [run] = _in_session(deps, clock)
    runs.cancel(run.job_id, run.due_at, deps, reason="cancelled by the user")
    assert session.lost(run.run_id) is None  # known at the next beat, not before
    clock.advance(10)
    session.beat()
    lost = session.lost(run.run_id)
    assert lost is not None and lost.cancelled is not None
