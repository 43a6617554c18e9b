"""The archiver Lambda on the runs table's stream (moto): TTL deletions archived, idempotently, with partial
batch failures and whole records written out when a batch fails (issue 19)."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError

from duetime.adapters.aws import dynamodb
from duetime.adapters.aws.resources import ResourceNames
from duetime.config.deps import Deps
from duetime.domain.archive import DATA_PREFIX, decode_member
from duetime.domain.clock import FixedClock
from duetime.domain.models import Run, RunState
from duetime.services import history
from tests.conftest import make_settings
from tests.contract.conftest import T0
from tests.contract.factories import make_job, make_run
from tests.helpers import LocalLambdaContext

JOB = "stream-job"


def load_archiver(
    names: ResourceNames, monkeypatch: pytest.MonkeyPatch, **settings_overrides: Any
) -> tuple[ModuleType, Deps]:
    """The archiver handler over the moto resources of ``names``, with these settings."""
    from duetime.config import deps as config_deps
    from duetime.config.deps import deps_from_settings
    from duetime.local.lambda_runtime import load_module

    settings = make_settings(names, archive_bucket=names.archive_bucket, **settings_overrides)
    deps = deps_from_settings(settings, FixedClock(T0 + timedelta(days=30)))
    monkeypatch.setattr(config_deps, "default_deps", lambda: deps)
    module = load_module("archiver")
    monkeypatch.setattr(module, "default_deps", lambda: deps)
    return module, deps


@pytest.fixture
def archiver(
    aws_mock: None, names: ResourceNames, monkeypatch: pytest.MonkeyPatch
) -> tuple[ModuleType, Deps]:
    return load_archiver(names, monkeypatch, keep_last_runs=2)


def finished_run(i: int) -> Run:
    run = make_run(make_job(JOB), T0 + timedelta(hours=i))
    return run.model_copy(
        update={"state": RunState.SUCCEEDED, "finished_at": run.due_at + timedelta(seconds=3)}
    )


def ttl_record(run: Run, seq: int, *, principal: str = "dynamodb.amazonaws.com") -> dict[str, Any]:
    image = dynamodb.serialize(dynamodb.run_to_item(run, retention=dynamodb.RetentionPolicy()))
    return {
        "eventID": str(seq),
        "eventName": "REMOVE",
        "eventSource": "aws:dynamodb",
        "userIdentity": {"type": "Service", "principalId": principal},
        "dynamodb": {
            "Keys": {},
            "OldImage": image,
            "SequenceNumber": f"{seq:021d}",
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
    }


def archived_ids(deps: Deps) -> list[str]:
    assert deps.archive is not None
    return [
        ln["run_id"]
        for k in deps.archive.list_keys(DATA_PREFIX)
        for ln in decode_member(deps.archive.get(k) or b"")
    ]


def invoke(module: ModuleType, records: list[dict[str, Any]]) -> Any:
    return module.lambda_handler({"Records": records}, LocalLambdaContext("archiver"))


def test_ttl_deletions_are_archived_once_even_when_the_batch_is_retried(
    archiver: tuple[ModuleType, Deps],
) -> None:
    module, deps = archiver
    # Given the newest two runs still hot, and five older ones deleted by the TTL
    for i in (10, 11):
        deps.store.put_new_run(finished_run(i))
    records = [ttl_record(finished_run(i), 100 + i) for i in range(5)]
    # When the batch is delivered twice (a retry)
    assert invoke(module, records) == {"batchItemFailures": []}
    assert invoke(module, records) == {"batchItemFailures": []}
    # Then each run is archived once and readable by id
    assert sorted(archived_ids(deps)) == sorted(finished_run(i).run_id for i in range(5))
    found = history.find_run(JOB, finished_run(3).due_at, tenant="t1", deps=deps)
    assert found is not None and found.archived


def test_a_run_among_its_jobs_last_n_is_put_back_with_a_rearmed_ttl(
    archiver: tuple[ModuleType, Deps],
) -> None:
    module, deps = archiver
    deps.store.put_new_run(finished_run(10))
    # When the TTL deletes the job's second newest run (keep_last_runs = 2)
    assert invoke(module, [ttl_record(finished_run(5), 1)]) == {"batchItemFailures": []}
    # Then it is back in the hot store, not archived
    assert deps.store.get_run(JOB, finished_run(5).due_at) is not None
    assert archived_ids(deps) == []


def test_a_users_delete_is_not_archived(archiver: tuple[ModuleType, Deps]) -> None:
    module, deps = archiver
    for i in (10, 11):
        deps.store.put_new_run(finished_run(i))
    assert invoke(module, [ttl_record(finished_run(1), 1, principal="someone")]) == {"batchItemFailures": []}
    assert archived_ids(deps) == []


def test_a_failed_batch_is_reported_and_its_records_written_out_whole(
    archiver: tuple[ModuleType, Deps], monkeypatch: pytest.MonkeyPatch
) -> None:
    module, deps = archiver
    for i in (10, 11):
        deps.store.put_new_run(finished_run(i))
    records = [ttl_record(finished_run(i), 200 + i) for i in range(3)]
    assert deps.archive is not None
    real_put = deps.archive.put

    def failing(key: str, data: bytes) -> None:
        if key.startswith(DATA_PREFIX):
            raise RuntimeError("S3 is down for data objects")
        real_put(key, data)

    monkeypatch.setattr(deps.archive, "put", failing)
    # When the archive write fails, the invocation fails as a whole (every record failed: the event source
    # mapping bisects the batch and retries it from its first record)
    with pytest.raises(BatchProcessingError):
        invoke(module, records)
    # Then the records were written out whole first
    dead = deps.archive.get(f"archive/failed/{records[0]['dynamodb']['SequenceNumber']}.json.gz")
    assert dead is not None
    assert [r["dynamodb"]["OldImage"] for r in json.loads(gzip.decompress(dead))] == [
        r["dynamodb"]["OldImage"] for r in records
    ]


def test_when_the_bucket_fails_too_the_records_go_whole_to_the_dead_letter_queue(
    aws_mock: None, names: ResourceNames, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName=f"{names.runs_table}-archiver-dlq")["QueueUrl"]
    module, deps = load_archiver(names, monkeypatch, keep_last_runs=0, archiver_dlq_url=url)
    assert deps.archive is not None

    def down(key: str, data: bytes) -> None:
        raise RuntimeError("S3 is down")

    monkeypatch.setattr(deps.archive, "put", down)
    records = [ttl_record(finished_run(i), 300 + i) for i in range(3)]
    # When neither the data objects nor the failed-batch object can be written
    with pytest.raises(BatchProcessingError):
        invoke(module, records)
    # Then the records are in the archiver's dead-letter queue, whole, tagged with their batch
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])[
        "Messages"
    ]
    parts = sorted(messages, key=lambda m: int(m["MessageAttributes"]["part"]["StringValue"]))
    assert {m["MessageAttributes"]["batch"]["StringValue"] for m in parts} == {
        records[0]["dynamodb"]["SequenceNumber"]
    }
    assert [r["dynamodb"]["OldImage"] for r in json.loads("".join(m["Body"] for m in parts))] == [
        r["dynamodb"]["OldImage"] for r in records
    ]
