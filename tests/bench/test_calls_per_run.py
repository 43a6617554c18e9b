"""The AWS calls one run costs, counted through botocore's hooks (duetime.local.callcount), asserted exactly.

A change that adds a call or a write unit to a run's path fails here: update the figures on purpose, with the
README's Performance section, or remove the extra call. Derived from the code (DESIGN.md sections 4 and 5):
- submit of a job its first claim completes (run-now, a one-off due within the lookahead): PutItem run
  (+ watchdog GSI, keys only), PutItem job already COMPLETED (+ by_tenant; never in the due GSI),
  SendMessageBatch;
- submit of any other job: PutItem job (+ due and by_tenant GSI entries); the tick's claim: PutItem run
  (+ watchdog GSI), UpdateItem job (advance next_fire_at: the due GSI entry moves or leaves; by_tenant only
  when the state changes), SendMessageBatch (one request per 10 messages);
- worker: ReceiveMessage, BatchGetItem of the poll's jobs, UpdateItem run (start: the watch time stays, no
  watchdog write), DeleteMessageBatch (at the start: the run row and the worker session hold the run from
  then on), PutObject log (none for an empty one), UpdateItem run (finish: leaves the watchdog GSI); a
  retry whose backoff ends within MAX_HOLD_SECONDS is started by the same worker from the same delivery
  (two more UpdateItems, no SQS request);
- worker session (per worker, not per run): while it holds runs, one BatchGetItem of them every heartbeat
  interval, and one UpdateItem (1 WRU) once one of them has run longer than its own lease less two
  intervals, whatever their number (a worker running only short tasks writes none);
- sweeper with nothing overdue: one empty watchdog Query per shard, nothing per run.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.resources import DUE_KEYS_PER_SHARD, WATCH_KEYS_PER_SHARD
from duetime.config.deps import Deps
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.clock import FixedClock
from duetime.domain.lifecycle import message_for
from duetime.domain.models import ContainerTask, JobState, RetryPolicy, Run, RunState, ScheduleSpec
from duetime.local import callcount
from duetime.services import claims, jobs
from duetime.services.runs import start_many
from duetime.services.sessions import WorkerSession
from duetime.services.sweeper import sweep
from duetime.services.worker import Worker
from tests.helpers import running_worker, wait_for


class Counted:
    """Reads the call records written since the last :meth:`take`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.seen = 0

    def take(self) -> list[dict[str, Any]]:
        callcount.flush()
        lines = [
            line
            for path in sorted(self.directory.glob("calls-*.jsonl"))
            for line in path.read_text().splitlines()
        ]
        new, self.seen = lines[self.seen :], len(lines)
        return [json.loads(line) for line in new]


