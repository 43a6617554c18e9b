"""Lambda tasks on moto: the dispatcher (claim, invoke once, partial batch failures) and the finish handler
(outcomes, retries, timeouts, fencing against stale envelopes), then the local Lambda runtime in-process."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from botocore.exceptions import ClientError

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.lambda_invoker import BotoLambdaInvoker
from duetime.config.deps import Deps
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.errors import InvokeError
from duetime.domain.lifecycle import build_run, message_for
from duetime.domain.models import (
    MAX_RESULT_BYTES,
    LambdaTask,
    OnTimeout,
    RetryPolicy,
    Run,
    RunMessage,
    RunState,
    ScheduleSpec,
    Trigger,
)
from duetime.local.lambda_runtime import LocalLambdaContext, load_module
from duetime.local.lambda_service import LocalLambda, sqs_event_record
from duetime.services import jobs
from duetime.services.lambda_tasks import LAMBDA_LEASE_MARGIN_SECONDS
from duetime.services.sweeper import sweep
from tests.helpers import call, drain

QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:test-lambda"


class FakeInvoker:
    """Records invocations; raises Lambda's error for the functions in ``refuse``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.refuse: dict[str, InvokeError] = {}

    def invoke_event(self, function: str, payload: bytes) -> str:
        if function in self.refuse:
            raise self.refuse[function]
        self.calls.append((function, json.loads(payload)))
        return f"req-{len(self.calls)}"


@pytest.fixture
def invoker() -> FakeInvoker:
    return FakeInvoker()


