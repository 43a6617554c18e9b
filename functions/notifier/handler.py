"""Notifier: run changes and the notifications queue -> events, noise control, deliveries (issue 17).

Two event sources, one function (``duetime.services.notifier``):

- **the runs table's stream** (``NEW_AND_OLD_IMAGES``; the archiver is its other reader): each record's old
  and new images are decoded to run snapshots and handed to ``notifier.handle_change``, the same call the
  local stack's outbox reader makes, so both derive events with the same code
  (``domain.notifications.derive_events``). The handler makes no HTTP call: each event's deliveries are
  recorded with it and woken through the queue, so a slow receiver never holds a stream shard. The mapping
  filters to changes that can give an event (``EVENT_STATES``, or an insert with ``missed_slots``). A record
  that fails fails every record after it in the batch too (Powertools' ``BatchProcessor`` reports them;
  Lambda retries from the first), so one job's changes are always handled in order (its incident depends
  on it); a retried record is a duplicate, recorded once by its event id.
- **the notifications queue**: the sweeper's ``late``/``overran`` signals (the sweeper finds them every
  minute in the watchdog index, where a run is watched no later than its late or overrun instant) and each
  delivery's wake-up, delayed until its next try (``notifier.handle_message``: one webhook try, SNS publish
  or email per message; a failed try re-arms the wake-up with backoff for about a day, then the delivery
  is dead-lettered and counted as ``NotificationDeadLettered``). A record that fails (a malformed body, the
  table unreachable) comes back after the visibility timeout, then goes to the queue's DLQ.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from duetime.config.deps import default_deps, stream_change_decoder
from duetime.config.observability import logger, metrics
from duetime.services.notifier import NotifierMessageRecord, handle_change, handle_message

stream_processor = BatchProcessor(event_type=EventType.DynamoDBStreams)
queue_processor = BatchProcessor(event_type=EventType.SQS, model=NotifierMessageRecord)
decode_change = stream_change_decoder()


class EarlierRecordFailedError(RuntimeError):
    """A record after a failed one in its batch: not handled, so the job's changes stay in order."""


_broken: list[str] = []


def stream_record(record: DynamoDBRecord) -> None:
    if _broken:
        raise EarlierRecordFailedError(f"record {_broken[0]} of this batch failed")
    try:
        change = decode_change(record.raw_event)
        if change is not None:
            handle_change(*change, default_deps())
    except Exception:
        _broken.append(record.event_id or "?")
        logger.exception("run change not handled", extra={"event_id": record.event_id})
        raise


def queue_record(record: NotifierMessageRecord) -> None:
    handle_message(record.body, default_deps())


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    records = event.get("Records") or []
    if records and records[0].get("eventSource") == "aws:sqs":
        return process_partial_response(
            event=event, record_handler=queue_record, processor=queue_processor, context=context
        )
    _broken.clear()
    return process_partial_response(
        event=event, record_handler=stream_record, processor=stream_processor, context=context
    )
