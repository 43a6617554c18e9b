"""Timeout handling for stuck or partitioned workers: the timeout-handler state machine (Step Functions).

The worker enforces ``timeout_seconds`` itself (SIGTERM, ``kill_grace_seconds``, SIGKILL, TIMED_OUT). When
it cannot (stuck, paused, cut off), its run stays RUNNING past the deadline; the sweeper sees that on the
watchdog GSI and starts one execution of the state machine below, named from the run id and attempt so a
second start is a no-op (DESIGN.md section 5). The execution:

1. **Fence**: one conditional DynamoDB UpdateItem ends the attempt as TIMED_OUT (or RETRY_WAIT for
   ``on_timeout.action = retry`` with attempts left) and bumps the fencing token, only if the run is still
   RUNNING under the stuck worker's token. If the worker finished first, the condition fails and the
   execution ends (``AlreadySettled``): one outcome, never two. The stuck worker's next heartbeat or finish
   is rejected and it kills its task.
2. **Stop the task** where the platform allows (ECS StopTask, for a per-task container ARN).
3. **Apply ``on_timeout``**: ``retry`` sends the next attempt's message with the backoff delay (SQS);
   ``trigger`` puts the triggered job's run (conditional, idempotent) and sends its message; ``fail`` is
   done by the fence alone.

Every step is a direct service integration (DynamoDB, SQS, ECS): no Lambda. The sweeper precomputes each
request (the same update the worker itself would have applied) and passes it as the execution input, so the
definition names no resource and the CDK app deploys this very definition. Without a configured state
machine the sweeper applies the same plan itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.dynamodb import run_to_item, serialize
from duetime.adapters.aws.resources import SQS_MAX_DELAY_SECONDS
from duetime.adapters.aws.sqs import delay_seconds
from duetime.config.deps import Deps
from duetime.config.observability import emit_metric, logger
from duetime.domain.models import Run, RunState, Trigger

#: Step Functions execution names: 1-80 characters of [A-Za-z0-9-_].
MAX_EXECUTION_NAME = 80


def state_machine_definition() -> dict[str, Any]:
    """The timeout handler's Amazon States Language definition (Standard workflow).

    Input: ``{"run_id", "attempt", "action", "fence": UpdateItem params, "ecs_task_arn"?,
    "retry_message"?: SendMessage params, "triggered_run"?: PutItem params, "triggered_message"?}``.
    """
    update_params = {
        f"{k}.$": f"$.fence.{k}"
        for k in (
            "TableName",
            "Key",
            "UpdateExpression",
            "ConditionExpression",
            "ExpressionAttributeNames",
            "ExpressionAttributeValues",
        )
    }

    def send(path: str, next_state: str) -> dict[str, Any]:
        return {
            "Type": "Task",
            "Resource": "arn:aws:states:::sqs:sendMessage",
            "Parameters": {
                "QueueUrl.$": f"$.{path}.QueueUrl",
                "MessageBody.$": f"$.{path}.MessageBody",
                "DelaySeconds.$": f"$.{path}.DelaySeconds",
                "MessageGroupId.$": f"$.{path}.MessageGroupId",
            },
            "ResultPath": None,
            "Retry": [
                {"ErrorEquals": ["States.ALL"], "IntervalSeconds": 1, "MaxAttempts": 5, "BackoffRate": 2}
            ],
            "Next": next_state,
        }

    return {
        "Comment": "Duetime timeout handler: fence the attempt, stop the task, apply on_timeout",
        "StartAt": "FenceAttempt",
        "States": {
            "FenceAttempt": {
                "Type": "Task",
                "Resource": "arn:aws:states:::dynamodb:updateItem",
                "Parameters": update_params,
                "ResultPath": None,
                "Retry": [
                    {
                        "ErrorEquals": [
                            "DynamoDB.ProvisionedThroughputExceededException",
                            "DynamoDB.ThrottlingException",
                            "DynamoDB.InternalServerErrorException",
                        ],
                        "IntervalSeconds": 1,
                        "MaxAttempts": 5,
                        "BackoffRate": 2,
                    }
                ],
                "Catch": [
                    {"ErrorEquals": ["DynamoDB.ConditionalCheckFailedException"], "Next": "AlreadySettled"}
                ],
                "Next": "HasTaskToStop",
            },
            "HasTaskToStop": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.ecs_task_arn", "IsPresent": True, "Next": "StopTask"}],
                "Default": "ApplyAction",
            },
            "StopTask": {
                "Type": "Task",
                "Resource": "arn:aws:states:::aws-sdk:ecs:stopTask",
                "Parameters": {"Task.$": "$.ecs_task_arn", "Reason": "duetime: run timed out"},
                "ResultPath": None,
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "ApplyAction"}],
                "Next": "ApplyAction",
            },
            "ApplyAction": {
                "Type": "Choice",
                "Choices": [
                    {"Variable": "$.retry_message", "IsPresent": True, "Next": "SendRetry"},
                    {"Variable": "$.triggered_run", "IsPresent": True, "Next": "PutTriggeredRun"},
                ],
                "Default": "HasSuccessor",
            },
            "SendRetry": send("retry_message", "Handled"),
            "PutTriggeredRun": {
                "Type": "Task",
                "Resource": "arn:aws:states:::dynamodb:putItem",
                "Parameters": {
                    "TableName.$": "$.triggered_run.TableName",
                    "Item.$": "$.triggered_run.Item",
                    "ConditionExpression.$": "$.triggered_run.ConditionExpression",
                },
                "ResultPath": None,
                "Catch": [
                    {
                        "ErrorEquals": ["DynamoDB.ConditionalCheckFailedException"],
                        "ResultPath": None,
                        "Next": "SendTriggered",
                    }
                ],
                "Next": "SendTriggered",
            },
            "SendTriggered": send("triggered_message", "HasSuccessor"),
            "HasSuccessor": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.successor_message", "IsPresent": True, "Next": "WakeSuccessor"}],
                "Default": "Handled",
            },
            "WakeSuccessor": send("successor_message", "Handled"),
            "Handled": {"Type": "Succeed"},
            "AlreadySettled": {
                "Type": "Succeed",
                "Comment": "the worker (or another handler) settled it first",
            },
        },
    }


def execution_name(run: Run) -> str:
    """``<run id>-<attempt>`` with ``.`` as ``-``; hashed when longer than Step Functions allows."""
    name = f"{run.run_id.replace('.', '-')}-a{run.attempt}"
    if len(name) <= MAX_EXECUTION_NAME:
        return name
    digest = hashlib.sha256(run.run_id.encode()).hexdigest()[:40]
    return f"run-{digest}-a{run.attempt}"


@dataclass(frozen=True)
class TimeoutPlan:
    """Everything one timeout handler execution does, as precomputed AWS requests."""

    run_id: str
    attempt: int
    action: str
    name: str
    fence: dict[str, Any]
    retry_message: dict[str, Any] | None
    triggered_run: dict[str, Any] | None
    triggered_message: dict[str, Any] | None
    #: the wake-up of the overlap successor waiting behind the run, when the fence ends the run
    successor_message: dict[str, Any] | None = None
    #: the fence ends the run dead-lettered (no attempts left)
    dead_letters: bool = False

    def execution_input(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run_id": self.run_id,
            "attempt": self.attempt,
            "action": self.action,
            "fence": self.fence,
        }
        for key in ("retry_message", "triggered_run", "triggered_message", "successor_message"):
            value = getattr(self, key)
            if value is not None:
                data[key] = value
        return data


def plan_timeout(run: Run, deps: Deps) -> TimeoutPlan:
    """The requests that settle ``run``'s current attempt as timed out under its ``on_timeout``.

    The fence is the same update the worker applies at its own deadline (``runs._attempt_end_update``),
    plus a fencing-token bump, conditional on RUNNING under the stuck worker's token.
    """
    from duetime.services.claims import new_run
    from duetime.services.runs import _attempt_end_update, message_for, triggerable

    now = deps.clock.now()
    name = execution_name(run)
    upd = _attempt_end_update(
        run,
        deps,
        now=now,
        fencing_token=run.fencing_token,
        outcome=RunState.TIMED_OUT,
        exit_code=None,
        error=f"timed out after {run.timeout_seconds} s; the worker did not stop it (timeout handler)",
        log_key=None,
        reason="timeout_handler",
        worker=run.lease_owner,
    )
    upd.adds["fencing_token"] = 1
    upd.sets["timeout_execution"] = name
    upd.conditions.update(state=RunState.RUNNING.value, fencing_token=run.fencing_token)
    fence = {
        "TableName": deps.store.runs_table,
        "Key": serialize({"job_id": run.job_id, "due_at": run.due_at}),
        **upd.build(),
    }
    retry_message = triggered_run = triggered_message = None
    retry_at = upd.sets.get("retry_at")
    if retry_at is not None and (retry_at - now).total_seconds() <= SQS_MAX_DELAY_SECONDS:
        retry_message = {
            "QueueUrl": deps.settings.queue_url(run.task.tier),
            "MessageBody": message_for(run, attempt=run.attempt + 1).model_dump_json(),
            "DelaySeconds": delay_seconds(retry_at, now),
            "MessageGroupId": run.tenant[:128],
        }
    if run.on_timeout.action == "trigger" and run.on_timeout.job_id:
        target = deps.store.get_job(run.on_timeout.job_id)
        if triggerable(target, run.tenant) and target is not None:
            due_at = run.deadline_at or now
            new = new_run(target, due_at, deps, trigger=Trigger.TIMEOUT_HANDLER).model_copy(
                update={"triggered_by": run.run_id}
            )
            triggered_run = {
                "TableName": deps.store.runs_table,
                "Item": serialize(run_to_item(new, retention_days=deps.settings.run_retention_days)),
                "ConditionExpression": "attribute_not_exists(job_id)",
            }
            triggered_message = {
                "QueueUrl": deps.settings.queue_url(new.task.tier),
                "MessageBody": message_for(new).model_dump_json(),
                "DelaySeconds": 0,
                "MessageGroupId": new.tenant[:128],
            }
    terminal = upd.sets.get("state") != RunState.RETRY_WAIT.value
    successor_message = None
    if terminal and run.overlap.enforced:
        # the run ends here: its overlap successor, waiting PENDING behind it, is woken at once
        for due_at in deps.store.query_active_after(run.job_id, after=run.due_at, limit=1):
            waiting = deps.store.get_run(run.job_id, due_at)
            if waiting is not None and waiting.state is RunState.PENDING and waiting.held is None:
                successor_message = {
                    "QueueUrl": deps.settings.queue_url(waiting.task.tier),
                    "MessageBody": message_for(waiting).model_dump_json(),
                    "DelaySeconds": 0,
                    "MessageGroupId": waiting.tenant[:128],
                }
    return TimeoutPlan(
        run_id=run.run_id,
        attempt=run.attempt,
        action=run.on_timeout.action,
        name=name,
        fence=fence,
        retry_message=retry_message,
        triggered_run=triggered_run,
        triggered_message=triggered_message,
        successor_message=successor_message,
        dead_letters=bool(upd.sets.get("dead_lettered")),
    )


def start_handler(run: Run, deps: Deps) -> str:
    """Start the timeout handler for ``run``'s current attempt; a second start for the same attempt is a no-op.

    Returns the execution name. With no state machine configured (``DUETIME_TIMEOUT_STATE_MACHINE_ARN``
    unset) the plan is applied in-process instead, with the same requests and the same conditions.

    Raises:
        botocore ClientError: on Step Functions faults other than "already exists" (the sweeper retries).
    """
    plan = plan_timeout(run, deps)
    arn = deps.settings.timeout_state_machine_arn
    if arn is None:
        apply_plan(plan, deps)
        return plan.name
    try:
        aws.client("stepfunctions").start_execution(
            stateMachineArn=arn, name=plan.name, input=json.dumps(plan.execution_input())
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ExecutionAlreadyExists":
            raise
        return plan.name
    _count(plan)
    logger.warning("timeout handler started", extra={"run_id": run.run_id, "execution": plan.name})
    return plan.name


def _count(plan: TimeoutPlan) -> None:
    """The metrics of a fenced attempt, the same as when a worker reports the timeout itself."""
    emit_metric("RunTimedOut")
    if plan.dead_letters:
        emit_metric("RunDeadLettered")
        logger.error("run dead-lettered", extra={"run_id": plan.run_id, "attempts": plan.attempt})


def apply_plan(plan: TimeoutPlan, deps: Deps) -> bool:
    """Run a plan in-process, step for step as the state machine would. Returns False if already settled."""
    ddb, sqs = aws.client("dynamodb"), aws.client("sqs")
    try:
        ddb.update_item(**plan.fence)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False
        raise
    _count(plan)
    if plan.retry_message is not None:
        sqs.send_message(**plan.retry_message)
    if plan.triggered_run is not None and plan.triggered_message is not None:
        try:
            ddb.put_item(**plan.triggered_run)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise
        sqs.send_message(**plan.triggered_message)
    if plan.successor_message is not None:
        sqs.send_message(**plan.successor_message)
    return True


def create_state_machine(name: str) -> str:
    """Create (or find) the timeout-handler state machine by ``name``; returns its ARN. Local stack only:
    the CDK app deploys :func:`state_machine_definition` itself."""
    sfn = aws.client("stepfunctions")
    for machine in sfn.list_state_machines().get("stateMachines", []):
        if machine["name"] == name:
            return str(machine["stateMachineArn"])
    out = sfn.create_state_machine(
        name=name,
        definition=json.dumps(state_machine_definition()),
        roleArn="arn:aws:iam::123456789012:role/duetime-timeout-handler",
        type="STANDARD",
    )
    return str(out["stateMachineArn"])


__all__ = [
    "TimeoutPlan",
    "apply_plan",
    "create_state_machine",
    "execution_name",
    "plan_timeout",
    "start_handler",
    "state_machine_definition",
]
