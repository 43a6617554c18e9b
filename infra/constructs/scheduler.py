"""Scheduling: EventBridge Scheduler drives the tick (one schedule per shard) and the sweeper (DESIGN.md 2, 4).

Each shard's schedule invokes the tick with ``{"shard": N}`` every minute; the stage's ``shard_count`` is also
the functions' ``DUETIME_SHARD_COUNT``, so every shard a job can hash to has a tick. One schedule invokes the
sweeper with ``{}`` (it sweeps every shard). Invocations are asynchronous; a lost or failed one is covered by
the next minute's, so events older than a minute are dropped instead of piling up.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from constructs import Construct

from infra.config import TICK_PERIOD_SECONDS, StageConfig
from infra.nag import acknowledge, arn_finding

assert TICK_PERIOD_SECONDS % 60 == 0, "EventBridge Scheduler rates are whole minutes"

#: A scheduled invocation older than this is dropped: the next one does the same work.
MAX_EVENT_AGE = Duration.seconds(60)
#: Scheduler's retries of a failed (e.g. throttled) invoke call.
RETRY_ATTEMPTS = 2


def tick_input(shard: int) -> dict[str, int]:
    """The event each shard's tick receives."""
    return {"shard": shard}


class Schedules(Construct):
    """``ticks[n]`` is shard n's schedule; ``sweeper`` the sweeper's."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: StageConfig,
        tick: lambda_.IFunction,
        sweeper: lambda_.IFunction,
    ) -> None:
        super().__init__(scope, id)
        # one role for every schedule; the targets grant it lambda:InvokeFunction on the two functions
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            ),
            description="EventBridge Scheduler: invoke the Duetime tick and sweeper",
        )
        for function in (tick, sweeper):
            acknowledge(
                self.role,
                arn_finding(function, ":*"),
                "CDK's grantInvoke also allows the function's own qualified ARNs (versions/aliases); "
                "nothing beyond this one function",
            )
        # Scheduler's rate() counts whole minutes: rate(1 minute)
        every_tick = scheduler.ScheduleExpression.rate(Duration.minutes(TICK_PERIOD_SECONDS // 60))
        self.ticks = [
            scheduler.Schedule(
                self,
                f"TickShard{shard}",
                description=f"Duetime tick of shard {shard} ({config.name})",
                schedule=every_tick,
                target=targets.LambdaInvoke(
                    tick,
                    input=scheduler.ScheduleTargetInput.from_object(tick_input(shard)),
                    max_event_age=MAX_EVENT_AGE,
                    retry_attempts=RETRY_ATTEMPTS,
                    role=self.role,
                ),
            )
            for shard in range(config.shard_count)
        ]
        self.sweeper = scheduler.Schedule(
            self,
            "Sweeper",
            description=f"Duetime sweeper, every shard ({config.name})",
            schedule=every_tick,
            target=targets.LambdaInvoke(
                sweeper,
                input=scheduler.ScheduleTargetInput.from_object({}),
                max_event_age=MAX_EVENT_AGE,
                retry_attempts=RETRY_ATTEMPTS,
                role=self.role,
            ),
        )
