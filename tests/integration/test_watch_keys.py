"""The watchdog index's key spread on DynamoDB (moto): one shard's runs over several key values."""

from __future__ import annotations

from datetime import UTC, datetime

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.dynamodb import serialize
from duetime.adapters.aws.resources import WATCH_INDEX_PK, WATCH_KEYS_PER_SHARD, watch_key, watch_keys
from duetime.config.deps import Deps
from tests.conftest import T0
from tests.contract.factories import make_job, put_run

FAR = datetime(2199, 1, 1, tzinfo=UTC)


def _due(at: datetime) -> str:
    """``at`` as the runs table's sort key stores it."""
    return str(serialize({"d": at})["d"]["S"])


def _watch_values(deps: Deps) -> dict[str, int]:
    """Each run row's watchdog key, by its due time as stored."""
    items = aws.client("dynamodb").scan(TableName=deps.settings.runs_table)["Items"]
    return {i["due_at"]["S"]: int(i[WATCH_INDEX_PK]["N"]) for i in items if WATCH_INDEX_PK in i}


def test_one_shards_runs_spread_over_its_watch_keys_and_the_sweep_reads_them_oldest_first(deps: Deps) -> None:
    # Given 24 runs of a shard-2 job, due one second apart
    job = make_job("spread", shard=2)
    runs = [put_run(deps.store, job, T0.replace(second=i), now=T0) for i in range(24)]
    # Then each sits under its own fixed key, within shard 2's keys, and they use several of them
    values = _watch_values(deps)
    assert {values[_due(r.due_at)] for r in runs} <= set(watch_keys(2))
    assert len(set(values.values())) > 1
    assert all(values[_due(r.due_at)] == watch_key(2, r.run_id) for r in runs)
    # And the shard's sweep finds every one, oldest watch first; no other shard's sweep sees them
    assert [r.due_at for r in deps.store.query_overdue(2, FAR)] == [r.due_at for r in runs]
    assert list(deps.store.query_overdue(1, FAR)) == list(deps.store.query_overdue(3, FAR)) == []


def test_a_row_written_before_the_spread_is_still_found_by_a_sweep_of_every_shard(deps: Deps) -> None:
    # Given a run of shard 3 whose row carries the old key (watch_shard = its shard)
    job = make_job("old-key", shard=3)
    run = put_run(deps.store, job, T0, now=T0)
    aws.client("dynamodb").update_item(
        TableName=deps.settings.runs_table,
        Key={"job_id": {"S": run.job_id}, "due_at": {"S": _due(run.due_at)}},
        UpdateExpression="SET #k = :k",
        ExpressionAttributeNames={"#k": WATCH_INDEX_PK},
        ExpressionAttributeValues={":k": {"N": "3"}},
    )
    assert _watch_values(deps)[_due(run.due_at)] == 3 < WATCH_KEYS_PER_SHARD * deps.settings.shard_count
    # Then the sweep over every shard (as the sweeper does) still finds it
    found = [
        r.run_id for shard in range(deps.settings.shard_count) for r in deps.store.query_overdue(shard, FAR)
    ]
    assert found == [run.run_id]
