"""Powertools logger and metrics, shared by every handler and service (one place, one namespace)."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics

logger = Logger(service="duetime")
metrics = Metrics(namespace="Duetime", service="duetime")
