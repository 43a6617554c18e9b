"""The synthesized Duetime stack: what the template must say (DESIGN.md sections 2, 3, 7, 10).

Every test reads the one ``dev`` synthesis of the session (see conftest); a few build a second, small app.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.infra.conftest import CDK_MISSING, Synthesized, cfn_lint, synthesize

pytest.importorskip("aws_cdk", reason=CDK_MISSING)

from aws_cdk.assertions import Match  # noqa: E402

from duetime.adapters.aws import resources  # noqa: E402
from duetime.adapters.aws.resources import (  # noqa: E402
    ACTIVE_INDEX,
    DEAD_LETTER_INDEX,
    DLQ_RETENTION_SECONDS,
    DUE_INDEX,
    DUE_INDEX_PK,
    DUE_INDEX_SK,
    JOBS_BY_TENANT_INDEX,
    JOBS_PK,
    QUEUE_MAX_RECEIVE_COUNT,
    QUEUE_VISIBILITY_SECONDS,
    RUNNING_INDEX,
    RUNS_PK,
    RUNS_SK,
    RUNS_TTL_ATTRIBUTE,
    WATCH_INDEX,
    WATCH_INDEX_PK,
    WATCH_INDEX_SK,
    jobs_table_definition,
    runs_table_definition,
)
from duetime.adapters.aws.stepfunctions import state_machine_definition  # noqa: E402
from duetime.config.settings import (  # noqa: E402
    ALL_TIERS,
    AWS_BACKEND_FIELDS,
    CONTAINER_TIERS,
    ENV_VARS,
    Settings,
    settings_from_env,
)
from infra.constructs.functions import FUNCTIONS  # noqa: E402
from infra.constructs.queues import DISPATCHER_TIMEOUT_SECONDS  # noqa: E402

# one xdist group: with `--dist loadgroup` the CDK app is synthesized by one worker only
pytestmark = [pytest.mark.infra, pytest.mark.xdist_group("cdk")]

#: Identity-policy actions that AWS only accepts on Resource "*".
STAR_RESOURCE_ACTIONS = {
    # DynamoDB Streams' ListStreams names no stream (CDK's stream read grant of the notifier's and the
    # archiver's mappings)
    "dynamodb:ListStreams",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    "ecr:GetAuthorizationToken",
    # Step Functions' log delivery to CloudWatch Logs (the timeout handler's role)
    "logs:CreateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:DescribeLogGroups",
    "logs:DescribeResourcePolicies",
    "logs:GetLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:UpdateLogDelivery",
}


# ---- helpers ------------------------------------------------------------------------------------------
def ref_id(value: Any) -> str | None:
    """The logical id a ``Ref`` or ``Fn::GetAtt [id, Arn]`` points at."""
    if isinstance(value, dict):
        if "Ref" in value:
            return str(value["Ref"])
        if "Fn::GetAtt" in value:
            return str(value["Fn::GetAtt"][0])
    return None


def render(value: Any) -> str:
    """A CloudFormation string expression with every Ref/GetAtt replaced by ``<LogicalId>``."""
    if isinstance(value, str):
        return value
    if ref_id(value) is not None:
        return f"<{ref_id(value)}>"
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(render(p) for p in parts)
    raise AssertionError(f"cannot render {value!r}")


def statements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    found = doc["Statement"]
    return found if isinstance(found, list) else [found]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def identity_statements(dev: Synthesized) -> list[tuple[str, dict[str, Any]]]:
    """(policy logical id, statement) of every identity policy: IAM policies and roles' inline policies."""
    out = []
    for lid, res in dev.of_type("AWS::IAM::Policy").items():
        out += [(lid, s) for s in statements(res["Properties"]["PolicyDocument"])]
    for lid, res in dev.of_type("AWS::IAM::ManagedPolicy").items():
        out += [(lid, s) for s in statements(res["Properties"]["PolicyDocument"])]
    for lid, res in dev.of_type("AWS::IAM::Role").items():
        for policy in res["Properties"].get("Policies", []):
            out += [(lid, s) for s in statements(policy["PolicyDocument"])]
    return out


def role_actions(dev: Synthesized, role_logical_id: str) -> dict[str, set[str]]:
    """action -> rendered resources, over every policy attached to the role."""
    grants: dict[str, set[str]] = {}
    for res in dev.of_type("AWS::IAM::Policy").values():
        if role_logical_id not in [ref_id(r) for r in res["Properties"]["Roles"]]:
            continue
        for st in statements(res["Properties"]["PolicyDocument"]):
            if st["Effect"] == "Deny":  # checked where a role has one (the notifier's)
                continue
            assert st["Effect"] == "Allow"
            for action in as_list(st["Action"]):
                grants.setdefault(action, set()).update(render(r) for r in as_list(st["Resource"]))
    return grants


def logical_id(dev: Synthesized, construct: Any) -> str:
    child = construct.node.default_child
    return str(dev.stack.resolve(dev.stack.get_logical_id(child)))


def tables(dev: Synthesized) -> dict[str, dict[str, Any]]:
    storage = dev.stack.storage
    return {
        name: dev.resources[logical_id(dev, table)]["Properties"]
        for name, table in (
            ("jobs", storage.jobs),
            ("runs", storage.runs),
            ("idempotency", storage.idempotency),
            ("notifications", dev.stack.notifications.table),
        )
    }


def function_env(dev: Synthesized) -> dict[str, dict[str, Any]]:
    return {
        name: dev.resources[logical_id(dev, fn)]["Properties"]["Environment"]["Variables"]
        for name, fn in dev.stack.functions.functions.items()
    }


def container_env(dev: Synthesized) -> dict[str, dict[str, Any]]:
    out = {}
    for lid, res in dev.of_type("AWS::ECS::TaskDefinition").items():
        (container,) = res["Properties"]["ContainerDefinitions"]
        out[lid] = {e["Name"]: e["Value"] for e in container["Environment"]}
    return out


# ---- storage -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("table", "definition"),
    [
        ("jobs", jobs_table_definition),
        ("runs", runs_table_definition),
        ("notifications", resources.notifications_table_definition),
    ],
)
def test_table_keys_and_indexes_equal_the_core_definitions(
    dev: Synthesized, table: str, definition: Any
) -> None:
    expected = definition("ignored")
    props = tables(dev)[table]

    assert props["KeySchema"] == expected["KeySchema"]
    assert sorted(props["AttributeDefinitions"], key=str) == sorted(expected["AttributeDefinitions"], key=str)
    got = {g["IndexName"]: (g["KeySchema"], g["Projection"]) for g in props.get("GlobalSecondaryIndexes", [])}
    want = {g["IndexName"]: (g["KeySchema"], g["Projection"]) for g in expected["GlobalSecondaryIndexes"]}
    assert got == want


