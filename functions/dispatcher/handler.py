"""Dispatcher: the ``lambda`` tier's SQS consumer (event source mapping with ``ReportBatchItemFailures``).

For each record: claim the run (PENDING -> RUNNING, lease = the function's timeout + a margin) and invoke its
function asynchronously with the run's envelope (``duetime.services.lambda_tasks.dispatch``). A duplicate or stale
delivery is dropped, not failed; only a record that could not be claimed (a malformed body, a DynamoDB fault)
is reported as a batch item failure and comes back after the queue's visibility timeout.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.typing import LambdaContext

from duetime.config.deps import default_deps, lambda_invoker
from duetime.config.observability import logger, metrics
from duetime.services.lambda_tasks import DispatchOutcome, RunMessageRecord, dispatch

processor = BatchProcessor(event_type=EventType.SQS, model=RunMessageRecord)
invoker = lambda_invoker()

_METRICS = {
    DispatchOutcome.INVOKED: "RunDispatched",
    DispatchOutcome.DROPPED: "DeliveryDropped",
    DispatchOutcome.FAILED: "RunInvokeFailed",
}


def record_handler(record: RunMessageRecord, lambda_context: LambdaContext) -> str:
    outcome = dispatch(
        record.body, default_deps(), invoker, owner=f"dispatcher:{lambda_context.aws_request_id}"
    )
    metrics.add_metric(name=_METRICS[outcome], unit=MetricUnit.Count, value=1)
    return outcome.value


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