@pytest.fixture
def dispatcher(deps: Deps, invoker: FakeInvoker, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load_module("dispatcher")
    monkeypatch.setattr(module, "default_deps", lambda: deps)
    monkeypatch.setattr(module, "invoker", invoker)
    return module


@pytest.fixture
def finisher(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load_module("finish")
    monkeypatch.setattr(module, "default_deps", lambda: deps)
    return module


def _submit(deps: Deps, function: str = "report", payload: dict | None = None, **kw: Any) -> Run:
    """A run-now Lambda job; returns its (PENDING) run."""
    task = LambdaTask(function=function, payload=payload or {})
    job = jobs.create_job(CreateJobRequest(name="l", task=task, **kw), tenant="local", deps=deps)
    [run] = deps.store.list_runs(job.job_id)
    return run


def _received(deps: Deps) -> list[dict[str, Any]]:
    """Every visible message of the lambda queue, received as the event source receives them."""
    sqs = aws.client("sqs")
    messages: list[dict[str, Any]] = []
    while True:
        out = sqs.receive_message(
            QueueUrl=deps.settings.queue_url("lambda"),
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            MessageSystemAttributeNames=["All"],
        )
        if not out.get("Messages"):
            return messages
        messages += out["Messages"]


def _event(messages: list[dict[str, Any]], *extra_bodies: str) -> dict[str, Any]:
    records = [sqs_event_record(m, queue_arn=QUEUE_ARN) for m in messages]
    for i, body in enumerate(extra_bodies):
        fake = {"MessageId": f"extra-{i}", "ReceiptHandle": f"rh-{i}", "Body": body}
        records.append(sqs_event_record(fake, queue_arn=QUEUE_ARN))
    return {"Records": records}


def _dispatch(dispatcher: ModuleType, event: dict[str, Any]) -> list[str]:
    """Invoke the dispatcher handler; returns the message ids it reported as failed."""
    out = dispatcher.lambda_handler(event, LocalLambdaContext("duetime-dispatcher"))
    return [f["itemIdentifier"] for f in out["batchItemFailures"]]


def _record(
    envelope: dict[str, Any], condition: str, response: Any, function_error: str | None = None
) -> dict:
    """Lambda's destination record for one invocation of ``envelope``."""
    record: dict[str, Any] = {
        "version": "1.0",
        "timestamp": "2026-11-29T12:00:01.000Z",
        "requestContext": {
            "requestId": "req-1",
            "functionArn": "arn:aws:lambda:us-east-1:123456789012:function:report:$LATEST",
            "condition": condition,
            "approximateInvokeCount": 1,
        },
        "requestPayload": envelope,
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST"},
        "responsePayload": response,
    }
    if function_error:
        record["responseContext"]["functionError"] = function_error
    return record


def _finish(finisher: ModuleType, record: dict[str, Any]) -> dict[str, Any]:
    return finisher.lambda_handler(record, LocalLambdaContext("duetime-finish"))  # type: ignore[no-any-return]


def _error(message: str, kind: str = "ValueError") -> dict[str, Any]:
    return {
        "errorMessage": message,
        "errorType": kind,
        "stackTrace": ['  File "/var/task/report.py", line 9\n'],
    }


# ---- dispatcher --------------------------------------------------------------------------------------------
def test_the_dispatcher_claims_the_run_and_invokes_its_function_once_with_the_envelope(
    deps: Deps, dispatcher: ModuleType, invoker: FakeInvoker, clock
) -> None:
    # Given a run-now Lambda job whose wake-up message SQS delivers twice in one batch
    run = _submit(deps, payload={"region": "eu", "limit": 1.0, "note": None}, timeout_seconds=120)
    deps.queues.send(
        "lambda", RunMessage(job_id=run.job_id, due_at=run.due_at, attempt=1, timeout_seconds=120)
    )
    messages = _received(deps)
    assert len(messages) == 2
    # When the dispatcher handles the batch
    failed = _dispatch(dispatcher, _event(messages))
    # Then neither record failed, the function was invoked once, with the run's envelope and payload
    assert failed == []
    [(function, envelope)] = invoker.calls
    assert function == "report"
    assert envelope == {
        "duetime": {
            "run_id": run.run_id,
            "job_id": run.job_id,
            "attempt": 1,
            "fencing_token": 1,
            "due_at": "2026-11-29T12:00:00.000Z",
            "timeout_seconds": 120,
        },
        "payload": {"region": "eu", "limit": 1.0, "note": None},
    }
    # and the run is RUNNING under token 1, its lease sized to the function's timeout plus a margin
    after = deps.store.get_run(run.job_id, run.due_at)
    assert after is not None and (after.state, after.fencing_token) == (RunState.RUNNING, 1)
    assert after.lease_expires_at == clock.now() + timedelta(seconds=120 + LAMBDA_LEASE_MARGIN_SECONDS)
    assert after.deadline_at == clock.now() + timedelta(seconds=120)
    assert after.lease_owner is not None and after.lease_owner.startswith("dispatcher:")
    # and a later redelivery is dropped too
    deps.queues.send("lambda", RunMessage(job_id=run.job_id, due_at=run.due_at, attempt=1))
    assert _dispatch(dispatcher, _event(_received(deps))) == []
    assert len(invoker.calls) == 1


def _manual_run(deps: Deps, due_in: float, function: str) -> Run:
    """A PENDING manual run of a Lambda job of its own (due far later), due ``due_in`` s from the clock."""
    task = LambdaTask(function=function)
    job = jobs.create_job(
        CreateJobRequest(name="l", task=task, schedule=ScheduleSpec(expression="at(2030-01-01T00:00:00)")),
        tenant="local",
        deps=deps,
    )
    due = deps.clock.now() + timedelta(seconds=due_in)
    run = build_run(job, due, now=deps.clock.now(), watch_after_seconds=30, trigger=Trigger.MANUAL)
    deps.store.put_new_run(run)
    return run


def test_a_batch_is_dispatched_in_the_order_its_attempts_may_start(
    deps: Deps, dispatcher: ModuleType, invoker: FakeInvoker
) -> None:
    # Given one batch whose first record wakes a run due 0.6 s from now (its delay rounded down: early) and
    # whose second wakes a run due now
    later, now = _manual_run(deps, 0.6, "later"), _manual_run(deps, 0, "now")
    failed = _dispatch(dispatcher, _event([], message_for(later).body(), message_for(now).body()))
    # Then the run due now was not held behind the early one: it was invoked first
    assert failed == []
    assert [f for f, _ in invoker.calls] == ["now", "later"]


def test_a_record_far_too_early_goes_back_on_the_queue_until_it_may_be_held(
    deps: Deps, dispatcher: ModuleType, invoker: FakeInvoker, monkeypatch: pytest.MonkeyPatch
) -> None:
    extended: list[tuple[str, str, int]] = []
    real_extend = deps.queues.extend_visibility

    def extend(tier: str, receipt_handle: str, seconds: int) -> None:
        extended.append((tier, receipt_handle, seconds))
        real_extend(tier, receipt_handle, seconds)

    monkeypatch.setattr(deps.queues, "extend_visibility", extend)
    # Given a wake-up delivered a minute before its run is due (a clock far off), in a batch with one due now
    run, due = _manual_run(deps, 60, "early"), _manual_run(deps, 0, "due")
    deps.queues.send("lambda", message_for(run))
    deps.queues.send("lambda", message_for(due))
    messages = _received(deps)
    # When the dispatcher handles the batch
    failed = _dispatch(dispatcher, _event(messages))
    # Then the early one is not claimed nor invoked, its record fails (not deleted), invisible for the wait
    early_id = next(m["MessageId"] for m in messages if run.job_id in m["Body"])
    assert failed == [early_id]
    assert [f for f, _ in invoker.calls] == ["due"]
    assert deps.store.get_run(run.job_id, run.due_at).state is RunState.PENDING  # type: ignore[union-attr]
    early = next(m for m in messages if m["MessageId"] == early_id)
    assert extended == [("lambda", early["ReceiptHandle"], 60)]  # the clock does not move: 60 s exactly


def test_a_record_that_cannot_be_claimed_fails_alone_in_its_batch(
    deps: Deps, dispatcher: ModuleType, invoker: FakeInvoker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three runs due, and DynamoDB failing the claim of the second
    ok1, broken, ok2 = (_submit(deps, function=f"fn{i}") for i in range(3))
    real_start = deps.store.start

    def flaky_start(job_id: str, *args: Any, **kw: Any) -> Run:
        if job_id == broken.job_id:
            raise ClientError(
                {"Error": {"Code": "InternalServerError", "Message": "try again"}}, "UpdateItem"
            )
        return real_start(job_id, *args, **kw)

    monkeypatch.setattr(deps.store, "start", flaky_start)
    messages = _received(deps)
    # When one batch holds their messages and a body that is no run message
    failed = _dispatch(dispatcher, _event(messages, '{"not": "a run message"}'))
    # Then only the broken run's record and the malformed one are reported failed (they come back later)
    broken_id = next(m["MessageId"] for m in messages if broken.job_id in m["Body"])
    assert sorted(failed) == sorted([broken_id, "extra-0"])
    # and the two others were claimed and invoked
    assert sorted(f for f, _ in invoker.calls) == ["fn0", "fn2"]
    assert deps.store.get_run(ok1.job_id, ok1.due_at).state is RunState.RUNNING  # type: ignore[union-attr]
    assert deps.store.get_run(ok2.job_id, ok2.due_at).state is RunState.RUNNING  # type: ignore[union-attr]
    assert deps.store.get_run(broken.job_id, broken.due_at).state is RunState.PENDING  # type: ignore[union-attr]


def test_an_unknown_function_fails_the_attempt_with_lambdas_error_and_the_retry_policy_applies(
    deps: Deps, dispatcher: ModuleType, invoker: FakeInvoker, api: ModuleType
) -> None:
    # Given Lambda has no function "ghost"
    invoker.refuse["ghost"] = InvokeError(
        "ResourceNotFoundException: Function not found: arn:aws:lambda:us-east-1:1:function:ghost",
        "ResourceNotFoundException",
    )
    run = _submit(deps, function="ghost", retry=RetryPolicy(max_attempts=2, backoff_seconds=0))
    # When the dispatcher handles its message
    assert _dispatch(dispatcher, _event(_received(deps))) == []
    # Then attempt 1 FAILED with Lambda's error (not a batch failure: a redelivery could not start it again)
    after = deps.store.get_run(run.job_id, run.due_at)
    assert after is not None and after.state is RunState.RETRY_WAIT
    [attempt] = after.attempts
    assert (attempt.state, attempt.reason) == (RunState.FAILED, "invoke_failed")
    assert after.error is not None and "ResourceNotFoundException" in after.error
    # and the log says why, and the retry's wake-up is on the lambda queue
    status, text, _ = call(api, "GET", f"/runs/{run.run_id}/logs")
    assert status == 200 and "cannot invoke function ghost: ResourceNotFoundException" in text
    assert [m["attempt"] for m in drain(deps.settings.queue_url("lambda"))] == [2]


# ---- finish ------------------------------------------------------------------------------------------------
def _running(
    deps: Deps, dispatcher: ModuleType, invoker: FakeInvoker, **kw: Any
) -> tuple[Run, dict[str, Any]]:
    """A Lambda run dispatched: (its run, the envelope its function got)."""
    run = _submit(deps, **kw)
    assert _dispatch(dispatcher, _event(_received(deps))) == []
    return run, invoker.calls[-1][1]


def test_a_successful_function_succeeds_the_run_with_its_result_shown_by_the_api(
    deps: Deps, dispatcher: ModuleType, finisher: ModuleType, invoker: FakeInvoker, api: ModuleType
) -> None:
    run, envelope = _running(deps, dispatcher, invoker)
    # When the function's success record arrives (a function written with duetime.lambda_target)
    response = {"duetime": {"run_id": run.run_id, "attempt": 1, "fencing_token": 1}, "result": {"rows": 42}}
    assert _finish(finisher, _record(envelope, "Success", response)) == {
        "status": "applied",
        "run_id": run.run_id,
        "state": "SUCCEEDED",
    }
    # Then GET /runs/{id} shows it SUCCEEDED with the function's result
    status, body, _ = call(api, "GET", f"/runs/{run.run_id}")
    assert status == 200
    assert (body["state"], body["result"], body["result_truncated"], body["exit_code"]) == (
        "SUCCEEDED",
        {"rows": 42},
        False,
        None,
    )
    assert body["attempts"][0]["state"] == "SUCCEEDED"
    # and its log holds the result
    _, text, _ = call(api, "GET", f"/runs/{run.run_id}/logs")
    assert "Success -> SUCCEEDED" in text and '"rows": 42' in text
    # and a repeated record (Lambda retrying its destination) changes nothing
    assert _finish(finisher, _record(envelope, "Success", response))["status"] == "stale"


def test_a_failing_function_fails_the_attempt_and_its_retry_runs_as_attempt_two(
    deps: Deps, dispatcher: ModuleType, finisher: ModuleType, invoker: FakeInvoker, api: ModuleType
) -> None:
    run, envelope = _running(deps, dispatcher, invoker, retry=RetryPolicy(max_attempts=2, backoff_seconds=0))
    # When the function raised
    out = _finish(finisher, _record(envelope, "RetriesExhausted", _error("no such table"), "Unhandled"))
    # Then attempt 1 FAILED with the function's error, and the run waits for its retry
    assert (out["status"], out["state"]) == ("applied", "RETRY_WAIT")
    after = deps.store.get_run(run.job_id, run.due_at)
    assert after is not None and after.error == "ValueError: no such table"
    assert (after.attempts[0].state, after.attempts[0].reason) == (RunState.FAILED, "function_error")
    _, text, _ = call(api, "GET", f"/runs/{run.run_id}/logs", query={"attempt": "1"})
    assert "ValueError: no such table" in text and "report.py" in text
    # When the retry's wake-up reaches the dispatcher
    assert _dispatch(dispatcher, _event(_received(deps))) == []
    # Then the function is invoked again as attempt 2 under token 2, and a second failure dead-letters it
    second = invoker.calls[-1][1]
    assert (second["duetime"]["attempt"], second["duetime"]["fencing_token"]) == (2, 2)
    out = _finish(finisher, _record(second, "RetriesExhausted", _error("still no table"), "Unhandled"))
    final = deps.store.get_run(run.job_id, run.due_at)
    assert final is not None and (final.state, final.dead_lettered) == (RunState.FAILED, True)
    assert [a.state for a in final.attempts] == [RunState.FAILED, RunState.FAILED]


@pytest.mark.parametrize(
    ("action", "state", "timeout_action"),
    [("fail", RunState.TIMED_OUT, "fail"), ("retry", RunState.RETRY_WAIT, "retry")],
)
def test_a_function_past_its_timeout_is_timed_out_and_on_timeout_decides(
    deps: Deps,
    dispatcher: ModuleType,
    finisher: ModuleType,
    invoker: FakeInvoker,
    action: str,
    state: RunState,
    timeout_action: str,
) -> None:
    run, envelope = _running(
        deps, dispatcher, invoker, timeout_seconds=30, on_timeout=OnTimeout(action=action)
    )
    timeout = {"errorMessage": "2026-11-29T12:00:30.100Z req-1 Task timed out after 30.03 seconds"}
    _finish(finisher, _record(envelope, "RetriesExhausted", timeout, "Unhandled"))
    after = deps.store.get_run(run.job_id, run.due_at)
    assert after is not None and (after.state, after.timeout_action) == (state, timeout_action)
    assert (after.attempts[0].state, after.attempts[0].reason) == (RunState.TIMED_OUT, "timeout")
    assert after.error is not None and after.error.startswith("timed out after 30.03 s")


def test_a_stale_envelope_is_rejected_and_recorded_never_applied(
    deps: Deps, dispatcher: ModuleType, finisher: ModuleType, invoker: FakeInvoker
) -> None:
    # Given attempt 1 failed and attempt 2 is running under token 2
    run, first = _running(deps, dispatcher, invoker, retry=RetryPolicy(max_attempts=3, backoff_seconds=0))
    _finish(finisher, _record(first, "RetriesExhausted", _error("flaky"), "Unhandled"))
    assert _dispatch(dispatcher, _event(_received(deps))) == []
    # When a late success record of attempt 1 (token 1) arrives
    out = _finish(finisher, _record(first, "Success", {"late": True}))
    # Then it is rejected: the run is still RUNNING attempt 2, without a result, and the rejection recorded
    assert out == {"status": "stale", "run_id": run.run_id, "state": None}
    after = deps.store.get_run(run.job_id, run.due_at)
    assert after is not None
    assert (after.state, after.attempt, after.fencing_token, after.result) == (RunState.RUNNING, 2, 2, None)
    [event] = [e for e in after.events if e.kind == "stale_finish_rejected"]
    assert event.detail["fencing_token"] == 1


def test_a_run_whose_outcome_never_arrives_is_timed_out_by_the_sweeper_and_the_late_outcome_is_stale(
    deps: Deps, dispatcher: ModuleType, finisher: ModuleType, invoker: FakeInvoker, clock
) -> None:
    # Given a dispatched run whose destination record is lost
    run, envelope = _running(
        deps, dispatcher, invoker, timeout_seconds=30, on_timeout=OnTimeout(action="fail")
    )
    # When the sweeper looks after the deadline (plus the kill grace and a beat interval)
    clock.advance(30 + 10 + 10 + 1)
    assert sweep(run.shard, deps).timeouts_handled == 1
    # Then the attempt is TIMED_OUT (fenced), and the record that finally arrives is stale
    assert _finish(finisher, _record(envelope, "Success", "done"))["status"] == "stale"
    after = deps.store.get_run(run.job_id, run.due_at)
    assert after is not None and (after.state, after.result) == (RunState.TIMED_OUT, None)


def test_a_result_too_large_to_keep_is_only_in_the_log(
    deps: Deps, dispatcher: ModuleType, finisher: ModuleType, invoker: FakeInvoker, api: ModuleType
) -> None:
    run, envelope = _running(deps, dispatcher, invoker)
    big = {"blob": "x" * (MAX_RESULT_BYTES + 1)}
    _finish(finisher, _record(envelope, "Success", big))
    _, body, _ = call(api, "GET", f"/runs/{run.run_id}")
    assert (body["state"], body["result"], body["result_truncated"]) == ("SUCCEEDED", None, True)
    assert "x" * 1000 in call(api, "GET", f"/runs/{run.run_id}/logs")[1]


def test_a_result_with_text_that_is_no_valid_unicode_is_kept_with_it_replaced(
    deps: Deps, dispatcher: ModuleType, finisher: ModuleType, invoker: FakeInvoker, api: ModuleType
) -> None:
    run, envelope = _running(deps, dispatcher, invoker)
    assert _finish(finisher, _record(envelope, "Success", {"s": "a\ud800b"}))["state"] == "SUCCEEDED"
    assert call(api, "GET", f"/runs/{run.run_id}")[1]["result"] == {"s": "a?b"}


def test_a_record_that_is_no_duetime_envelope_is_ignored(finisher: ModuleType) -> None:
    assert _finish(finisher, _record({"hello": "world"}, "Success", 1))["status"] == "ignored"
    assert _finish(finisher, {"some": "event"})["status"] == "ignored"


# ---- the local Lambda runtime, in-process (the local stack runs the same pieces) ---------------------------
def test_the_local_lambda_runs_the_function_and_its_outcome_reaches_the_finish_handler(
    deps: Deps, dispatcher: ModuleType, finisher: ModuleType, api: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the local Lambda serving test functions, with the finish handler as their destination
    local = LocalLambda(
        {"echo": "tests.lambda_functions:echo", "fail": "tests.lambda_functions:fail"},
        destination=lambda record: _finish(finisher, record),
        logs=deps.logs,
        python_path=[Path(__file__).resolve().parents[2]],
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", local.serve())
    aws.reset_clients()  # the dispatcher's real boto3 invoker now reaches the local Lambda
    monkeypatch.setattr(dispatcher, "invoker", BotoLambdaInvoker())
    try:
        ok = _submit(deps, function="echo", payload={"word": "hi"})
        bad = _submit(deps, function="fail", retry=RetryPolicy(max_attempts=1))
        ghost = _submit(deps, function="ghost", retry=RetryPolicy(max_attempts=1))
        # When the dispatcher handles their messages
        assert _dispatch(dispatcher, _event(_received(deps))) == []
        runs = _wait_terminal(deps, [ok, bad, ghost])
    finally:
        local.stop()
    # Then the function saw its envelope and payload, and the run SUCCEEDED with its result and output
    assert runs[0].state is RunState.SUCCEEDED
    assert runs[0].result is not None and runs[0].result["payload"] == {"word": "hi"}  # type: ignore[index]
    assert (runs[0].result["run_id"], runs[0].result["fencing_token"]) == (ok.run_id, 1)  # type: ignore[index]
    text = call(api, "GET", f"/runs/{ok.run_id}/logs")[1]
    assert f"echo: run {ok.run_id} attempt 1 token 1 payload {{'word': 'hi'}}" in text
    assert text.startswith("START RequestId: ") and "REPORT RequestId: " in text
    # and the function that raised FAILED with its error and traceback in the log
    assert (runs[1].state, runs[1].error) == (RunState.FAILED, "ValueError: boom on attempt 1")
    assert "fail: attempt 1 is about to raise" in call(api, "GET", f"/runs/{bad.run_id}/logs")[1]
    # and the unregistered one FAILED with Lambda's ResourceNotFoundException, at once
    assert runs[2].state is RunState.FAILED
    assert runs[2].error is not None and "ResourceNotFoundException: Function not found" in runs[2].error


def _wait_terminal(deps: Deps, runs: list[Run], timeout: float = 20.0) -> list[Run]:
    deadline = time.monotonic() + timeout
    while True:
        now = [deps.store.get_run(r.job_id, r.due_at) for r in runs]
        if all(r is not None and r.state.terminal for r in now) or time.monotonic() > deadline:
            return [r for r in now if r is not None]
        time.sleep(0.1)
