"""The timeout handler on AWS: a Step Functions state machine whose steps are direct service integrations.

:class:`StepFunctionsTimeoutRunner` turns a :class:`~duetime.domain.ports.TimeoutPlan` into the execution
input of :func:`state_machine_definition`: the fence as DynamoDB UpdateItem parameters (built by the DynamoDB
adapter, the same write a worker's own finish applies, plus the fencing-token bump), the triggered run as
PutItem parameters, and each wake-up as SendMessage parameters. The definition names no resource, so the
CDK app deploys this very definition (``infra/constructs/timeouts.py``). The execution is named from the run
id and attempt, so a second start for the same attempt is a no-op (``ExecutionAlreadyExists``).
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.dynamodb import DynamoStore
from duetime.adapters.aws.sqs import SqsQueues
from duetime.domain.ports import TimeoutPlan


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


class StepFunctionsTimeoutRunner:
    """Starts one execution of the timeout-handler state machine per plan.

    Args:
        state_machine_arn: the deployed :func:`state_machine_definition`.
        store: builds the fence and the triggered run's put.
        queues: builds the wake-up messages.
    """

    def __init__(self, state_machine_arn: str, store: DynamoStore, queues: SqsQueues) -> None:
        self.state_machine_arn = state_machine_arn
        self.store = store
        self.queues = queues

    def execution_input(self, plan: TimeoutPlan) -> dict[str, Any]:
        """The state machine's input for ``plan`` (see :func:`state_machine_definition`)."""
        data: dict[str, Any] = {
            "run_id": plan.run.run_id,
            "attempt": plan.run.attempt,
            "action": plan.run.on_timeout.action,
            "fence": self.store.end_attempt_request(plan.end),
        }
        if plan.retry is not None:
            message, delay = plan.retry
            data["retry_message"] = self.queues.send_request(
                message.tier or plan.run.task.tier, message, delay=delay
            )
        if plan.triggered is not None:
            run, message = plan.triggered
            data["triggered_run"] = self.store.put_new_run_request(run)
            data["triggered_message"] = self.queues.send_request(run.task.tier, message)
        if plan.successor is not None:
            data["successor_message"] = self.queues.send_request(
                plan.successor.tier or plan.run.task.tier, plan.successor
            )
        return data

    def start(self, plan: TimeoutPlan) -> bool:
        """Start the execution named ``plan.name``; False if it already exists.

        Raises:
            botocore ClientError: on Step Functions faults other than "already exists" (the sweeper retries).
        """
        try:
            aws.client("stepfunctions").start_execution(
                stateMachineArn=self.state_machine_arn,
                name=plan.name,
                input=json.dumps(self.execution_input(plan)),
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ExecutionAlreadyExists":
                raise
            return False
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


__all__ = ["StepFunctionsTimeoutRunner", "create_state_machine", "state_machine_definition"]