def test_due_watchdog_and_tenant_indexes_use_the_resource_constants(dev: Synthesized) -> None:
    t = tables(dev)

    def index(props: dict[str, Any], name: str) -> list[tuple[str, str]]:
        (gsi,) = [g for g in props["GlobalSecondaryIndexes"] if g["IndexName"] == name]
        return [(k["AttributeName"], k["KeyType"]) for k in gsi["KeySchema"]]

    assert t["jobs"]["KeySchema"] == [{"AttributeName": JOBS_PK, "KeyType": "HASH"}]
    assert index(t["jobs"], DUE_INDEX) == [(DUE_INDEX_PK, "HASH"), (DUE_INDEX_SK, "RANGE")]
    assert [k for k, _ in index(t["jobs"], JOBS_BY_TENANT_INDEX)][0] == "tenant"
    assert [(k["AttributeName"], k["KeyType"]) for k in t["runs"]["KeySchema"]] == [
        (RUNS_PK, "HASH"),
        (RUNS_SK, "RANGE"),
    ]
    assert index(t["runs"], WATCH_INDEX) == [(WATCH_INDEX_PK, "HASH"), (WATCH_INDEX_SK, "RANGE")]


def test_tables_are_on_demand_with_point_in_time_recovery_and_encryption(dev: Synthesized) -> None:
    for name, props in tables(dev).items():
        assert props["BillingMode"] == "PAY_PER_REQUEST", name
        assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}, name
        assert props["SSESpecification"]["SSEEnabled"] is True, name
        assert "TableName" not in props, name


def test_runs_expire_by_ttl_and_idempotency_records_by_theirs(dev: Synthesized) -> None:
    t = tables(dev)
    core_definition = getattr(resources, "idempotency_table_definition", None)
    if core_definition is not None:
        assert t["idempotency"]["KeySchema"] == core_definition("-")["KeySchema"]

    assert t["runs"]["TimeToLiveSpecification"] == {"AttributeName": RUNS_TTL_ATTRIBUTE, "Enabled": True}
    assert t["idempotency"]["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]
    assert t["idempotency"]["TimeToLiveSpecification"] == {"AttributeName": "expiration", "Enabled": True}


def test_logs_bucket_is_private_encrypted_tls_only_logged_and_expires_with_the_runs(dev: Synthesized) -> None:
    props = dev.resources[logical_id(dev, dev.stack.storage.logs_bucket)]["Properties"]

    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"
    ] == {"SSEAlgorithm": "AES256"}
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    assert ref_id(props["LoggingConfiguration"]["DestinationBucketName"]) == logical_id(
        dev, dev.stack.storage.access_logs_bucket
    )
    (rule,) = props["LifecycleConfiguration"]["Rules"]
    lifecycle = dev.config.log_lifecycle
    assert rule["Status"] == "Enabled"
    assert rule["Transitions"] == [
        {"StorageClass": "STANDARD_IA", "TransitionInDays": lifecycle.infrequent_access_days},
        {"StorageClass": "GLACIER_IR", "TransitionInDays": lifecycle.glacier_instant_retrieval_days},
    ]
    assert rule["ExpirationInDays"] == lifecycle.expiration_days
    assert lifecycle.expiration_days is not None
    assert lifecycle.expiration_days >= max(dev.config.retention_days, dev.config.failed_run_retention_days)
    dev.template.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "Bucket": {"Ref": logical_id(dev, dev.stack.storage.logs_bucket)},
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Action": "s3:*",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            },
        },
    )


# ---- queues --------------------------------------------------------------------------------------------
def test_every_tier_queue_redrives_to_its_own_dead_letter_queue(dev: Synthesized) -> None:
    queues = dev.stack.queues

    # a queue and a dead-letter queue per tier, the archiver's dead-letter queue (test_archive), and the
    # notifications queue with its dead-letter queue
    dev.template.resource_count_is("AWS::SQS::Queue", 2 * len(ALL_TIERS) + 3)
    for tier in ALL_TIERS:
        props = dev.resources[logical_id(dev, queues.queue(tier))]["Properties"]
        assert props["RedrivePolicy"] == {
            "deadLetterTargetArn": {"Fn::GetAtt": [logical_id(dev, queues.dead_letter_queue(tier)), "Arn"]},
            "maxReceiveCount": QUEUE_MAX_RECEIVE_COUNT,
        }, tier
        assert props["MessageRetentionPeriod"] == DLQ_RETENTION_SECONDS
        dlq = dev.resources[logical_id(dev, queues.dead_letter_queue(tier))]["Properties"]
        assert dlq["MessageRetentionPeriod"] == DLQ_RETENTION_SECONDS
        assert "RedrivePolicy" not in dlq


def test_queue_visibility_timeouts_fit_their_consumers(dev: Synthesized) -> None:
    queues = dev.stack.queues

    for tier in CONTAINER_TIERS:
        props = dev.resources[logical_id(dev, queues.queue(tier))]["Properties"]
        assert props["VisibilityTimeout"] == QUEUE_VISIBILITY_SECONDS, tier
    lambda_tier = dev.resources[logical_id(dev, queues.queue("lambda"))]["Properties"]
    assert lambda_tier["VisibilityTimeout"] >= 6 * DISPATCHER_TIMEOUT_SECONDS


def test_every_queue_is_encrypted_and_refuses_plain_http(dev: Synthesized) -> None:
    for lid, queue in dev.of_type("AWS::SQS::Queue").items():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True, lid
        assert "QueueName" not in queue["Properties"], lid
    ssl_only = [
        ref_id(q)
        for p in dev.of_type("AWS::SQS::QueuePolicy").values()
        for q in p["Properties"]["Queues"]
        if any(
            s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
            for s in statements(p["Properties"]["PolicyDocument"])
        )
    ]
    assert sorted(ssl_only) == sorted(dev.of_type("AWS::SQS::Queue"))


