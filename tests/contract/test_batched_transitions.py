"""A worker's batched writes: ``start_many``, ``end_attempts`` and ``delete_batch`` give, item by item, the
outcome each single call would (the same run, the same error), on both adapter sets."""

from __future__ import annotations

import time
from datetime import timedelta

from duetime.domain.errors import LeaseLostError, StartRejectedError
from duetime.domain.models import RunState
from duetime.domain.ports import RunStart
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import LEASE, attempt_end, make_job, make_run, put_run, start
from tests.contract.test_queue import message


def _start_of(run, *, now=T0, attempt=None, owner="w1") -> RunStart:  # type: ignore[no-untyped-def]
    lease = now + timedelta(seconds=LEASE)
    return RunStart(
        run.job_id,
        run.due_at,
        attempt or run.attempt,
        owner,
        lease,
        now,
        deadline_at=now + timedelta(seconds=run.timeout_seconds),
        watch_at=lease,
    )


def test_start_many_starts_each_startable_run_and_rejects_the_others_item_by_item(adapters: Adapters) -> None:
    fresh = [put_run(adapters.store, make_job(f"sm-{i}"), T0) for i in range(3)]
    already = put_run(adapters.store, make_job("sm-running"), T0)
    start(adapters.store, already, now=T0)
    missing = make_job("sm-missing")  # never claimed: no row
    starts = [
        _start_of(fresh[0]),
        _start_of(already),  # a duplicate delivery: RUNNING already
        _start_of(fresh[1]),
        _start_of(make_run(missing, T0)),
        _start_of(fresh[2], attempt=2),  # a stale message: the run is at attempt 1
    ]
    outcomes = adapters.store.start_many(starts)
    assert [type(o).__name__ for o in outcomes] == [
        "Run",
        "StartRejectedError",
        "Run",
        "StartRejectedError",
        "StartRejectedError",
    ]
    for run, outcome in ((fresh[0], outcomes[0]), (fresh[1], outcomes[2])):
        assert not isinstance(outcome, Exception)
        assert (outcome.state, outcome.fencing_token, outcome.lease_owner) == (RunState.RUNNING, 1, "w1")
        assert adapters.store.get_run(run.job_id, T0) == outcome
    # what was rejected is as it was
    assert adapters.store.get_run(fresh[2].job_id, T0) == fresh[2]
    assert adapters.store.get_run(already.job_id, T0).fencing_token == 1  # type: ignore[union-attr]
    assert adapters.store.start_many([]) == []


def test_a_run_twice_in_one_start_many_starts_once(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("sm-twice"), T0)
    first, second = adapters.store.start_many([_start_of(run, owner="a"), _start_of(run, owner="b")])
    assert not isinstance(first, Exception) and first.lease_owner == "a" and first.fencing_token == 1
    assert isinstance(second, StartRejectedError)
    assert adapters.store.get_run(run.job_id, T0) == first


def test_end_attempts_applies_each_current_end_and_rejects_each_stale_one(adapters: Adapters) -> None:
    running = [
        start(adapters.store, put_run(adapters.store, make_job(f"ea-{i}", max_attempts=2), T0), now=T0)
        for i in range(3)
    ]
    later = T0 + timedelta(seconds=5)
    ends = [
        attempt_end(running[0], RunState.SUCCEEDED, now=later),
        attempt_end(running[1], RunState.FAILED, now=later, token=running[1].fencing_token + 1),  # stale
        attempt_end(running[2], RunState.FAILED, now=later, reason="exit_code"),
    ]
    done, stale, retrying = adapters.store.end_attempts(ends)
    assert not isinstance(done, Exception) and done.state is RunState.SUCCEEDED
    assert isinstance(stale, LeaseLostError)
    assert not isinstance(retrying, Exception)
    assert (retrying.state, retrying.attempt, [a.reason for a in retrying.attempts]) == (
        RunState.RETRY_WAIT,
        1,
        ["exit_code"],
    )
    assert adapters.store.get_run(running[0].job_id, T0) == done
    assert adapters.store.get_run(running[1].job_id, T0) == running[1]  # untouched
    assert adapters.store.get_run(running[2].job_id, T0) == retrying
    # the same ends again: the runs moved on, every one is stale now
    assert all(isinstance(o, LeaseLostError) for o in adapters.store.end_attempts([ends[0], ends[2]]))
    assert adapters.store.end_attempts([]) == []


def test_delete_batch_deletes_the_deliveries_and_ignores_stale_handles(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    adapters.queues.send_batch(tier, [(message(f"del-{i}"), 0) for i in range(12)])
    got = []
    deadline = time.monotonic() + 5
    while len(got) < 12 and time.monotonic() < deadline:
        got += adapters.queues.receive(tier, max_messages=10, wait_seconds=0, visibility_seconds=1)
    assert len(got) == 12
    keep = got[0]
    # eleven deleted in one call (two SQS requests)
    adapters.queues.delete_batch(tier, [g.receipt_handle for g in got[1:]])
    adapters.queues.delete_batch(tier, [])
    # only the one not deleted comes back once its visibility timeout ends
    back = []
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and not back:
        back = adapters.queues.receive(tier, max_messages=10, wait_seconds=1, visibility_seconds=30)
    assert [b.message.job_id for b in back if b.message] == [keep.message.job_id]  # type: ignore[union-attr]
    # a handle of an earlier delivery is stale now: deleting by it deletes nothing (and raises nothing)
    adapters.queues.delete_batch(tier, [keep.receipt_handle])
    adapters.queues.delete_batch(tier, [back[0].receipt_handle])
    time.sleep(1.2)
    assert adapters.queues.receive(tier, max_messages=10, wait_seconds=0) == []
