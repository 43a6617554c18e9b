"""The local moto server's key-ordering speed-ups (:mod:`duetime.local.moto_speedups`) answer exactly as moto's
stock methods: random items and random Queries and Scans (indexes, filters, Limit, paging, both directions,
projections) asked of in-process moto twice, once with each, every page compared whole; and the SQS retention
check answers as moto's for messages on either side of a queue's retention period."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table
from moto.sqs.models import SQSBackend, sqs_backends

from duetime.adapters.aws import clients as aws
from duetime.local import moto_speedups

STOCK_SORTED, STOCK_ALL = Table.sorted_items, Table.all_items
STOCK_RETENTION = SQSBackend.is_message_valid_based_on_retention_period
FAST_SORTED = moto_speedups.make_sorted_items(STOCK_SORTED)
FAST_ALL = moto_speedups.make_all_items(STOCK_ALL)
TENANTS = ["alice", "bob", "carol", "dan"]
STATES = ["ACTIVE", "PAUSED", "DELETED"]
#: numbers whose order as numbers differs from their order as strings ("10" < "9"), equal values spelt apart
NUMBERS = ["0", "1", "1.0", "2", "9", "10", "-3.5", "100", "0.25", "-10", "7e1"]


@pytest.fixture
def ddb(aws_mock: None) -> Any:
    return aws.client("dynamodb")


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stock methods unless a test switches them (:func:`answer`); restored after."""
    monkeypatch.setattr(Table, "sorted_items", STOCK_SORTED)
    monkeypatch.setattr(Table, "all_items", STOCK_ALL)
    yield


def answer(ddb: Any, operation: str, request: dict[str, Any], *, speedups: bool) -> list[dict[str, Any]]:
    """Every page of ``request`` (following LastEvaluatedKey), asked with moto's stock ordering or the
    speed-ups: each page's Items, Count, ScannedCount and LastEvaluatedKey."""
    Table.sorted_items = FAST_SORTED if speedups else STOCK_SORTED  # type: ignore[method-assign]
    Table.all_items = FAST_ALL if speedups else STOCK_ALL  # type: ignore[method-assign]
    try:
        pages, kwargs = [], dict(request)
        for _ in range(200):
            out = getattr(ddb, operation)(**kwargs)
            pages.append({k: out.get(k) for k in ("Items", "Count", "ScannedCount", "LastEvaluatedKey")})
            if "LastEvaluatedKey" not in out:
                return pages
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]
        raise AssertionError(f"{operation} did not end within 200 pages: {request}")
    finally:
        Table.sorted_items = STOCK_SORTED  # type: ignore[method-assign]
        Table.all_items = STOCK_ALL  # type: ignore[method-assign]


