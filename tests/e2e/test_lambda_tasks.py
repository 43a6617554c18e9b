"""End to end, Lambda tasks on the real local stack: HTTP API -> lambda queue -> SQS event source ->
dispatcher -> local Invoke API -> function process -> destination record -> finish -> S3 log."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import boto3
import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack

pytestmark = pytest.mark.e2e

FUNCTIONS = {name: f"tests.lambda_functions:{name}" for name in ("echo", "fail", "sleepy", "count")}


@pytest.fixture(scope="module")
def lambda_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("lambda-stack")
    args = ["--tick-seconds", "1", "--workers", "0", "--heartbeat-seconds", "1", "--lease-seconds", "4"]
    for name, target in FUNCTIONS.items():
        args += ["--lambda", f"{name}={target}"]
    # the moto backend: the duplicate-delivery test sends raw messages to the lambda queue over SQS
    stack = start_stack(workdir, *args, backend="moto")
    yield stack
    stop_stack(stack)


def _lambda_job(function: str, payload: dict | None = None, **kw) -> dict:
    return {
        "name": "e2e-lambda",
        "task": {"kind": "lambda", "function": function, "payload": payload or {}},
        **kw,
    }


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _submit(stack: Stack, body: dict) -> str:
    status, job = stack.request("POST", "/jobs", body)
    assert status == 201, job
    return str(job["job_id"])


def test_a_lambda_job_runs_its_function_with_the_envelope_and_succeeds_with_its_result(
    lambda_stack: Stack,
) -> None:
    job_id = _submit(lambda_stack, _lambda_job("echo", {"word": "hi", "n": 1.5}, timeout_seconds=20))
    [run] = lambda_stack.wait_run(job_id, {"SUCCEEDED"}, timeout=20)
    status, body = lambda_stack.request("GET", f"/runs/{run['run_id']}")
    assert status == 200 and body["state"] == "SUCCEEDED"
    result = dict(body["result"])
    assert _ts(result.pop("due_at")) == _ts(body["due_at"])
    assert result == {
        "payload": {"word": "hi", "n": 1.5},
        "run_id": run["run_id"],
        "job_id": job_id,
        "attempt": 1,
        "fencing_token": 1,
        "timeout_seconds": 20,
    }
    status, text = lambda_stack.request("GET", f"/runs/{run['run_id']}/logs")
    assert status == 200
    assert f"echo: run {run['run_id']} attempt 1 token 1 payload {{'word': 'hi', 'n': 1.5}}" in text
    assert "Success -> SUCCEEDED" in text


def test_a_function_that_raises_fails_each_attempt_and_the_retry_policy_applies(lambda_stack: Stack) -> None:
    job_id = _submit(lambda_stack, _lambda_job("fail", retry={"max_attempts": 2, "backoff_seconds": 1}))
    [run] = lambda_stack.wait_run(job_id, {"FAILED"}, timeout=25)
    assert (run["attempt"], run["dead_lettered"], run["error"]) == (2, True, "ValueError: boom on attempt 2")
    assert [(a["state"], a["reason"]) for a in run["attempts"]] == [("FAILED", "function_error")] * 2
    text = lambda_stack.request("GET", f"/runs/{run['run_id']}/logs?attempt=1")[1]
    assert "fail: attempt 1 is about to raise" in text and "Traceback" in text


def test_a_function_past_its_timeout_is_killed_and_timed_out_and_on_timeout_applies(
    lambda_stack: Stack,
) -> None:
    body = _lambda_job("sleepy", {"seconds": 60}, timeout_seconds=2, on_timeout={"action": "fail"})
    job_id = _submit(lambda_stack, body)
    [run] = lambda_stack.wait_run(job_id, {"TIMED_OUT"}, timeout=20)
    assert (run["timeout_action"], run["attempts"][0]["reason"]) == ("fail", "timeout")
    text = lambda_stack.request("GET", f"/runs/{run['run_id']}/logs")[1]
    assert "sleepy: going to sleep" in text and "Task timed out after 2.00 seconds" in text


def test_an_unregistered_function_fails_the_attempt_at_once(lambda_stack: Stack) -> None:
    job_id = _submit(lambda_stack, _lambda_job("nobody-home", retry={"max_attempts": 1}))
    [run] = lambda_stack.wait_run(job_id, {"FAILED"}, timeout=15)
    assert "ResourceNotFoundException: Function not found" in run["error"]
    assert run["attempts"][0]["reason"] == "invoke_failed"


def test_a_duplicate_delivery_never_invokes_the_function_twice(lambda_stack: Stack, tmp_path: Path) -> None:
    # Given a run that succeeded, its function counting its invocations in a file
    counter = tmp_path / "invocations.txt"
    job_id = _submit(lambda_stack, _lambda_job("count", {"path": str(counter)}))
    [run] = lambda_stack.wait_run(job_id, {"SUCCEEDED"}, timeout=20)
    # When SQS delivers the attempt's wake-up again, twice
    state = json.loads((lambda_stack.workdir / ".duetime" / "local.json").read_text())
    sqs = boto3.client(
        "sqs",
        endpoint_url=state["aws_endpoint"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    message = json.dumps({"job_id": job_id, "due_at": run["due_at"], "attempt": 1, "timeout_seconds": 3600})
    for _ in range(2):
        sqs.send_message(QueueUrl=state["queues"]["lambda"], MessageBody=message)
    time.sleep(3)  # the event source polls every second
    # Then the function ran once, and the run is as it was
    assert counter.read_text().splitlines() == [f"{run['run_id']} 1 1"]
    _, after = lambda_stack.request("GET", f"/runs/{run['run_id']}")
    assert (after["state"], after["fencing_token"], after["result"]) == ("SUCCEEDED", 1, 1)
    attrs = sqs.get_queue_attributes(
        QueueUrl=state["queues"]["lambda"],
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert attrs == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}
