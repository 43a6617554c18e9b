"""What every service receives: settings, the ports and a clock.

Services take one :class:`Deps` and reach storage, queues, logs and the timeout handler only through the
ports of :mod:`duetime.domain.ports`. The composition root, :mod:`duetime.config.deps`, builds the AWS
adapter set for the handlers; tests build their own (moto-backed adapters, a ``FixedClock``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from duetime.config.settings import Settings
from duetime.domain.clock import Clock
from duetime.domain.ports import (
    ArchiveStore,
    ChangeFeed,
    DeliveryWakeups,
    LogStore,
    NotificationStore,
    RunQueue,
    SignalOutbox,
    SnsPublisher,
    Store,
    TimeoutRunner,
    WebhookSender,
)

if TYPE_CHECKING:
    from duetime.domain.ports import IdempotencyPersistence


def _never(exc: BaseException) -> bool:  # noqa: ARG001 - the default classifier knows no endpoint
    return False


@dataclass
class NotifyPorts:
    """What the notifier needs (docs/design/notifications.md).

    Attributes:
        store: tenants' rules, events, deliveries, incidents.
        outbox: where the sweeper appends ``late`` and ``overran``.
        webhooks: POSTs deliveries (SSRF-checked on the resolved address, no redirects).
        sns: SNS topics and email.
        feed: the run changes, by cursor (the embedded store's outbox); None on AWS, where the runs table's
            stream invokes the notifier with them.
        wakeups: wakes the notifier for each delivery's next try (the notifications queue on AWS); None where
            the notifier polls due deliveries (the local stack).
    """

    store: NotificationStore
    outbox: SignalOutbox
    webhooks: WebhookSender
    sns: SnsPublisher
    feed: ChangeFeed | None = None
    wakeups: DeliveryWakeups | None = None


@dataclass
class Deps:
    """Attributes:
    settings: the process's settings.
    store: jobs and runs (:class:`~duetime.domain.ports.Store`).
    queues: the tier queues (:class:`~duetime.domain.ports.RunQueue`).
    logs: run logs (:class:`~duetime.domain.ports.LogStore`).
    clock: the clock every service reads (UTC).
    timeouts: runs timeout plans (Step Functions, or in-process when None: :mod:`duetime.services.timeouts`).
    idempotency: returns the persistence layer of ``Idempotency-Key`` records (created on first use); None
        where the deployment keeps none (the API refuses the header).
    unreachable: True for an exception that says the backing service could not be reached at all, or is
        too busy to answer for now (the embedded file's write lock held past its busy timeout): transient, so
        a worker logs one line for it instead of a traceback, and tries again.
    notify: the notifier's ports (:class:`NotifyPorts`).
    archive: the run archive (:class:`~duetime.domain.ports.ArchiveStore`).
    """

    settings: Settings
    store: Store
    queues: RunQueue
    logs: LogStore
    clock: Clock
    timeouts: TimeoutRunner | None = None
    idempotency: Callable[[], IdempotencyPersistence] | None = None
    unreachable: Callable[[BaseException], bool] = field(default=_never)
    #: the notifier's ports; None where the deployment has none (rules are still validated and stored)
    notify: NotifyPorts | None = None
    #: the run archive (domain/archive.py); None where the deployment has none (runs past the hot window
    #: are then gone)
    archive: ArchiveStore | None = None
