"""Powertools logger and metrics, shared by every handler and service (one place, one namespace)."""

from __future__ import annotations

import threading

from aws_lambda_powertools import Logger, Metrics, single_metric
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

logger = Logger(service="duetime")
metrics = Metrics(namespace="Duetime", service="duetime")


def emit_metric(name: str, value: float = 1.0, unit: MetricUnit = MetricUnit.Count) -> None:
    """Publish one metric now (EMF to stdout), from any process: a handler, the sweeper or a worker.

    Uses Powertools' ``single_metric``, which flushes on exit; honours ``POWERTOOLS_METRICS_DISABLED``.
    """
    if is_metrics_disabled():
        return
    with single_metric(name=name, unit=unit, value=value, namespace="Duetime") as metric:
        metric.add_dimension(name="service", value="duetime")


def emit_metric_values(name: str, values: list[float], unit: MetricUnit = MetricUnit.Count) -> None:
    """Publish several values of one metric now, as one EMF document per 100 values (CloudWatch's limit of
    values per metric in a document; Powertools flushes at it): a worker's batch of starts prints one line,
    not one per run. CloudWatch aggregates each value as its own sample (the p99 alarms see them all).

    A provider of its own, reused (not the shared :data:`metrics`, whose metric set a Lambda handler may be
    filling); honours ``POWERTOOLS_METRICS_DISABLED``; nothing for no values.
    """
    if not values or is_metrics_disabled():
        return
    with _values_lock:  # one provider, reused (creating one costs about 45 us); flushing empties it
        try:
            for value in values:
                _values_provider.add_metric(name=name, unit=unit, value=value)
            _values_provider.flush_metrics()
        finally:  # a flush that failed (stdout closed) must not send these values again with the next
            _values_provider.clear_metrics()


_values_lock = threading.Lock()
_values_provider = AmazonCloudWatchEMFProvider(
    metric_set={}, dimension_set={}, metadata_set={}, namespace="Duetime", service="duetime"
)
