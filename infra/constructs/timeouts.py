"""The timeout-handler state machine (Step Functions, Standard): ``duetime.adapters.aws.stepfunctions.state_machine_definition``.

The definition names no resource (the sweeper passes table names, keys and queue URLs in each execution's
input), so the role is what bounds it: UpdateItem (the fence) and PutItem (an ``on_timeout: trigger`` run) on
the runs table, SendMessage to the tier queues, and StopTask on tasks of Duetime's own cluster only. Logs go
to its own log group (level ALL, without execution data: inputs carry run items); X-Ray tracing is on.
"""

from __future__ import annotations

import json

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from duetime.adapters.aws.stepfunctions import state_machine_definition
from infra.config import StageConfig
from infra.constructs.access import Access, Catalogue, Target, allow
from infra.nag import acknowledge

#: The fence (updateItem) and the triggered run (putItem) on the runs table; the retry and triggered
#: messages (sendMessage) to any tier's queue.
TIMEOUT_HANDLER_ACCESS: tuple[Access, ...] = (
    allow(Target.RUNS, "dynamodb:UpdateItem", "dynamodb:PutItem"),
    allow(Target.QUEUES, "sqs:SendMessage"),
)


class TimeoutHandler(Construct):
    """The state machine (``state_machine``), its role and log group; :meth:`allow_stop_tasks` once the
    cluster exists."""

    def __init__(self, scope: Construct, id: str, *, config: StageConfig, catalogue: Catalogue) -> None:
        super().__init__(scope, id)
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=logs.RetentionDays[config.log_retention],
            removal_policy=RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY,
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
            description="Duetime timeout handler: fence the attempt, stop the task, apply on_timeout",
        )
        catalogue.grant(self.role, TIMEOUT_HANDLER_ACCESS)
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_string(json.dumps(state_machine_definition())),
            role=self.role,
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=False
            ),
        )
        acknowledge(
            self.role,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray (PutTraceSegments, PutTelemetryRecords, GetSampling*) and CloudWatch Logs log delivery "
            "(*LogDelivery*, PutResourcePolicy, DescribeResourcePolicies, DescribeLogGroups) support no "
            "resource-level permissions: AWS requires *",
        )

    def allow_stop_tasks(self, cluster: ecs.ICluster) -> None:
        """``ecs:StopTask`` on the tasks of ``cluster`` (and, by condition, of no other cluster)."""
        tasks = Stack.of(self).format_arn(
            service="ecs", resource="task", resource_name=f"{cluster.cluster_name}/*"
        )
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["ecs:StopTask"],
                resources=[tasks],
                conditions={"ArnEquals": {"ecs:cluster": cluster.cluster_arn}},
            )
        )
        acknowledge(
            self.role,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ecs:<AWS::Region>:<AWS::AccountId>:task/<"
            + Stack.of(self).resolve(Stack.of(self).get_logical_id(cluster.node.default_child))  # type: ignore[arg-type]
            + ">/*]",
            "ECS names tasks by id: the grant covers the tasks of Duetime's own cluster (and ecs:cluster "
            "pins the cluster)",
        )
