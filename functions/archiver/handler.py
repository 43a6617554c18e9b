"""Archiver: the runs table's stream (NEW_AND_OLD_IMAGES) -> the run archive (issue 19).

The event source mapping filters the stream to TTL deletions (``userIdentity`` ``Service`` /
``dynamodb.amazonaws.com``; the handler checks again, so a user's delete is never archived) and reports
batch item failures, bisects a failed batch and retries it within the stream's 24 h, then hands the batch's
pointers to its on-failure queue. The handler writes the batch's TTL deletions as one archive batch keyed by
the batch's first sequence number (a retried batch overwrites its objects, never duplicates them);
a run still among its job's last N is put back with its TTL re-armed instead (``services.archiver``).

A batch that fails is reported failed from its first record (Powertools' ``BatchProcessor``: Lambda
retries from there) and its records are written out whole first, to the archive bucket's
``archive/failed/<first sequence number>.json.gz`` (or, if the bucket is what fails, to the archiver's
dead-letter queue): the on-failure destination keeps only stream pointers, which are useless after the
stream's 24 h, so no run is lost past it. Readers of the stream: this function and the notifier (issue 17),
DynamoDB Streams' two readers per shard.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from duetime.config.deps import default_deps, stream_run_decoder
from duetime.config.observability import logger, metrics
from duetime.services.archiver import archive_removed

processor = BatchProcessor(event_type=EventType.DynamoDBStreams)
decode_run = stream_run_decoder()
#: the dead-letter queue of batches that could not be archived (their records whole, in chunks)
DLQ_ENV = "DUETIME_ARCHIVER_DLQ_URL"  # Settings.archiver_dlq_url
_SQS_CHUNK = 200_000


def is_ttl_delete(record: dict[str, Any]) -> bool:
    """A REMOVE made by DynamoDB's TTL (not by a user or the archiver itself)."""
    identity = record.get("userIdentity") or {}
    return (
        record.get("eventName") == "REMOVE"
        and identity.get("type") == "Service"
        and identity.get("principalId") == "dynamodb.amazonaws.com"
    )


def dead_letter(records: list[dict[str, Any]], batch: str) -> None:
    """Write ``records`` whole where a person or a replay can find them after the stream forgets them."""
    deps = default_deps()
    body = json.dumps(records, separators=(",", ":"), default=str).encode()
    try:
        if deps.archive is None:
            raise RuntimeError("no archive bucket")
        deps.archive.put(f"archive/failed/{batch}.json.gz", gzip.compress(body, mtime=0))
        return
    except Exception:  # noqa: BLE001 - the bucket may be what fails: the queue next
        logger.exception("archive dead letters not written to the bucket", extra={"batch": batch})
    url = deps.settings.archiver_dlq_url
    if not url:
        raise RuntimeError(f"{DLQ_ENV} is not set: records of batch {batch} kept only in the stream")
    import boto3

    sqs = boto3.client("sqs")
    text = body.decode()
    for n, start in enumerate(range(0, len(text), _SQS_CHUNK)):
        sqs.send_message(
            QueueUrl=url,
            MessageBody=text[start : start + _SQS_CHUNK],
            MessageAttributes={
                "batch": {"DataType": "String", "StringValue": batch},
                "part": {"DataType": "Number", "StringValue": str(n)},
            },
        )


def archive_batch(records: list[dict[str, Any]]) -> set[str]:
    """Archive the TTL deletions of ``records``; returns the sequence numbers that failed (all or none)."""
    removed = [r for r in records if is_ttl_delete(r)]
    if not removed:
        return set()
    batch = str(records[0]["dynamodb"]["SequenceNumber"])
    try:
        runs = [decode_run(r["dynamodb"]["OldImage"]) for r in removed]
        archived = archive_removed(runs, batch=batch, deps=default_deps())
    except Exception:  # noqa: BLE001 - the whole batch is retried from its first record
        logger.exception("archive batch failed", extra={"batch": batch, "records": len(records)})
        dead_letter(records, batch)
        return {str(r["dynamodb"]["SequenceNumber"]) for r in records}
    metrics.add_metric(name="RunsArchived", unit=MetricUnit.Count, value=len(archived))
    metrics.add_metric(name="RunsKeptHot", unit=MetricUnit.Count, value=len(runs) - len(archived))
    return set()


_failed: set[str] = set()


def record_handler(record: DynamoDBRecord) -> None:
    if record.dynamodb is not None and record.dynamodb.sequence_number in _failed:
        raise RuntimeError("its batch could not be archived")


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    records = list(event.get("Records") or [])
    _failed.clear()
    _failed.update(archive_batch(records))
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
