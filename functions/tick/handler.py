"""Tick: claim the due runs of one shard. Invoked once a minute per shard by EventBridge Scheduler with
``{"shard": N}`` (the local stack's clock loop does the same)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from duetime.config.deps import default_deps
from duetime.config.observability import logger, metrics
from duetime.services.claims import tick


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    shard = int(event["shard"])
    result = tick(shard, default_deps(), child_timeout_seconds=_child_time(context))
    metrics.add_metric(name="RunsClaimed", unit=MetricUnit.Count, value=result.claimed)
    if result.errors:
        metrics.add_metric(name="ClaimErrors", unit=MetricUnit.Count, value=result.errors)
    return {
        "shard": shard,
        "claimed": result.claimed,
        "already_claimed": result.already_claimed,
        "not_advanced": result.not_advanced,
        "errors": result.errors,
    }


#: seconds of the invocation a tick of several processes keeps for itself after its children's time is up
#: (kill them, add up what came back, release the shard's lease, report)
WIND_DOWN_SECONDS = 5.0


def _child_time(context: LambdaContext) -> float | None:
    """How long a tick's claiming processes may take: the invocation's remaining time less the wind-down
    (None where the context says nothing: the tick's default, one tick period)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if not callable(remaining):
        return None
    try:
        left = float(remaining()) / 1000 - WIND_DOWN_SECONDS
    except (TypeError, ValueError):
        return None
    return max(1.0, left)
