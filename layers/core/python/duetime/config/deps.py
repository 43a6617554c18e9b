"""The composition root: the only module that picks adapters for the ports.

Handlers call :func:`default_deps` (one :class:`~duetime.services.deps.Deps` per process, cached, from the
environment); :func:`deps_from_settings` builds the AWS adapter set for any settings. Tests build their
own ``Deps`` with a :class:`~duetime.domain.clock.FixedClock` and moto-backed adapters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from duetime.config.settings import Settings, get_settings
from duetime.domain.clock import Clock, SystemClock
from duetime.services.deps import Deps, NotifyPorts

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    from duetime.domain.models import Run
    from duetime.domain.notifications import RunSnapshot
    from duetime.domain.ports import IdempotencyPersistence, LambdaInvoker

# The adapters are imported by the function that picks them: a process on the embedded backend (a local
# worker, an API process) never loads boto3 (about 30 MB of memory per process).

__all__ = [
    "Deps",
    "default_deps",
    "deps_from_settings",
    "lambda_invoker",
    "sqlite_deps",
    "stream_change_decoder",
    "stream_run_decoder",
]


#: the embedded backend's database file and log directory, inside ``settings.state_dir``
DATABASE_FILE = "duetime.sqlite"
LOGS_DIR = "logs"
#: the local stack's SNS: what would be published (topics and email), one JSON object a line
SNS_FILE = "sns-published.jsonl"


def deps_from_settings(settings: Settings, clock: Clock | None = None) -> Deps:
    """The adapters ``settings`` name: the embedded SQLite set when ``state_dir`` is set
    (:func:`sqlite_deps`), else the AWS set for its tables, queues, bucket and timeout state machine
    (clients are created lazily, on first use; without a state machine ARN, timeouts run in-process)."""
    if settings.state_dir is not None:
        return sqlite_deps(settings, clock)
    from duetime.adapters.aws import clients as aws
    from duetime.adapters.aws.dynamodb import DynamoStore
    from duetime.adapters.aws.s3_logs import S3Logs
    from duetime.adapters.aws.sqs import SqsQueues
    from duetime.adapters.aws.stepfunctions import StepFunctionsTimeoutRunner

    store = DynamoStore(
        settings.jobs_table,
        settings.runs_table,
        retention=settings.retention,
        submits_table=settings.idempotency_table,
    )
    from duetime.adapters.aws.s3_archive import S3Archive

    queues = SqsQueues(settings.queue_urls)
    arn = settings.timeout_state_machine_arn
    notify = None
    if settings.notifications_table and settings.notifications_queue_url:
        from duetime.adapters.aws.notifications import DynamoNotifications, SnsTopics, SqsNotifierQueue
        from duetime.adapters.http.webhooks import HttpWebhooks

        queue = SqsNotifierQueue(settings.notifications_queue_url)
        notify = NotifyPorts(
            store=DynamoNotifications(
                settings.notifications_table,
                retention_days=max(settings.run_retention_days, settings.failed_run_retention_days),
            ),
            outbox=queue,
            webhooks=HttpWebhooks(allow_private=settings.notify_allow_private),
            sns=SnsTopics(settings.email_topic_prefix),
            wakeups=queue,
        )
    return Deps(
        settings=settings,
        store=store,
        queues=queues,
        logs=S3Logs(settings.logs_bucket),
        clock=clock or SystemClock(),
        timeouts=StepFunctionsTimeoutRunner(arn, store, queues) if arn else None,
        idempotency=_dynamodb_idempotency(settings.idempotency_table),
        unreachable=aws.unreachable,
        archive=S3Archive(settings.archive_bucket) if settings.archive_bucket else None,
        notify=notify,
    )


def sqlite_deps(settings: Settings, clock: Clock | None = None) -> Deps:
    """The embedded adapter set under ``settings.state_dir``: jobs, runs, queues and idempotency records in
    one SQLite file (``duetime.sqlite``, WAL: every process of the stack shares it), logs as files under
    ``logs/``; timeouts run in-process (no Step Functions).

    Raises:
        StateFileError: the database cannot be opened (corrupted, locked, read-only, a newer schema).
    """
    from duetime.adapters.http.webhooks import HttpWebhooks
    from duetime.adapters.sqlite.archive import FileArchive
    from duetime.adapters.sqlite.logs import FileLogs
    from duetime.adapters.sqlite.notifications import SqliteNotifications
    from duetime.adapters.sqlite.queue import SqliteQueues
    from duetime.adapters.sqlite.sns_stub import RecordingSns
    from duetime.adapters.sqlite.store import SqliteStore

    assert settings.state_dir is not None
    root = Path(settings.state_dir)
    clock = clock or SystemClock()
    path = root / DATABASE_FILE
    store = SqliteStore(path, clock=clock, retention=settings.retention)
    notifications = SqliteNotifications(
        path, retention_days=max(settings.run_retention_days, settings.failed_run_retention_days)
    )
    return Deps(
        settings=settings,
        store=store,
        queues=SqliteQueues(path, clock=clock),
        logs=FileLogs(root / LOGS_DIR),
        clock=clock,
        idempotency=lambda: _sqlite_idempotency(path),
        # the file's write lock held past the busy timeout: transient, retried (logged without a traceback)
        unreachable=_busy,
        notify=NotifyPorts(
            store=notifications,
            outbox=notifications,
            webhooks=HttpWebhooks(allow_private=True),
            sns=RecordingSns(root / SNS_FILE),
            feed=notifications,
        ),
        archive=FileArchive(root),
    )


def _busy(exc: BaseException) -> bool:
    from duetime.domain.errors import ThrottledError

    return isinstance(exc, ThrottledError)


@lru_cache(maxsize=8)
def _sqlite_idempotency(path: Path) -> IdempotencyPersistence:
    """The embedded persistence layer on ``path``, created on first use (one per file and process)."""
    from duetime.adapters.sqlite.idempotency import SqlitePersistenceLayer

    return SqlitePersistenceLayer(path)


def _dynamodb_idempotency(table: str | None) -> Callable[[], DynamoDBPersistenceLayer] | None:
    """Powertools' DynamoDB persistence layer on ``table``, created on first use (it makes its client then)."""
    if table is None:
        return None
    return lambda: _persistence(table)


@lru_cache(maxsize=8)
def _persistence(table: str) -> DynamoDBPersistenceLayer:
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    return DynamoDBPersistenceLayer(table_name=table)


def stream_run_decoder() -> Callable[[Mapping[str, Any]], Run]:
    """How the archiver reads a run from a runs-table stream record's image (DynamoDB's wire format)."""
    from duetime.adapters.aws.dynamodb import run_from_stream_image

    return run_from_stream_image


def stream_change_decoder() -> Callable[[Mapping[str, Any]], tuple[RunSnapshot | None, RunSnapshot] | None]:
    """How the notifier reads a run change from a runs-table stream record (None: not a run's change)."""
    from duetime.adapters.aws.notifications import change_of_stream_record

    return change_of_stream_record


def lambda_invoker() -> LambdaInvoker:
    """The dispatcher's Lambda invoker (``lambda:InvokeFunction``; locally, ``AWS_ENDPOINT_URL_LAMBDA``
    points it at the local stack's Lambda runtime, whichever backend holds the state)."""
    from duetime.adapters.aws.lambda_invoker import BotoLambdaInvoker

    return BotoLambdaInvoker()


@lru_cache(maxsize=1)
def default_deps() -> Deps:
    """The process's dependencies from the environment (see :mod:`duetime.config.settings`)."""
    return deps_from_settings(get_settings())
