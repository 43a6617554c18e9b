"""Least privilege, declared: which actions a compute role may take on which of Duetime's resources.

Each function (and each worker tier) lists :class:`Access` entries, read off the code it runs: e.g. the tick
queries the due index, inserts runs, advances jobs and sends to the tier queues, and nothing else. A
:class:`Catalogue` turns the entries into IAM statements on exact ARNs. No entry may use a wildcard action;
the only wildcard resources are object keys under the logs prefix (S3 has no other way to say "these
objects") and what AWS itself requires (X-Ray, ECR auth), each acknowledged where it is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam

from duetime.adapters.aws.resources import (
    jobs_table_definition,
    notifications_table_definition,
    runs_table_definition,
)
from duetime.config.settings import ALL_TIERS
from duetime.domain.logs import log_key
from infra.constructs.archive import ARCHIVE_PREFIX, Archive
from infra.constructs.notifications import Notifications
from infra.constructs.queues import TierQueues
from infra.constructs.storage import Storage
from infra.nag import acknowledge, arn_finding

#: Key prefix of run logs in the logs bucket, read off ``duetime.adapters.aws.s3_logs.log_key`` so the two cannot drift.
LOG_KEY_PREFIX = log_key("job", "run", 1).split("/", 1)[0] + "/"


class Target(StrEnum):
    JOBS = "jobs table"
    RUNS = "runs table"
    IDEMPOTENCY = "idempotency table"
    #: every tier's queue, or one tier's with ``Access.tier``
    QUEUES = "tier queues"
    #: objects under LOG_KEY_PREFIX in the logs bucket
    LOG_OBJECTS = "run log objects"
    #: the logs bucket itself (ListBucket: lets GetObject answer NoSuchKey instead of AccessDenied)
    LOGS_BUCKET = "logs bucket"
    #: Lambda functions of this account and region tagged ``TARGET_TAG_KEY=TARGET_TAG_VALUE`` (Lambda tasks)
    TAGGED_FUNCTIONS = "functions tagged for Duetime"
    #: objects under ARCHIVE_PREFIX in the archive bucket (run history, issue 19)
    ARCHIVE_OBJECTS = "run archive objects"
    #: the archive bucket itself (ListBucket: a job's archived days and index entries are listed)
    ARCHIVE_BUCKET = "archive bucket"
    #: the archiver's dead-letter queue
    ARCHIVER_DLQ = "archiver dead-letter queue"
    #: the notifier's table (events, deliveries, incidents, tenants' rules)
    NOTIFICATIONS = "notifications table"
    #: the notifications queue (signals and delivery wake-ups)
    NOTIFICATIONS_QUEUE = "notifications queue"
    #: the tenants' email topics: SNS topics of this account and region named ``<email topic prefix>-*``
    EMAIL_TOPICS = "email topics"
    #: SNS topics of this account and region (a rule's own ``sns_topic_arn``)
    ACCOUNT_TOPICS = "this account's topics"


#: The tag a function must carry for the dispatcher to invoke it as a Lambda task's target.
TARGET_TAG_KEY = "duetime-target"
TARGET_TAG_VALUE = "true"


#: The indexes each table has, from the core's own definitions: an Access naming another index is refused.
TABLE_INDEXES: dict[Target, frozenset[str]] = {
    Target.JOBS: frozenset(g["IndexName"] for g in jobs_table_definition("-")["GlobalSecondaryIndexes"]),
    Target.RUNS: frozenset(g["IndexName"] for g in runs_table_definition("-")["GlobalSecondaryIndexes"]),
    Target.NOTIFICATIONS: frozenset(
        g["IndexName"] for g in notifications_table_definition("-")["GlobalSecondaryIndexes"]
    ),
}


@dataclass(frozen=True)
class Access:
    """Allow ``actions`` on ``target``: on one of its GSIs when ``index`` is set; for QUEUES, only on
    ``tier``'s queue when ``tier`` is set."""

    target: Target
    actions: tuple[str, ...]
    tier: str | None = None
    index: str | None = None

    def __post_init__(self) -> None:
        if not self.actions or any("*" in a for a in self.actions):
            raise ValueError(f"exact actions only, got {self.actions}")
        if self.tier is not None and (self.target is not Target.QUEUES or self.tier not in ALL_TIERS):
            raise ValueError(f"tier {self.tier!r} only applies to queues of {ALL_TIERS}")
        if self.index is not None and self.index not in TABLE_INDEXES.get(self.target, ()):
            raise ValueError(f"{self.target} has no index {self.index!r}")


def allow(target: Target, *actions: str, tier: str | None = None, index: str | None = None) -> Access:
    return Access(target, tuple(actions), tier, index)


