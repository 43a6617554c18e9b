"""Finish: the Lambda destination (on success and on failure) of every Lambda task's function.

The event is Lambda's destination record: ``requestContext.condition`` (``Success``, ``RetriesExhausted``,
``EventAgeExceeded``), ``requestPayload`` (the run's envelope) and ``responsePayload`` (the function's result,
or its error object). The attempt ends under the envelope's fencing token (``duetime.services.lambda_tasks``); a stale
envelope is rejected and recorded on the run.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from duetime.config.deps import default_deps
from duetime.config.observability import logger, metrics
from duetime.services.lambda_tasks import DestinationRecord, FinishStatus, finish_from_record

_METRICS = {
    FinishStatus.APPLIED: "LambdaRunFinished",
    FinishStatus.STALE: "StaleFinishRejected",
    FinishStatus.IGNORED: "DestinationRecordIgnored",
}


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        record = DestinationRecord.model_validate(event)
    except ValidationError:
        logger.error("not a Lambda destination record", extra={"keys": sorted(event)[:20]})
        metrics.add_metric(name=_METRICS[FinishStatus.IGNORED], unit=MetricUnit.Count, value=1)
        return {"status": FinishStatus.IGNORED.value, "run_id": None, "state": None}
    result = finish_from_record(record, default_deps())
    metrics.add_metric(name=_METRICS[result.status], unit=MetricUnit.Count, value=1)
    return {
        "status": result.status.value,
        "run_id": result.run_id,
        "state": result.state.value if result.state is not None else None,
    }
