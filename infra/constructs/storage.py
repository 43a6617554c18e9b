"""Storage: the jobs, runs and idempotency tables and the run-logs bucket (DESIGN.md section 3).

The tables are built from ``duetime.adapters.aws.resources``' ``create_table`` definitions, the same ones the local stack
and the integration tests create, so keys, attribute types and indexes cannot drift between AWS and moto.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3express as s3express
from constructs import Construct

from duetime.adapters.aws.resources import RUNS_TTL_ATTRIBUTE, jobs_table_definition, runs_table_definition
from infra.config import StageConfig
from infra.nag import acknowledge

#: Powertools idempotency's DynamoDB persistence layer defaults (``DynamoDBPersistenceLayer``).
IDEMPOTENCY_KEY_ATTRIBUTE = "id"
IDEMPOTENCY_TTL_ATTRIBUTE = "expiration"

_TYPES = {"S": ddb.AttributeType.STRING, "N": ddb.AttributeType.NUMBER, "B": ddb.AttributeType.BINARY}
_PROJECTIONS = {
    "ALL": ddb.ProjectionType.ALL,
    "KEYS_ONLY": ddb.ProjectionType.KEYS_ONLY,
    "INCLUDE": ddb.ProjectionType.INCLUDE,
}


def _keys(
    definition: dict[str, Any], key_schema: list[dict[str, str]]
) -> tuple[ddb.Attribute, ddb.Attribute | None]:
    """(partition key, sort key or None) of a boto3 KeySchema, typed from the AttributeDefinitions."""
    types = {a["AttributeName"]: a["AttributeType"] for a in definition["AttributeDefinitions"]}
    keys = {
        k["KeyType"]: ddb.Attribute(name=k["AttributeName"], type=_TYPES[types[k["AttributeName"]]])
        for k in key_schema
    }
    return keys["HASH"], keys.get("RANGE")


def table_from_definition(
    scope: Construct,
    id: str,
    definition: dict[str, Any],
    *,
    config: StageConfig,
    time_to_live_attribute: str | None = None,
    name: str | None = None,
    stream: ddb.StreamViewType | None = None,
) -> ddb.Table:
    """A DynamoDB table (on-demand, PITR, encrypted) with the keys and GSIs of a ``create_table`` definition.

    ``TableName`` is ignored: CloudFormation names the table so that stages can share an account. ``name``
    (``jobs``, ``runs``, ``idempotency``) picks the stage's ``warm_throughput`` for the table and its indexes.
    """
    if definition.get("BillingMode") != "PAY_PER_REQUEST":
        raise ValueError(f"{id}: Duetime's tables are on-demand")
    partition_key, sort_key = _keys(definition, definition["KeySchema"])
    table = ddb.Table(
        scope,
        id,
        partition_key=partition_key,
        sort_key=sort_key,
        billing_mode=ddb.BillingMode.PAY_PER_REQUEST,
        encryption=ddb.TableEncryption.AWS_MANAGED,
        point_in_time_recovery_specification=ddb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=True
        ),
        time_to_live_attribute=time_to_live_attribute,
        stream=stream,
        warm_throughput=_warm(config, name),
        deletion_protection=config.retain_data,
        removal_policy=RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY,
    )
    for gsi in definition.get("GlobalSecondaryIndexes", []):
        projection = gsi["Projection"]
        partition_key, sort_key = _keys(definition, gsi["KeySchema"])
        table.add_global_secondary_index(
            index_name=gsi["IndexName"],
            partition_key=partition_key,
            sort_key=sort_key,
            projection_type=_PROJECTIONS[projection["ProjectionType"]],
            non_key_attributes=projection.get("NonKeyAttributes"),
            warm_throughput=_warm(config, f"{name}.{gsi['IndexName']}" if name else None),
        )
    return table


def _warm(config: StageConfig, key: str | None) -> ddb.WarmThroughput | None:
    """The stage's warm throughput for table or index ``key`` (None: DynamoDB's default)."""
    warm = config.warm_throughput.get(key) if key else None
    if warm is None:
        return None
    return ddb.WarmThroughput(
        read_units_per_second=warm.read_units_per_second, write_units_per_second=warm.write_units_per_second
    )


class Storage(Construct):
    """Tables and the logs bucket.

    Attributes:
        jobs: pk ``job_id``; GSIs ``due`` (shard, next_fire_at) and ``by_tenant`` (tenant, created_at).
        runs: pk ``job_id``, sk ``due_at``; GSI ``watchdog`` (watch_shard, watch_at) and whatever else
            ``runs_table_definition`` declares; TTL ``expires_at``; a stream of new and old images.
        idempotency: Powertools idempotency records for ``POST /jobs`` (pk ``id``, TTL ``expiration``).
        logs_bucket: run logs, ``logs/<job>/<run>/attempt-<n>.log``, expired after the run retention (the
            stage's ``log_storage`` ``standard``; None for ``express``).
        logs_directory_bucket: the same as an S3 Express One Zone directory bucket in the stage's
            ``log_zone`` (``log_storage`` ``express``; else None). Directory buckets have no server access
            logs, versioning or transitions; their lifecycle expires the logs with the runs.
        logs_bucket_name, logs_bucket_arn: whichever of the two holds the logs.
        access_logs_bucket: S3 server access logs of the logs bucket (``standard`` only).
    """

    def __init__(self, scope: Construct, id: str, *, config: StageConfig) -> None:
        super().__init__(scope, id)
        self.jobs = table_from_definition(
            self, "Jobs", jobs_table_definition("jobs"), config=config, name="jobs"
        )
        self.runs = table_from_definition(
            self,
            "Runs",
            runs_table_definition("runs"),
            config=config,
            time_to_live_attribute=RUNS_TTL_ATTRIBUTE,
            name="runs",
            # read by the notifier (issue 17) and the archiver (issue 19)
            stream=ddb.StreamViewType.NEW_AND_OLD_IMAGES,
        )
        self.idempotency = table_from_definition(
            self,
            "Idempotency",
            {
                "BillingMode": "PAY_PER_REQUEST",
                "KeySchema": [{"AttributeName": IDEMPOTENCY_KEY_ATTRIBUTE, "KeyType": "HASH"}],
                "AttributeDefinitions": [{"AttributeName": IDEMPOTENCY_KEY_ATTRIBUTE, "AttributeType": "S"}],
            },
            config=config,
            time_to_live_attribute=IDEMPOTENCY_TTL_ATTRIBUTE,
            name="idempotency",
        )

        self.logs_bucket: s3.Bucket | None = None
        self.logs_directory_bucket: s3express.CfnDirectoryBucket | None = None
        if config.log_storage == "express":
            assert config.log_zone is not None  # StageConfig refuses express without it
            self.logs_directory_bucket = s3express.CfnDirectoryBucket(
                self,
                "LogsExpress",
                data_redundancy="SingleAvailabilityZone",
                location_name=config.log_zone,
                bucket_encryption=s3express.CfnDirectoryBucket.BucketEncryptionProperty(
                    server_side_encryption_configuration=[
                        s3express.CfnDirectoryBucket.ServerSideEncryptionRuleProperty(
                            server_side_encryption_by_default=s3express.CfnDirectoryBucket.ServerSideEncryptionByDefaultProperty(
                                sse_algorithm="AES256"
                            )
                        )
                    ]
                ),
                lifecycle_configuration=s3express.CfnDirectoryBucket.LifecycleConfigurationProperty(
                    rules=[
                        s3express.CfnDirectoryBucket.RuleProperty(
                            id="expire-with-runs",
                            status="Enabled",
                            expiration_in_days=config.retention_days,
                            abort_incomplete_multipart_upload=s3express.CfnDirectoryBucket.AbortIncompleteMultipartUploadProperty(
                                days_after_initiation=1
                            ),
                        )
                    ]
                ),
            )
            self.logs_directory_bucket.apply_removal_policy(RemovalPolicy.RETAIN)
            self.logs_bucket_name: str = self.logs_directory_bucket.ref
            self.logs_bucket_arn: str = self.logs_directory_bucket.attr_arn
            return

        self.access_logs_bucket = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,  # server access logging requires SSE-S3
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            lifecycle_rules=[s3.LifecycleRule(id="expire", expiration=Duration.days(config.retention_days))],
            removal_policy=RemovalPolicy.RETAIN,
        )
        acknowledge(
            self.access_logs_bucket,
            "AwsSolutions-S1",
            "this bucket is the server-access-log target of the logs bucket; logging it too would loop",
        )
        self.logs_bucket = s3.Bucket(
            self,
            "Logs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,  # ACLs disabled
            enforce_ssl=True,
            minimum_tls_version=1.2,
            server_access_logs_bucket=self.access_logs_bucket,
            server_access_logs_prefix="logs-bucket/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-with-runs",
                    expiration=Duration.days(config.retention_days),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.logs_bucket_name = self.logs_bucket.bucket_name
        self.logs_bucket_arn = self.logs_bucket.bucket_arn
