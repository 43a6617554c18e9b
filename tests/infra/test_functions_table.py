"""The function table: one entry per function; a queue-fed entry gets an SQS event source that reports
partial batch failures (the dispatcher's), checked here with a stand-in handler."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra.conftest import CDK_MISSING, NO_BUNDLING

pytest.importorskip("aws_cdk", reason=CDK_MISSING)

from aws_cdk import App, Stack  # noqa: E402
from aws_cdk.assertions import Match, Template  # noqa: E402

from infra.app import cdk_json_context  # noqa: E402
from infra.config import StageConfig  # noqa: E402
from infra.constructs.access import Catalogue, Target, allow  # noqa: E402
from infra.constructs.functions import FUNCTIONS, Functions, FunctionSpec  # noqa: E402
from infra.constructs.queues import DISPATCHER_TIMEOUT_SECONDS, TierQueues  # noqa: E402
from infra.constructs.storage import Storage  # noqa: E402

# one xdist group: with `--dist loadgroup` the CDK app is synthesized by one worker only
pytestmark = [pytest.mark.infra, pytest.mark.xdist_group("cdk")]


def build(spec: FunctionSpec) -> Stack:
    app = App(context={**cdk_json_context(), **NO_BUNDLING})  # cdk.json's feature flags, as in the real app
    stack = Stack(app, "FunctionTable")
    storage = Storage(stack, "Storage", config=StageConfig())
    queues = TierQueues(stack, "Queues")
    Functions(
        stack,
        "Functions",
        config=StageConfig(),
        specs=(spec,),
        catalogue=Catalogue(storage, queues),
        queues=queues,
        environment={"DUETIME_JOBS_TABLE": "x"},
    )
    return stack


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    (tmp_path / "handler.py").write_text(
        "def lambda_handler(event, context):\n    return {'batchItemFailures': []}\n"
    )
    return tmp_path


def test_the_table_names_every_handler() -> None:
    assert [f.name for f in FUNCTIONS] == [
        "api",
        "tick",
        "sweeper",
        "dispatcher",
        "finish",
        "archiver",
        "notifier",
    ]
    for spec in FUNCTIONS:
        assert (spec.code_dir / "handler.py").is_file(), spec.name


def test_a_queue_fed_function_reports_batch_item_failures(stand_in: Path) -> None:
    spec = FunctionSpec(
        "dispatcher",
        "stand-in",
        timeout_seconds=DISPATCHER_TIMEOUT_SECONDS,
        memory_mib=256,
        access=(allow(Target.RUNS, "dynamodb:UpdateItem"),),
        queue_source="lambda",
        source=stand_in,
    )

    stack = build(spec)
    template = Template.from_stack(stack)

    queue = stack.resolve(
        stack.get_logical_id(stack.node.find_child("Queues").queue("lambda").node.default_child)
    )
    template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
            "EventSourceArn": {"Fn::GetAtt": [queue, "Arn"]},
        },
    )
    template.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        {
                            "Action": Match.array_with(["sqs:DeleteMessage", "sqs:ReceiveMessage"]),
                            "Effect": "Allow",
                            "Resource": {"Fn::GetAtt": [queue, "Arn"]},
                        }
                    ]
                )
            }
        },
    )


def test_a_queue_fed_function_must_fit_six_times_in_the_visibility_timeout(stand_in: Path) -> None:
    spec = FunctionSpec(
        "too-slow",
        "stand-in",
        timeout_seconds=300,
        memory_mib=256,
        access=(allow(Target.RUNS, "dynamodb:UpdateItem"),),
        queue_source="lambda",
        source=stand_in,
    )

    with pytest.raises(ValueError, match="visibility timeout"):
        build(spec)


def test_access_entries_refuse_wildcard_actions() -> None:
    with pytest.raises(ValueError, match="exact actions"):
        allow(Target.RUNS, "dynamodb:*")


def test_access_entries_refuse_an_index_the_table_does_not_have() -> None:
    with pytest.raises(ValueError, match="no index"):
        allow(Target.RUNS, "dynamodb:Query", index="no_such_index")
