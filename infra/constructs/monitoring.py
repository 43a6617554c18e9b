"""Monitoring: alarms to an encrypted SNS topic, and one dashboard (DESIGN.md section 10).

Alarms: schedule lag p99 (``ScheduleLag``, seconds from due to start, emitted by the code), each queue's age of
oldest message, each dead-letter queue's depth, runs dead-lettered (``RunDeadLettered``), API 5xx, and errors
of the scheduled functions. The code's metrics are EMF in namespace ``Duetime`` with the Powertools
``service`` dimension; both are read from ``duetime.config.observability`` so the alarms watch what the code emits.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from duetime.config.observability import metrics as code_metrics
from duetime.config.settings import ALL_TIERS
from duetime.services.notifier import DELIVERY_DEAD_LETTERED
from infra.config import StageConfig
from infra.constructs.api import Api
from infra.constructs.notifications import Notifications
from infra.constructs.queues import TierQueues

NAMESPACE = code_metrics.namespace or "Duetime"
#: Powertools adds ``service`` to every metric it emits.
DIMENSIONS = {"service": code_metrics.service} if code_metrics.service else {}
SCHEDULE_LAG = "ScheduleLag"
RUN_DEAD_LETTERED = "RunDeadLettered"
#: a notification delivery given up on (the notifier's own name for it)
NOTIFICATION_DEAD_LETTERED = DELIVERY_DEAD_LETTERED
ONE_MINUTE = Duration.minutes(1)
FIVE_MINUTES = Duration.minutes(5)


def code_metric(name: str, *, statistic: str, period: Duration = ONE_MINUTE) -> cw.Metric:
    """A metric the Duetime code emits."""
    return cw.Metric(
        namespace=NAMESPACE, metric_name=name, dimensions_map=DIMENSIONS, statistic=statistic, period=period
    )


def api_metric(api: Api, name: str, period: Duration) -> cw.Metric:
    """A metric of the HTTP API's ``$default`` stage (``Count``, ``4xx``, ``5xx``, ``Latency``)."""
    return cw.Metric(
        namespace="AWS/ApiGateway",
        metric_name=name,
        statistic="Sum",
        period=period,
        dimensions_map={"ApiId": api.http_api.api_id, "Stage": "$default"},
    )


