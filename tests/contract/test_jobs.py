"""The job store's other promises: batch reads, optimistic replace, counters, shard leases, run events."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from duetime.domain.errors import ChangedMeanwhileError
from duetime.domain.models import JobState, RunEvent
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import MS, make_job, put_run

MINUTE = timedelta(minutes=1)


def test_get_jobs_returns_the_stored_ones_by_id(adapters: Adapters) -> None:
    jobs = [make_job(f"batch-{i:03d}") for i in range(120)]  # more than one batch of 100
    for job in jobs:
        adapters.store.put_new_job(job)
    found = adapters.store.get_jobs([j.job_id for j in jobs] + ["absent", jobs[0].job_id])
    assert found == {j.job_id: j for j in jobs}
    assert adapters.store.get_jobs([]) == {}
    assert adapters.store.get_job("absent") is None


def test_replace_job_applies_only_over_the_expected_version_and_next_fire(adapters: Adapters) -> None:
    job = make_job("replace", next_fire_at=T0)
    adapters.store.put_new_job(job)
    v2 = job.model_copy(update={"name": "renamed", "version": 2})
    with pytest.raises(ChangedMeanwhileError):
        adapters.store.replace_job(v2, expected_version=2, expected_next_fire_at=T0)
    with pytest.raises(ChangedMeanwhileError):
        adapters.store.replace_job(v2, expected_version=1, expected_next_fire_at=T0 + MS)
    with pytest.raises(ChangedMeanwhileError):
        adapters.store.replace_job(v2, expected_version=1, expected_next_fire_at=None)
    assert adapters.store.get_job(job.job_id) == job
    adapters.store.replace_job(v2, expected_version=1, expected_next_fire_at=T0)
    assert adapters.store.get_job(job.job_id) == v2
    # a tick advanced the job meanwhile: the write read before it conflicts
    adapters.store.advance(job.job_id, claimed=T0, next_fire_at=T0 + MINUTE, now=T0)
    v3 = v2.model_copy(update={"state": JobState.PAUSED, "version": 3})
    with pytest.raises(ChangedMeanwhileError):
        adapters.store.replace_job(v3, expected_version=2, expected_next_fire_at=T0)


def test_add_missed_slots_adds_and_ignores_an_absent_job(adapters: Adapters) -> None:
    adapters.store.put_new_job(make_job("missed"))
    adapters.store.add_missed_slots("missed", 2)
    adapters.store.add_missed_slots("missed", 3)
    job = adapters.store.get_job("missed")
    assert job is not None and job.missed_slots == 5
    adapters.store.add_missed_slots("absent", 1)
    assert adapters.store.get_job("absent") is None


def test_add_active_jobs_stays_within_its_limit(adapters: Adapters) -> None:
    store = adapters.store
    assert [store.add_active_jobs("t-quota", 1, limit=2) for _ in range(3)] == [True, True, False]
    assert store.add_active_jobs("t-quota", -1) is True
    assert store.add_active_jobs("t-quota", 1, limit=2) is True
    assert store.add_active_jobs("t-quota", 1, limit=2) is False
    assert store.add_active_jobs("t-quota", 5) is True  # no limit: always
    assert store.add_active_jobs("t-quota-other", 2, limit=2) is True  # per tenant
    assert store.add_active_jobs("t-quota-other", 1, limit=2) is False


def test_count_submit_counts_per_tenant_and_minute(adapters: Adapters) -> None:
    store = adapters.store
    assert [store.count_submit("t-rate", T0, limit=2) for _ in range(3)] == [True, True, False]
    assert store.count_submit("t-rate", T0 + MINUTE, limit=2) is True
    assert store.count_submit("t-rate-other", T0, limit=2) is True


def test_a_shard_lease_is_held_until_it_expires_or_is_released(adapters: Adapters) -> None:
    store = adapters.store
    assert store.acquire_shard_lease(0, owner="tick-a", now=T0, lease_seconds=30) is True
    assert (
        store.acquire_shard_lease(0, owner="tick-b", now=T0 + 29 * timedelta(seconds=1), lease_seconds=30)
        is False
    )
    assert store.acquire_shard_lease(1, owner="tick-b", now=T0, lease_seconds=30) is True  # another shard
    assert store.acquire_shard_lease(0, owner="tick-a", now=T0 + MS, lease_seconds=30) is True  # renewal
    # the renewed lease runs to T0 + 1 ms + 30 s: expired from then on (expires_at <= now)
    end = T0 + MS + timedelta(seconds=30)
    assert store.acquire_shard_lease(0, owner="tick-b", now=end - MS, lease_seconds=30) is False
    assert store.acquire_shard_lease(0, owner="tick-b", now=end, lease_seconds=30) is True
    store.release_shard_lease(0, owner="tick-a", now=end)  # not its lease any more: no-op
    assert store.acquire_shard_lease(0, owner="tick-a", now=end + MS, lease_seconds=30) is False
    store.release_shard_lease(0, owner="tick-b", now=end + MS)
    assert store.acquire_shard_lease(0, owner="tick-a", now=end + MS, lease_seconds=30) is True


def test_record_event_appends_to_the_runs_history_and_ignores_an_absent_run(adapters: Adapters) -> None:
    run = put_run(adapters.store, make_job("events"), T0)
    first = {"at": T0, "kind": "stale_finish", "detail": {"token": 1, "worker": "w1"}}
    second = {"at": T0 + MS, "kind": "note", "detail": {}}
    adapters.store.record_event(run.job_id, T0, first)
    adapters.store.record_event(run.job_id, T0, second)
    stored = adapters.store.get_run(run.job_id, T0)
    assert stored is not None
    assert stored.events == [RunEvent.model_validate(first), RunEvent.model_validate(second)]
    assert stored.model_copy(update={"events": []}) == run
    adapters.store.record_event(run.job_id, T0 + MS, first)
    assert adapters.store.get_run(run.job_id, T0 + MS) is None


def test_a_job_write_keeps_the_fields_a_newer_version_stored(adapters: Adapters) -> None:
    # a rollback must never lose what a newer version wrote: its row reads leniently, and a write of the
    # fields this version knows leaves the others in place (a later roll-forward reads them back)
    from duetime.domain.models import Job

    store = adapters.store
    job = make_job("newer-fields")
    store.put_new_job(job)
    _add_unknown_field(adapters, job.job_id)
    read = store.get_job(job.job_id)
    assert read is not None and read == job
    store.replace_job(
        read.model_copy(update={"name": "renamed", "version": 2}),
        expected_version=read.version,
        expected_next_fire_at=read.next_fire_at,
    )
    assert _unknown_field(adapters, job.job_id) == "kept"
    assert isinstance(store.get_job(job.job_id), Job)


def _add_unknown_field(adapters: Adapters, job_id: str) -> None:
    """What a newer version would write (through the adapter's own storage: no port writes unknown fields)."""
    store: Any = adapters.store
    if adapters.kind == "aws":
        store._ddb.update_item(
            TableName=store.jobs_table,
            Key={"job_id": {"S": job_id}},
            UpdateExpression="SET future_field = :v",
            ExpressionAttributeValues={":v": {"S": "kept"}},
        )
    else:
        with store.db.transaction() as conn:
            conn.execute(
                "UPDATE jobs SET doc = json_set(doc, '$.future_field', 'kept') WHERE job_id = ?", (job_id,)
            )


def _unknown_field(adapters: Adapters, job_id: str) -> Any:
    store: Any = adapters.store
    if adapters.kind == "aws":
        item = store._ddb.get_item(TableName=store.jobs_table, Key={"job_id": {"S": job_id}})["Item"]
        return item.get("future_field", {}).get("S")
    [(value,)] = store.db.read(
        "SELECT json_extract(doc, '$.future_field') FROM jobs WHERE job_id = ?", (job_id,)
    )
    return value
