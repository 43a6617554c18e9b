"""Timeouts and timeout handlers: worker-side enforcement and the Step Functions handler for stuck workers.

moto executes the state machine (config ``stepfunctions.execute_state_machine``) with its DynamoDB and SQS
integrations against the same mocked tables and queues.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.resources import ResourceNames
from duetime.adapters.aws.stepfunctions import create_state_machine
from duetime.config.deps import Deps, deps_from_settings
from duetime.domain.api_models import CreateJobRequest, UpdateJobRequest
from duetime.domain.clock import FixedClock
from duetime.domain.errors import LeaseLostError, RequestFieldError
from duetime.domain.models import ContainerTask, OnTimeout, RetryPolicy, RunState, ScheduleSpec, Trigger
from duetime.services import jobs, runs
from duetime.services.sessions import WorkerSession
from duetime.services.sweeper import sweep
from duetime.services.timeouts import execution_name, start_handler
from duetime.services.worker import Worker
from tests.conftest import T0, make_settings, moto_env
from tests.helpers import drain


@pytest.fixture
def sfn_deps(monkeypatch: pytest.MonkeyPatch) -> Iterator[Deps]:
    """moto with Step Functions executing, the timeout-handler state machine created, a fixed clock."""
    with moto_env(monkeypatch, {"stepfunctions": {"execute_state_machine": True}}):
        settings = make_settings(
            ResourceNames.for_prefix("t"),
            shard_count=1,
            heartbeat_seconds=5,
            kill_grace_seconds=10,
            timeout_state_machine_arn=create_state_machine("t-timeout-handler"),
        )
        yield deps_from_settings(settings, FixedClock(T0))


def _job(deps: Deps, command: list[str], *, name: str = "t", **kw) -> str:
    request = CreateJobRequest(name=name, task=ContainerTask(command=command), **kw)
    return jobs.create_job(request, tenant="t1", deps=deps).job_id


def _wait_execution(deps: Deps, name: str) -> dict:
    sfn = aws.client("stepfunctions")
    arn = deps.settings.timeout_state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"
    for _ in range(100):
        out = sfn.describe_execution(executionArn=arn)
        if out["status"] != "RUNNING":
            return out
        time.sleep(0.05)
    raise AssertionError(f"execution {name} still running")


def _stuck(deps: Deps, job_id: str, session: WorkerSession | None = None):
    """Start the job's run as a worker that then hangs (under ``session``, held by it, if given); move the
    clock past the handler's due time."""
    [pending] = deps.store.list_runs(job_id)
    drain(deps.settings.queue_url("small"))
    session_id = session.session_id if session is not None else None
    running = runs.start(runs.message_for(pending), deps, owner="stuck-worker", session_id=session_id)
    if session is not None:
        session.hold(running)
    assert running.deadline_at == T0 + timedelta(seconds=pending.timeout_seconds)
    deps.clock.advance(pending.timeout_seconds + pending.on_timeout.kill_grace_seconds + 5 + 0.001)
    return running


# ---- worker-side enforcement -----------------------------------------------------------------------------
def test_worker_timeout_with_fail_ends_timed_out_without_retry(sfn_deps: Deps) -> None:
    job_id = _job(
        sfn_deps,
        ["sh", "-c", "echo working; sleep 30"],
        timeout_seconds=1,
        on_timeout=OnTimeout(action="fail", kill_grace_seconds=1),
        retry=RetryPolicy(max_attempts=3),
    )
    Worker(sfn_deps, "small", owner="w").poll_once()
    [run] = sfn_deps.store.list_runs(job_id)
    assert (run.state, run.attempt, run.dead_lettered) == (RunState.TIMED_OUT, 1, False)
    assert (run.timeout_action, run.timeout_outcome) == ("fail", "failed, no retry")
    assert "working" in jobs.get_run_log(run.run_id, tenant="t1", deps=sfn_deps)
    assert drain(sfn_deps.settings.queue_url("small")) == []


