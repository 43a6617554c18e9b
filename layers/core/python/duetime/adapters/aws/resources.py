"""The shape of every AWS resource Duetime uses, defined once.

The local stack creates tables and queues from these definitions (boto3 ``create_table`` /
``create_queue`` arguments) and the CDK app (``infra/``) builds its constructs from the same constants, so the
two cannot drift. Physical names are never hard-coded in AWS: the CDK app lets CloudFormation name them;
locally they are ``<prefix>-<logical>``.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

from pydantic import BaseModel, ConfigDict

from duetime.config.settings import ALL_TIERS
from duetime.domain.lifecycle import MAX_MESSAGE_DELAY_SECONDS
from duetime.domain.ports import QUEUE_MAX_RECEIVE_COUNT, QUEUE_VISIBILITY_SECONDS

# --- jobs table -------------------------------------------------------------------------------------------
JOBS_PK = "job_id"
#: due GSI: (shard, next_fire_at); sparse, holds only jobs with a future fire (DESIGN.md section 3). The
#: item's ``shard`` attribute holds the job's due key (:func:`due_key`), not the shard itself.
DUE_INDEX = "due"
DUE_INDEX_PK = "shard"
DUE_INDEX_SK = "next_fire_at"
#: due-index key values per shard: a job's key is ``DUE_KEY_BASE + shard * DUE_KEYS_PER_SHARD + part``, its
#: part a stable hash of its id (:func:`due_part`), so one shard's claims, whose every advance moves the
#: job's index entry (2 write units), spread over this many index partitions (each key value takes at most
#: 1,000 write units/s: "Best practices for designing and using partition keys", Amazon DynamoDB Developer
#: Guide): at most 500 claims/s per key, ``500 * DUE_KEYS_PER_SHARD`` per shard. A tick queries each key
#: (:func:`due_keys`) and merges them by due time.
DUE_KEYS_PER_SHARD = 4
#: The first due key: above every shard number (at most 1,023: ``Settings.shard_count``'s bound), so a row
#: written before the spread, whose ``shard`` attribute is its shard, is never under another shard's key; a
#: tick still queries that legacy key (its shard's number) and the row's next write moves it to its own key.
DUE_KEY_BASE = 10_000


def due_part(job_id: str) -> int:
    """Which of its shard's due keys job ``job_id`` sits under, ``0 <= part < DUE_KEYS_PER_SHARD``: fixed
    for the job's life. BLAKE2b of the id, not the CRC-32 that picks the shard (``services.jobs.shard_of``):
    with a shard count divisible by the key count, CRC-32 mod the key count would be the same for every job
    of a shard, and Python's ``hash()`` differs between processes."""
    digest = hashlib.blake2b(job_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % DUE_KEYS_PER_SHARD


def due_key(shard: int, job_id: str) -> int:
    """The due-index key of job ``job_id`` of ``shard`` (the value its ``shard`` attribute holds)."""
    return DUE_KEY_BASE + shard * DUE_KEYS_PER_SHARD + due_part(job_id)


def due_keys(shard: int) -> range:
    """Every due-index key value of ``shard`` (:func:`due_key`), in part order; not the legacy key."""
    first = DUE_KEY_BASE + shard * DUE_KEYS_PER_SHARD
    return range(first, first + DUE_KEYS_PER_SHARD)


def shard_of_due_key(value: int) -> int:
    """The shard a stored ``shard`` attribute names: a due key's (:func:`due_key`), or the value itself on
    a row written before the spread (below :data:`DUE_KEY_BASE`)."""
    return value if value < DUE_KEY_BASE else (value - DUE_KEY_BASE) // DUE_KEYS_PER_SHARD


#: per-tenant listing of jobs: (tenant, created_at).
JOBS_BY_TENANT_INDEX = "by_tenant"
TENANT_KEY = "tenant"
CREATED_AT_KEY = "created_at"
#: the non-key attributes the listing index holds (``domain.models.JobSummary``'s fields)
JOBS_BY_TENANT_PROJECTION = ("state", "name", "schedule", "anchor")

# --- runs table -------------------------------------------------------------------------------------------
RUNS_PK = "job_id"
RUNS_SK = "due_at"
#: watchdog GSI: (watch_shard, watch_at); sparse, holds only non-terminal runs; KEYS_ONLY.
WATCH_INDEX = "watchdog"
WATCH_INDEX_PK = "watch_shard"
WATCH_INDEX_SK = "watch_at"
#: watchdog key values per shard: a run's key is ``shard * WATCH_KEYS_PER_SHARD + crc32(run_id) % it``
#: (:func:`watch_key`), so one shard's non-terminal runs spread over this many index partitions (each key
#: value takes at most 1,000 write units/s: "Best practices for designing and using partition keys", Amazon
#: DynamoDB Developer Guide); the sweeper queries each. Rows written before the spread carry
#: ``watch_shard = shard``, a value in the range the sweep covers, so they are still found.
WATCH_KEYS_PER_SHARD = 4


def watch_key(shard: int, run_id: str) -> int:
    """The watchdog index key of run ``run_id`` of ``shard``: fixed for the run's life (derived from its id,
    so a write never moves it to another key)."""
    return shard * WATCH_KEYS_PER_SHARD + zlib.crc32(run_id.encode()) % WATCH_KEYS_PER_SHARD


def watch_keys(shard: int) -> range:
    """Every watchdog key value of ``shard`` (:func:`watch_key`)."""
    return range(shard * WATCH_KEYS_PER_SHARD, (shard + 1) * WATCH_KEYS_PER_SHARD)


#: active-runs GSI: (active_job, due_at), KEYS_ONLY; sparse: only non-terminal runs of jobs with an overlap
#: policy carry ``active_job`` (= job_id), so starting a run finds the job's other active runs in one Query.
ACTIVE_INDEX = "active_by_job"
ACTIVE_INDEX_PK = "active_job"
#: running-runs GSI: (running_tenant, due_at), KEYS_ONLY; sparse: only RUNNING runs, and only while a
#: per-tenant concurrency limit is configured, so a start can count the tenant's running runs in one Query.
RUNNING_INDEX = "running_by_tenant"
RUNNING_INDEX_PK = "running_tenant"
#: dead letters GSI: (dead_letter_tenant, dead_lettered_at); sparse: only dead-lettered runs.
DEAD_LETTER_INDEX = "dead_letters"
DEAD_LETTER_INDEX_PK = "dead_letter_tenant"
DEAD_LETTER_INDEX_SK = "dead_lettered_at"
#: the shard lease items live in the jobs table under these ids (no tenant, no next_fire_at: in no index).
SHARD_LEASE_PREFIX = "#shard-lease#"
#: per-tenant counters (active jobs) live in the jobs table under these ids (in no index either).
TENANT_COUNTER_PREFIX = "#tenant#"
#: per-tenant, per-minute submit counters live in the idempotency table (it has a TTL) under these ids.
SUBMIT_RATE_PREFIX = "#submits#"
#: worker sessions are items of the runs table under ``job_id = SESSION_PREFIX + session_id`` (no job id can
#: take it: job ids are letters, digits, ``_`` and ``-``) and ``due_at = SESSION_SORT_KEY``; they carry no
#: index attribute, so no GSI holds them
SESSION_PREFIX = "#session#"
SESSION_SORT_KEY = "session"
#: TTL attribute on runs (epoch seconds).
RUNS_TTL_ATTRIBUTE = "expires_at"

# --- idempotency table (Powertools idempotency persistence) -------------------------------------------
IDEMPOTENCY_PK = "id"
IDEMPOTENCY_TTL_ATTRIBUTE = "expiration"

# --- notifications table (docs/design/notifications.md) ------------------------------------------------
#: pk ``pk``, sk ``sk`` (both strings): every item of a job under ``pk = job#<job_id>`` (its incident, its
#: events, their deliveries and each event id's "seen" marker), a tenant's default rules under
#: ``pk = tenant#<tenant>``, ``sk = rules`` (items of adapters/aws/notifications.py).
NOTIFICATIONS_PK = "pk"
NOTIFICATIONS_SK = "sk"
#: due-deliveries GSI: (due_shard, next_attempt_at); sparse: only pending deliveries carry ``due_shard``
#: (crc32 of the delivery id mod :data:`DELIVERY_DUE_SHARDS`, so writes spread over that many partitions).
DELIVERY_DUE_INDEX = "due_deliveries"
DELIVERY_DUE_INDEX_PK = "due_shard"
DELIVERY_DUE_INDEX_SK = "next_attempt_at"
DELIVERY_DUE_SHARDS = 4
#: TTL attribute of events and deliveries (epoch seconds): kept as long as failed runs are.
NOTIFICATIONS_TTL_ATTRIBUTE = "expires_at"

# --- queues -----------------------------------------------------------------------------------------------
#: SQS caps DelaySeconds at 900 (15 minutes).
SQS_MAX_DELAY_SECONDS = MAX_MESSAGE_DELAY_SECONDS
#: DLQ retention: the SQS maximum, 14 days.
DLQ_RETENTION_SECONDS = 14 * 24 * 3600


class ResourceNames(BaseModel):
    """Physical names of one stack's resources (local stack) or their CloudFormation-generated names."""

    model_config = ConfigDict(frozen=True)

    jobs_table: str
    runs_table: str
    logs_bucket: str
    #: tier -> queue name
    queues: dict[str, str]
    #: tier -> dead-letter queue name
    dead_letter_queues: dict[str, str]
    #: Powertools idempotency records of ``Idempotency-Key`` requests
    idempotency_table: str = ""
    #: the run archive (domain/archive.py)
    archive_bucket: str = ""
    #: the notifier's table (events, deliveries, incidents, tenants' rules) and its queue (the sweeper's
    #: late/overran signals and each delivery's wake-ups) with its dead-letter queue
    notifications_table: str = ""
    notifications_queue: str = ""
    notifications_dead_letter_queue: str = ""

    @classmethod
    def for_prefix(cls, prefix: str) -> ResourceNames:
        """Names for a local stack: ``<prefix>-jobs``, ``<prefix>-runs``, ``<prefix>-<tier>``..."""
        return cls(
            jobs_table=f"{prefix}-jobs",
            runs_table=f"{prefix}-runs",
            logs_bucket=f"{prefix}-logs",
            queues={tier: f"{prefix}-{tier}" for tier in ALL_TIERS},
            dead_letter_queues={tier: f"{prefix}-{tier}-dlq" for tier in ALL_TIERS},
            idempotency_table=f"{prefix}-idempotency",
            archive_bucket=f"{prefix}-archive",
            notifications_table=f"{prefix}-notifications",
            notifications_queue=f"{prefix}-notifications",
            notifications_dead_letter_queue=f"{prefix}-notifications-dlq",
        )


def jobs_table_definition(name: str) -> dict[str, Any]:
    """``dynamodb.create_table`` arguments for the jobs table (on-demand billing)."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": [{"AttributeName": JOBS_PK, "KeyType": "HASH"}],
        "AttributeDefinitions": [
            {"AttributeName": JOBS_PK, "AttributeType": "S"},
            {"AttributeName": DUE_INDEX_PK, "AttributeType": "N"},
            {"AttributeName": DUE_INDEX_SK, "AttributeType": "S"},
            {"AttributeName": TENANT_KEY, "AttributeType": "S"},
            {"AttributeName": CREATED_AT_KEY, "AttributeType": "S"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": DUE_INDEX,
                "KeySchema": [
                    {"AttributeName": DUE_INDEX_PK, "KeyType": "HASH"},
                    {"AttributeName": DUE_INDEX_SK, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": JOBS_BY_TENANT_INDEX,
                "KeySchema": [
                    {"AttributeName": TENANT_KEY, "KeyType": "HASH"},
                    {"AttributeName": CREATED_AT_KEY, "KeyType": "RANGE"},
                ],
                # what a listing shows and its filters read (JobSummary): a claim (next_fire_at,
                # version, updated_at) never writes this index
                "Projection": {
                    "ProjectionType": "INCLUDE",
                    "NonKeyAttributes": list(JOBS_BY_TENANT_PROJECTION),
                },
            },
        ],
    }


def runs_table_definition(name: str) -> dict[str, Any]:
    """``dynamodb.create_table`` arguments for the runs table (on-demand billing, TTL set separately)."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": [
            {"AttributeName": RUNS_PK, "KeyType": "HASH"},
            {"AttributeName": RUNS_SK, "KeyType": "RANGE"},
        ],
        "AttributeDefinitions": [
            {"AttributeName": RUNS_PK, "AttributeType": "S"},
            {"AttributeName": RUNS_SK, "AttributeType": "S"},
            {"AttributeName": WATCH_INDEX_PK, "AttributeType": "N"},
            {"AttributeName": WATCH_INDEX_SK, "AttributeType": "S"},
            {"AttributeName": ACTIVE_INDEX_PK, "AttributeType": "S"},
            {"AttributeName": RUNNING_INDEX_PK, "AttributeType": "S"},
            {"AttributeName": DEAD_LETTER_INDEX_PK, "AttributeType": "S"},
            {"AttributeName": DEAD_LETTER_INDEX_SK, "AttributeType": "S"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": WATCH_INDEX,
                "KeySchema": [
                    {"AttributeName": WATCH_INDEX_PK, "KeyType": "HASH"},
                    {"AttributeName": WATCH_INDEX_SK, "KeyType": "RANGE"},
                ],
                # keys only: a run's writes that leave its watch key (events, most starts) cost
                # the index nothing; the sweeper reads the few overdue runs whole (BatchGetItem)
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
            {
                "IndexName": ACTIVE_INDEX,
                "KeySchema": [
                    {"AttributeName": ACTIVE_INDEX_PK, "KeyType": "HASH"},
                    {"AttributeName": RUNS_SK, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
            {
                "IndexName": RUNNING_INDEX,
                "KeySchema": [
                    {"AttributeName": RUNNING_INDEX_PK, "KeyType": "HASH"},
                    {"AttributeName": RUNS_SK, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
            {
                "IndexName": DEAD_LETTER_INDEX,
                "KeySchema": [
                    {"AttributeName": DEAD_LETTER_INDEX_PK, "KeyType": "HASH"},
                    {"AttributeName": DEAD_LETTER_INDEX_SK, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
        ],
    }


def idempotency_table_definition(name: str) -> dict[str, Any]:
    """``dynamodb.create_table`` arguments for Powertools' idempotency table (pk ``id``, TTL ``expiration``)."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": [{"AttributeName": IDEMPOTENCY_PK, "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": IDEMPOTENCY_PK, "AttributeType": "S"}],
    }


def notifications_table_definition(name: str) -> dict[str, Any]:
    """``dynamodb.create_table`` arguments for the notifications table (on-demand, TTL set separately)."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": [
            {"AttributeName": NOTIFICATIONS_PK, "KeyType": "HASH"},
            {"AttributeName": NOTIFICATIONS_SK, "KeyType": "RANGE"},
        ],
        "AttributeDefinitions": [
            {"AttributeName": NOTIFICATIONS_PK, "AttributeType": "S"},
            {"AttributeName": NOTIFICATIONS_SK, "AttributeType": "S"},
            {"AttributeName": DELIVERY_DUE_INDEX_PK, "AttributeType": "N"},
            {"AttributeName": DELIVERY_DUE_INDEX_SK, "AttributeType": "S"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": DELIVERY_DUE_INDEX,
                "KeySchema": [
                    {"AttributeName": DELIVERY_DUE_INDEX_PK, "KeyType": "HASH"},
                    {"AttributeName": DELIVERY_DUE_INDEX_SK, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    }


#: The notifications queue: a message is received this many times before it is dead-lettered. A delivery's
#: own retries (about a day, with backoff) are separate messages, each received once when all goes well;
#: this counts the notifier's failures to handle one message (its table or SNS unreachable).
NOTIFICATIONS_MAX_RECEIVE_COUNT = 10
#: The notifier's timeout, seconds: a batch of :data:`NOTIFIER_QUEUE_BATCH` wake-ups, each one webhook try
#: of at most 60 s (``notify_timeout_seconds``' cap), fits in it; the queue's visibility timeout is 6 times
#: it (AWS's rule for an SQS event source).
NOTIFIER_TIMEOUT_SECONDS = 300
NOTIFIER_QUEUE_BATCH = 4
NOTIFICATIONS_VISIBILITY_SECONDS = 6 * NOTIFIER_TIMEOUT_SECONDS


def notifications_queue_attributes(dead_letter_arn: str) -> dict[str, str]:
    """``sqs.create_queue`` attributes of the notifications queue (redrive to ``dead_letter_arn``)."""
    import json

    return {
        "VisibilityTimeout": str(NOTIFICATIONS_VISIBILITY_SECONDS),
        "MessageRetentionPeriod": str(DLQ_RETENTION_SECONDS),
        "RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": NOTIFICATIONS_MAX_RECEIVE_COUNT}
        ),
    }


def queue_attributes(dead_letter_arn: str, *, tier: str) -> dict[str, str]:
    """``sqs.create_queue`` attributes of a tier's queue, with its redrive policy to ``dead_letter_arn``."""
    import json

    return {
        "VisibilityTimeout": str(QUEUE_VISIBILITY_SECONDS),
        "MessageRetentionPeriod": str(DLQ_RETENTION_SECONDS),
        "RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": QUEUE_MAX_RECEIVE_COUNT}
        ),
    }


def dead_letter_queue_attributes() -> dict[str, str]:
    """``sqs.create_queue`` attributes of a tier's dead-letter queue."""
    return {"MessageRetentionPeriod": str(DLQ_RETENTION_SECONDS)}


def create_all(names: ResourceNames, *, session: Any = None) -> dict[str, str]:
    """Create every table, queue and the bucket (idempotent: existing ones are kept).

    Used by the local stack and by integration tests under moto. Returns ``{tier: queue_url}``.

    Args:
        names: physical names to create.
        session: an optional ``boto3.Session``; the default session otherwise.
    """
    import boto3

    sess = session or boto3.session.Session()
    ddb = sess.client("dynamodb")
    existing = set(ddb.list_tables()["TableNames"])
    for definition in (jobs_table_definition(names.jobs_table), runs_table_definition(names.runs_table)):
        if definition["TableName"] not in existing:
            ddb.create_table(**definition)
    if names.runs_table not in existing:
        ddb.update_time_to_live(
            TableName=names.runs_table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": RUNS_TTL_ATTRIBUTE},
        )
    if names.idempotency_table and names.idempotency_table not in existing:
        ddb.create_table(**idempotency_table_definition(names.idempotency_table))
        ddb.update_time_to_live(
            TableName=names.idempotency_table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": IDEMPOTENCY_TTL_ATTRIBUTE},
        )

    if names.notifications_table and names.notifications_table not in existing:
        ddb.create_table(**notifications_table_definition(names.notifications_table))
        ddb.update_time_to_live(
            TableName=names.notifications_table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": NOTIFICATIONS_TTL_ATTRIBUTE},
        )

    s3 = sess.client("s3")
    for bucket in filter(None, (names.logs_bucket, names.archive_bucket)):
        try:
            s3.head_bucket(Bucket=bucket)
        except Exception:  # noqa: BLE001 - any miss means "create it"
            s3.create_bucket(Bucket=bucket)

    sqs = sess.client("sqs")
    urls: dict[str, str] = {}
    for tier in ALL_TIERS:
        dlq_url = sqs.create_queue(
            QueueName=names.dead_letter_queues[tier], Attributes=dead_letter_queue_attributes()
        )["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        urls[tier] = sqs.create_queue(
            QueueName=names.queues[tier], Attributes=queue_attributes(dlq_arn, tier=tier)
        )["QueueUrl"]
    if names.notifications_queue:
        notifications_queue_url(names, session=sess)
    return urls


def notifications_queue_url(names: ResourceNames, *, session: Any = None) -> str:
    """Create the notifications queue and its dead-letter queue if they are not there; the queue's URL."""
    import boto3

    sqs = (session or boto3.session.Session()).client("sqs")
    dlq_url = sqs.create_queue(
        QueueName=names.notifications_dead_letter_queue, Attributes=dead_letter_queue_attributes()
    )["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    return str(
        sqs.create_queue(
            QueueName=names.notifications_queue, Attributes=notifications_queue_attributes(dlq_arn)
        )["QueueUrl"]
    )
