"""The dependencies every service takes: settings, store, queues, logs and a clock.

Handlers build one :class:`Deps` per process (cached) from the environment; tests build their own with a
:class:`~duetime.domain.clock.FixedClock` and moto-backed adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from duetime.adapters.aws.dynamodb import DynamoStore
from duetime.adapters.aws.s3_logs import S3Logs
from duetime.adapters.aws.sqs import SqsQueues
from duetime.config.settings import Settings, get_settings
from duetime.domain.clock import Clock, SystemClock


@dataclass
class Deps:
    settings: Settings
    store: DynamoStore
    queues: SqsQueues
    logs: S3Logs
    clock: Clock


def deps_from_settings(settings: Settings, clock: Clock | None = None) -> Deps:
    """Adapters for ``settings``' tables, queues and bucket (clients are created lazily, on first use)."""
    return Deps(
        settings=settings,
        store=DynamoStore(
            settings.jobs_table, settings.runs_table, run_retention_days=settings.run_retention_days
        ),
        queues=SqsQueues(settings.queue_urls),
        logs=S3Logs(settings.logs_bucket),
        clock=clock or SystemClock(),
    )


@lru_cache(maxsize=1)
def default_deps() -> Deps:
    """The process's dependencies from the environment (see :mod:`duetime.config.settings`)."""
    return deps_from_settings(get_settings())