class Monitoring(Construct):
    """``topic`` receives every alarm (``alarms``); ``dashboard`` shows the system at a glance."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: StageConfig,
        queues: TierQueues,
        api: Api,
        functions: dict[str, lambda_.Function],
        archiver_dlq: sqs.IQueue | None = None,
        notifications: Notifications | None = None,
    ) -> None:
        super().__init__(scope, id)
        key = kms.Key(
            self,
            "AlarmTopicKey",
            description="Duetime alarm topic encryption",
            enable_key_rotation=True,
        )
        # CloudWatch alarms publish to an encrypted topic only if the key lets CloudWatch use it
        key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy, "*" means this key
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            )
        )
        self.topic = sns.Topic(
            self,
            "AlarmTopic",
            display_name=f"Duetime alarms ({config.name})",
            master_key=key,
            enforce_ssl=True,
        )
        if config.alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(config.alarm_email))
        action = cw_actions.SnsAction(self.topic)
        thresholds = config.alarms
        self.alarms: list[cw.Alarm] = []

        def alarm(
            id: str, metric: cw.IMetric, threshold: float, description: str, periods: int = 1
        ) -> cw.Alarm:
            made = cw.Alarm(
                self,
                id,
                metric=metric,
                threshold=threshold,
                evaluation_periods=periods,
                datapoints_to_alarm=periods,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                alarm_description=description,
            )
            made.add_alarm_action(action)
            made.add_ok_action(action)
            self.alarms.append(made)
            return made

        lag_p99 = code_metric(SCHEDULE_LAG, statistic="p99")
        alarm(
            "ScheduleLagP99",
            lag_p99,
            thresholds.schedule_lag_p99_seconds,
            f"p99 of run start - due time >= {thresholds.schedule_lag_p99_seconds} s for 3 minutes: runs start "
            "late (workers saturated or scaling, queue or tick trouble)",
            periods=3,
        )
        dead_letters = code_metric(RUN_DEAD_LETTERED, statistic="Sum", period=FIVE_MINUTES)
        alarm(
            "RunsDeadLettered",
            dead_letters,
            thresholds.dead_letters_per_5_minutes,
            "runs exhausted their attempts and ended FAILED, dead_lettered (see the runs' attempt history)",
        )
        for tier in ALL_TIERS:
            name = tier.capitalize()
            age_limit = (
                thresholds.lambda_queue_age_seconds
                if tier == "lambda"
                else config.workers[tier].queue_age_alarm_seconds
            )
            alarm(
                f"{name}QueueAge",
                queues.queue(tier).metric_approximate_age_of_oldest_message(
                    period=ONE_MINUTE, statistic="Maximum"
                ),
                age_limit,
                f"the {tier} queue's oldest message is >= {age_limit} s old (delay + waiting + running): "
                "its consumers are stuck or too few",
                periods=5,
            )
            alarm(
                f"{name}DeadLetterQueueDepth",
                queues.dead_letter_queue(tier).metric_approximate_number_of_messages_visible(
                    period=ONE_MINUTE, statistic="Maximum"
                ),
                thresholds.dlq_depth,
                f"messages in the {tier} dead-letter queue: SQS gave up delivering them "
                f"(the sweeper re-sends the runs; inspect and purge)",
            )
        if archiver_dlq is not None:
            alarm(
                "ArchiverDeadLetterQueueDepth",
                archiver_dlq.metric_approximate_number_of_messages_visible(
                    period=ONE_MINUTE, statistic="Maximum"
                ),
                thresholds.dlq_depth,
                "messages in the archiver's dead-letter queue: a batch of the runs table's TTL deletions was "
                "not archived (its records are in archive/failed/ or in the messages; replay them)",
            )
        if notifications is not None:
            alarm(
                "NotificationsDeadLettered",
                code_metric(NOTIFICATION_DEAD_LETTERED, statistic="Sum", period=FIVE_MINUTES),
                1,
                "notification deliveries were given up on (a receiver failing for a day, or an address the SSRF "
                "rules refuse): see GET /jobs/{id}/deliveries",
            )
            alarm(
                "NotificationsDeadLetterQueueDepth",
                notifications.dead_letter_queue.metric_approximate_number_of_messages_visible(
                    period=ONE_MINUTE, statistic="Maximum"
                ),
                thresholds.dlq_depth,
                "messages or stream batches the notifier could not handle: their deliveries wait; inspect, "
                "fix and redrive",
            )
        api_5xx = api_metric(api, "5xx", FIVE_MINUTES)
        alarm("Api5xx", api_5xx, thresholds.api_5xx_per_5_minutes, "the HTTP API answers 5xx")
        for fname, what in (
            ("tick", "claims are not happening"),
            ("sweeper", "repairs are not happening"),
            ("archiver", "archiving is not happening"),
            ("notifier", "events or deliveries are waiting"),
        ):
            if fname in functions:
                alarm(
                    f"{fname.capitalize()}Errors",
                    functions[fname].metric_errors(period=FIVE_MINUTES, statistic="Sum"),
                    thresholds.function_errors_per_5_minutes,
                    f"the {fname} function fails: {what}",
                )

        self.dashboard = self._dashboard(config, queues, api, api_5xx, lag_p99, dead_letters, functions)

    def _dashboard(
        self,
        config: StageConfig,
        queues: TierQueues,
        api: Api,
        api_5xx: cw.IMetric,
        lag_p99: cw.Metric,
        dead_letters: cw.Metric,
        functions: dict[str, lambda_.Function],
    ) -> cw.Dashboard:
        dashboard = cw.Dashboard(self, "Dashboard", default_interval=Duration.hours(3))
        # what the code emits today: the tick's claims, the sweeper's repairs, timeouts and dead letters
        counts = [
            code_metric(name, statistic="Sum")
            for name in ("RunsClaimed", "RunsResent", "LeasesExpired", "RetriesReleased", "RunTimedOut")
        ]
        dashboard.add_widgets(
            cw.TextWidget(
                markdown=f"# Duetime ({config.name})\nLag = run start - due time. Queues: visible = waiting for a "
                "consumer, in flight = being run. Any dead letter needs a look.",
                width=24,
                height=2,
            )
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Schedule lag (s)",
                width=8,
                left=[code_metric(SCHEDULE_LAG, statistic="p50"), lag_p99],
                left_annotations=[
                    cw.HorizontalAnnotation(value=config.alarms.schedule_lag_p99_seconds, label="p99 alarm")
                ],
            ),
            cw.GraphWidget(
                title="Runs per minute",
                width=8,
                left=[*counts, dead_letters.with_(period=ONE_MINUTE)],
            ),
            cw.AlarmStatusWidget(title="Alarms", width=8, alarms=list(self.alarms)),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Runs waiting (visible)",
                width=8,
                left=[
                    queues.queue(t).metric_approximate_number_of_messages_visible(period=ONE_MINUTE, label=t)
                    for t in ALL_TIERS
                ],
            ),
            cw.GraphWidget(
                title="Runs in flight",
                width=8,
                left=[
                    queues.queue(t).metric_approximate_number_of_messages_not_visible(
                        period=ONE_MINUTE, label=t
                    )
                    for t in ALL_TIERS
                ],
            ),
            cw.GraphWidget(
                title="Oldest message (s) / dead letters",
                width=8,
                left=[
                    queues.queue(t).metric_approximate_age_of_oldest_message(period=ONE_MINUTE, label=t)
                    for t in ALL_TIERS
                ],
                right=[
                    queues.dead_letter_queue(t).metric_approximate_number_of_messages_visible(
                        period=ONE_MINUTE, label=f"{t} DLQ"
                    )
                    for t in ALL_TIERS
                ],
            ),
        )
        dashboard.add_widgets(
            cw.GraphWidget(
                title="Functions: errors and p99 duration",
                width=12,
                left=[f.metric_errors(period=ONE_MINUTE, label=f"{n} errors") for n, f in functions.items()],
                right=[
                    f.metric_duration(period=ONE_MINUTE, statistic="p99", label=f"{n} p99 ms")
                    for n, f in functions.items()
                ],
            ),
            cw.GraphWidget(
                title="API: requests and 5xx",
                width=12,
                left=[api_metric(api, "Count", ONE_MINUTE)],
                right=[api_5xx],
            ),
        )
        return dashboard