def make_tables(ddb: Any) -> None:
    """A jobs-like table (hash key; a sparse GSI on a number range key, a GSI with an INCLUDE projection) and
    a runs-like one (hash and range key; a GSI whose range key repeats across items)."""
    ddb.create_table(
        TableName="jobs",
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "job_id", "AttributeType": "S"},
            {"AttributeName": "tenant", "AttributeType": "S"},
            {"AttributeName": "created_at", "AttributeType": "S"},
            {"AttributeName": "shard", "AttributeType": "N"},
            {"AttributeName": "next_fire", "AttributeType": "N"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by_tenant",
                "KeySchema": [
                    {"AttributeName": "tenant", "KeyType": "HASH"},
                    {"AttributeName": "created_at", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["state", "name"]},
            },
            {
                "IndexName": "due",
                "KeySchema": [
                    {"AttributeName": "shard", "KeyType": "HASH"},
                    {"AttributeName": "next_fire", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
        ],
    )
    ddb.create_table(
        TableName="runs",
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[
            {"AttributeName": "job_id", "KeyType": "HASH"},
            {"AttributeName": "due", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "job_id", "AttributeType": "S"},
            {"AttributeName": "due", "AttributeType": "N"},
            {"AttributeName": "state", "AttributeType": "S"},
            {"AttributeName": "watch", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by_state",
                "KeySchema": [
                    {"AttributeName": "state", "KeyType": "HASH"},
                    {"AttributeName": "watch", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    )


def fill(ddb: Any, rng: random.Random) -> None:
    """Random jobs (some created at the same instant, some without a next fire) and runs (watch times that
    repeat across runs, big payloads on a few so pages also end on moto's size limit)."""
    for i in range(rng.randint(60, 160)):
        item: dict[str, Any] = {
            "job_id": {"S": f"job-{rng.randrange(10**6):06d}-{i}"},
            "tenant": {"S": rng.choice(TENANTS)},
            "created_at": {"S": f"2026-12-0{rng.randint(1, 3)}T1{rng.randint(0, 2)}:00:00Z"},
            "state": {"S": rng.choice(STATES)},
            "name": {"S": rng.choice(["nightly ", "report ", "zeta ", "\u00e9t\u00e9 "]) + str(i)},
            "shard": {"N": str(rng.randrange(3))},
            "payload": {"M": {"n": {"N": rng.choice(NUMBERS)}, "tags": {"SS": ["a", str(i)]}}},
        }
        if rng.random() < 0.7:
            item["next_fire"] = {"N": rng.choice(NUMBERS)}
        ddb.put_item(TableName="jobs", Item=item)
    job_ids = [f"job-{j}" for j in range(8)]
    for _ in range(rng.randint(80, 200)):
        run: dict[str, Any] = {
            "job_id": {"S": rng.choice(job_ids)},
            "due": {"N": f"{rng.randint(-50, 500)}{rng.choice(['', '.5'])}"},
            "state": {"S": rng.choice(["PENDING", "RUNNING", "FAILED"])},
            "attempt": {"N": str(rng.randint(1, 3))},
        }
        if rng.random() < 0.8:
            run["watch"] = {"S": f"2026-12-03T10:0{rng.randint(0, 4)}"}
        if rng.random() < 0.02:
            run["log"] = {"S": "x" * 300_000}
        ddb.put_item(TableName="runs", Item=run)


def random_requests(rng: random.Random) -> Iterator[tuple[str, dict[str, Any]]]:
    """Queries of every index and table key (with and without range conditions and filters) and Scans."""
    for _ in range(40):
        limit = rng.choice([None, 2, 5, 25, 1000])
        forward = rng.random() < 0.5
        shape = rng.randrange(7)
        request: dict[str, Any]
        if shape == 0:  # the console's listing: by_tenant, newest first, filtered
            names = {"#t": "tenant", "#st": "state"}
            values: dict[str, Any] = {":t": {"S": rng.choice(TENANTS)}, ":d": {"S": "DELETED"}}
            flt = "#st <> :d"
            if rng.random() < 0.5:
                names["#n"], values[":np"] = "name", {"S": rng.choice(["nightly", "zeta", "\u00e9"])}
                flt += " AND begins_with(#n, :np)"
            request = {
                "TableName": "jobs",
                "IndexName": "by_tenant",
                "KeyConditionExpression": "#t = :t",
                "FilterExpression": flt,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
            }
        elif shape == 1:  # the tick's: one shard's jobs due by a time (numbers, not strings)
            request = {
                "TableName": "jobs",
                "IndexName": "due",
                "KeyConditionExpression": "#s = :s AND #f <= :u",
                "ExpressionAttributeNames": {"#s": "shard", "#f": "next_fire"},
                "ExpressionAttributeValues": {
                    ":s": {"N": str(rng.randrange(3))},
                    ":u": {"N": rng.choice(NUMBERS)},
                },
            }
        elif shape == 2:  # by_tenant between two creation times
            request = {
                "TableName": "jobs",
                "IndexName": "by_tenant",
                "KeyConditionExpression": "tenant = :t AND created_at BETWEEN :a AND :b",
                "ExpressionAttributeValues": {
                    ":t": {"S": rng.choice(TENANTS)},
                    ":a": {"S": "2026-12-01T11"},
                    ":b": {"S": "2026-12-03T11"},
                },
            }
        elif shape == 3:  # one job's runs, a due window, a state filter, a projection
            request = {
                "TableName": "runs",
                "KeyConditionExpression": "job_id = :j AND due >= :since",
                "FilterExpression": "#st <> :f",
                "ProjectionExpression": "job_id, due, #st",
                "ExpressionAttributeNames": {"#st": "state"},
                "ExpressionAttributeValues": {
                    ":j": {"S": f"job-{rng.randrange(8)}"},
                    ":since": {"N": str(rng.randint(-60, 400))},
                    ":f": {"S": "FAILED"},
                },
            }
        elif shape == 4:  # a GSI whose range key repeats: ties broken by the table's keys
            request = {
                "TableName": "runs",
                "IndexName": "by_state",
                "KeyConditionExpression": "#st = :s",
                "ExpressionAttributeNames": {"#st": "state"},
                "ExpressionAttributeValues": {":s": {"S": rng.choice(["PENDING", "RUNNING", "FAILED"])}},
            }
        else:  # Scans: the table's own order, or an index's
            request = {"TableName": rng.choice(["jobs", "runs"])}
            if shape == 6:
                request["IndexName"] = "due" if request["TableName"] == "jobs" else "by_state"
            yield "scan", {**request, **({"Limit": limit} if limit else {})}
            continue
        request["ScanIndexForward"] = forward
        if limit:
            request["Limit"] = limit
        yield "query", request


@pytest.mark.parametrize("seed", range(6))
def test_every_page_of_random_queries_and_scans_is_moto_stocks(ddb: Any, fast: None, seed: int) -> None:
    # Given random jobs and runs in moto
    rng = random.Random(seed)
    make_tables(ddb)
    fill(ddb, rng)
    items_read = 0
    for operation, request in random_requests(rng):
        # When the same request is paged through with moto's stock ordering and with the speed-ups
        stock = answer(ddb, operation, request, speedups=False)
        fast_pages = answer(ddb, operation, request, speedups=True)
        # Then every page is the same: items (their order and attributes), counts and LastEvaluatedKey
        assert fast_pages == stock, (operation, request)
        items_read += sum(page["Count"] for page in stock)
    # And the requests did read items (not only empty answers)
    assert items_read > 500


def test_a_page_boundary_inside_equal_index_keys_resumes_where_moto_does(ddb: Any, fast: None) -> None:
    # Given 30 jobs of one tenant created at the same instant (equal index keys; the job id breaks ties)
    make_tables(ddb)
    for i in range(30):
        ddb.put_item(
            TableName="jobs",
            Item={
                "job_id": {"S": f"job-{(i * 7) % 30:02d}"},
                "tenant": {"S": "alice"},
                "created_at": {"S": "2026-12-03T12:00:00Z"},
                "state": {"S": "ACTIVE"},
                "name": {"S": f"n{i}"},
                "shard": {"N": "0"},
            },
        )
    request = {
        "TableName": "jobs",
        "IndexName": "by_tenant",
        "KeyConditionExpression": "tenant = :t",
        "ExpressionAttributeValues": {":t": {"S": "alice"}},
        "ScanIndexForward": False,
        "Limit": 7,
    }
    # When it is paged through 7 at a time, newest first, both ways
    stock = answer(ddb, "query", request, speedups=False)
    fast_pages = answer(ddb, "query", request, speedups=True)
    # Then both give the same 5 pages, in descending job id order, each resuming after the last key
    assert fast_pages == stock
    ids = [item["job_id"]["S"] for page in fast_pages for item in page["Items"]]
    assert ids == [f"job-{i:02d}" for i in range(29, -1, -1)]
    assert [page["Count"] for page in fast_pages] == [7, 7, 7, 7, 2]
    assert fast_pages[0]["LastEvaluatedKey"] == {
        "job_id": {"S": "job-23"},
        "tenant": {"S": "alice"},
        "created_at": {"S": "2026-12-03T12:00:00Z"},
    }


def test_numbers_are_ordered_as_numbers_and_equal_spellings_keep_moto_order() -> None:
    # Given number keys spelt in ways whose string order differs from their numeric order
    rows = [[DynamoType({"N": n})] for n in ["10", "9", "1.0", "1", "-2", "7e1"]]
    # Then their plain keys order them as numbers ("1.0" and "1" equal, so a stable sort keeps them as given)
    keys = moto_speedups.plain_sort_keys(rows)
    assert keys is not None
    order = sorted(range(len(rows)), key=keys.__getitem__)
    assert [rows[i][0].value for i in order] == ["-2", "1.0", "1", "9", "10", "7e1"]


def test_values_the_plain_order_does_not_cover_are_left_to_moto() -> None:
    # Given key rows with a type a key cannot have, or two types at one position
    a_set = [[DynamoType({"SS": ["a"]})], [DynamoType({"S": "b"})]]
    mixed = [[DynamoType({"S": "1"})], [DynamoType({"N": "1"})]]
    ragged = [[DynamoType({"S": "a"})], [DynamoType({"S": "a"}), DynamoType({"S": "b"})]]
    # Then no plain keys are made for them (moto's own method sorts them)
    assert moto_speedups.plain_sort_keys(a_set) is None
    assert moto_speedups.plain_sort_keys(mixed) is None
    assert moto_speedups.plain_sort_keys(ragged) is None
    assert moto_speedups.plain_sort_keys([[DynamoType({"S": "b"})], [DynamoType({"S": "a"})]]) == [
        ("b",),
        ("a",),
    ]


def test_install_replaces_the_two_methods_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given moto's Table with its stock methods
    monkeypatch.setattr(Table, "sorted_items", STOCK_SORTED)
    monkeypatch.setattr(Table, "all_items", STOCK_ALL)
    monkeypatch.setattr(SQSBackend, "is_message_valid_based_on_retention_period", STOCK_RETENTION)
    monkeypatch.delattr(Table, "_duetime_plain_keys", raising=False)
    # When the speed-ups are installed twice
    moto_speedups.install()
    first = Table.sorted_items
    moto_speedups.install()
    # Then the methods are replaced, and the second install wraps nothing again
    assert Table.sorted_items is first and Table.sorted_items is not STOCK_SORTED
    assert Table.all_items is not STOCK_ALL
    assert SQSBackend.is_message_valid_based_on_retention_period is moto_speedups.retention_check


@pytest.mark.parametrize("retention", [60, 86400 * 4])
def test_the_sqs_retention_check_answers_as_moto_s(aws_mock: None, retention: int) -> None:
    # Given a queue with that retention period holding messages sent from 2 hours ago up to now
    sqs = aws.client("sqs")
    url = sqs.create_queue(QueueName="kept", Attributes={"MessageRetentionPeriod": str(retention)})[
        "QueueUrl"
    ]
    for i in range(6):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    backend = sqs_backends["123456789012"]["us-east-1"]
    messages = list(backend.get_queue("kept")._messages)
    for age_s, message in zip([7200, 3600, 61, 59, 1, 0], messages, strict=True):
        message.sent_timestamp -= age_s * 1000
    # When each is checked by moto's method and by the speed-up
    stock = [STOCK_RETENTION(backend, "kept", m) for m in messages]
    fast = [moto_speedups.retention_check(backend, "kept", m) for m in messages]
    # Then both give the same answers, and those answers split at the retention period
    assert fast == stock
    assert fast == [age < retention for age in [7200, 3600, 61, 59, 1, 0]]
