"""The adapter sets under contract: one ``adapters`` fixture, parametrized by adapter set id.

Every test in ``tests/contract/`` talks to the ports of :mod:`duetime.domain.ports` only, through the object
this fixture yields (:class:`Adapters`: ``store``, ``queues``, ``logs``, a ``FixedClock``, ``new_tier()``
for an unused queue tier, ``send_raw()`` for a foreign message body); this module is the only one that knows
adapter classes. To hold another adapter set (SQLite) to the same behaviour, add its id to
:data:`ADAPTER_SETS` and a ``_<id>_backend`` fixture that returns a factory of fresh, isolated
:class:`Adapters`.

``aws``: DynamoDB, SQS and S3 under moto in-process (one mock for this package, started when its first test
needs it and stopped after its last; every test gets its own tables, bucket and queues, created by
``resources.create_all`` under a fresh name prefix, so nothing leaks between tests).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from duetime.config.settings import ALL_TIERS, CONTAINER_TIERS
from duetime.domain.clock import FixedClock
from duetime.domain.models import Run
from duetime.domain.notifications import RunSnapshot
from duetime.domain.ports import ArchiveStore, LogStore, NotificationStore, RunQueue, Store

#: a run change as the notifier reads it: (old, new) snapshots
Change = tuple[RunSnapshot | None, RunSnapshot]

#: the adapter sets the contract runs against (a new set: add its id and a ``_<id>_backend`` fixture)
ADAPTER_SETS = ["aws", "sqlite"]

#: A Sunday noon, UTC: the fixed "now" every contract test starts from.
T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


@dataclass
class Adapters:
    """One adapter set, fresh and empty, for one test.

    Attributes:
        kind: the adapter set's id (``aws``).
        store: jobs and runs (:class:`~duetime.domain.ports.Store`).
        queues: the tier queues (:class:`~duetime.domain.ports.RunQueue`).
        logs: run logs (:class:`~duetime.domain.ports.LogStore`).
        clock: a fixed clock at :data:`T0` (the ports take instants as arguments; tests read it from here).
    """

    kind: str
    store: Store
    queues: RunQueue
    logs: LogStore
    clock: FixedClock
    put_raw: Callable[[str, str], None] = field(repr=False)
    _unused_tiers: list[str] = field(default_factory=lambda: [*CONTAINER_TIERS, "lambda"], repr=False)
    #: the run archive (:class:`~duetime.domain.ports.ArchiveStore`)
    archive: ArchiveStore | None = None
    #: the notifier's store (:class:`~duetime.domain.ports.NotificationStore`)
    notifications: NotificationStore | None = None
    #: the run changes of a transition ``before -> after`` as this set's change feed gives them: the
    #: embedded outbox (its trigger on the runs rows; the arguments unused), or the runs table's stream
    #: (records of the rows' images, decoded as the notifier Lambda decodes them)
    read_changes: Callable[[Run | None, Run], list[Change]] | None = field(default=None, repr=False)

    def changes(self, before: Run | None, after: Run) -> list[Change]:
        assert self.read_changes is not None
        return self.read_changes(before, after)

    def new_tier(self) -> str:
        """A tier whose queue no one in this test has used yet: empty, with the production queue's settings
        (container tiers first, so a job's ``task.tier`` can name it). A test gets up to four."""
        if not self._unused_tiers:
            raise RuntimeError(f"a test has only {len(ALL_TIERS)} tiers: {ALL_TIERS}")
        return self._unused_tiers.pop(0)

    def send_raw(self, tier: str, body: str) -> None:
        """Put a message with ``body`` on ``tier``'s queue, bypassing the port (a body no sender of ours
        writes, as a misconfigured producer or a hand-sent message would)."""
        self.put_raw(tier, body)


#: a factory of fresh adapter sets, returned by a backend fixture
AdapterFactory = Callable[[], Adapters]


# ---- aws: moto in-process --------------------------------------------------------------------------------
@pytest.fixture(scope="package")
def _aws_backend() -> Iterator[AdapterFactory]:
    """moto's in-process mock for the package (fake credentials only, no endpoint or profile from the
    caller's environment); each call of the factory creates a fresh set of resources."""
    import boto3
    from moto.core.botocore_stubber import BotocoreStubber

    from duetime.adapters.aws import dynamodb
    from duetime.adapters.aws.dynamodb import DynamoStore
    from duetime.adapters.aws.notifications import DynamoNotifications, change_of_stream_record
    from duetime.adapters.aws.resources import ResourceNames, create_all
    from duetime.adapters.aws.s3_archive import S3Archive
    from duetime.adapters.aws.s3_logs import S3Logs
    from duetime.adapters.aws.sqs import SqsQueues
    from tests.conftest import moto_env

    prefixes = (f"contract{n}" for n in itertools.count())
    with pytest.MonkeyPatch.context() as monkeypatch, moto_env(monkeypatch):
        # moto's DynamoDB checks a condition and then writes without a lock, so two threads' conditional
        # writes to one item can both pass (8 racing starts: several "win"). DynamoDB itself serialises the
        # writes to an item; so is moto's DynamoDB here, one request at a time, so that the race tests
        # test the adapter and not moto. (SQS and S3 requests are not serialised: a long poll must not
        # block the others.)
        process = BotocoreStubber.process_request
        one_at_a_time = threading.Lock()

        def serialised(self: BotocoreStubber, request: Any) -> Any:
            if urlsplit(request.url).netloc.startswith("dynamodb."):
                with one_at_a_time:
                    return process(self, request)
            return process(self, request)

        monkeypatch.setattr(BotocoreStubber, "process_request", serialised)
        session = boto3.session.Session()  # inside the mock; one for all tests: clients are made once
        sqs = session.client("sqs")

        def make() -> Adapters:
            names = ResourceNames.for_prefix(next(prefixes))
            queues = SqsQueues(create_all(names, session=session))

            def put_raw(tier: str, body: str) -> None:
                sqs.send_message(QueueUrl=queues.queue_urls[tier], MessageBody=body)

            def stream(before: Run | None, after: Run) -> list[Change]:
                def image(run: Run) -> dict[str, Any]:
                    return dynamodb.serialize(dynamodb.run_to_item(run, retention=dynamodb.RetentionPolicy()))

                record: dict[str, Any] = {
                    "eventName": "INSERT" if before is None else "MODIFY",
                    "dynamodb": {"NewImage": image(after), "StreamViewType": "NEW_AND_OLD_IMAGES"},
                }
                if before is not None:
                    record["dynamodb"]["OldImage"] = image(before)
                change = change_of_stream_record(record)
                return [change] if change is not None else []

            return Adapters(
                kind="aws",
                store=DynamoStore(names.jobs_table, names.runs_table, submits_table=names.idempotency_table),
                queues=queues,
                logs=S3Logs(names.logs_bucket),
                clock=FixedClock(T0),
                put_raw=put_raw,
                archive=S3Archive(names.archive_bucket),
                notifications=DynamoNotifications(names.notifications_table),
                read_changes=stream,
            )

        yield make


@pytest.fixture
def _sqlite_backend(tmp_path: Path) -> AdapterFactory:
    """The embedded set: one SQLite file per test (the queues on the wall clock: test_queue waits in real
    time), logs as files beside it."""
    from duetime.adapters.sqlite.archive import FileArchive
    from duetime.adapters.sqlite.logs import FileLogs
    from duetime.adapters.sqlite.notifications import SqliteNotifications
    from duetime.adapters.sqlite.queue import SqliteQueues
    from duetime.adapters.sqlite.store import SqliteStore

    def make() -> Adapters:
        path = tmp_path / "duetime.sqlite"
        queues = SqliteQueues(path)
        notifications = SqliteNotifications(path)

        def outbox(before: Run | None, after: Run) -> list[Change]:  # noqa: ARG001 - the trigger saw them
            entries = notifications.read_changes(limit=1000)
            if entries:
                notifications.ack_changes(entries[-1].position)
            return [(e.old, e.new) for e in entries if e.new is not None]

        return Adapters(
            kind="sqlite",
            store=SqliteStore(path),
            queues=queues,
            logs=FileLogs(tmp_path / "logs"),
            clock=FixedClock(T0),
            put_raw=lambda tier, body: queues.send_raw(tier, body),
            archive=FileArchive(tmp_path),
            notifications=notifications,
            read_changes=outbox,
        )

    return make


# ---- the fixture every contract test uses ----------------------------------------------------------------
@pytest.fixture(params=ADAPTER_SETS)
def adapters(request: pytest.FixtureRequest) -> Adapters:
    """A fresh, empty adapter set of each kind in :data:`ADAPTER_SETS`."""
    factory: AdapterFactory = request.getfixturevalue(f"_{request.param}_backend")
    return factory()