# ---- scheduling ----------------------------------------------------------------------------------------
def test_one_tick_schedule_per_shard_with_its_shard_as_input(dev: Synthesized) -> None:
    tick = logical_id(dev, dev.stack.functions.functions["tick"])
    shards = []
    for schedule in dev.of_type("AWS::Scheduler::Schedule").values():
        props = schedule["Properties"]
        if ref_id(props["Target"]["Arn"]) == tick:
            assert props["ScheduleExpression"] == "rate(1 minute)"
            assert props["FlexibleTimeWindow"] == {"Mode": "OFF"}
            shards.append(json.loads(props["Target"]["Input"])["shard"])

    assert sorted(shards) == list(range(dev.config.shard_count))
    for env in function_env(dev).values():
        assert env["DUETIME_SHARD_COUNT"] == str(dev.config.shard_count)


def test_the_sweeper_has_one_schedule_every_minute(dev: Synthesized) -> None:
    sweeper = logical_id(dev, dev.stack.functions.functions["sweeper"])
    found = [
        s["Properties"]
        for s in dev.of_type("AWS::Scheduler::Schedule").values()
        if ref_id(s["Properties"]["Target"]["Arn"]) == sweeper
    ]

    assert len(found) == 1
    assert found[0]["ScheduleExpression"] == "rate(1 minute)"
    assert json.loads(found[0]["Target"]["Input"]) == {}


