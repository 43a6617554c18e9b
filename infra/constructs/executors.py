"""Executors: a Fargate service of ``duetime worker --tier T`` per container tier (DESIGN.md section 7).

Network: a two-AZ VPC; workers run in private subnets with no inbound rules. Egress goes through NAT
(``nat_gateways``, default 1: about 33 USD/month plus 0.045 USD/GB, and it gives tasks the internet access
most jobs need), while DynamoDB and S3, the bulk of the workers' own traffic, go through free gateway
endpoints. The alternative, interface endpoints for SQS, CloudWatch Logs and ECR (api + dkr), would cost
about 58 USD/month in two AZs and still leave tasks without internet.

Scaling, per tier, on its queue: out when runs wait (``ApproximateNumberOfMessagesVisible`` >= 1, +1/+3/+10
tasks by backlog, every minute); in, straight to the minimum, only when the tier has been completely idle
(nothing visible, nothing in flight) for ``scale_in_idle_minutes``, so scaling in never stops a worker that is
running a task (a worker holds its message in flight until the run finishes).

The image is built by ``cdk deploy`` from ``infra/worker.Dockerfile`` (arm64); synth only stages its context.
"""

from __future__ import annotations

from aws_cdk import Aws, Duration, IgnoreMode, RemovalPolicy
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from duetime.adapters.aws.resources import ACTIVE_INDEX, RUNNING_INDEX
from duetime.config.settings import CONTAINER_TIERS
from infra.bundling import REPO_ROOT
from infra.config import StageConfig, WorkerTierConfig
from infra.constructs.access import Access, Catalogue, Target, allow
from infra.constructs.queues import TierQueues
from infra.nag import acknowledge

WORKER_DOCKERFILE = "infra/worker.Dockerfile"
#: The image's build context is the repository, reduced to what ``pip install .`` needs.
IMAGE_CONTEXT_EXCLUDES = [
    "*",
    "!pyproject.toml",
    "!README.md",
    "!layers/core/python/duetime",
    "!" + WORKER_DOCKERFILE,
    "**/__pycache__",
    "**/*.pyc",
]
#: Fargate's longest SIGTERM -> SIGKILL grace: the worker kills its task and records the attempt meanwhile.
STOP_TIMEOUT = Duration.seconds(120)


