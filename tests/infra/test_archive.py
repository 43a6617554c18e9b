"""Run history in the synthesized stack (issue 19): the runs table's stream, the archiver's event source,
its dead-letter queue and alarm, the archive bucket's lifecycle, and the Glue table and Athena workgroup."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.infra.conftest import CDK_MISSING, Synthesized, synthesize
from tests.infra.test_stack import function_env, logical_id, ref_id, render

pytest.importorskip("aws_cdk", reason=CDK_MISSING)

from duetime.domain.archive import DATA_PREFIX, encode_batch, run_line  # noqa: E402
from duetime.domain.models import AttemptRecord, RunState  # noqa: E402
from infra.constructs.archive import COLUMNS, PARTITION_KEYS  # noqa: E402
from tests.contract.conftest import T0  # noqa: E402
from tests.contract.factories import make_job, make_run  # noqa: E402

pytestmark = [pytest.mark.infra, pytest.mark.xdist_group("cdk")]


def archiver_mapping(dev: Synthesized) -> dict[str, Any]:
    archiver = logical_id(dev, dev.stack.functions.functions["archiver"])
    (mapping,) = [
        m["Properties"]
        for m in dev.of_type("AWS::Lambda::EventSourceMapping").values()
        if ref_id(m["Properties"]["FunctionName"]) == archiver
    ]
    return mapping


def archive_bucket(dev: Synthesized) -> dict[str, Any]:
    return dict(dev.resources[logical_id(dev, dev.stack.archive.bucket)]["Properties"])


def test_the_runs_table_streams_new_and_old_images(dev: Synthesized) -> None:
    runs = dev.resources[logical_id(dev, dev.stack.storage.runs)]["Properties"]

    assert runs["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}
    # the jobs table has no stream (nothing reads one)
    assert "StreamSpecification" not in dev.resources[logical_id(dev, dev.stack.storage.jobs)]["Properties"]


def test_the_archiver_reads_only_ttl_deletions_from_the_runs_stream(dev: Synthesized) -> None:
    mapping = archiver_mapping(dev)

    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [logical_id(dev, dev.stack.storage.runs), "StreamArn"]}
    (only,) = mapping["FilterCriteria"]["Filters"]
    assert json.loads(only["Pattern"]) == {
        "eventName": ["REMOVE"],
        "userIdentity": {"type": ["Service"], "principalId": ["dynamodb.amazonaws.com"]},
    }
    assert mapping["StartingPosition"] == "TRIM_HORIZON"
    # large batches (an archive object needs ~240 runs to reach the 128 KB lifecycle transitions need),
    # gathered for at most Lambda's 300 s
    assert mapping["BatchSize"] == 1000
    assert 0 < mapping["MaximumBatchingWindowInSeconds"] <= 300


def test_a_failing_archive_batch_is_bisected_retried_within_the_streams_day_then_dead_lettered(
    dev: Synthesized,
) -> None:
    mapping = archiver_mapping(dev)

    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["BisectBatchOnFunctionError"] is True
    assert 1 <= mapping["MaximumRetryAttempts"] <= 10_000
    # DynamoDB Streams keeps a record 24 h: the mapping gives up before, so its pointers still resolve
    assert 60 <= mapping["MaximumRecordAgeInSeconds"] < 24 * 3600
    dlq = logical_id(dev, dev.stack.archive.dead_letter_queue)
    assert ref_id(mapping["DestinationConfig"]["OnFailure"]["Destination"]) == dlq
    # and the handler's own last resort for whole records is the same queue
    env = function_env(dev)["archiver"]
    assert render(env["DUETIME_ARCHIVER_DLQ_URL"]) == f"<{dlq}>"


def test_the_archivers_dead_letter_queue_is_encrypted_and_alarmed(dev: Synthesized) -> None:
    dlq = logical_id(dev, dev.stack.archive.dead_letter_queue)
    props = dev.resources[dlq]["Properties"]
    assert props["SqsManagedSseEnabled"] is True
    assert props["MessageRetentionPeriod"] == 14 * 24 * 3600

    alarms = [
        a["Properties"]
        for a in dev.of_type("AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == "ApproximateNumberOfMessagesVisible"
        and any(ref_id(d["Value"]) == dlq for d in a["Properties"].get("Dimensions", []))
    ]
    (alarm,) = alarms
    assert alarm["Threshold"] == dev.config.alarms.dlq_depth
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert ref_id(alarm["AlarmActions"][0]) == logical_id(dev, dev.stack.monitoring.topic)


def test_the_archive_moves_to_infrequent_access_then_glacier_instant_retrieval(dev: Synthesized) -> None:
    props = archive_bucket(dev)
    rules = {r["Id"]: r for r in props["LifecycleConfiguration"]["Rules"]}
    lifecycle = dev.config.archive_lifecycle

    archive = rules["tier-archive"]
    assert archive["Prefix"] == "archive/"
    assert archive["Transitions"] == [
        {"StorageClass": "STANDARD_IA", "TransitionInDays": lifecycle.infrequent_access_days},
        {"StorageClass": "GLACIER_IR", "TransitionInDays": lifecycle.glacier_instant_retrieval_days},
    ]
    assert "ExpirationInDays" not in archive  # kept until deleted by default
    results = rules["expire-athena-results"]
    assert (results["Prefix"], results["ExpirationInDays"]) == (
        "athena-results/",
        dev.config.athena_results_days,
    )
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"
    ] == {"SSEAlgorithm": "AES256"}
    assert ref_id(props["LoggingConfiguration"]["DestinationBucketName"]) == logical_id(
        dev, dev.stack.storage.access_logs_bucket
    )


def test_the_archive_lifecycle_days_come_from_the_stage(tmp_path_factory: pytest.TempPathFactory) -> None:
    other = synthesize(
        tmp_path_factory.mktemp("cdk-lifecycle"),
        {
            "stage": "ci",
            "duetime:retention_days": 0.5,
            "duetime:archive_lifecycle": {
                "infrequent_access_days": 45,
                "glacier_instant_retrieval_days": 120,
                "expiration_days": 1825,
            },
        },
    )
    (rule,) = [
        r for r in archive_bucket(other)["LifecycleConfiguration"]["Rules"] if r["Id"] == "tier-archive"
    ]

    assert [t["TransitionInDays"] for t in rule["Transitions"]] == [45, 120]
    assert rule["ExpirationInDays"] == 1825
    # the fractional hot window reaches the functions as it is
    for env in function_env(other).values():
        assert env["DUETIME_RUN_RETENTION_DAYS"] == "0.5"


def test_the_glue_table_projects_tenant_and_day_partitions_over_the_archive(dev: Synthesized) -> None:
    (table,) = dev.of_type("AWS::Glue::Table").values()
    (database,) = dev.of_type("AWS::Glue::Database").values()
    props = table["Properties"]
    table_input = props["TableInput"]
    params = table_input["Parameters"]
    bucket = f"<{logical_id(dev, dev.stack.archive.bucket)}>"

    assert ref_id(props["DatabaseName"]) == dev.stack.resolve(
        dev.stack.get_logical_id(dev.stack.archive.database)
    )
    assert database["Properties"]["DatabaseInput"]["Name"] == "duetime_dev"
    assert [(k["Name"], k["Type"]) for k in table_input["PartitionKeys"]] == [
        ("tenant", "string"),
        ("dt", "string"),
    ]
    assert params["projection.enabled"] == "true"
    assert params["projection.tenant.type"] == "injected"
    assert params["projection.dt.type"] == "date"
    assert params["projection.dt.format"] == "yyyy-MM-dd"
    assert params["projection.dt.range"].endswith(",NOW")
    assert (params["projection.dt.interval"], params["projection.dt.interval.unit"]) == ("1", "DAYS")
    assert (
        render(params["storage.location.template"])
        == f"s3://{bucket}/{DATA_PREFIX}tenant=${{tenant}}/dt=${{dt}}/"
    )
    storage = table_input["StorageDescriptor"]
    assert render(storage["Location"]) == f"s3://{bucket}/{DATA_PREFIX}"
    assert storage["SerdeInfo"]["SerializationLibrary"] == "org.openx.data.jsonserde.JsonSerDe"
    assert {c["Name"] for c in storage["Columns"]} >= {"run_id", "job_id", "due_at", "state", "started_at"}


def test_the_tables_columns_are_fields_of_a_real_archive_line() -> None:
    """Every column names a field the archiver writes, with a JSON type the column's type reads."""
    run = make_run(make_job("job-1"), T0)
    attempt = AttemptRecord(
        attempt=1, fencing_token=1, worker="w1", started_at=T0, finished_at=T0, state=RunState.SUCCEEDED
    )
    run = run.model_copy(
        update={
            "state": RunState.SUCCEEDED,
            "started_at": T0,
            "finished_at": T0,
            "exit_code": 0,
            "attempts": [attempt],
        }
    )
    line = run_line(run, logs={1: "hello"}, archived_at=run.due_at)
    (obj,) = encode_batch([line], batch="b1")
    assert obj.key.startswith(f"{DATA_PREFIX}tenant={run.tenant}/dt=")

    json_types = {"string": (str,), "int": (int,), "bigint": (int,), "boolean": (bool,)}
    for name, kind in COLUMNS:
        assert name in line, name
        value = line[name]
        if value is None:
            continue
        if kind.startswith("array<struct<"):
            assert isinstance(value, list) and value, name
            fields = [
                f.split(":", 1)[0] for f in kind.removeprefix("array<struct<").removesuffix(">>").split(",")
            ]
            assert set(fields) <= set(value[0]), (name, set(fields) - set(value[0]))
        elif kind.startswith("map<"):
            assert isinstance(value, dict), name
        else:
            assert isinstance(value, json_types[kind]), (name, kind, value)
    # the partition columns come from the key, and tenant is in every line too
    assert [n for n, _ in PARTITION_KEYS] == ["tenant", "dt"]
    assert "tenant" in line and "tenant" not in dict(COLUMNS)


def test_the_athena_workgroup_encrypts_and_enforces_its_result_location(dev: Synthesized) -> None:
    (workgroup,) = dev.of_type("AWS::Athena::WorkGroup").values()
    config = workgroup["Properties"]["WorkGroupConfiguration"]

    assert config["EnforceWorkGroupConfiguration"] is True
    results = config["ResultConfiguration"]
    assert results["EncryptionConfiguration"] == {"EncryptionOption": "SSE_S3"}
    assert (
        render(results["OutputLocation"])
        == f"s3://<{logical_id(dev, dev.stack.archive.bucket)}>/athena-results/"
    )
