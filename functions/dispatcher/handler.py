"""Dispatcher: the ``lambda`` tier's SQS consumer (event source mapping with ``ReportBatchItemFailures``).

For each record: claim the run (PENDING -> RUNNING, lease = the function's timeout + a margin) and invoke its
function asynchronously with the run's envelope (``duetime.services.lambda_tasks.dispatch``). A duplicate or stale
delivery is dropped, not failed; only a record that could not be claimed (a malformed body, a DynamoDB fault)
is reported as a batch item failure and comes back after the queue's visibility timeout.

Records are handled one at a time in the order their attempts may start (``RunMessage.ready_at``): a wake-up
comes up to a second early (its delay is rounded down) and is held until then; one far earlier than
``MAX_HOLD_SECONDS`` goes back on the queue until it may be held (a batch item failure, not deleted).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.typing import LambdaContext

from duetime.config.deps import default_deps, lambda_invoker
from duetime.config.observability import logger, metrics
from duetime.domain.lifecycle import delay_seconds
from duetime.domain.models import RunMessage
from duetime.services.lambda_tasks import DispatchOutcome, NotReadyError, RunMessageRecord, dispatch

processor = BatchProcessor(event_type=EventType.SQS, model=RunMessageRecord)
invoker = lambda_invoker()

_METRICS = {
    DispatchOutcome.INVOKED: "RunDispatched",
    DispatchOutcome.DROPPED: "DeliveryDropped",
    DispatchOutcome.FAILED: "RunInvokeFailed",
}


def record_handler(record: RunMessageRecord, lambda_context: LambdaContext) -> str:
    deps = default_deps()
    try:
        outcome = dispatch(record.body, deps, invoker, owner=f"dispatcher:{lambda_context.aws_request_id}")
    except NotReadyError:
        # far too early to hold: back on the queue until it may be held (the record fails, not deleted)
        after = delay_seconds(record.body.ready_at, deps.clock.now())
        deps.queues.extend_visibility(record.body.tier or "lambda", record.receiptHandle, after)
        raise
    metrics.add_metric(name=_METRICS[outcome], unit=MetricUnit.Count, value=1)
    return outcome.value


def _ready_at(record: dict[str, Any]) -> datetime:
    """When a record's attempt may start (a body that is not a run message: now, it fails at once)."""
    try:
        return RunMessage.model_validate_json(record.get("body") or "").ready_at
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    # the records one at a time in the order their attempts may start, so the hold of one that came early
    # (its delay rounded down) never delays one that may start sooner
    event = {**event, "Records": sorted(event.get("Records") or [], key=_ready_at)}
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
