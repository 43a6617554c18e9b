"""An ended run's DynamoDB row stays under 1 KB (one write unit per write, not two): an attempt's own log key,
derived from the run's id and the attempt, is left out of the row and derived on read (as every earlier
reader does for an attempt without a key); any other key (a log pack's, a row an older version wrote) is
stored as it is, and an attempt that printed nothing has no key."""

from __future__ import annotations

from datetime import timedelta

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.dynamodb import deserialize, run_from_item, serialize
from duetime.config.deps import Deps
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.lifecycle import build_run
from duetime.domain.logs import log_key
from duetime.domain.models import AttemptRecord, ContainerTask, RunState, ScheduleSpec, Trigger
from duetime.local.callcount import WRITE_UNIT_BYTES, item_size
from duetime.services import jobs
from duetime.services.worker import Worker

#: a worker id as long as one on Fargate (``<hostname>:<pid>:<random>``)
FARGATE_WORKER = "ip-10-0-101-123.us-east-1.compute.internal:12345:a1b2c3"


def _raw(deps: Deps, job_id: str, due_at: object) -> dict:
    key = serialize({"job_id": job_id, "due_at": due_at})
    return aws.client("dynamodb").get_item(TableName=deps.settings.runs_table, Key=key)["Item"]


def test_an_ended_runs_own_log_keys_are_left_out_of_its_row_and_read_back_whole(deps: Deps) -> None:
    # Given a run-now job with a retry policy and a timeout of its own, run to its end by a worker
    job = jobs.create_job(
        CreateJobRequest(
            name="nightly-report-for-tenant-acme",
            task=ContainerTask(command=["sh", "-c", "echo hello from the report"]),
            timeout_seconds=900,
        ),
        tenant="t1",
        deps=deps,
    )
    Worker(deps, "small", owner=FARGATE_WORKER).poll_once()
    [run] = deps.store.list_runs(job.job_id)
    assert run.state is RunState.SUCCEEDED
    # Then the run and its attempt name the attempt's own log key, and the log reads back
    own = log_key(run.job_id, run.run_id, 1)
    assert run.log_key == own and run.attempts[0].log_key == own
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps).strip() == "hello from the report"
    # and the row leaves them out, and is under one write unit
    raw = _raw(deps, run.job_id, run.due_at)
    assert "log_key" not in raw
    assert "log_key" not in raw["attempts"]["L"][0]["M"]
    assert item_size(raw) < WRITE_UNIT_BYTES, item_size(raw)
    assert run_from_item(deserialize(raw)) == run


def test_a_log_key_that_is_not_the_attempts_own_is_stored_as_it_is(deps: Deps) -> None:
    job = jobs.create_job(
        CreateJobRequest(
            name="later",
            task=ContainerTask(command=["true"]),
            schedule=ScheduleSpec(expression="at(2030-01-01T00:00:00)"),
        ),
        tenant="t1",
        deps=deps,
    )
    due = deps.clock.now() + timedelta(seconds=5)
    run = build_run(job, due, now=deps.clock.now(), watch_after_seconds=30, trigger=Trigger.MANUAL)
    packed = run.model_copy(update={"log_key": "logs/packs/2026-12-01/w1-0001.log"})
    deps.store.put_new_run(packed)
    raw = _raw(deps, run.job_id, run.due_at)
    assert raw["log_key"] == {"S": "logs/packs/2026-12-01/w1-0001.log"}
    assert deps.store.get_run(run.job_id, run.due_at).log_key == "logs/packs/2026-12-01/w1-0001.log"  # type: ignore[union-attr]


def test_an_attempt_without_a_log_key_reads_back_without_one(deps: Deps) -> None:
    # Given a cancelled run whose attempt record has no log key (the cancel wrote it)
    job = jobs.create_job(
        CreateJobRequest(name="c", task=ContainerTask(command=["sleep", "30"])), tenant="t1", deps=deps
    )
    [run] = deps.store.list_runs(job.job_id)
    started = deps.store.start(
        run.job_id,
        run.due_at,
        attempt=1,
        owner="w1",
        lease_expires_at=deps.clock.now() + timedelta(seconds=30),
        now=deps.clock.now(),
    )
    record = AttemptRecord(attempt=1, fencing_token=started.fencing_token, state=RunState.CANCELLED)
    cancelled = deps.store.cancel(started, reason="by test", now=deps.clock.now(), record=record)
    assert cancelled is not None
    # Then it is stored as an explicit null (not left out, which means "its own key") and reads as None
    raw = _raw(deps, run.job_id, run.due_at)
    assert raw["attempts"]["L"][0]["M"]["log_key"] == {"NULL": True}
    assert deps.store.get_run(run.job_id, run.due_at).attempts == [record]  # type: ignore[union-attr]