def test_worker_timeout_with_retry_counts_as_a_failed_attempt(sfn_deps: Deps) -> None:
    job_id = _job(
        sfn_deps,
        ["sleep", "30"],
        timeout_seconds=1,
        on_timeout=OnTimeout(kill_grace_seconds=0),
        retry=RetryPolicy(max_attempts=2, backoff_seconds=5, jitter="none"),
    )
    Worker(sfn_deps, "small", owner="w").poll_once()
    [run] = sfn_deps.store.list_runs(job_id)
    assert (run.state, run.attempts[0].state) == (RunState.RETRY_WAIT, RunState.TIMED_OUT)
    assert run.retry_at == T0 + timedelta(seconds=5)
    assert run.timeout_outcome == "attempt 2 after a 5.0 s backoff"


def test_worker_timeout_with_trigger_starts_the_other_job_with_the_run_id(sfn_deps: Deps) -> None:
    # Given job B, and job A whose timeout triggers B
    b = _job(sfn_deps, ["sh", "-c", "echo triggered by $DUETIME_TRIGGERED_BY"], name="b")
    drain(sfn_deps.settings.queue_url("small"))
    Worker(sfn_deps, "small", owner="w").poll_once()  # nothing: B's own run-now message was drained
    a = _job(
        sfn_deps,
        ["sleep", "30"],
        timeout_seconds=1,
        on_timeout=OnTimeout(action="trigger", job_id=b, kill_grace_seconds=0),
    )
    worker = Worker(sfn_deps, "small", owner="w")
    worker.poll_once()
    [timed_out] = sfn_deps.store.list_runs(a)
    assert (timed_out.state, timed_out.timeout_outcome) == (RunState.TIMED_OUT, f"triggered job {b}")
    # Then B has a run triggered by the timeout handler, due at A's deadline (the fixed clock is moved
    # there: it stood still while the task ran), and it runs with DUETIME_TRIGGERED_BY
    assert timed_out.deadline_at is not None
    sfn_deps.clock.set(timed_out.deadline_at)  # type: ignore[attr-defined]
    worker.poll_once()
    triggered = [r for r in sfn_deps.store.list_runs(b) if r.trigger is Trigger.TIMEOUT_HANDLER]
    assert len(triggered) == 1 and triggered[0].triggered_by == timed_out.run_id
    assert triggered[0].state is RunState.SUCCEEDED
    log = jobs.get_run_log(triggered[0].run_id, tenant="t1", deps=sfn_deps)
    assert log.strip() == f"triggered by {timed_out.run_id}"


def test_a_trigger_must_name_an_existing_job_of_the_same_tenant(sfn_deps: Deps) -> None:
    with pytest.raises(RequestFieldError) as err:
        _job(sfn_deps, ["true"], on_timeout=OnTimeout(action="trigger", job_id="job-nope"))
    assert err.value.field == "on_timeout.job_id"
    other = jobs.create_job(
        CreateJobRequest(name="x", task=ContainerTask(command=["true"])), tenant="other", deps=sfn_deps
    )
    with pytest.raises(RequestFieldError):
        _job(sfn_deps, ["true"], on_timeout=OnTimeout(action="trigger", job_id=other.job_id))


