"""Run history (issue 19): the archive bucket, the archiver's stream source and dead-letter queue, and an
Athena table over the archive.

- **Bucket**: its own, not a prefix of the logs bucket: the logs bucket may be an S3 Express One Zone
  directory bucket (one AZ, no transitions), the archive is kept for years while logs expire, and Athena's
  table and results stay apart from the logs. ``archive/`` moves Standard -> Infrequent Access -> Glacier
  Instant Retrieval by the stage's ``archive_lifecycle`` (every class a GET reads at once, so the API pages
  the archive as before); Athena's results under ``athena-results/`` expire after ``athena_results_days``.
- **Archiver** (``functions/archiver``): reads the runs table's stream, filtered to TTL deletions
  (``userIdentity`` ``Service`` / ``dynamodb.amazonaws.com``), reporting batch item failures, bisecting a
  failed batch, retried within the stream's 24 h (``ARCHIVER_MAX_RECORD_AGE``), then the batch's stream
  pointers go to the on-failure queue. The handler writes a failing batch's records whole to
  ``archive/failed/`` (else to the same queue, ``DUETIME_ARCHIVER_DLQ_URL``) before it reports them failed,
  so nothing is lost when the stream forgets them. An alarm watches the queue's depth (``Monitoring``).
- **Athena**: a Glue table over ``archive/runs/`` (JSON Lines, gzip) with partition projection (``tenant``
  injected: a query names its tenant, ``dt`` a date from :data:`PROJECTION_START` to today), so no crawler
  and no partition upkeep; a workgroup whose results are encrypted (SSE-S3) and enforced.
"""

from __future__ import annotations

from aws_cdk import Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_athena as athena
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_glue as glue
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk.aws_lambda_event_sources import DynamoEventSource, SqsDlq
from constructs import Construct

from duetime.domain.archive import DATA_PREFIX, INDEX_PREFIX
from infra.config import StageConfig
from infra.constructs.queues import dead_letter_queue
from infra.constructs.storage import Storage, lifecycle_rule
from infra.nag import acknowledge

#: every archive object (data, per-job index, failed batches) lives under this prefix
ARCHIVE_PREFIX = DATA_PREFIX.split("/", 1)[0] + "/"
assert INDEX_PREFIX.startswith(ARCHIVE_PREFIX)
ATHENA_RESULTS_PREFIX = "athena-results/"
#: the Glue table's name in the stage's database
TABLE_NAME = "runs"
#: the first day partition projection offers (``dt`` before it is never scanned)
PROJECTION_START = "2024-01-01"

#: stream records per invocation (Lambda also stops a batch at 6 MB of payload); one batch is one archive
#: object per (tenant, day). Large on purpose: lifecycle transitions skip objects under 128 KB, and
#: ``bench cost`` measures 550 B of gzip JSON Lines per run, so an object needs 239+ runs to ever leave
#: S3 Standard; each object (and each job's index entry) is a PUT
ARCHIVER_BATCH_SIZE = 1000
#: how long the mapping gathers records before it invokes (fewer, larger archive objects); history is not
#: urgent, and the hot store still serves a run until its TTL deletion is archived
ARCHIVER_BATCHING_WINDOW = Duration.seconds(60)
#: a failing batch is bisected and retried this many times...
ARCHIVER_RETRY_ATTEMPTS = 10
#: ... and never past this age: the stream keeps records 24 h, so the on-failure pointers still resolve
ARCHIVER_MAX_RECORD_AGE = Duration.hours(23)
#: what DynamoDB's TTL writes as a deletion's identity (Amazon DynamoDB Developer Guide, "DynamoDB Streams
#: and Time to Live")
TTL_IDENTITY = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}

#: the archive line's columns (``duetime.domain.archive.run_line``: a run's JSON plus ``run_id``,
#: ``archived_at`` and ``logs``). ``tenant`` is the partition column (and in every line). Times are ISO 8601
#: strings (``from_iso8601_timestamp``); lists and objects are JSON, typed where Athena queries them.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "string"),
    ("job_id", "string"),
    ("due_at", "string"),
    ("state", "string"),
    ("attempt", "int"),
    ("max_attempts", "int"),
    ("trigger", "string"),
    ("started_at", "string"),
    ("finished_at", "string"),
    ("exit_code", "int"),
    ("error", "string"),
    ("dead_lettered", "boolean"),
    ("dead_lettered_at", "string"),
    ("missed_slots", "int"),
    ("timeout_seconds", "int"),
    ("triggered_by", "string"),
    ("created_at", "string"),
    ("archived_at", "string"),
    (
        "attempts",
        "array<struct<attempt:int,fencing_token:bigint,worker:string,started_at:string,finished_at:string,"
        "state:string,exit_code:int,reason:string,log_key:string,log_bytes:bigint>>",
    ),
    ("logs", "map<string,string>"),
)
PARTITION_KEYS: tuple[tuple[str, str], ...] = (("tenant", "string"), ("dt", "string"))


def glue_database_name(config: StageConfig) -> str:
    """``duetime_<stage>``: Glue folds names to lower case and Athena quotes hyphens, so neither is used."""
    return "duetime_" + config.name.lower().replace("-", "_")


