"""Notifications (issue 17): the notifier's table, its queue and dead-letter queue, and its event sources.

- **table**: built from ``resources.notifications_table_definition`` (the definition moto and the tests
  create), TTL ``expires_at``: events, deliveries, incidents, tenants' default rules.
- **queue** (+ DLQ): the sweeper's ``late``/``overran`` signals and each delivery's wake-up, delayed until
  its next try (backoff for about a day is the notifier's, one message per try); a message the notifier
  fails to handle ``NOTIFICATIONS_MAX_RECEIVE_COUNT`` times goes to the DLQ, which also receives the
  pointers of stream batches the notifier gave up on (the mapping's on-failure destination).
- **event sources** of the notifier function (:meth:`Notifications.feed`): the runs table's stream
  (``NEW_AND_OLD_IMAGES``), filtered to changes that can give an event (``EVENT_STATES``, or an insert with
  ``missed_slots``), and the queue; both report batch item failures.
- **email topics** are created by the notifier at run time, one per tenant, named
  ``<stack name>-email-<tenant>-<hash>`` (``email_topic_prefix``): the role may create, tag, subscribe to,
  list and publish to topics with that prefix only.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from aws_cdk.aws_lambda_event_sources import DynamoEventSource, SqsDlq, SqsEventSource
from constructs import Construct

from duetime.adapters.aws.resources import (
    DLQ_RETENTION_SECONDS,
    NOTIFICATIONS_MAX_RECEIVE_COUNT,
    NOTIFICATIONS_TTL_ATTRIBUTE,
    NOTIFICATIONS_VISIBILITY_SECONDS,
    NOTIFIER_QUEUE_BATCH,
    notifications_table_definition,
)
from duetime.domain.notifications import EVENT_STATES
from infra.config import StageConfig
from infra.constructs.queues import dead_letter_queue
from infra.constructs.storage import table_from_definition

#: stream records per notifier invocation (it makes no HTTP call on them: a few DynamoDB writes each)
STREAM_BATCH = 100
#: the stream mapping's retries of a failed batch before its pointers go to the DLQ (records stay in the
#: stream for 24 h; each retry starts from the first failed record)
STREAM_RETRIES = 100


def email_topic_prefix(scope: Construct) -> str:
    """The name prefix of this stack's email topics (``<stack name>-email``)."""
    return f"{Stack.of(scope).stack_name}-email"


class Notifications(Construct):
    """Attributes:
    table: the notifications table.
    queue: the notifications queue; dead_letter_queue: its DLQ.
    email_topic_prefix: the prefix of the tenants' email topics (see the module).
    """

    def __init__(self, scope: Construct, id: str, *, config: StageConfig) -> None:
        super().__init__(scope, id)
        self.table = table_from_definition(
            self,
            "Table",
            notifications_table_definition("notifications"),
            config=config,
            time_to_live_attribute=NOTIFICATIONS_TTL_ATTRIBUTE,
            name="notifications",
        )
        self.dead_letter_queue = dead_letter_queue(
            self, "Dlq", of="the notifications queue and of the notifier's stream mapping"
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            visibility_timeout=Duration.seconds(NOTIFICATIONS_VISIBILITY_SECONDS),
            retention_period=Duration.seconds(DLQ_RETENTION_SECONDS),
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.dead_letter_queue, max_receive_count=NOTIFICATIONS_MAX_RECEIVE_COUNT
            ),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        self.email_topic_prefix = email_topic_prefix(self)

    def feed(self, notifier: lambda_.Function, runs: ddb.ITable) -> None:
        """Make the runs table's stream and the queue the notifier's event sources."""
        changes = lambda_.FilterCriteria.filter(
            {"dynamodb": {"NewImage": {"state": {"S": lambda_.FilterRule.or_(*EVENT_STATES)}}}}
        )
        missed = lambda_.FilterCriteria.filter(
            {
                "eventName": lambda_.FilterRule.is_equal("INSERT"),
                # CDK's between(a, b) is "> a, <= b": missed_slots >= 1
                "dynamodb": {"NewImage": {"missed_slots": {"N": lambda_.FilterRule.between(0, 10**9)}}},
            }
        )
        notifier.add_event_source(
            DynamoEventSource(
                runs,
                starting_position=lambda_.StartingPosition.TRIM_HORIZON,
                batch_size=STREAM_BATCH,
                max_batching_window=Duration.seconds(1),
                report_batch_item_failures=True,
                retry_attempts=STREAM_RETRIES,
                on_failure=SqsDlq(self.dead_letter_queue),
                filters=[changes, missed],
            )
        )
        notifier.add_event_source(
            SqsEventSource(self.queue, batch_size=NOTIFIER_QUEUE_BATCH, report_batch_item_failures=True)
        )