class Catalogue:
    """Resolves :class:`Target` to the ARNs of one stack's resources."""

    def __init__(
        self,
        storage: Storage,
        queues: TierQueues,
        archive: Archive | None = None,
        notifications: Notifications | None = None,
    ) -> None:
        self.storage = storage
        self.queues = queues
        self.archive = archive
        self.notifications = notifications

    def _archive(self) -> Archive:
        if self.archive is None:
            raise ValueError("this stack has no run archive")
        return self.archive

    def _notifications(self) -> Notifications:
        if self.notifications is None:
            raise ValueError("this stack has no notifications construct")
        return self.notifications

    def _topic_arn(self, name: str) -> str:
        return Stack.of(self.storage).format_arn(
            service="sns", resource=name, arn_format=ArnFormat.NO_RESOURCE_NAME
        )

    def arns(self, access: Access) -> list[str]:
        s = self.storage
        if access.target in (Target.JOBS, Target.RUNS, Target.IDEMPOTENCY, Target.NOTIFICATIONS):
            table = (
                self._notifications().table
                if access.target is Target.NOTIFICATIONS
                else {Target.JOBS: s.jobs, Target.RUNS: s.runs, Target.IDEMPOTENCY: s.idempotency}[
                    access.target
                ]
            )
            return [f"{table.table_arn}/index/{access.index}" if access.index else table.table_arn]
        match access.target:
            case Target.QUEUES:
                tiers = [access.tier] if access.tier else list(ALL_TIERS)
                return [self.queues.queue(t).queue_arn for t in tiers]
            case Target.LOG_OBJECTS:
                return [f"{s.logs_bucket_arn}/{LOG_KEY_PREFIX}*"]
            case Target.LOGS_BUCKET:
                return [s.logs_bucket_arn]
            case Target.ARCHIVE_OBJECTS:
                return [f"{self._archive().bucket.bucket_arn}/{ARCHIVE_PREFIX}*"]
            case Target.ARCHIVE_BUCKET:
                return [self._archive().bucket.bucket_arn]
            case Target.ARCHIVER_DLQ:
                return [self._archive().dead_letter_queue.queue_arn]
            case Target.NOTIFICATIONS_QUEUE:
                return [self._notifications().queue.queue_arn]
            case Target.EMAIL_TOPICS:
                return [self._topic_arn(f"{self._notifications().email_topic_prefix}-*")]
            case Target.ACCOUNT_TOPICS:
                return [self._topic_arn("*")]
            case Target.TAGGED_FUNCTIONS:
                return [
                    Stack.of(s).format_arn(
                        service="lambda",
                        resource="function",
                        resource_name="*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ]
        raise ValueError(access.target)

    @staticmethod
    def conditions(access: Access) -> dict[str, Any] | None:
        if access.target is Target.TAGGED_FUNCTIONS:
            return {"StringEquals": {f"aws:ResourceTag/{TARGET_TAG_KEY}": TARGET_TAG_VALUE}}
        return None

    def statements(self, accesses: tuple[Access, ...]) -> list[iam.PolicyStatement]:
        """One statement per entry: exact actions on exact resources (tagged functions: by tag condition).
        With logs in a directory bucket (S3 Express One Zone), the log entries become one
        ``s3express:CreateSession`` on the bucket: its sessions carry the object access, read-only
        (``s3express:SessionMode``) when every log action is a read ("Authorizing Regional endpoint API
        operations with IAM", Amazon S3 User Guide)."""
        logs = (Target.LOG_OBJECTS, Target.LOGS_BUCKET)
        out = [
            iam.PolicyStatement(
                actions=sorted(a.actions), resources=self.arns(a), conditions=self.conditions(a)
            )
            for a in accesses
            if self.storage.logs_directory_bucket is None or a.target not in logs
        ]
        log_actions = {action for a in accesses if a.target in logs for action in a.actions}
        if self.storage.logs_directory_bucket is not None and log_actions:
            read_only = log_actions <= {"s3:GetObject", "s3:ListBucket"}
            out.append(
                iam.PolicyStatement(
                    actions=["s3express:CreateSession"],
                    resources=[self.storage.logs_bucket_arn],
                    conditions={"StringEquals": {"s3express:SessionMode": "ReadOnly"}} if read_only else None,
                )
            )
        return out

    def grant(self, role: iam.IRole, accesses: tuple[Access, ...]) -> None:
        """Add the statements to ``role``; acknowledge the log-object wildcard where it is granted."""
        for statement in self.statements(accesses):
            role.add_to_principal_policy(statement)
        if any(a.target is Target.LOG_OBJECTS for a in accesses) and self.storage.logs_bucket is not None:
            acknowledge(
                role,
                arn_finding(self.storage.logs_bucket, f"/{LOG_KEY_PREFIX}*"),
                f"S3 names objects by key: the grant covers exactly the run logs under {LOG_KEY_PREFIX} in "
                "Duetime's own logs bucket",
            )
        if any(a.target is Target.ARCHIVE_OBJECTS for a in accesses):
            acknowledge(
                role,
                arn_finding(self._archive().bucket, f"/{ARCHIVE_PREFIX}*"),
                f"S3 names objects by key: the grant covers exactly the run archive under {ARCHIVE_PREFIX} in "
                "Duetime's own archive bucket",
            )
        if any(a.target is Target.EMAIL_TOPICS for a in accesses):
            prefix = self._notifications().email_topic_prefix
            acknowledge(
                role,
                f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sns:<AWS::Region>:<AWS::AccountId>:{prefix}-*]",
                "the notifier creates one email topic per tenant at run time (a tenant's alerts never share a "
                f"topic with another's): the grant covers exactly this stack's topics, named {prefix}-*",
            )
        if any(a.target is Target.ACCOUNT_TOPICS for a in accesses):
            acknowledge(
                role,
                "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sns:<AWS::Region>:<AWS::AccountId>:*]",
                "a rule names its own topic (sns_topic_arn) at run time: sns:Publish only, on topics of this "
                "account and region (a topic in another account is refused by this policy whatever its own "
                "resource policy says); each message carries its tenant as an attribute",
            )
        if any(a.target is Target.TAGGED_FUNCTIONS for a in accesses):
            acknowledge(
                role,
                "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:lambda:<AWS::Region>:<AWS::AccountId>:function:*]",
                "Lambda tasks name their target at run time: the grant is limited by condition to functions "
                f"of this account and region tagged {TARGET_TAG_KEY}={TARGET_TAG_VALUE}",
            )