# ---- the state machine, for a stuck worker ---------------------------------------------------------------
def test_a_stuck_worker_is_fenced_by_the_state_machine_and_its_finish_rejected(sfn_deps: Deps) -> None:
    job_id = _job(
        sfn_deps,
        ["sleep", "300"],
        timeout_seconds=3,
        on_timeout=OnTimeout(action="fail", kill_grace_seconds=2),
    )
    session = WorkerSession(sfn_deps, "stuck-worker", monotonic=lambda: sfn_deps.clock.now().timestamp())
    running = _stuck(sfn_deps, job_id, session)
    # When the sweeper sees the run past its deadline
    result = sweep(running.shard, sfn_deps)
    assert result.timeouts_handled == 1
    execution = _wait_execution(sfn_deps, execution_name(running))
    # Then the execution succeeded, the run is TIMED_OUT with the token bumped, the execution named on it
    assert execution["status"] == "SUCCEEDED", execution
    [run] = sfn_deps.store.list_runs(job_id)
    assert (run.state, run.fencing_token, run.timeout_execution) == (
        RunState.TIMED_OUT,
        running.fencing_token + 1,
        execution_name(running),
    )
    assert run.attempts[0].reason == "timeout_handler" and run.watch_at is None
    # And the stuck worker, waking up, finds the run fenced at its session's beat and is rejected on finish
    session.beat()
    lost = session.lost(running.run_id)
    assert lost is not None and lost.why == "fencing token superseded" and lost.cancelled is None
    with pytest.raises(LeaseLostError):
        runs.finish(
            running, sfn_deps, fencing_token=running.fencing_token, outcome=RunState.SUCCEEDED, exit_code=0
        )
    assert sfn_deps.store.list_runs(job_id)[0].state is RunState.TIMED_OUT


def test_a_second_handler_start_for_the_same_attempt_is_a_no_op(sfn_deps: Deps) -> None:
    job_id = _job(sfn_deps, ["sleep", "300"], timeout_seconds=3, on_timeout=OnTimeout(action="fail"))
    running = _stuck(sfn_deps, job_id)
    start_handler(running, sfn_deps)
    start_handler(running, sfn_deps)
    _wait_execution(sfn_deps, execution_name(running))
    executions = aws.client("stepfunctions").list_executions(
        stateMachineArn=sfn_deps.settings.timeout_state_machine_arn
    )["executions"]
    assert len(executions) == 1
    assert sweep(running.shard, sfn_deps).timeouts_handled == 0  # terminal: out of the watchdog index


def test_the_state_machine_retry_action_requeues_the_next_attempt(sfn_deps: Deps) -> None:
    job_id = _job(
        sfn_deps,
        ["sleep", "300"],
        timeout_seconds=3,
        retry=RetryPolicy(max_attempts=2, backoff_seconds=0, jitter="none"),
    )
    running = _stuck(sfn_deps, job_id)
    sweep(running.shard, sfn_deps)
    assert _wait_execution(sfn_deps, execution_name(running))["status"] == "SUCCEEDED"
    [run] = sfn_deps.store.list_runs(job_id)
    assert run.state is RunState.RETRY_WAIT
    [message] = drain(sfn_deps.settings.queue_url("small"))
    assert message["attempt"] == 2
    sfn_deps.queues.send("small", runs.RunMessage.model_validate(message))  # put the wake-up back
    Worker(sfn_deps, "small", owner="w2").poll_once()  # sleep 300 with a 3 s timeout: times out again
    [run] = sfn_deps.store.list_runs(job_id)
    assert (run.state, run.attempt, run.dead_lettered) == (RunState.TIMED_OUT, 2, True)


def test_the_state_machine_trigger_action_creates_the_other_jobs_run(sfn_deps: Deps) -> None:
    b = _job(sfn_deps, ["true"], name="b")
    a = _job(sfn_deps, ["sleep", "300"], timeout_seconds=3, on_timeout=OnTimeout(action="trigger", job_id=b))
    running = _stuck(sfn_deps, a)
    sweep(running.shard, sfn_deps)
    assert _wait_execution(sfn_deps, execution_name(running))["status"] == "SUCCEEDED"
    triggered = [r for r in sfn_deps.store.list_runs(b) if r.trigger is Trigger.TIMEOUT_HANDLER]
    assert [r.triggered_by for r in triggered] == [running.run_id]
    bodies = [json.dumps(m) for m in drain(sfn_deps.settings.queue_url("small"))]
    assert any(triggered[0].due_at.strftime("%Y-%m-%dT%H:%M:%S") in body for body in bodies)


