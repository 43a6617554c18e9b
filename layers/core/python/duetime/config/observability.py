"""Powertools logger and metrics, shared by every handler and service (one place, one namespace)."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, single_metric
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

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
