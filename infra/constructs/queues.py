"""Queues: one SQS queue per tier with its dead-letter queue (DESIGN.md section 7).

Attributes mirror ``duetime.adapters.aws.resources.queue_attributes`` (what the local stack creates): retention, redrive
after ``QUEUE_MAX_RECEIVE_COUNT`` deliveries, and the visibility timeout. The one deliberate difference is the
lambda tier: its consumer will be the dispatcher function, and AWS asks for a visibility timeout of at
least six times the timeout of a function fed by an SQS event source.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from duetime.adapters.aws.resources import (
    DLQ_RETENTION_SECONDS,
    QUEUE_MAX_RECEIVE_COUNT,
    QUEUE_VISIBILITY_SECONDS,
)
from duetime.config.settings import ALL_TIERS
from infra.nag import acknowledge

#: The dispatcher (the lambda tier's consumer) runs with this timeout, seconds.
DISPATCHER_TIMEOUT_SECONDS = 30
#: AWS: an SQS event source's queue needs a visibility timeout >= 6x the function timeout.
EVENT_SOURCE_VISIBILITY_FACTOR = 6


def visibility_seconds(tier: str) -> int:
    """Visibility timeout of ``tier``'s queue: workers extend theirs while a run runs; the lambda tier's
    covers six dispatcher timeouts."""
    if tier == "lambda":
        return max(QUEUE_VISIBILITY_SECONDS, EVENT_SOURCE_VISIBILITY_FACTOR * DISPATCHER_TIMEOUT_SECONDS)
    return QUEUE_VISIBILITY_SECONDS


def dead_letter_queue(scope: Construct, id: str, *, of: str) -> sqs.Queue:
    """A dead-letter queue (SQS-managed encryption, TLS only, ``DLQ_RETENTION_SECONDS``: SQS's 14-day
    maximum), acknowledged as one for cdk-nag's AwsSolutions-SQS3; ``of`` says whose (the finding's reason)."""
    dlq = sqs.Queue(
        scope,
        id,
        retention_period=Duration.seconds(DLQ_RETENTION_SECONDS),
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
    )
    acknowledge(dlq, "AwsSolutions-SQS3", f"it is the dead-letter queue of {of}")
    return dlq


class TierQueues(Construct):
    """``queue(tier)`` and ``dead_letter_queue(tier)`` for every tier in ``ALL_TIERS``."""

    def __init__(self, scope: Construct, id: str) -> None:
        super().__init__(scope, id)
        self._queues: dict[str, sqs.Queue] = {}
        self._dlqs: dict[str, sqs.Queue] = {}
        for tier in ALL_TIERS:
            name = tier.capitalize()
            dlq = dead_letter_queue(self, f"{name}Dlq", of=f"the {tier} tier's queue")
            self._dlqs[tier] = dlq
            self._queues[tier] = sqs.Queue(
                self,
                f"{name}Queue",
                visibility_timeout=Duration.seconds(visibility_seconds(tier)),
                retention_period=Duration.seconds(DLQ_RETENTION_SECONDS),
                dead_letter_queue=sqs.DeadLetterQueue(queue=dlq, max_receive_count=QUEUE_MAX_RECEIVE_COUNT),
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
            )

    def queue(self, tier: str) -> sqs.Queue:
        return self._queues[tier]

    def dead_letter_queue(self, tier: str) -> sqs.Queue:
        return self._dlqs[tier]

    @property
    def urls(self) -> dict[str, str]:
        """tier -> queue URL (tokens), the value of ``DUETIME_QUEUE_URLS``."""
        return {tier: q.queue_url for tier, q in self._queues.items()}
