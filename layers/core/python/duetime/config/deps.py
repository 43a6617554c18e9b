"""The composition root: the only module that picks adapters for the ports.

Handlers call :func:`default_deps` (one :class:`~duetime.services.deps.Deps` per process, cached, from the
environment); :func:`deps_from_settings` builds the AWS adapter set for any settings. Tests build their
own ``Deps`` with a :class:`~duetime.domain.clock.FixedClock` and moto-backed adapters.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.dynamodb import DynamoStore
from duetime.adapters.aws.s3_logs import S3Logs
from duetime.adapters.aws.sqs import SqsQueues
from duetime.adapters.aws.stepfunctions import StepFunctionsTimeoutRunner
from duetime.config.settings import Settings, get_settings
from duetime.domain.clock import Clock, SystemClock
from duetime.services.deps import Deps

__all__ = ["Deps", "default_deps", "deps_from_settings"]


def deps_from_settings(settings: Settings, clock: Clock | None = None) -> Deps:
    """The AWS adapters for ``settings``' tables, queues, bucket and timeout state machine (clients are
    created lazily, on first use). Without a state machine ARN, timeouts run in-process."""
    store = DynamoStore(
        settings.jobs_table,
        settings.runs_table,
        run_retention_days=settings.run_retention_days,
        submits_table=settings.idempotency_table,
    )
    queues = SqsQueues(settings.queue_urls)
    arn = settings.timeout_state_machine_arn
    return Deps(
        settings=settings,
        store=store,
        queues=queues,
        logs=S3Logs(settings.logs_bucket),
        clock=clock or SystemClock(),
        timeouts=StepFunctionsTimeoutRunner(arn, store, queues) if arn else None,
        idempotency=_dynamodb_idempotency(settings.idempotency_table),
        unreachable=aws.unreachable,
    )


def _dynamodb_idempotency(table: str | None) -> Callable[[], DynamoDBPersistenceLayer] | None:
    """Powertools' DynamoDB persistence layer on ``table``, created on first use (it makes its client then)."""
    if table is None:
        return None
    return lambda: _persistence(table)


@lru_cache(maxsize=8)
def _persistence(table: str) -> DynamoDBPersistenceLayer:
    return DynamoDBPersistenceLayer(table_name=table)


@lru_cache(maxsize=1)
def default_deps() -> Deps:
    """The process's dependencies from the environment (see :mod:`duetime.config.settings`)."""
    return deps_from_settings(get_settings())