def test_a_stage_setting_changes_the_shard_count_and_the_authorizer(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    other = synthesize(
        tmp_path_factory.mktemp("cdk-other"),
        {
            "stage": "ci",
            "duetime:shard_count": 2,
            "duetime:authorizer": "jwt",
            "duetime:jwt_issuer": "https://issuer.example.com",
            "duetime:jwt_audience": ["duetime"],
        },
    )

    inputs = sorted(
        s["Properties"]["Target"]["Input"] for s in other.of_type("AWS::Scheduler::Schedule").values()
    )
    assert inputs == ['{"shard":0}', '{"shard":1}', "{}"]
    assert {env["DUETIME_SHARD_COUNT"] for env in function_env(other).values()} == {"2"}
    other.template.has_resource_properties(
        "AWS::ApiGatewayV2::Authorizer",
        {
            "AuthorizerType": "JWT",
            "JwtConfiguration": {"Issuer": "https://issuer.example.com", "Audience": ["duetime"]},
        },
    )
    other.template.has_resource_properties("AWS::ApiGatewayV2::Route", {"AuthorizationType": "JWT"})


# ---- functions -----------------------------------------------------------------------------------------
def test_functions_run_arm64_python312_with_json_logs_tracing_and_a_role_each(dev: Synthesized) -> None:
    functions = dev.of_type("AWS::Lambda::Function")

    assert len(functions) == len(FUNCTIONS)
    roles = set()
    for lid, fn in functions.items():
        props = fn["Properties"]
        assert props["Architectures"] == ["arm64"], lid
        assert props["Runtime"] == "python3.12", lid
        assert props["Handler"] == "handler.lambda_handler", lid
        assert props["TracingConfig"] == {"Mode": "Active"}, lid
        assert props["LoggingConfig"]["LogFormat"] == "JSON", lid
        log_group = dev.resources[ref_id(props["LoggingConfig"]["LogGroup"])]["Properties"]
        assert log_group["RetentionInDays"] == dev.config.log_retention_days, lid
        assert len(props["Layers"]) == 1, lid
        assert "FunctionName" not in props, lid
        roles.add(ref_id(props["Role"]))
    assert len(roles) == len(functions)


def test_every_function_and_worker_gets_every_setting_the_code_reads(dev: Synthesized) -> None:
    # every setting the AWS backend cannot do without (the deployed stack has no state directory)
    required = {
        v for v, f in ENV_VARS.items() if Settings.model_fields[f].is_required() or f in AWS_BACKEND_FIELDS
    }
    assert required >= {
        "DUETIME_JOBS_TABLE",
        "DUETIME_RUNS_TABLE",
        "DUETIME_LOGS_BUCKET",
        "DUETIME_QUEUE_URLS",
    }
    envs = {**function_env(dev), **container_env(dev)}

    assert len(envs) == len(FUNCTIONS) + len(CONTAINER_TIERS)
    for name, env in envs.items():
        duetime_vars = {k for k in env if k.startswith("DUETIME_")}
        assert duetime_vars >= required, name
        assert duetime_vars <= set(ENV_VARS), (
            f"{name}: variables no code reads: {duetime_vars - set(ENV_VARS)}"
        )
        assert ref_id(env["DUETIME_JOBS_TABLE"]) == logical_id(dev, dev.stack.storage.jobs), name
        assert ref_id(env["DUETIME_RUNS_TABLE"]) == logical_id(dev, dev.stack.storage.runs), name
        assert ref_id(env["DUETIME_LOGS_BUCKET"]) == logical_id(dev, dev.stack.storage.logs_bucket), name


def test_the_environment_carries_the_stages_non_default_settings(dev: Synthesized) -> None:
    """Read back by the code's own reader, each environment gives the stage's values, not code defaults."""
    s, q = dev.stack.storage, dev.stack.queues
    values: dict[str, Any] = {
        "jobs_table": f"<{logical_id(dev, s.jobs)}>",
        "runs_table": f"<{logical_id(dev, s.runs)}>",
        "logs_bucket": f"<{logical_id(dev, s.logs_bucket)}>",
        "queue_urls": {t: f"<{logical_id(dev, q.queue(t))}>" for t in ALL_TIERS},
        "shard_count": dev.config.shard_count,
        "run_retention_days": dev.config.retention_days,
        "failed_run_retention_days": dev.config.failed_run_retention_days,
        "keep_last_runs": dev.config.keep_last_runs,
        "log_pack_linger_seconds": 15.0,  # the stage default: the workers gather logs into packs for 15 s
        "archive_bucket": f"<{logical_id(dev, dev.stack.archive.bucket)}>",
        "archiver_dlq_url": f"<{logical_id(dev, dev.stack.archive.dead_letter_queue)}>",
        "tick_period_seconds": 60,  # the schedules' rate(1 minute)
    }
    if "idempotency_table" in Settings.model_fields:
        values["idempotency_table"] = f"<{logical_id(dev, s.idempotency)}>"
    values["timeout_state_machine_arn"] = f"<{logical_id(dev, dev.stack.timeouts.state_machine)}>"
    n = dev.stack.notifications
    values["notifications_table"] = f"<{logical_id(dev, n.table)}>"
    values["notifications_queue_url"] = f"<{logical_id(dev, n.queue)}>"
    values["email_topic_prefix"] = f"{dev.stack.stack_name}-email"
    values["aws_account_id"] = "<AWS::AccountId>"
    expected = Settings.model_validate(values)
    for name, env in {**function_env(dev), **container_env(dev)}.items():
        assert settings_from_env({k: render(v) for k, v in env.items()}) == expected, name


def test_queue_urls_variable_is_a_json_object_of_every_tier_queue(dev: Synthesized) -> None:
    queues = dev.stack.queues
    for name, env in {**function_env(dev), **container_env(dev)}.items():
        urls = json.loads(render(env["DUETIME_QUEUE_URLS"]))

        assert urls == {t: f"<{logical_id(dev, queues.queue(t))}>" for t in ALL_TIERS}, name


# ---- IAM -----------------------------------------------------------------------------------------------
def test_no_identity_statement_allows_a_wildcard_action(dev: Synthesized) -> None:
    for lid, st in identity_statements(dev):
        for action in as_list(st["Action"]):
            assert "*" not in action, (lid, action)


def test_resource_policies_allow_no_wildcard_action(dev: Synthesized) -> None:
    for kind, doc_key in (
        ("AWS::SQS::QueuePolicy", "PolicyDocument"),
        ("AWS::S3::BucketPolicy", "PolicyDocument"),
        ("AWS::SNS::TopicPolicy", "PolicyDocument"),
    ):
        for lid, res in dev.of_type(kind).items():
            for st in statements(res["Properties"][doc_key]):
                if st["Effect"] == "Allow":
                    assert all("*" not in a for a in as_list(st["Action"])), (lid, st)


def test_resource_star_only_where_aws_requires_it(dev: Synthesized) -> None:
    for lid, st in identity_statements(dev):
        if "*" in as_list(st["Resource"]):
            assert set(as_list(st["Action"])) <= STAR_RESOURCE_ACTIONS, (lid, st["Action"])


def test_function_roles_hold_exactly_the_access_their_code_needs(dev: Synthesized) -> None:
    fns = dev.stack.functions.functions
    s = dev.stack.storage
    jobs, runs, idem, bucket = (
        f"<{logical_id(dev, x)}>" for x in (s.jobs, s.runs, s.idempotency, s.logs_bucket)
    )
    queues = {f"<{logical_id(dev, dev.stack.queues.queue(t))}>" for t in ALL_TIERS}
    xray = {"xray:PutTraceSegments": {"*"}, "xray:PutTelemetryRecords": {"*"}}
    archive = f"<{logical_id(dev, dev.stack.archive.bucket)}>"
    archiver_dlq = f"<{logical_id(dev, dev.stack.archive.dead_letter_queue)}>"
    notify_table = f"<{logical_id(dev, dev.stack.notifications.table)}>"
    notify_queue = f"<{logical_id(dev, dev.stack.notifications.queue)}>"

    def grants(name: str) -> dict[str, set[str]]:
        got = role_actions(dev, ref_id(dev.resources[logical_id(dev, fns[name])]["Properties"]["Role"]) or "")
        logs = {got.pop("logs:CreateLogStream").pop(), got.pop("logs:PutLogEvents").pop()}
        assert logs == {f"<{logical_id(dev, dev.stack.functions.log_groups[name])}>"}
        return got

    assert grants("tick") == {
        "dynamodb:Query": {f"{jobs}/index/{DUE_INDEX}"},
        "dynamodb:UpdateItem": {jobs},
        "dynamodb:PutItem": {runs},
        "sqs:SendMessage": queues,
        **xray,
    }
    assert grants("sweeper") == {
        "dynamodb:Query": {f"{runs}/index/{WATCH_INDEX}", f"{runs}/index/{ACTIVE_INDEX}"},
        "dynamodb:BatchGetItem": {runs},
        "dynamodb:GetItem": {runs, jobs},
        "dynamodb:PutItem": {runs},
        "dynamodb:UpdateItem": {runs, jobs},
        "sqs:SendMessage": queues | {notify_queue},
        "states:StartExecution": {f"<{logical_id(dev, dev.stack.timeouts.state_machine)}>"},
        **xray,
    }
    assert grants("api") == {
        "dynamodb:GetItem": {jobs, runs, idem, notify_table},
        "dynamodb:BatchGetItem": {jobs, notify_table},
        "dynamodb:PutItem": {jobs, runs, idem, notify_table},
        "dynamodb:UpdateItem": {jobs, runs, idem},
        "dynamodb:DeleteItem": {idem},
        "dynamodb:Query": {
            notify_table,
            runs,
            f"{jobs}/index/{JOBS_BY_TENANT_INDEX}",
            f"{runs}/index/{ACTIVE_INDEX}",
            f"{runs}/index/{DEAD_LETTER_INDEX}",
        },
        "sqs:SendMessage": queues,
        "s3:GetObject": {f"{bucket}/logs/*", f"{archive}/archive/*"},
        "s3:ListBucket": {bucket, archive},
        **{
            a: {f"arn:<AWS::Partition>:sns:<AWS::Region>:<AWS::AccountId>:{dev.stack.stack_name}-email-*"}
            for a in ("sns:CreateTopic", "sns:TagResource", "sns:ListSubscriptionsByTopic", "sns:Subscribe")
        },
        **xray,
    }
    lambda_queue = f"<{logical_id(dev, dev.stack.queues.queue('lambda'))}>"
    consume = ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility")
    consume += ("sqs:GetQueueAttributes", "sqs:GetQueueUrl")
    assert grants("dispatcher") == {
        "dynamodb:GetItem": {runs, jobs},
        "dynamodb:BatchGetItem": {jobs},
        "dynamodb:UpdateItem": {runs, jobs},
        "dynamodb:Query": {f"{runs}/index/{ACTIVE_INDEX}", f"{runs}/index/{RUNNING_INDEX}"},
        "sqs:SendMessage": {lambda_queue},
        **{a: {lambda_queue} for a in consume},
        "s3:PutObject": {f"{bucket}/logs/*"},
        "lambda:InvokeFunction": {"arn:<AWS::Partition>:lambda:<AWS::Region>:<AWS::AccountId>:function:*"},
        **xray,
    }
    assert grants("finish") == {
        "dynamodb:GetItem": {runs, jobs},
        "dynamodb:PutItem": {runs},
        "dynamodb:UpdateItem": {runs},
        "dynamodb:Query": {f"{runs}/index/{ACTIVE_INDEX}"},
        "sqs:SendMessage": queues,
        "s3:GetObject": {f"{bucket}/logs/*"},
        "s3:PutObject": {f"{bucket}/logs/*"},
        "s3:ListBucket": {bucket},
        **xray,
    }
    stream = runs  # Fn::GetAtt [runs, StreamArn]: test_archive checks the attribute
    assert grants("archiver") == {
        "dynamodb:Query": {runs},
        "dynamodb:PutItem": {runs},
        # the stream event source (CDK's grantStreamRead) and its on-failure queue (grantSendMessages)
        "dynamodb:DescribeStream": {stream},
        "dynamodb:GetRecords": {stream},
        "dynamodb:GetShardIterator": {stream},
        "dynamodb:ListStreams": {"*"},
        "sqs:SendMessage": {archiver_dlq},
        "sqs:GetQueueAttributes": {archiver_dlq},
        "sqs:GetQueueUrl": {archiver_dlq},
        "s3:GetObject": {f"{bucket}/logs/*"},
        "s3:ListBucket": {bucket},
        "s3:PutObject": {f"{archive}/archive/*"},
        **xray,
    }


def test_the_dispatcher_invokes_only_functions_tagged_for_duetime(dev: Synthesized) -> None:
    role = ref_id(
        dev.resources[logical_id(dev, dev.stack.functions.functions["dispatcher"])]["Properties"]["Role"]
    )
    invokes = [
        st
        for res in dev.of_type("AWS::IAM::Policy").values()
        if role in [ref_id(r) for r in res["Properties"]["Roles"]]
        for st in statements(res["Properties"]["PolicyDocument"])
        if "lambda:InvokeFunction" in as_list(st["Action"])
    ]

    assert [st["Condition"] for st in invokes] == [
        {"StringEquals": {"aws:ResourceTag/duetime-target": "true"}}
    ]


def test_the_dispatcher_consumes_the_lambda_queue_reporting_batch_item_failures(dev: Synthesized) -> None:
    dispatcher = logical_id(dev, dev.stack.functions.functions["dispatcher"])
    mappings = [
        m["Properties"]
        for m in dev.of_type("AWS::Lambda::EventSourceMapping").values()
        if ref_id(m["Properties"]["FunctionName"]) == dispatcher
    ]

    (mapping,) = mappings
    assert ref_id(mapping["EventSourceArn"]) == logical_id(dev, dev.stack.queues.queue("lambda"))
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["BatchSize"] == 10
    props = dev.resources[dispatcher]["Properties"]
    assert props["Timeout"] == DISPATCHER_TIMEOUT_SECONDS


# ---- notifications (issue 17) ----------------------------------------------------------------------------
def test_the_notifiers_role_holds_exactly_what_it_calls_and_never_the_alarm_topic(dev: Synthesized) -> None:
    fn = dev.stack.functions.functions["notifier"]
    role = ref_id(dev.resources[logical_id(dev, fn)]["Properties"]["Role"]) or ""
    got = role_actions(dev, role)
    for action in ("logs:CreateLogStream", "logs:PutLogEvents"):
        assert got.pop(action) == {f"<{logical_id(dev, dev.stack.functions.log_groups['notifier'])}>"}
    n = dev.stack.notifications
    table, queue, dlq = (f"<{logical_id(dev, x)}>" for x in (n.table, n.queue, n.dead_letter_queue))
    runs = f"<{logical_id(dev, dev.stack.storage.runs)}>"
    stream = runs  # rendered: its StreamArn attribute (checked below)
    email = f"arn:<AWS::Partition>:sns:<AWS::Region>:<AWS::AccountId>:{dev.stack.stack_name}-email-*"
    account = "arn:<AWS::Partition>:sns:<AWS::Region>:<AWS::AccountId>:*"
    consume = ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility")
    consume += ("sqs:GetQueueAttributes", "sqs:GetQueueUrl")
    assert got == {
        "dynamodb:GetItem": {f"<{logical_id(dev, dev.stack.storage.jobs)}>", table},
        "dynamodb:PutItem": {table},
        "sqs:SendMessage": {queue, dlq},  # the DLQ: the stream mapping's on-failure destination
        "sqs:GetQueueAttributes": {queue, dlq},
        "sqs:GetQueueUrl": {queue, dlq},
        **{a: {queue} for a in consume if a not in ("sqs:GetQueueAttributes", "sqs:GetQueueUrl")},
        "dynamodb:DescribeStream": {stream},
        "dynamodb:GetRecords": {stream},
        "dynamodb:GetShardIterator": {stream},
        "dynamodb:ListStreams": {"*"},
        "sns:Publish": {account, email},
        "sns:CreateTopic": {email},
        "sns:TagResource": {email},
        "sns:ListSubscriptionsByTopic": {email},
        "sns:Subscribe": {email},
        "xray:PutTraceSegments": {"*"},
        "xray:PutTelemetryRecords": {"*"},
    }
    # the runs table only through its stream: every grant on it is on its StreamArn
    on_runs = [
        st
        for res in dev.of_type("AWS::IAM::Policy").values()
        if role in [ref_id(r) for r in res["Properties"]["Roles"]]
        for st in statements(res["Properties"]["PolicyDocument"])
        if any(ref_id(r) == runs.strip("<>") for r in as_list(st["Resource"]))
    ]
    assert on_runs and all(
        r == {"Fn::GetAtt": [runs.strip("<>"), "StreamArn"]}
        for st in on_runs
        for r in as_list(st["Resource"])
    )
    denied = [
        (as_list(st["Action"]), [render(r) for r in as_list(st["Resource"])])
        for res in dev.of_type("AWS::IAM::Policy").values()
        if role in [ref_id(r) for r in res["Properties"]["Roles"]]
        for st in statements(res["Properties"]["PolicyDocument"])
        if st["Effect"] == "Deny"
    ]
    assert denied == [(["sns:Publish"], [f"<{logical_id(dev, dev.stack.monitoring.topic)}>"])]


def test_the_notifier_reads_the_runs_stream_filtered_and_its_queue_reporting_failures(
    dev: Synthesized,
) -> None:
    from duetime.adapters.aws.resources import NOTIFICATIONS_VISIBILITY_SECONDS, NOTIFIER_TIMEOUT_SECONDS
    from duetime.domain.notifications import EVENT_STATES

    notifier = logical_id(dev, dev.stack.functions.functions["notifier"])
    n = dev.stack.notifications
    runs = tables(dev)["runs"]
    assert runs["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}
    mappings = {
        ref_id(m["Properties"]["EventSourceArn"]) or json.dumps(m["Properties"]["EventSourceArn"]): m[
            "Properties"
        ]
        for m in dev.of_type("AWS::Lambda::EventSourceMapping").values()
        if ref_id(m["Properties"]["FunctionName"]) == notifier
    }
    queue = mappings.pop(logical_id(dev, n.queue))
    assert (queue["FunctionResponseTypes"], queue["BatchSize"]) == (["ReportBatchItemFailures"], 4)
    (stream,) = mappings.values()
    assert stream["EventSourceArn"] == {"Fn::GetAtt": [logical_id(dev, dev.stack.storage.runs), "StreamArn"]}
    assert stream["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert stream["StartingPosition"] == "TRIM_HORIZON"
    assert ref_id(stream["DestinationConfig"]["OnFailure"]["Destination"]) == logical_id(
        dev, n.dead_letter_queue
    )
    patterns = [json.loads(f["Pattern"]) for f in stream["FilterCriteria"]["Filters"]]
    assert {"dynamodb": {"NewImage": {"state": {"S": list(EVENT_STATES)}}}} in patterns
    assert {
        "eventName": ["INSERT"],
        "dynamodb": {"NewImage": {"missed_slots": {"N": [{"numeric": [">", 0, "<=", 10**9]}]}}},
    } in patterns
    props = dev.resources[notifier]["Properties"]
    assert props["Timeout"] == NOTIFIER_TIMEOUT_SECONDS
    q = dev.resources[logical_id(dev, n.queue)]["Properties"]
    assert q["VisibilityTimeout"] == NOTIFICATIONS_VISIBILITY_SECONDS >= 6 * NOTIFIER_TIMEOUT_SECONDS
    assert q["RedrivePolicy"]["deadLetterTargetArn"] == {
        "Fn::GetAtt": [logical_id(dev, n.dead_letter_queue), "Arn"]
    }
    assert tables(dev)["notifications"]["TimeToLiveSpecification"] == {
        "AttributeName": "expires_at",
        "Enabled": True,
    }


def test_notifications_dead_letters_and_the_notifiers_errors_are_alarmed(dev: Synthesized) -> None:
    found = {
        (a.get("Namespace"), a.get("MetricName"), a.get("Statistic"), a.get("Threshold")) for a in alarms(dev)
    }
    assert ("Duetime", "NotificationDeadLettered", "Sum", 1) in found
    notifier = logical_id(dev, dev.stack.functions.functions["notifier"])
    assert any(
        a.get("MetricName") == "Errors" and ref_id(a["Dimensions"][0]["Value"]) == notifier
        for a in alarms(dev)
    )


def test_the_finish_function_is_a_destination_of_this_accounts_functions_and_an_output(
    dev: Synthesized,
) -> None:
    finish = logical_id(dev, dev.stack.functions.functions["finish"])
    permissions = [
        p["Properties"]
        for p in dev.of_type("AWS::Lambda::Permission").values()
        if ref_id(p["Properties"]["FunctionName"]) == finish
    ]

    assert permissions == [
        {
            "Action": "lambda:InvokeFunction",
            "FunctionName": {"Fn::GetAtt": [finish, "Arn"]},
            "Principal": "lambda.amazonaws.com",
            "SourceAccount": {"Ref": "AWS::AccountId"},
        }
    ]
    assert ref_id(dev.template.to_json()["Outputs"]["FinishFunctionArn"]["Value"]) == finish


# ---- timeout handler -----------------------------------------------------------------------------------
def test_the_timeout_handler_is_the_cores_definition_logged_and_traced(dev: Synthesized) -> None:
    (machine,) = dev.of_type("AWS::StepFunctions::StateMachine").values()
    props = machine["Properties"]

    definition = json.loads(render(props["DefinitionString"]))
    assert definition == state_machine_definition()
    assert {"FenceAttempt", "StopTask", "ApplyAction", "SendRetry", "PutTriggeredRun"} <= set(
        definition["States"]
    )
    assert props["StateMachineType"] == "STANDARD"
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props["LoggingConfiguration"]["Level"] in ("ALL", "ERROR")
    assert props["LoggingConfiguration"]["IncludeExecutionData"] is False
    (destination,) = props["LoggingConfiguration"]["Destinations"]
    log_group = ref_id(destination["CloudWatchLogsLogGroup"]["LogGroupArn"])
    assert dev.resources[log_group]["Type"] == "AWS::Logs::LogGroup"
    assert dev.resources[log_group]["Properties"]["RetentionInDays"] == dev.config.log_retention_days


def test_the_timeout_handlers_role_holds_exactly_what_its_states_call(dev: Synthesized) -> None:
    s = dev.stack.storage
    runs = f"<{logical_id(dev, s.runs)}>"
    queues = {f"<{logical_id(dev, dev.stack.queues.queue(t))}>" for t in ALL_TIERS}
    cluster = logical_id(dev, dev.stack.executors.cluster)
    role = logical_id(dev, dev.stack.timeouts.role)
    (machine,) = dev.of_type("AWS::StepFunctions::StateMachine").values()
    assert ref_id(machine["Properties"]["RoleArn"]) == role

    grants = role_actions(dev, role)
    star = {a for a, resources in grants.items() if resources == {"*"}}
    assert star <= STAR_RESOURCE_ACTIONS
    assert {a: r for a, r in grants.items() if a not in star} == {
        "dynamodb:UpdateItem": {runs},
        "dynamodb:PutItem": {runs},
        "sqs:SendMessage": queues,
        "ecs:StopTask": {f"arn:<AWS::Partition>:ecs:<AWS::Region>:<AWS::AccountId>:task/<{cluster}>/*"},
    }
    (stop,) = [
        st
        for res in dev.of_type("AWS::IAM::Policy").values()
        if role in [ref_id(r) for r in res["Properties"]["Roles"]]
        for st in statements(res["Properties"]["PolicyDocument"])
        if "ecs:StopTask" in as_list(st["Action"])
    ]
    assert stop["Condition"] == {"ArnEquals": {"ecs:cluster": {"Fn::GetAtt": [cluster, "Arn"]}}}


def test_the_sweeper_and_every_process_know_the_timeout_handler(dev: Synthesized) -> None:
    machine = logical_id(dev, dev.stack.timeouts.state_machine)

    for name, env in {**function_env(dev), **container_env(dev)}.items():
        assert ref_id(env["DUETIME_TIMEOUT_STATE_MACHINE_ARN"]) == machine, name
    assert ref_id(dev.template.to_json()["Outputs"]["TimeoutStateMachineArn"]["Value"]) == machine


def test_each_worker_tier_may_pull_only_its_own_queue(dev: Synthesized) -> None:
    s = dev.stack.storage
    jobs, runs, bucket = (f"<{logical_id(dev, x)}>" for x in (s.jobs, s.runs, s.logs_bucket))
    queues = {f"<{logical_id(dev, dev.stack.queues.queue(t))}>" for t in ALL_TIERS}
    for tier in CONTAINER_TIERS:
        task = dev.stack.executors.services[tier].task_definition
        task_role = ref_id(dev.resources[logical_id(dev, task)]["Properties"]["TaskRoleArn"]) or ""
        queue = f"<{logical_id(dev, dev.stack.queues.queue(tier))}>"

        assert role_actions(dev, task_role) == {
            "sqs:ReceiveMessage": {queue},
            "sqs:DeleteMessage": {queue},
            "sqs:ChangeMessageVisibility": {queue},
            "sqs:SendMessage": queues,
            "dynamodb:GetItem": {runs, jobs},
            "dynamodb:BatchGetItem": {jobs},
            "dynamodb:PutItem": {runs},
            "dynamodb:UpdateItem": {runs, jobs},
            "dynamodb:Query": {f"{runs}/index/{ACTIVE_INDEX}", f"{runs}/index/{RUNNING_INDEX}"},
            "s3:PutObject": {f"{bucket}/logs/*"},
            "s3:DeleteObject": {f"{bucket}/logs/*"},
        }, tier


# ---- API -----------------------------------------------------------------------------------------------
def test_api_routes_require_iam_by_default(dev: Synthesized) -> None:
    routes = dev.of_type("AWS::ApiGatewayV2::Route")

    assert routes, "no routes"
    for lid, route in routes.items():
        assert route["Properties"]["AuthorizationType"] == "AWS_IAM", lid


def test_api_stage_is_throttled_and_writes_json_access_logs(dev: Synthesized) -> None:
    (stage,) = dev.of_type("AWS::ApiGatewayV2::Stage").values()
    props = stage["Properties"]

    assert props["StageName"] == "$default"
    assert props["DefaultRouteSettings"] == {
        "ThrottlingBurstLimit": dev.config.api_burst_limit,
        "ThrottlingRateLimit": dev.config.api_rate_limit,
    }
    log_group = ref_id(props["AccessLogSettings"]["DestinationArn"])
    assert dev.resources[log_group]["Type"] == "AWS::Logs::LogGroup"
    assert json.loads(props["AccessLogSettings"]["Format"])["requestId"] == "$context.requestId"


# ---- monitoring ----------------------------------------------------------------------------------------
def scaling_policies(dev: Synthesized) -> set[str]:
    return set(dev.of_type("AWS::ApplicationAutoScaling::ScalingPolicy"))


def alarms(dev: Synthesized) -> list[dict[str, Any]]:
    """The monitoring alarms (not the ones that drive autoscaling)."""
    policies = scaling_policies(dev)
    return [
        a["Properties"]
        for a in dev.of_type("AWS::CloudWatch::Alarm").values()
        if not {ref_id(x) for x in a["Properties"]["AlarmActions"]} & policies
    ]


def test_schedule_lag_p99_and_dead_letter_alarms_watch_the_codes_metrics(dev: Synthesized) -> None:
    found = {
        (a.get("Namespace"), a.get("MetricName"), a.get("ExtendedStatistic") or a.get("Statistic"))
        for a in alarms(dev)
    }

    assert ("Duetime", "ScheduleLag", "p99") in found
    assert ("Duetime", "RunDeadLettered", "Sum") in found
    dev.template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "ScheduleLag",
            "Dimensions": [{"Name": "service", "Value": "duetime"}],
            "Threshold": dev.config.alarms.schedule_lag_p99_seconds,
        },
    )


def test_every_queue_has_an_age_alarm_and_every_dead_letter_queue_a_depth_alarm(dev: Synthesized) -> None:
    q = dev.stack.queues
    watched: dict[str, set[str | None]] = {}
    for a in alarms(dev):
        if a.get("Namespace") == "AWS/SQS":
            (dim,) = a["Dimensions"]
            watched.setdefault(a["MetricName"], set()).add(ref_id(dim["Value"]))

    assert watched["ApproximateAgeOfOldestMessage"] == {logical_id(dev, q.queue(t)) for t in ALL_TIERS}
    # the notifications queue holds wake-ups delayed up to 15 minutes by design: its DLQ is watched, and the
    # deliveries given up on (test_notifications_dead_letters_and_the_notifiers_errors_are_alarmed)
    assert watched["ApproximateNumberOfMessagesVisible"] == {
        logical_id(dev, q.dead_letter_queue(t)) for t in ALL_TIERS
    } | {
        logical_id(dev, dev.stack.archive.dead_letter_queue),
        logical_id(dev, dev.stack.notifications.dead_letter_queue),
    }


def test_alarms_notify_an_encrypted_topic(dev: Synthesized) -> None:
    topic = logical_id(dev, dev.stack.monitoring.topic)
    props = dev.resources[topic]["Properties"]

    assert "KmsMasterKeyId" in props
    assert len(alarms(dev)) >= 2 + 2 * len(ALL_TIERS)
    for a in alarms(dev):
        assert [ref_id(x) for x in a["AlarmActions"]] == [topic]
        assert [ref_id(x) for x in a["OKActions"]] == [topic]


def test_a_dashboard_shows_lag_queues_and_functions(dev: Synthesized) -> None:
    (dashboard,) = dev.of_type("AWS::CloudWatch::Dashboard").values()
    body = render(dashboard["Properties"]["DashboardBody"])

    for word in (
        "ScheduleLag",
        "ApproximateNumberOfMessagesVisible",
        "ApproximateAgeOfOldestMessage",
        "Errors",
    ):
        assert word in body


# ---- executors -----------------------------------------------------------------------------------------
def test_one_fargate_service_per_container_tier_sized_by_the_stage(dev: Synthesized) -> None:
    services = dev.stack.executors.services

    assert set(services) == set(CONTAINER_TIERS)
    for tier, service in services.items():
        task = dev.resources[logical_id(dev, service.task_definition)]["Properties"]
        sizing = dev.config.workers[tier]
        assert task["Cpu"] == str(sizing.cpu), tier
        assert task["Memory"] == str(sizing.memory_mib), tier
        assert task["RuntimePlatform"]["CpuArchitecture"] == "ARM64", tier
        (container,) = task["ContainerDefinitions"]
        # the tier's slots, bounded by its task size (small 4 on 0.25 vCPU, not the local default of 8)
        assert container["Command"] == ["worker", "--tier", tier, "--slots", str(sizing.slots)]
        assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    assert {t: dev.config.workers[t].slots for t in CONTAINER_TIERS} == {"small": 4, "medium": 2, "large": 1}


def test_workers_run_in_private_subnets_without_public_addresses(dev: Synthesized) -> None:
    private = {logical_id(dev, s) for s in dev.stack.executors.vpc.private_subnets}
    for lid, service in dev.of_type("AWS::ECS::Service").items():
        network = service["Properties"]["NetworkConfiguration"]["AwsvpcConfiguration"]

        assert network["AssignPublicIp"] == "DISABLED", lid
        assert {ref_id(s) for s in network["Subnets"]} <= private, lid


def test_workers_scale_out_on_waiting_runs_and_in_only_when_idle(dev: Synthesized) -> None:
    targets = dev.of_type("AWS::ApplicationAutoScaling::ScalableTarget")
    sizes = sorted((t["Properties"]["MinCapacity"], t["Properties"]["MaxCapacity"]) for t in targets.values())
    assert sizes == sorted((w.min_tasks, w.max_tasks) for w in dev.config.workers.values())

    policies = scaling_policies(dev)
    scaling = [
        a["Properties"]
        for a in dev.of_type("AWS::CloudWatch::Alarm").values()
        if {ref_id(x) for x in a["Properties"]["AlarmActions"]} & policies
    ]
    out = [a for a in scaling if a.get("MetricName") == "ApproximateNumberOfMessagesVisible"]
    idle = [a for a in scaling if "Metrics" in a]
    assert len(out) == len(idle) == len(CONTAINER_TIERS)
    assert {ref_id(a["Dimensions"][0]["Value"]) for a in out} == {
        logical_id(dev, dev.stack.queues.queue(t)) for t in CONTAINER_TIERS
    }
    for a in out:
        assert (a["ComparisonOperator"], a["Threshold"], a["EvaluationPeriods"]) == (
            "GreaterThanOrEqualToThreshold",
            1,
            1,
        )
    for a in idle:
        assert (a["ComparisonOperator"], a["Threshold"], a["EvaluationPeriods"]) == (
            "LessThanOrEqualToThreshold",
            0,
            dev.config.scale_in_idle_minutes,
        )
        assert {m["MetricStat"]["Metric"]["MetricName"] for m in a["Metrics"] if "MetricStat" in m} == {
            "ApproximateNumberOfMessagesVisible",
            "ApproximateNumberOfMessagesNotVisible",
        }


# ---- hygiene -------------------------------------------------------------------------------------------
NAME_PROPERTIES = re.compile(
    r"^(TableName|QueueName|BucketName|FunctionName|RoleName|LogGroupName|TopicName|ClusterName|ServiceName|"
    r"DashboardName|AlarmName|LayerName|KeyName|Name)$"
)


def test_no_resource_has_a_hard_coded_physical_name(dev: Synthesized) -> None:
    for lid, res in dev.resources.items():
        for key, value in (res.get("Properties") or {}).items():
            if NAME_PROPERTIES.match(key):
                assert not isinstance(value, str), (lid, key, value)


def test_the_prod_stage_sets_warm_throughput_on_the_hot_tables_and_indexes_and_a_tick_of_four_processes(
    tmp_path_factory: pytest.TempPathFactory, dev: Synthesized
) -> None:
    # the prod preset, and (a -c override of the whole field) the idempotency table too
    preset = json.loads((Path(__file__).resolve().parents[2] / "cdk.json").read_text())
    warm = preset["context"]["stages"]["prod"]["warm_throughput"]
    idempotency_warm = {"idempotency": {"write_units_per_second": 8000}}
    prod = synthesize(
        tmp_path_factory.mktemp("cdk-prod"),
        {"stage": "prod", "duetime:warm_throughput": {**warm, **idempotency_warm}},
    )
    storage = prod.stack.storage
    runs = prod.resources[logical_id(prod, storage.runs)]["Properties"]
    jobs = prod.resources[logical_id(prod, storage.jobs)]["Properties"]
    assert runs["WarmThroughput"] == {"WriteUnitsPerSecond": 44_000}
    assert jobs["WarmThroughput"] == {"WriteUnitsPerSecond": 20_000}
    idempotency = prod.resources[logical_id(prod, storage.idempotency)]["Properties"]
    assert idempotency["WarmThroughput"] == {"WriteUnitsPerSecond": 8_000}
    indexes = {
        g["IndexName"]: g.get("WarmThroughput")
        for table in (runs, jobs)
        for g in table["GlobalSecondaryIndexes"]
    }
    assert indexes["watchdog"] == {"WriteUnitsPerSecond": 28_000}
    assert indexes["due"] == {"WriteUnitsPerSecond": 15_000}
    assert indexes["by_tenant"] == {"WriteUnitsPerSecond": 10_000}
    assert indexes["dead_letters"] is None
    # and dev leaves DynamoDB's defaults
    assert all("WarmThroughput" not in t for t in tables(dev).values())
    # and its ticks claim with 4 processes, the tick function sized for 4 vCPUs (1,769 MB each); dev's with 1
    for synth, processes, memory in ((prod, "4", 7_076), (dev, "1", 512)):
        tick = synth.resources[logical_id(synth, synth.stack.functions.functions["tick"])]["Properties"]
        assert tick["MemorySize"] == memory
        assert tick["Environment"]["Variables"]["DUETIME_TICK_PROCESSES"] == processes
    api = dev.resources[logical_id(dev, dev.stack.functions.functions["api"])]["Properties"]
    assert api["MemorySize"] == 512
    # and cfn-lint knows the property and finds nothing in the prod template
    result = cfn_lint(prod)
    assert result is not None, "cfn-lint comes with the cdk extra"
    assert result.returncode == 0, result.stdout + result.stderr
