"""The due index's key spread on DynamoDB (moto): one shard's jobs over several key values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.resources import DUE_INDEX_PK, DUE_KEYS_PER_SHARD, due_key, due_keys
from duetime.config.deps import Deps
from duetime.services.claims import tick
from tests.conftest import T0
from tests.contract.factories import make_job

FAR = datetime(2199, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def _due_values(deps: Deps) -> dict[str, int]:
    """Each job row's due-index key (its ``shard`` attribute as stored), by job id."""
    items = aws.client("dynamodb").scan(TableName=deps.settings.jobs_table)["Items"]
    return {i["job_id"]["S"]: int(i[DUE_INDEX_PK]["N"]) for i in items if DUE_INDEX_PK in i}


def test_one_shards_jobs_spread_over_its_due_keys_and_a_tick_query_reads_them_oldest_first(
    deps: Deps,
) -> None:
    # Given 24 jobs of shard 1, due one second apart, put in reverse order
    jobs = [make_job(f"spread-{i:02d}", shard=1, next_fire_at=T0 + i * SECOND) for i in range(24)]
    for job in reversed(jobs):
        deps.store.put_new_job(job)
    # Then each sits under its own fixed key among shard 1's, and they use every one of them
    values = _due_values(deps)
    assert {values[j.job_id] for j in jobs} == set(due_keys(1))
    assert len(due_keys(1)) == DUE_KEYS_PER_SHARD > 1
    assert all(values[j.job_id] == due_key(1, j.job_id) for j in jobs)
    # And the shard's query finds every one, oldest first, with its shard read back; no other shard's does
    found = list(deps.store.query_due(1, FAR))
    assert [j.job_id for j in found] == [j.job_id for j in jobs]
    assert {j.shard for j in found} == {1}
    assert deps.store.get_job("spread-00") == jobs[0]
    assert list(deps.store.query_due(0, FAR)) == []
    # And the shard's parts split them: disjoint, each oldest first, together all of them
    parts = [[j.job_id for j in deps.store.query_due(1, FAR, part=p, parts=2)] for p in range(2)]
    assert all(part for part in parts) and not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == [j.job_id for j in jobs]
    assert all(part == sorted(part) for part in parts)


def test_a_row_written_before_the_spread_is_found_by_its_shards_tick_and_moves_to_its_key(deps: Deps) -> None:
    # Given a due job of shard 1 whose row carries the old key (shard = its shard), and one of the new kind
    old, new = (
        make_job("old-key", shard=1, next_fire_at=T0),
        make_job("new-key", shard=1, next_fire_at=T0 + SECOND),
    )
    deps.store.put_new_job(old)
    deps.store.put_new_job(new)
    aws.client("dynamodb").update_item(
        TableName=deps.settings.jobs_table,
        Key={"job_id": {"S": old.job_id}},
        UpdateExpression="SET #k = :k",
        ExpressionAttributeNames={"#k": DUE_INDEX_PK},
        ExpressionAttributeValues={":k": {"N": "1"}},
    )
    assert _due_values(deps)[old.job_id] == 1
    # Then its shard's query finds it, oldest first, read as a job of shard 1; no other shard's query does
    assert [j.job_id for j in deps.store.query_due(1, FAR)] == ["old-key", "new-key"]
    assert deps.store.get_job("old-key") == old
    assert [list(deps.store.query_due(s, FAR)) for s in (0, 2, 3)] == [[], [], []]
    # When the shard's tick claims it
    result = tick(1, deps)
    # Then it is claimed once, and its advance moved it to its own key (still its shard's next due job)
    assert (result.claimed, result.errors) == (2, 0)
    assert _due_values(deps)[old.job_id] == due_key(1, old.job_id)
    assert [j.job_id for j in deps.store.query_due(1, FAR)] == ["old-key", "new-key"]
