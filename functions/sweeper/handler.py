"""Sweeper: repair lost messages, expired leases and due retries on every shard (or ``{"shard": N}``).
Invoked once a minute by EventBridge Scheduler (locally by the stack's clock loop)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from duetime.config.deps import default_deps
from duetime.config.observability import logger, metrics
from duetime.services.sweeper import sweep


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    deps = default_deps()
    shards = [int(event["shard"])] if "shard" in event else range(deps.settings.shard_count)
    results = [sweep(shard, deps) for shard in shards]
    for name, attr in (
        ("RunsResent", "resent"),
        ("LeasesExpired", "leases_expired"),
        ("RetriesReleased", "retries_released"),
    ):
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=sum(getattr(r, attr) for r in results))
    return {"shards": [asdict(r) for r in results]}