@pytest.mark.parametrize("first", ["worker", "handler"])
def test_a_run_finishing_exactly_at_its_deadline_has_one_outcome(sfn_deps: Deps, first: str) -> None:
    job_id = _job(sfn_deps, ["sleep", "300"], timeout_seconds=3, on_timeout=OnTimeout(action="fail"))
    running = _stuck(sfn_deps, job_id)
    finish = lambda: runs.finish(  # noqa: E731
        running, sfn_deps, fencing_token=running.fencing_token, outcome=RunState.SUCCEEDED, exit_code=0
    )
    if first == "worker":
        finish()
        start_handler(running, sfn_deps)
        assert _wait_execution(sfn_deps, execution_name(running))["status"] == "SUCCEEDED"
        expected = RunState.SUCCEEDED
    else:
        start_handler(running, sfn_deps)
        _wait_execution(sfn_deps, execution_name(running))
        with pytest.raises(LeaseLostError):
            finish()
        expected = RunState.TIMED_OUT
    [run] = sfn_deps.store.list_runs(job_id)
    assert run.state is expected and len(run.attempts) == 1


# ---- what follows a timeout: the same actions on every path (issue: job actions govern claimed runs) -----
def test_on_timeout_trigger_never_runs_a_deleted_job(sfn_deps: Deps) -> None:
    # Given job B, deleted after job A named it as its timeout's trigger
    b = _job(sfn_deps, ["true"], name="b")
    drain(sfn_deps.settings.queue_url("small"))
    a = _job(
        sfn_deps,
        ["sleep", "30"],
        timeout_seconds=1,
        on_timeout=OnTimeout(action="trigger", job_id=b, kill_grace_seconds=0),
    )
    jobs.delete_job(b, tenant="t1", deps=sfn_deps)
    # When A times out on its worker
    Worker(sfn_deps, "small", owner="w").poll_once()
    # Then A is TIMED_OUT and B got no run (as a manual trigger of a deleted job is refused)
    [timed_out] = sfn_deps.store.list_runs(a)
    assert timed_out.state is RunState.TIMED_OUT
    assert [r for r in sfn_deps.store.list_runs(b) if r.trigger is Trigger.TIMEOUT_HANDLER] == []


def test_the_state_machine_never_triggers_a_deleted_job(sfn_deps: Deps) -> None:
    b = _job(sfn_deps, ["true"], name="b")
    a = _job(sfn_deps, ["sleep", "300"], timeout_seconds=3, on_timeout=OnTimeout(action="trigger", job_id=b))
    jobs.delete_job(b, tenant="t1", deps=sfn_deps)
    running = _stuck(sfn_deps, a)
    sweep(running.shard, sfn_deps)
    assert _wait_execution(sfn_deps, execution_name(running))["status"] == "SUCCEEDED"
    assert [r for r in sfn_deps.store.list_runs(b) if r.trigger is Trigger.TIMEOUT_HANDLER] == []


def _metric_names(out: str) -> list[str]:
    names = []
    for line in out.splitlines():
        if line.startswith('{"_aws"'):
            doc = json.loads(line)
            names += [m["Name"] for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]]
    return names


def test_a_run_dead_lettered_by_the_timeout_handler_counts_as_dead_lettered(sfn_deps: Deps, capsys) -> None:
    # Given a stuck worker on the last attempt of a run whose timeout is retried
    job_id = _job(sfn_deps, ["sleep", "300"], timeout_seconds=3, retry=RetryPolicy(max_attempts=1))
    running = _stuck(sfn_deps, job_id)
    capsys.readouterr()
    # When the handler fences it
    sweep(running.shard, sfn_deps)
    assert _wait_execution(sfn_deps, execution_name(running))["status"] == "SUCCEEDED"
    # Then the run is dead-lettered and both metrics were published (the dead-letter alarm sees it)
    [run] = sfn_deps.store.list_runs(job_id)
    assert (run.state, run.dead_lettered) == (RunState.TIMED_OUT, True)
    names = _metric_names(capsys.readouterr().out)
    assert "RunTimedOut" in names and "RunDeadLettered" in names