class Archive(Construct):
    """The run archive.

    Attributes:
        bucket: ``archive/runs/tenant=<T>/dt=<D>/<batch>.jsonl.gz`` and its per-job index (``domain/archive``).
        dead_letter_queue: the archiver's on-failure destination and its last resort for whole records.
        database, table: the Glue database (``glue_database_name``) and table ``runs``.
        workgroup: the Athena workgroup to query it with.
    """

    def __init__(self, scope: Construct, id: str, *, config: StageConfig, storage: Storage) -> None:
        super().__init__(scope, id)
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            server_access_logs_bucket=storage.access_logs_bucket,
            server_access_logs_prefix="archive-bucket/",
            lifecycle_rules=[
                lifecycle_rule("tier-archive", config.archive_lifecycle, prefix=ARCHIVE_PREFIX),
                s3.LifecycleRule(
                    id="expire-athena-results",
                    prefix=ATHENA_RESULTS_PREFIX,
                    expiration=Duration.days(config.athena_results_days),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.dead_letter_queue = dead_letter_queue(
            self, "ArchiverDlq", of="the archiver (the stream mapping's on-failure destination)"
        )
        self._athena(config)

    def _athena(self, config: StageConfig) -> None:
        account = Stack.of(self).account
        self.database = glue.CfnDatabase(
            self,
            "Database",
            catalog_id=account,
            database_input=glue.CfnDatabase.DatabaseInputProperty(
                name=glue_database_name(config),
                description=f"Duetime run history ({config.name})",
            ),
        )
        location = f"s3://{self.bucket.bucket_name}/{DATA_PREFIX}"
        self.table = glue.CfnTable(
            self,
            "RunsTable",
            catalog_id=account,
            database_name=self.database.ref,  # the database's name
            table_input=glue.CfnTable.TableInputProperty(
                name=TABLE_NAME,
                description="Archived runs, one JSON line each (duetime.domain.archive.run_line)",
                table_type="EXTERNAL_TABLE",
                partition_keys=[glue.CfnTable.ColumnProperty(name=n, type=t) for n, t in PARTITION_KEYS],
                parameters={
                    "classification": "json",
                    "compressionType": "gzip",
                    "projection.enabled": "true",
                    "projection.tenant.type": "injected",
                    "projection.dt.type": "date",
                    "projection.dt.format": "yyyy-MM-dd",
                    "projection.dt.range": f"{PROJECTION_START},NOW",
                    "projection.dt.interval": "1",
                    "projection.dt.interval.unit": "DAYS",
                    "storage.location.template": location + "tenant=${tenant}/dt=${dt}/",
                },
                storage_descriptor=glue.CfnTable.StorageDescriptorProperty(
                    location=location,
                    columns=[glue.CfnTable.ColumnProperty(name=n, type=t) for n, t in COLUMNS],
                    input_format="org.apache.hadoop.mapred.TextInputFormat",
                    output_format="org.apache.hadoop.hive.ql.io.HiveIgnoreKeyTextOutputFormat",
                    compressed=True,
                    serde_info=glue.CfnTable.SerdeInfoProperty(
                        serialization_library="org.openx.data.jsonserde.JsonSerDe",
                        parameters={"ignore.malformed.json": "true"},
                    ),
                ),
            ),
        )
        self.workgroup = athena.CfnWorkGroup(
            self,
            "Workgroup",
            name=f"{Aws.STACK_NAME}-history",
            description=f"Duetime run history queries ({config.name})",
            state="ENABLED",
            recursive_delete_option=True,
            work_group_configuration=athena.CfnWorkGroup.WorkGroupConfigurationProperty(
                enforce_work_group_configuration=True,
                publish_cloud_watch_metrics_enabled=True,
                result_configuration=athena.CfnWorkGroup.ResultConfigurationProperty(
                    output_location=f"s3://{self.bucket.bucket_name}/{ATHENA_RESULTS_PREFIX}",
                    encryption_configuration=athena.CfnWorkGroup.EncryptionConfigurationProperty(
                        encryption_option="SSE_S3"
                    ),
                ),
            ),
        )

    def read_stream(self, archiver: lambda_.Function, runs: ddb.ITable) -> DynamoEventSource:
        """Feed ``archiver`` the TTL deletions of ``runs``' stream (see the module docstring)."""
        source = DynamoEventSource(
            runs,
            starting_position=lambda_.StartingPosition.TRIM_HORIZON,
            batch_size=ARCHIVER_BATCH_SIZE,
            max_batching_window=ARCHIVER_BATCHING_WINDOW,
            bisect_batch_on_error=True,
            retry_attempts=ARCHIVER_RETRY_ATTEMPTS,
            max_record_age=ARCHIVER_MAX_RECORD_AGE,
            report_batch_item_failures=True,
            on_failure=SqsDlq(self.dead_letter_queue),
            filters=[
                lambda_.FilterCriteria.filter(
                    {
                        "eventName": lambda_.FilterRule.is_equal("REMOVE"),
                        "userIdentity": {k: lambda_.FilterRule.is_equal(v) for k, v in TTL_IDENTITY.items()},
                    }
                )
            ],
        )
        archiver.add_event_source(source)
        if archiver.role is not None:
            acknowledge(
                archiver.role,
                "AwsSolutions-IAM5[Resource::*]",
                "dynamodb:ListStreams (the stream event source) and X-Ray's PutTraceSegments/"
                "PutTelemetryRecords support no resource-level permissions (AWS requires *)",
            )
        return source
