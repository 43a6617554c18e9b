"""Functions: the Lambda handlers in ``functions/<name>/handler.py`` with the core library as a layer.

Adding a function is one entry in :data:`FUNCTIONS`: its folder, size, the exact access its code needs and,
for a queue consumer, the tier whose queue feeds it. Every function gets arm64, Python 3.12, JSON logs in its
own log group with the stage's retention, active X-Ray tracing, its own role with only its listed access, and
the same ``DUETIME_*`` environment (see :mod:`infra.environment`).

``queue_source`` adds an SQS event source with ``report_batch_item_failures`` (the handler must answer with
Powertools' ``process_partial_response``) and checks the queue's visibility timeout is at least six times the
function's timeout. The mechanism is exercised by ``tests/infra`` with a stand-in handler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk.aws_lambda_event_sources import SqsEventSource
from constructs import Construct

from duetime.adapters.aws.resources import (
    ACTIVE_INDEX,
    DEAD_LETTER_INDEX,
    DUE_INDEX,
    JOBS_BY_TENANT_INDEX,
    NOTIFIER_TIMEOUT_SECONDS,
    RUNNING_INDEX,
    WATCH_INDEX,
)
from infra.bundling import LAYER_EXCLUDES, LAYER_SOURCE, PYTHON_VERSION, REPO_ROOT, layer_bundling
from infra.config import StageConfig
from infra.constructs.access import Access, Catalogue, Target, allow
from infra.constructs.queues import (
    DISPATCHER_TIMEOUT_SECONDS,
    EVENT_SOURCE_VISIBILITY_FACTOR,
    TierQueues,
    visibility_seconds,
)
from infra.nag import acknowledge

RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.ARM_64
HANDLER = "handler.lambda_handler"
FUNCTIONS_DIR = REPO_ROOT / "functions"
assert RUNTIME.name == f"python{PYTHON_VERSION}", "the layer is bundled for another Python"

_SEND = ("sqs:SendMessage",)


@dataclass(frozen=True)
class FunctionSpec:
    """One Lambda function: ``functions/<name>/handler.py`` exposing ``lambda_handler``."""

    name: str
    description: str
    timeout_seconds: int
    memory_mib: int
    #: exact actions on exact resources, read off the code the handler runs
    access: tuple[Access, ...]
    #: tier whose queue invokes this function (SQS event source, partial batch failures)
    queue_source: str | None = None
    #: Lambda's own retries of an asynchronous invocation (scheduled ones: the next schedule is the retry)
    async_retries: int = 2
    #: the Lambda destination of target functions in this account: lambda.amazonaws.com may invoke it
    destination: bool = False
    #: the folder holding handler.py (default ``functions/<name>``)
    source: Path | None = field(default=None, compare=False)

    @property
    def code_dir(self) -> Path:
        return self.source or FUNCTIONS_DIR / self.name


#: Powertools idempotency (``DynamoDBPersistenceLayer``): get, put (conditional), update and delete records.
IDEMPOTENCY_ACTIONS = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")

#: The API serves ``duetime.services.jobs``: submit (put job, then claim: put run, advance job, send), read and list
#: jobs (GetItem; Query by tenant, then BatchGetItem the page), replace a job on PATCH/pause/resume/delete (conditional PutItem), trigger
#: (put run, send), list runs (Query), read a run (GetItem), cancel or redrive a run (UpdateItem, then wake the
#: job's next waiting run: Query the active index, GetItem, send), list dead letters (Query), read logs
#: (GetObject; ListBucket so a missing object reads as NoSuchKey, not AccessDenied), read run history that
#: left the hot window (``services.history``: list a job's archived days and index entries, ListBucket; read
#: them and ranged GETs of the data objects, GetObject), and replay ``Idempotency-Key`` requests (Powertools);
#: notifications: read and replace the tenant's default rules
#: (GetItem, PutItem) and list a job's events (Query) with their deliveries (BatchGetItem); subscribe a rule's
#: email addresses to the tenant's email topic when it is saved (CreateTopic with its tenant tag: TagResource;
#: ListSubscriptionsByTopic, Subscribe).
API = FunctionSpec(
    "api",
    "Duetime HTTP API: submit and read jobs, runs and logs",
    timeout_seconds=10,
    memory_mib=512,
    access=(
        allow(
            Target.JOBS,
            "dynamodb:GetItem",
            "dynamodb:BatchGetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
        ),
        allow(Target.JOBS, "dynamodb:Query", index=JOBS_BY_TENANT_INDEX),
        allow(Target.RUNS, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"),
        allow(Target.RUNS, "dynamodb:Query", index=ACTIVE_INDEX),
        allow(Target.RUNS, "dynamodb:Query", index=DEAD_LETTER_INDEX),
        allow(Target.IDEMPOTENCY, *IDEMPOTENCY_ACTIONS),
        allow(Target.QUEUES, *_SEND),
        allow(Target.LOG_OBJECTS, "s3:GetObject"),
        allow(Target.LOGS_BUCKET, "s3:ListBucket"),
        allow(Target.ARCHIVE_OBJECTS, "s3:GetObject"),
        allow(Target.ARCHIVE_BUCKET, "s3:ListBucket"),
        allow(
            Target.NOTIFICATIONS,
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:BatchGetItem",
        ),
        allow(
            Target.EMAIL_TOPICS,
            "sns:CreateTopic",
            "sns:TagResource",
            "sns:ListSubscriptionsByTopic",
            "sns:Subscribe",
        ),
    ),
)
#: The tick runs ``duetime.services.claims.tick``: Query the due index (each of the shard's due keys); with
#: something due, take the shard lease (UpdateItem on its item in the jobs table), then per job PutItem run,
#: UpdateItem job, SendMessage to the run's tier; release. Its memory is the stage's
#: (``StageConfig.tick_memory_mb``: a vCPU per process).
TICK = FunctionSpec(
    "tick",
    "Duetime tick: claim the due runs of one shard",
    timeout_seconds=60,
    memory_mib=512,
    access=(
        allow(Target.JOBS, "dynamodb:Query", index=DUE_INDEX),
        allow(Target.JOBS, "dynamodb:UpdateItem"),
        allow(Target.RUNS, "dynamodb:PutItem"),
        allow(Target.QUEUES, *_SEND),
    ),
    async_retries=0,
)
#: The sweeper runs ``duetime.services.sweeper.sweep``: Query the watchdog index; re-send PENDING runs and release
#: retries (UpdateItem, send); skip runs past their starting deadline, expire leases and settle timed-out
#: attempts (start an execution of the timeout-handler state machine, granted by the stack; without one
#: configured it settles them in-process with the same plan): UpdateItem, then retry wake-ups (send), the
#: ``on_timeout: trigger`` run of another job (GetItem job, PutItem run, send) and the job's next waiting run
#: (Query the active index, GetItem run, send); settle runs a pause held once their job is resumed or
#: deleted (GetItem job, Query the active index, UpdateItem run, UpdateItem job's missed_slots, send); and
#: send the notifier a ``late`` or ``overran`` signal (SendMessage to the notifications queue; the run's
#: history records it: UpdateItem run).
SWEEPER = FunctionSpec(
    "sweeper",
    "Duetime sweeper: re-send lost runs, expire leases, release retries, settle timeouts",
    timeout_seconds=120,
    memory_mib=512,
    access=(
        allow(Target.RUNS, "dynamodb:Query", index=WATCH_INDEX),
        allow(Target.RUNS, "dynamodb:Query", index=ACTIVE_INDEX),
        # the watchdog index holds keys only: the overdue runs are read whole, a page at a time
        allow(Target.RUNS, "dynamodb:BatchGetItem"),
        allow(Target.RUNS, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"),
        allow(Target.JOBS, "dynamodb:GetItem", "dynamodb:UpdateItem"),
        allow(Target.QUEUES, *_SEND),
        allow(Target.NOTIFICATIONS_QUEUE, *_SEND),
    ),
    async_retries=0,
)

#: The dispatcher runs ``duetime.services.lambda_tasks.dispatch`` for each lambda-tier message: re-check a first
#: attempt against its job (GetItem job; a slot skipped as missed counts on the job: UpdateItem), read and
#: claim the run (GetItem, UpdateItem; overlap check on the active index, tenant RUNNING quota on the
#: running-runs index),
#: put a run over quota back on its queue (send), record an invoke failure's log (PutObject), and invoke the
#: target asynchronously: only functions tagged ``duetime-target=true``.
DISPATCHER = FunctionSpec(
    "dispatcher",
    "Duetime dispatcher: claim lambda-tier runs and invoke their target functions",
    timeout_seconds=DISPATCHER_TIMEOUT_SECONDS,
    memory_mib=512,
    access=(
        allow(Target.RUNS, "dynamodb:GetItem", "dynamodb:UpdateItem"),
        allow(Target.RUNS, "dynamodb:Query", index=ACTIVE_INDEX),
        allow(Target.RUNS, "dynamodb:Query", index=RUNNING_INDEX),
        # a start re-checks its first attempts against their jobs, read together (runs.start_many)
        allow(Target.JOBS, "dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:UpdateItem"),
        allow(Target.QUEUES, *_SEND, tier="lambda"),
        allow(Target.LOG_OBJECTS, "s3:PutObject"),
        allow(Target.TAGGED_FUNCTIONS, "lambda:InvokeFunction"),
    ),
    queue_source="lambda",
)
#: Finish runs ``duetime.services.lambda_tasks.finish_from_record`` on a target's destination record: end the attempt
#: under its fencing token (GetItem, UpdateItem run), write its log (Get/PutObject, ListBucket), then retry
#: (send), start an ``on_timeout``/``on_failure`` trigger run of another job (GetItem job, PutItem run, send to
#: its tier) and wake the job's next waiting run (Query the active index, send).
FINISH = FunctionSpec(
    "finish",
    "Duetime finish: end Lambda task attempts from their functions' destination records",
    timeout_seconds=30,
    memory_mib=512,
    access=(
        allow(Target.RUNS, "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:PutItem"),
        allow(Target.RUNS, "dynamodb:Query", index=ACTIVE_INDEX),
        allow(Target.JOBS, "dynamodb:GetItem"),
        allow(Target.QUEUES, *_SEND),
        allow(Target.LOG_OBJECTS, "s3:GetObject", "s3:PutObject"),
        allow(Target.LOGS_BUCKET, "s3:ListBucket"),
    ),
    destination=True,
)

#: The archiver runs ``functions/archiver`` on the runs table's TTL deletions (its stream source is wired by
#: ``infra.constructs.archive``, which also grants the stream reads and the on-failure queue): per run, count
#: its job's newer runs (Query) and put a run among the last N back with its TTL re-armed (PutItem); read
#: the small final logs to inline (GetObject; a worker's unfinished chunks are listed: ListBucket); write
#: the batch's data objects, index entries and, for a failing batch, its records whole (PutObject under
#: ``archive/``); when the bucket fails too, send the records to its dead-letter queue (SendMessage).
ARCHIVER = FunctionSpec(
    "archiver",
    "Duetime archiver: runs leaving the hot window (TTL deletions) to the S3 archive",
    # a batch of up to 1,000 TTL deletions: a Query each, the small logs read, the objects written
    timeout_seconds=300,
    memory_mib=512,
    access=(
        allow(Target.RUNS, "dynamodb:Query", "dynamodb:PutItem"),
        allow(Target.LOG_OBJECTS, "s3:GetObject"),
        allow(Target.LOGS_BUCKET, "s3:ListBucket"),
        allow(Target.ARCHIVE_OBJECTS, "s3:PutObject"),
        allow(Target.ARCHIVER_DLQ, "sqs:SendMessage"),
    ),
    async_retries=0,
)

#: The notifier runs ``duetime.services.notifier`` on the runs table's stream and the notifications queue (its
#: event sources: ``Notifications.feed``): read the job (GetItem job) and its tenant's rules (GetItem), the
#: job's incident (GetItem) and record each event with its deliveries and the incident (TransactWriteItems of
#: Puts: PutItem); read and save a delivery at each try (GetItem, PutItem) and wake its next try
#: (SendMessage to its queue); deliver to webhooks (HTTPS, no AWS access), to a rule's own SNS topic in this
#: account (Publish) and by email through the tenant's own topic (CreateTopic with its tenant tag:
#: TagResource; ListSubscriptionsByTopic, Subscribe with a filter policy, Publish).
NOTIFIER = FunctionSpec(
    "notifier",
    "Duetime notifier: run changes and time signals to events, deliveries to webhooks, SNS and email",
    timeout_seconds=NOTIFIER_TIMEOUT_SECONDS,
    memory_mib=512,
    access=(
        allow(Target.JOBS, "dynamodb:GetItem"),
        allow(Target.NOTIFICATIONS, "dynamodb:GetItem", "dynamodb:PutItem"),
        allow(Target.NOTIFICATIONS_QUEUE, *_SEND),
        allow(Target.ACCOUNT_TOPICS, "sns:Publish"),
        allow(
            Target.EMAIL_TOPICS,
            "sns:CreateTopic",
            "sns:TagResource",
            "sns:ListSubscriptionsByTopic",
            "sns:Subscribe",
            "sns:Publish",
        ),
    ),
)

FUNCTIONS: tuple[FunctionSpec, ...] = (API, TICK, SWEEPER, DISPATCHER, FINISH, ARCHIVER, NOTIFIER)


class Functions(Construct):
    """The core layer and one function (with role and log group) per :class:`FunctionSpec`."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: StageConfig,
        specs: tuple[FunctionSpec, ...],
        catalogue: Catalogue,
        queues: TierQueues,
        environment: dict[str, str],
    ) -> None:
        super().__init__(scope, id)
        self.layer = lambda_.LayerVersion(
            self,
            "CoreLayer",
            code=lambda_.Code.from_asset(
                str(LAYER_SOURCE), exclude=list(LAYER_EXCLUDES), bundling=layer_bundling()
            ),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="Duetime core library (python/duetime) and its dependencies",
        )
        self.functions: dict[str, lambda_.Function] = {}
        self.log_groups: dict[str, logs.LogGroup] = {}
        for spec in specs:
            self._add(spec, config=config, catalogue=catalogue, queues=queues, environment=environment)

    def _add(
        self,
        spec: FunctionSpec,
        *,
        config: StageConfig,
        catalogue: Catalogue,
        queues: TierQueues,
        environment: dict[str, str],
    ) -> None:
        name = spec.name.capitalize()
        log_group = logs.LogGroup(
            self,
            f"{name}Logs",
            retention=logs.RetentionDays[config.log_retention],
            removal_policy=RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY,
        )
        role = iam.Role(
            self,
            f"{name}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"Duetime {spec.name} function: only the access its code needs",
        )
        log_group.grant_write(role)
        catalogue.grant(role, spec.access)
        function = lambda_.Function(
            self,
            name,
            description=spec.description,
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler=HANDLER,
            code=lambda_.Code.from_asset(str(spec.code_dir), exclude=["__pycache__", "*.pyc"]),
            layers=[self.layer],
            role=role,
            timeout=Duration.seconds(spec.timeout_seconds),
            # the tick's memory buys it a vCPU per claiming process (StageConfig.tick_memory_mb)
            memory_size=config.tick_memory_mb if spec.name == TICK.name else spec.memory_mib,
            environment=environment,
            log_group=log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            application_log_level_v2=lambda_.ApplicationLogLevel.INFO,
            system_log_level_v2=lambda_.SystemLogLevel.WARN,
            tracing=lambda_.Tracing.ACTIVE,
            retry_attempts=spec.async_retries,
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray's PutTraceSegments/PutTelemetryRecords support no resource-level permissions (AWS requires *)",
        )
        acknowledge(
            function,
            "AwsSolutions-L1",
            f"pinned to python{PYTHON_VERSION}: the layer's compiled wheels (pydantic-core) are built for it; move "
            "the layer and the functions to a newer runtime together",
        )
        if spec.queue_source is not None:
            queue = queues.queue(spec.queue_source)
            needed = EVENT_SOURCE_VISIBILITY_FACTOR * spec.timeout_seconds
            if visibility_seconds(spec.queue_source) < needed:
                raise ValueError(
                    f"{spec.name}: the {spec.queue_source} queue's visibility timeout must be >= {needed} s"
                )
            function.add_event_source(SqsEventSource(queue, batch_size=10, report_batch_item_failures=True))
        if spec.destination:
            function.add_permission(
                "DestinationInvoke",
                principal=iam.ServicePrincipal("lambda.amazonaws.com"),
                source_account=Stack.of(self).account,
            )
        self.functions[spec.name] = function
        self.log_groups[spec.name] = log_group