def test_the_timeout_handler_wakes_the_overlap_successor_at_once(sfn_deps: Deps) -> None:
    from duetime.domain.models import OverlapPolicy, ScheduleSpec

    # Given a buffer_one job whose run 1 is stuck and whose run 2 waits behind it
    request = CreateJobRequest(
        name="o",
        schedule=ScheduleSpec(expression="rate(1 minute)"),
        task=ContainerTask(command=["sleep", "300"]),
        timeout_seconds=3,
        on_timeout=OnTimeout(action="fail", kill_grace_seconds=2),
        overlap=OverlapPolicy(policy="buffer_one"),
    )
    job = jobs.create_job(request, tenant="t1", deps=sfn_deps)
    [first] = sfn_deps.store.list_runs(job.job_id)
    sfn_deps.clock.advance(60)
    drain(sfn_deps.settings.queue_url("small"))
    running = runs.start(runs.message_for(first), sfn_deps, owner="stuck-worker")
    from duetime.services import claims

    claims.tick(job.shard, sfn_deps)
    waiting = sorted(sfn_deps.store.list_runs(job.job_id), key=lambda r: r.due_at)[1]
    with pytest.raises(runs.NotStartedError):
        runs.start(runs.message_for(waiting), sfn_deps, owner="w2")
    drain(sfn_deps.settings.queue_url("small"))
    # When the handler fences the stuck run 1
    sfn_deps.clock.advance(3 + 2 + 5 + 0.001)
    start_handler(running, sfn_deps)
    assert _wait_execution(sfn_deps, execution_name(running))["status"] == "SUCCEEDED"
    # Then run 2's wake-up is on the queue at once, not left for the sweeper
    woken = [m for m in drain(sfn_deps.settings.queue_url("small")) if m["attempt"] == 1]
    assert [m["due_at"] for m in woken] == [
        waiting.run_id and runs.message_for(waiting).model_dump(mode="json")["due_at"]
    ]


def test_a_run_timed_out_with_on_timeout_fail_can_be_redriven(sfn_deps: Deps) -> None:
    job_id = _job(
        sfn_deps,
        ["sleep", "30"],
        timeout_seconds=1,
        on_timeout=OnTimeout(action="fail", kill_grace_seconds=0),
        retry=RetryPolicy(max_attempts=2),
    )
    Worker(sfn_deps, "small", owner="w").poll_once()
    [run] = sfn_deps.store.list_runs(job_id)
    assert run.state is RunState.TIMED_OUT and not run.dead_lettered
    redriven = jobs.redrive(run.run_id, tenant="t1", deps=sfn_deps)
    assert (redriven.state, redriven.attempt, redriven.max_attempts) == (RunState.PENDING, 2, 3)
    assert redriven.timeout_outcome is None


def test_a_job_cannot_trigger_itself_on_its_timeout_at_submit_or_in_a_patch(sfn_deps: Deps) -> None:
    with pytest.raises(RequestFieldError) as err:
        _job(sfn_deps, ["true"], job_id="loop", on_timeout=OnTimeout(action="trigger", job_id="loop"))
    assert err.value.field == "on_timeout.job_id" and "itself" in str(err.value)
    assert sfn_deps.store.get_job("loop") is None  # nothing stored
    job_id = _job(sfn_deps, ["true"], schedule=ScheduleSpec(expression="rate(1 hour)"))
    with pytest.raises(RequestFieldError) as err:
        jobs.update_job(
            job_id,
            UpdateJobRequest.model_validate({"on_timeout": {"action": "trigger", "job_id": job_id}}),
            tenant="t1",
            deps=sfn_deps,
        )
    assert err.value.field == "on_timeout.job_id"
    stored = sfn_deps.store.get_job(job_id)
    assert stored is not None and stored.on_timeout.action != "trigger"