def worker_access(tier: str) -> tuple[Access, ...]:
    """The worker (``duetime.services.worker`` and ``duetime.services.runs``): pull, extend and delete its tier's messages; start
    a run (UpdateItem, after an overlap check: Query the active index, GetItem, and the tenant's RUNNING quota:
    Query the running-runs index), heartbeat and finish it
    (UpdateItem); afterwards send the retry wake-up, start an ``on_timeout: trigger`` run of another job (GetItem
    job, PutItem run, send to that job's tier) and wake the job's next waiting run; stream each attempt's log
    in chunks (PutObject) and delete them once the whole log is written. A first attempt is re-checked against
    its job (GetItem; a poll's together: BatchGetItem); a slot it skips as missed is counted on the job (UpdateItem).
    """
    return (
        allow(
            Target.QUEUES, "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", tier=tier
        ),
        allow(Target.QUEUES, "sqs:SendMessage"),
        allow(Target.RUNS, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"),
        allow(Target.RUNS, "dynamodb:Query", index=ACTIVE_INDEX),
        allow(Target.RUNS, "dynamodb:Query", index=RUNNING_INDEX),
        # a poll's starts re-check their first attempts against their jobs, read together (BatchGetItem)
        allow(Target.JOBS, "dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:UpdateItem"),
        allow(Target.LOG_OBJECTS, "s3:PutObject", "s3:DeleteObject"),
    )


class Executors(Construct):
    """VPC, cluster and one autoscaled Fargate service per container tier (``services[tier]``)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: StageConfig,
        catalogue: Catalogue,
        queues: TierQueues,
        environment: dict[str, str],
    ) -> None:
        super().__init__(scope, id)
        removal = RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=config.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name="workers", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20
                ),
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
                "DynamoDB": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
                # the logs' directory bucket (S3 Express One Zone) has its own endpoint service
                **(
                    {
                        "S3Express": ec2.GatewayVpcEndpointOptions(
                            service=ec2.GatewayVpcEndpointAwsService.S3_EXPRESS
                        )
                    }
                    if config.log_storage == "express"
                    else {}
                ),
            },
            # no custom resource to empty the default security group: nothing here uses it
            restrict_default_security_group=False,
        )
        flow_logs = logs.LogGroup(
            self, "FlowLogs", retention=logs.RetentionDays[config.log_retention], removal_policy=removal
        )
        self.vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs))

        self.cluster = ecs.Cluster(
            self, "Cluster", vpc=self.vpc, container_insights_v2=ecs.ContainerInsights.ENABLED
        )
        self.image = ecr_assets.DockerImageAsset(
            self,
            "WorkerImage",
            directory=str(REPO_ROOT),
            file=WORKER_DOCKERFILE,
            platform=ecr_assets.Platform.LINUX_ARM64,
            exclude=IMAGE_CONTEXT_EXCLUDES,
            ignore_mode=IgnoreMode.DOCKER,
        )
        self.services: dict[str, ecs.FargateService] = {}
        self.log_groups: dict[str, logs.LogGroup] = {}
        for tier in CONTAINER_TIERS:
            self._add_tier(
                tier,
                config.workers[tier],
                config=config,
                catalogue=catalogue,
                queues=queues,
                environment=environment,
                removal=removal,
            )

    def _add_tier(
        self,
        tier: str,
        sizing: WorkerTierConfig,
        *,
        config: StageConfig,
        catalogue: Catalogue,
        queues: TierQueues,
        environment: dict[str, str],
        removal: RemovalPolicy,
    ) -> None:
        name = tier.capitalize()
        task_role = iam.Role(
            self,
            f"{name}TaskRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description=f"Duetime {tier} workers: their queue, run updates, log uploads",
        )
        catalogue.grant(task_role, worker_access(tier))
        task = ecs.FargateTaskDefinition(
            self,
            f"{name}Task",
            cpu=sizing.cpu,
            memory_limit_mib=sizing.memory_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.ARM64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
            task_role=task_role,
        )
        log_group = logs.LogGroup(
            self, f"{name}Logs", retention=logs.RetentionDays[config.log_retention], removal_policy=removal
        )
        task.add_container(
            "worker",
            image=ecs.ContainerImage.from_docker_image_asset(self.image),
            command=["worker", "--tier", tier, "--slots", str(sizing.slots)],
            # Fargate sets AWS_REGION; the default region is spelled out for every SDK and tool a task may use
            environment={**environment, "AWS_DEFAULT_REGION": Aws.REGION},
            logging=ecs.LogDriver.aws_logs(stream_prefix=tier, log_group=log_group),
            stop_timeout=STOP_TIMEOUT,
        )
        acknowledge(
            task,
            "AwsSolutions-ECS2",
            "the variables are resource names, queue URLs and tunables (duetime.config.settings), none of them secret",
        )
        if task.execution_role is not None:
            acknowledge(
                task.execution_role,
                "AwsSolutions-IAM5[Resource::*]",
                "ecr:GetAuthorizationToken has no resource-level permissions (AWS requires *); the image pull "
                "itself is limited to the asset repository",
            )
        service = ecs.FargateService(
            self,
            f"{name}Service",
            cluster=self.cluster,
            task_definition=task,
            # no DesiredCount: autoscaling owns it (a template value can reset a scaled-out fleet on a deploy);
            # a new service starts one task and scales from there
            min_healthy_percent=100,
            max_healthy_percent=200,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            assign_public_ip=False,
        )
        self._autoscale(service, tier, sizing, config=config, queues=queues)
        self.services[tier] = service
        self.log_groups[tier] = log_group

    @staticmethod
    def _autoscale(
        service: ecs.FargateService,
        tier: str,
        sizing: WorkerTierConfig,
        *,
        config: StageConfig,
        queues: TierQueues,
    ) -> None:
        queue = queues.queue(tier)
        scaling = service.auto_scale_task_count(min_capacity=sizing.min_tasks, max_capacity=sizing.max_tasks)
        waiting = queue.metric_approximate_number_of_messages_visible(
            period=Duration.minutes(1), statistic="Maximum"
        )
        scaling.scale_on_metric(
            "ScaleOutOnWaitingRuns",
            metric=waiting,
            adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            scaling_steps=[
                appscaling.ScalingInterval(upper=1, change=0),
                appscaling.ScalingInterval(lower=1, change=1),
                appscaling.ScalingInterval(lower=10, change=3),
                appscaling.ScalingInterval(lower=50, change=10),
            ],
            cooldown=Duration.minutes(1),
            evaluation_periods=1,
        )
        busy = cw.MathExpression(
            expression="visible + inflight",
            using_metrics={
                "visible": waiting,
                "inflight": queue.metric_approximate_number_of_messages_not_visible(
                    period=Duration.minutes(1), statistic="Maximum"
                ),
            },
            period=Duration.minutes(1),
            label=f"{tier} runs waiting or running",
        )
        scaling.scale_on_metric(
            "ScaleInWhenIdle",
            metric=busy,
            adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            scaling_steps=[
                # clamps at min_capacity: "back to the minimum"
                appscaling.ScalingInterval(upper=0, change=-sizing.max_tasks),
                appscaling.ScalingInterval(lower=1, change=0),
            ],
            evaluation_periods=config.scale_in_idle_minutes,
            datapoints_to_alarm=config.scale_in_idle_minutes,
        )
