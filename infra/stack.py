"""The Duetime stack: composition only. Constructs per concern, wired together; tags; nothing else."""

from __future__ import annotations

from aws_cdk import CfnOutput, Environment, Stack, Tags
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import StageConfig
from infra.constructs.access import Catalogue
from infra.constructs.api import Api
from infra.constructs.archive import Archive
from infra.constructs.console import ConsoleSignIn
from infra.constructs.executors import Executors
from infra.constructs.functions import FUNCTIONS, Functions, FunctionSpec
from infra.constructs.monitoring import Monitoring
from infra.constructs.notifications import Notifications
from infra.constructs.queues import TierQueues
from infra.constructs.scheduler import Schedules
from infra.constructs.storage import Storage
from infra.constructs.timeouts import TimeoutHandler
from infra.environment import runtime_environment


def stack_id(config: StageConfig) -> str:
    """``Duetime-<stage>``: also the CloudFormation stack name, which prefixes every generated name."""
    return f"Duetime-{config.name}"


class DuetimeStack(Stack):
    """Everything in DESIGN.md section 2."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: StageConfig,
        functions: tuple[FunctionSpec, ...] = FUNCTIONS,
    ) -> None:
        env = Environment(account=config.account, region=config.region) if config.account else None
        super().__init__(scope, id, env=env, description=f"Duetime job scheduler ({config.name})")
        self.config = config
        Tags.of(self).add("app", "duetime")
        Tags.of(self).add("stage", config.name)

        self.storage = Storage(self, "Storage", config=config)
        self.queues = TierQueues(self, "Queues")
        self.archive = Archive(self, "Archive", config=config, storage=self.storage)
        self.notifications = Notifications(self, "Notifications", config=config)
        catalogue = Catalogue(self.storage, self.queues, self.archive, self.notifications)
        self.timeouts = TimeoutHandler(self, "TimeoutHandler", config=config, catalogue=catalogue)
        environment = runtime_environment(
            self,
            config=config,
            storage=self.storage,
            queues=self.queues,
            archive=self.archive,
            timeout_state_machine_arn=self.timeouts.state_machine.state_machine_arn,
            notifications=self.notifications,
        )

        self.functions = Functions(
            self,
            "Functions",
            config=config,
            specs=functions,
            catalogue=catalogue,
            queues=self.queues,
            environment=environment,
        )
        fn = self.functions.functions
        self.console = (
            ConsoleSignIn(self, "Console", config=config, console=config.console) if config.console else None
        )
        self.api = Api(self, "Api", config=config, handler=fn["api"], sign_in=self.console)
        if self.console is not None:
            self.console.configure(fn["api"])
        self.schedules = Schedules(self, "Schedules", config=config, tick=fn["tick"], sweeper=fn["sweeper"])
        self.executors = Executors(
            self, "Executors", config=config, catalogue=catalogue, queues=self.queues, environment=environment
        )
        if "archiver" in fn:
            self.archive.read_stream(fn["archiver"], self.storage.runs)
        self.timeouts.allow_stop_tasks(self.executors.cluster)
        self.timeouts.state_machine.grant_start_execution(fn["sweeper"])
        if "notifier" in fn:
            self.notifications.feed(fn["notifier"], self.storage.runs)
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            config=config,
            queues=self.queues,
            api=self.api,
            functions=fn,
            archiver_dlq=self.archive.dead_letter_queue,
            notifications=self.notifications,
        )
        if "notifier" in fn:
            # a rule's own topic may be any of this account's, but never the operators' alarm topic
            fn["notifier"].add_to_role_policy(
                iam.PolicyStatement(
                    effect=iam.Effect.DENY,
                    actions=["sns:Publish"],
                    resources=[self.monitoring.topic.topic_arn],
                )
            )

        CfnOutput(self, "ApiUrl", value=self.api.url, description="HTTP API endpoint (SigV4 or JWT)")
        if self.console is not None:
            CfnOutput(
                self,
                "ConsoleUrl",
                value=self.api.http_api.api_endpoint + "/console/shell",
                description="the web console: signs in through the stage's OIDC issuer (Cognito's hosted UI)",
            )
            if self.console.user_pool is not None:
                CfnOutput(self, "ConsoleUserPoolId", value=self.console.user_pool.user_pool_id)
        CfnOutput(self, "AlarmTopicArn", value=self.monitoring.topic.topic_arn)
        CfnOutput(self, "DashboardName", value=self.monitoring.dashboard.dashboard_name)
        CfnOutput(self, "JobsTableName", value=self.storage.jobs.table_name)
        CfnOutput(self, "RunsTableName", value=self.storage.runs.table_name)
        CfnOutput(self, "NotificationsTableName", value=self.notifications.table.table_name)
        CfnOutput(self, "LogsBucketName", value=self.storage.logs_bucket_name)
        CfnOutput(self, "ArchiveBucketName", value=self.archive.bucket.bucket_name)
        CfnOutput(
            self,
            "HistoryWorkgroup",
            value=self.archive.workgroup.ref,
            description="Athena workgroup for the run-history table (README, Run history)",
        )
        CfnOutput(
            self,
            "TimeoutStateMachineArn",
            value=self.timeouts.state_machine.state_machine_arn,
            description="the timeout handler the sweeper starts for stuck attempts",
        )
        if "finish" in fn:
            CfnOutput(
                self,
                "FinishFunctionArn",
                value=fn["finish"].function_arn,
                description="OnSuccess and OnFailure destination of every Lambda task's target function",
            )