@pytest.fixture
def counted(deps: Deps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    """Every client that ``duetime.adapters.aws.clients.client`` creates from here on counts its calls into
    ``tmp_path``, as in a process of the local stack started with ``DUETIME_CALL_COUNT_DIR`` set."""
    monkeypatch.setenv(callcount.ENV_VAR, str(tmp_path))
    aws.reset_clients()
    callcount.reset()
    assert callcount.install_from_env()
    yield Counted(tmp_path)
    callcount.uninstall()
    callcount.reset()
    aws.reset_clients()


def ops(records: list[dict[str, Any]]) -> Counter[str]:
    """``{"dynamodb PutItem test-runs": 1, ...}``"""
    return Counter(
        f"{r['svc']} {r['op']} {r.get('table') or r.get('queue') or r.get('bucket') or ''}".strip()
        for r in records
    )


def wru(records: list[dict[str, Any]]) -> int:
    return sum(int(r.get("wru") or 0) for r in records)


def rru(records: list[dict[str, Any]]) -> float:
    return sum(float(r.get("rru") or 0) for r in records)


def _submit(deps: Deps, **kw: Any) -> Any:
    request = CreateJobRequest(name="bench", task=ContainerTask(command=["true"]), **kw)
    return jobs.create_job(request, tenant="t1", deps=deps)


WORKER_CALLS = {
    "sqs ReceiveMessage test-small": 1,
    # a first attempt re-checks its job at start (deleted, paused, schedule changed, missed): one read of
    # the jobs of the whole poll
    "dynamodb BatchGetItem": 1,
    "dynamodb UpdateItem test-runs": 2,
    # `true` prints nothing: no log object (the attempt records log_bytes 0)
    "sqs DeleteMessageBatch test-small": 1,
}
# start: 1 table write (the watch time stays: the KEYS_ONLY watchdog is not written); finish: 1 table write
# + leaving the watchdog GSI
WORKER_WRU = 1 + 2
# the job, read strongly consistent (one 4 KB unit)
WORKER_RRU = 1


def test_a_run_now_job_costs_five_calls_to_submit_and_five_to_run(deps: Deps, counted: Counted) -> None:
    # When a run-now job is submitted (the API claims it itself) and a worker runs it
    job = _submit(deps)
    submit = counted.take()
    Worker(deps, "small").poll_once()
    work = counted.take()

    # Then the submit is: the tenant's submit-rate counter, the run, the job stored already claimed, the
    # message (a run-now job never counts against the active-jobs quota: it completes at once)
    assert ops(submit) == {
        "dynamodb UpdateItem test-idempotency": 1,
        "dynamodb PutItem test-runs": 1,
        "dynamodb PutItem test-jobs": 1,
        "sqs SendMessageBatch test-small": 1,
    }
    # rate counter: 1; put run: table + watchdog; put job (COMPLETED, no next fire): table + by_tenant, no
    # due-index entry and no advance (was 1, 3, 2, 3: the job entered the due index and left it at once)
    assert [r["wru"] for r in submit if r["svc"] == "dynamodb"] == [1, 2, 2]
    assert job.state is JobState.COMPLETED and job.next_fire_at is None
    assert rru(submit) == 0
    # and the worker's run is five calls, one of them the job's read
    assert ops(work) == WORKER_CALLS
    assert wru(work) == WORKER_WRU and rru(work) == WORKER_RRU
    [run] = deps.store.list_runs(job.job_id)
    assert run.state is RunState.SUCCEEDED


def test_a_scheduled_run_costs_the_tick_three_calls_beyond_its_fixed_cost(
    deps: Deps, clock: FixedClock, counted: Counted
) -> None:
    # Given a rate(5 minutes) job, submitted (not claimed: its first fire is beyond the lookahead)
    job = _submit(deps, job_id="sched", schedule=ScheduleSpec(expression="rate(5 minutes)"))
    submit = counted.take()
    # the tenant's submit-rate counter, its active-jobs counter, and the job
    assert ops(submit) == {
        "dynamodb UpdateItem test-idempotency": 1,
        "dynamodb UpdateItem test-jobs": 1,
        "dynamodb PutItem test-jobs": 1,
    }
    assert wru(submit) == 1 + 1 + 3

    # When the clock reaches its first fire and both shards tick: the other shard has nothing due
    clock.advance(300)
    other = 1 - job.shard
    claims.tick(other, deps)
    fixed = counted.take()
    result = claims.tick(job.shard, deps)
    ticked = counted.take()
    assert result.claimed == 1

    # Then a tick with nothing due costs one empty Query per due key of its shard and one of the legacy key
    # (rows written before the spread), and nothing else: no shard lease taken, nothing written
    assert ops(fixed) == {"dynamodb Query test-jobs": DUE_KEYS_PER_SHARD + 1}
    assert [r["items"] for r in fixed if r["op"] == "Query"] == [0] * (DUE_KEYS_PER_SHARD + 1)
    assert wru(fixed) == 0
    # and a tick with a due job takes and releases the shard's lease (2 UpdateItems, 1 write unit each, once
    # per tick whatever it claims), and the due job adds exactly: PutItem run, UpdateItem job (advance),
    # SendMessageBatch, and its bytes in its key's Query page
    per_tick = Counter({"dynamodb UpdateItem test-jobs": 2})
    per_run = ops(ticked) - ops(fixed) - per_tick
    assert per_run == {
        "dynamodb PutItem test-runs": 1,
        "dynamodb UpdateItem test-jobs": 1,
        "sqs SendMessageBatch test-small": 1,
    }
    assert sorted(r["items"] for r in ticked if r["op"] == "Query") == [0] * DUE_KEYS_PER_SHARD + [1]
    # put run: table + watchdog; advance (next_fire_at moves): table + due delete + due put; by_tenant
    # projects only state and name, so a claim never writes it
    assert wru(ticked) - wru(fixed) == 2 + 3 + 2

    # And the worker's run is the same six calls as a run-now job's
    Worker(deps, "small").poll_once()
    work = counted.take()
    assert ops(work) == WORKER_CALLS and wru(work) == WORKER_WRU

    # And a sweep with nothing overdue costs one empty watchdog Query per shard, nothing per run
    for shard in range(deps.settings.shard_count):
        sweep(shard, deps)
    swept = counted.take()
    assert ops(swept) == {"dynamodb Query test-runs": deps.settings.shard_count * WATCH_KEYS_PER_SHARD}
    assert all(r["items"] == 0 for r in swept)


def test_a_failing_once_run_retried_by_its_worker_costs_no_sqs_request_for_the_retry(
    deps: Deps, counted: Counted
) -> None:
    # Given a run-now job that fails its first attempt, with no backoff, submitted
    request = CreateJobRequest(
        name="bench",
        task=ContainerTask(command=["sh", "-c", 'test "$DUETIME_ATTEMPT" -ge 2']),
        retry=RetryPolicy(max_attempts=3, backoff_seconds=0, jitter="none"),
    )
    job = jobs.create_job(request, tenant="t1", deps=deps)
    counted.take()
    # When a worker's receive loop runs it to its end (and stops)
    worker = Worker(deps, "small", owner="w1", slots=2)
    with running_worker(worker):
        wait_for(
            "the run to succeed", lambda: deps.store.list_runs(job.job_id)[0].state is RunState.SUCCEEDED
        )
    work = [r for r in counted.take() if not (r["op"] == "ReceiveMessage" and not r.get("messages"))]
    # Then both attempts came from one delivery: one receive and one delete, no message sent for the retry
    # (was a SendMessage, a second receive and a second delete); the run's row: two starts and two ends
    calls = ops(work)
    assert {k: v for k, v in calls.items() if k.startswith("sqs")} == {
        "sqs ReceiveMessage test-small": 1,
        "sqs DeleteMessageBatch test-small": 1,
    }
    assert calls["dynamodb UpdateItem test-runs"] == 4
    [run] = deps.store.list_runs(job.job_id)
    assert [(a.attempt, a.state) for a in run.attempts] == [(1, RunState.FAILED), (2, RunState.SUCCEEDED)]


def test_a_worker_session_renews_every_run_it_holds_with_one_write_and_one_read(
    deps: Deps, clock: FixedClock, counted: Counted
) -> None:
    # Given a worker session holding three RUNNING runs (long tasks: started, not ended)
    made = [_submit(deps, job_id=f"long-{i}") for i in range(3)]
    session = WorkerSession(deps, "w1", monotonic=lambda: clock.now().timestamp())
    messages = [message_for(run) for job in made for run in deps.store.list_runs(job.job_id)]
    counted.take()
    started = [
        r for r in start_many(messages, deps, owner="w1", session_id=session.session_id) if isinstance(r, Run)
    ]
    assert len(started) == 3 and all(r.session_id == session.session_id for r in started)
    for run in started:
        session.hold(run)
    counted.take()
    # When the first heartbeat interval passes: the runs' own leases (30 s) last two more beats, so the
    # beat only reads them (for cancels and fences)
    clock.advance(deps.settings.heartbeat_seconds)
    assert session.due()
    session.beat()
    assert ops(counted.take()) == {"dynamodb BatchGetItem": 1}
    # And at the next one their leases end within two beats: one UpdateItem (1 WRU: the session item is
    # under 1 KB) renews all three, not a write per run; a 60 s run's row is written as often as a 1 s run's
    clock.advance(deps.settings.heartbeat_seconds + 0.5)
    session.beat()
    beat = counted.take()
    assert ops(beat) == {"dynamodb UpdateItem test-runs": 1, "dynamodb BatchGetItem": 1}
    assert wru(beat) == 1
    assert session.renewals == 1
    assert all(session.lost(run.run_id) is None for run in started)
    [stored] = deps.store.get_sessions([session.session_id]).values()
    assert sorted(stored.runs) == sorted(run.run_id for run in started)


def test_a_tick_sends_its_claims_messages_ten_to_a_batch_request(
    deps: Deps, clock: FixedClock, counted: Counted
) -> None:
    # Given jobs due at their first fire, more than 20 of them on one shard
    made = [
        _submit(deps, job_id=f"batch-{i:02d}", schedule=ScheduleSpec(expression="rate(5 minutes)"))
        for i in range(60)
    ]
    shard = made[0].shard
    mine = sum(j.shard == shard for j in made)
    assert mine > 20
    counted.take()
    clock.advance(300)
    # When the shard ticks (batches of 10: SendMessageBatch's limit)
    assert claims.tick(shard, deps).claimed == mine
    ticked = counted.take()
    # Then each job costs its PutItem and UpdateItem, and the messages one SQS request per 10, not one each
    calls = ops(ticked)
    # (the two more UpdateItems on the jobs table take and release the shard's lease)
    assert calls["dynamodb PutItem test-runs"] == mine and calls["dynamodb UpdateItem test-jobs"] == mine + 2
    assert "sqs SendMessage test-small" not in calls
    sends = [r for r in ticked if r["op"] == "SendMessageBatch"]
    assert sorted(r["messages"] for r in sends) == sorted(
        [10] * (mine // 10) + ([mine % 10] if mine % 10 else [])
    )
    assert sum(r["requests"] for r in sends) == -(-mine // 10)


def test_a_second_install_replaces_the_first(deps: Deps, counted: Counted) -> None:
    assert callcount.install_from_env()
    aws.reset_clients()
    aws.client("sqs").list_queues()
    assert ops(counted.take()) == {"sqs ListQueues": 1}


def test_counting_is_off_without_the_environment_variable(
    deps: Deps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(callcount.ENV_VAR, raising=False)
    assert not callcount.install_from_env()
    aws.reset_clients()
    _submit(deps)
    assert not hasattr(aws.client("dynamodb").meta, "duetime_callcount")
    assert list(tmp_path.glob("calls-*.jsonl")) == []


def _succeeded(deps: Deps, job_id: str) -> bool:
    return deps.store.list_runs(job_id)[0].state is RunState.SUCCEEDED


def test_runs_a_lingering_worker_ends_seconds_apart_cost_one_log_put_between_them(
    deps: Deps, counted: Counted
) -> None:
    # Given a worker lingering 6 s over its log packs (the AWS stages' way, with a shorter linger)
    lingering = replace(deps, settings=deps.settings.model_copy(update={"log_pack_linger_seconds": 6.0}))
    worker = Worker(lingering, "small", owner="w1", slots=2)
    seen: list[dict[str, Any]] = []

    def log_puts() -> int:
        seen.extend(counted.take())
        return sum(n for op, n in ops(seen).items() if op.startswith("s3 PutObject"))

    with running_worker(worker):
        # When three printing run-now jobs are submitted one after the other, each once the last succeeded
        for i in range(3):
            request = CreateJobRequest(name=f"p{i}", task=ContainerTask(command=["echo", f"log {i}"]))
            job_id = jobs.create_job(request, tenant="t1", deps=deps).job_id
            wait_for("the run to succeed", functools.partial(_succeeded, deps, job_id))
        # Then every end is recorded before any log is stored, and the three final logs cost one PutObject
        assert log_puts() == 0
        wait_for("the pack", lambda: log_puts() == 1, 20)
    assert log_puts() == 1
