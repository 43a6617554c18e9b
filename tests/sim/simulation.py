"""Deterministic simulation of Duetime (issues 4 and 15): FoundationDB's idea in miniature.

The real services (``jobs.create_job``, ``claims.tick``, ``runs.start/finish`` and the worker session
through the real ``Worker``, ``sweeper.sweep``) run in one process with a simulated clock
(:class:`~duetime.domain.clock.FixedClock`) and an in-memory queue (:class:`SimQueue`, the interface of the
``RunQueue`` port, delays and visibility in simulated time), on one of two adapter sets (``backend``):

- ``sqlite`` (the default, `make test`): :class:`~duetime.adapters.sqlite.store.SqliteStore` on a fresh
  database file per seed, wrapped in a :class:`PortProxy` whose every call is an interleaving and fault point;
  every write of a run is observed with its before and after image through triggers on the runs table
  (:data:`AUDIT_SCHEMA`, in the simulation's own file only).
- ``aws`` (`make faults`): :class:`~duetime.adapters.aws.dynamodb.DynamoStore` on moto's in-process DynamoDB,
  interleaved and faulted per AWS call by botocore ``before-call``/``after-call`` hooks, every write of a run
  observed from its parameters and its result.

Each actor (a tick per shard, a lease-less "rogue" tick, sweepers, workers, API submits, an operator who
triggers, cancels, pauses, resumes and re-drives) runs in its own thread, but only one thread ever runs at a
time: every store call (a port call on sqlite, an AWS call on aws), each :class:`SimQueue` method and every
simulated sleep hands control back to the scheduler, which picks what runs next with ``random.Random(seed)``.
So a seed fixes the interleaving of concurrent ticks, workers and sweepers, the faults, and the time at which
each step happens: a failing seed replays exactly (``python -m tests.sim.simulation --backend B --seed N
--trace``).

Faults (only during the fault phase; then a quiesce phase without faults must bring everything to rest):
crash before or after any call (``SimulatedCrash``, a ``BaseException`` so that no ``except Exception`` in
the core can swallow it, aborts that actor, which is restarted later as a supervisor would), throttling
(sqlite: ``ThrottledError``, the write lock taken past the busy timeout; aws: the SDK's retries exhausted,
``ProvisionedThroughputExceededException``), an ambiguous error after a write was applied (sqlite: a disk
I/O error from the commit; aws: ``InternalServerError``), slow calls (time jumps while a call is in flight),
lost, duplicated and twice-delivered queue messages, and worker pauses longer than the lease (session
beats delayed past it).

Invariants (checked on every write and after each seed, the same on both backends): see
:meth:`Simulation._check_write` and :meth:`Simulation._final_checks`.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import itertools
import json
import logging
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import IO, Any

import boto3
from botocore.exceptions import ClientError

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.dynamodb import DynamoStore, deserialize, job_from_item, run_from_item
from duetime.adapters.aws.resources import (
    QUEUE_MAX_RECEIVE_COUNT,
    QUEUE_VISIBILITY_SECONDS,
    SESSION_PREFIX,
    WATCH_INDEX_PK,
    WATCH_INDEX_SK,
    jobs_table_definition,
    runs_table_definition,
)
from duetime.adapters.sqlite.store import SqliteStore
from duetime.config.deps import Deps
from duetime.config.observability import logger as duetime_logger
from duetime.config.settings import ALL_TIERS, Settings
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.clock import FixedClock
from duetime.domain.errors import (
    ConflictError,
    NotFoundError,
    RequestFieldError,
    ScheduleError,
    ThrottledError,
)
from duetime.domain.models import (
    TERMINAL_STATES,
    CatchUpPolicy,
    ContainerTask,
    Job,
    OnTimeout,
    OverlapPolicy,
    RetryPolicy,
    Run,
    RunMessage,
    RunState,
    ScheduleSpec,
)
from duetime.domain.ports import ReceivedMessage, Store
from duetime.domain.timeutil import from_iso, to_epoch_ms, to_iso, truncate_ms
from duetime.services import claims, jobs, sweeper
from duetime.services.sessions import WorkerSession
from duetime.services.worker import TaskOutcome, Worker

#: simulated start instant (any fixed instant will do: every seed gets fresh tables)
T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
TERMINAL = frozenset(s.value for s in TERMINAL_STATES)
WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem"})


class SimulatedCrash(BaseException):  # noqa: N818 - it is a crash, not an error
    """Aborts the current step of one actor, as if its process died. Not an ``Exception``: nothing in the
    core may catch it."""


@dataclass(frozen=True)
class FaultRates:
    """Probabilities, per AWS call (or per queue message / session beat wait), of each fault."""

    crash_before: float = 0.008
    crash_after: float = 0.008
    throttle: float = 0.01
    ambiguous: float = 0.004
    slow_call: float = 0.02
    drop_message: float = 0.05
    duplicate_send: float = 0.05
    duplicate_delivery: float = 0.04
    pause: float = 0.1


# ---- actors: threads that run one at a time ---------------------------------------------------------------
class Op:
    """One actor's thread. It runs only while the scheduler has handed it the baton."""

    def __init__(
        self, sim: Simulation, name: str, fn: Callable[[], None], restart: Callable[[], None] | None
    ):
        self.sim = sim
        self.name = name
        self.fn = fn
        self.restart = restart
        self.go = threading.Semaphore(0)
        self.back = threading.Semaphore(0)
        self.state = "new"  # new | call | sleep | running | done
        self.wake_at: datetime | None = None
        self.killed = False
        self.crashed = False  # a crashed actor makes no further call (not even in a `finally`)
        #: a worker: the run it works on and the fencing token of its lease
        self.lease: tuple[tuple[str, str], int] | None = None
        self.outcome = ""
        self.thread = threading.Thread(target=self._main, name=f"sim-{name}", daemon=True)

    def _main(self) -> None:
        self.go.acquire()
        try:
            if not self.killed:
                self.fn()
            self.outcome = "returned"
        except SimulatedCrash:
            self.outcome = "crashed"
        except BaseException as exc:  # noqa: BLE001 - reported as a violation, never swallowed
            self.outcome = "error"
            self.sim.violation(
                f"{self.name}: unexpected {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            )
        finally:
            self.state = "done"
            self.back.release()

    def ready(self, now: datetime) -> bool:
        return self.state in ("new", "call") or (
            self.state == "sleep" and self.wake_at is not None and self.wake_at <= now
        )


@dataclass(order=True)
class Spawn:
    at: datetime
    seq: int
    name: str = field(compare=False)
    fn: Callable[[], None] = field(compare=False)
    restart: Callable[[], None] | None = field(compare=False, default=None)


# ---- the in-memory queue ----------------------------------------------------------------------------------
@dataclass
class _Message:
    mid: int
    body: str
    visible_at: datetime
    receive_count: int = 0
    receipt: str | None = None


class SimQueue:
    """The ``RunQueue`` port in memory, in simulated time, for both backends (as ``SqsQueues`` and
    ``SqliteQueues`` behave): delays, visibility, receive counts, redrive to a dead-letter list after
    ``QUEUE_MAX_RECEIVE_COUNT`` receives, and stale receipt handles (a delete with an old handle deletes
    nothing). Its calls are interleaving and fault points like the store's, raising the backend's errors."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.service = sim.backend.queue_service
        self.queues: dict[str, list[_Message]] = {tier: [] for tier in ALL_TIERS}
        self.dead: dict[str, list[_Message]] = {tier: [] for tier in ALL_TIERS}
        self._ids = 0

    def _add(self, tier: str, body: str, visible_at: datetime) -> None:
        self._ids += 1
        self.queues[tier].append(_Message(self._ids, body, visible_at))

    def send(self, tier: str, message: RunMessage, *, delay: int = 0) -> None:
        self.send_body(tier, message.model_dump_json(), delay, f"{message.run_id}#{message.attempt}")

    def send_batch(self, tier: str, messages: list[tuple[RunMessage, int]]) -> None:
        """A batch send: each entry as :meth:`send` (each its own interleaving and fault point, so a crash
        part way through sends only the first entries, and each may be lost or sent twice)."""
        for message, delay in messages:
            self.send(tier, message, delay=delay)

    def send_body(self, tier: str, body: str, delay: int, label: str) -> None:
        """SendMessage, with the queue's faults: the message may be lost or sent twice."""
        sim = self.sim
        sim.enter_call(self.service, "SendMessage", f"{label} delay={delay}")
        copies = 1
        if sim.faults_on:
            r = sim.rng.random()
            if r < sim.rates.drop_message:
                copies = 0
                sim.fault("drop_message", label)
            elif r < sim.rates.drop_message + sim.rates.duplicate_send:
                copies = 2
                sim.fault("duplicate_send", label)
        for _ in range(copies):
            self._add(tier, body, sim.clock.now() + timedelta(seconds=max(0, min(900, int(delay)))))
        sim.leave_call(self.service, "SendMessage", ok=True, write=True)

    def receive(
        self,
        tier: str,
        *,
        max_messages: int = 1,
        wait_seconds: int = 1,
        visibility_seconds: int | None = None,
    ) -> list[ReceivedMessage]:
        sim = self.sim
        sim.enter_call(self.service, "ReceiveMessage", tier)
        now = sim.clock.now()
        out: list[ReceivedMessage] = []
        for msg in list(self.queues[tier]):
            if len(out) >= max_messages:
                break
            if msg.visible_at > now:
                continue
            if msg.receive_count >= QUEUE_MAX_RECEIVE_COUNT:  # redrive policy
                self.queues[tier].remove(msg)
                self.dead[tier].append(msg)
                sim.stats["dlq_redriven"] += 1
                continue
            msg.receive_count += 1
            msg.receipt = f"{msg.mid}:{msg.receive_count}"
            msg.visible_at = now + timedelta(seconds=visibility_seconds or QUEUE_VISIBILITY_SECONDS)
            if sim.faults_on and sim.rng.random() < sim.rates.duplicate_delivery:
                self._add(tier, msg.body, now)  # at-least-once: another consumer gets it too
                sim.fault("duplicate_delivery", msg.body)
            try:
                parsed: RunMessage | None = RunMessage.model_validate_json(msg.body)
            except ValueError:
                parsed = None
            out.append(ReceivedMessage(parsed, msg.receipt, msg.body, msg.receive_count))
        sim.leave_call(self.service, "ReceiveMessage", ok=True, write=True)
        return out

    def delete(self, tier: str, receipt_handle: str) -> None:
        self.sim.enter_call(self.service, "DeleteMessage", receipt_handle)
        for msg in self.queues[tier]:
            if msg.receipt == receipt_handle:
                self.queues[tier].remove(msg)
                break
        self.sim.leave_call(self.service, "DeleteMessage", ok=True, write=True)

    def delete_batch(self, tier: str, receipt_handles: list[str]) -> None:
        """A batch delete: each handle as :meth:`delete` (each its own interleaving and fault point)."""
        for handle in receipt_handles:
            self.delete(tier, handle)

    def extend_visibility(self, tier: str, receipt_handle: str, seconds: int) -> None:
        try:
            self.sim.enter_call(self.service, "ChangeMessageVisibility", receipt_handle)
            for msg in self.queues[tier]:
                if msg.receipt == receipt_handle:
                    msg.visible_at = self.sim.clock.now() + timedelta(seconds=seconds)
            self.sim.leave_call(self.service, "ChangeMessageVisibility", ok=True, write=True)
        except self.sim.backend.injected:
            return  # best effort, as in SqsQueues and SqliteQueues

    def pending(self) -> int:
        return sum(len(q) for q in self.queues.values())


class SimLogs:
    """The S3 log store, reduced to its calls (the simulated task writes nothing worth keeping)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def put(self, key: str, data: bytes) -> None:
        self.sim.enter_call(self.sim.backend.logs_service, "PutObject", key)
        self.sim.leave_call(self.sim.backend.logs_service, "PutObject", ok=True)

    def get(self, key: str) -> bytes | None:
        return None


# ---- the simulated worker -------------------------------------------------------------------------------
class SimWorker(Worker):
    """The real :class:`~duetime.services.worker.Worker` (receive, start, finish, delete) whose task is simulated.

    The task never spawns a process: it is an effect-log append (run id, attempt, fencing token) at execute
    time, then a wait in simulated time. The wait loop mirrors ``Worker._run_task``: the session beats every
    ``heartbeat_seconds``, stop at the timeout, and stop ("kill the task") when the session finds the run
    lost.
    """

    def __init__(self, sim: Simulation, tier: str, owner: str) -> None:
        super().__init__(sim.deps, tier, owner=owner)
        self.sim = sim
        # the session's own view of its lease's end runs on the simulated clock (a pause is simulated time)
        self.session = WorkerSession(
            sim.deps,
            owner,
            monotonic=lambda: sim.clock.now().timestamp(),
            new_id=lambda: f"s{next(sim.session_ids)}-{owner}",  # unique in the world, and reproducible
        )

    def _run_task(self, run: Run, token: int, out: IO[bytes], received: ReceivedMessage) -> TaskOutcome:
        sim = self.sim
        op = sim._my_op()  # noqa: SLF001
        if op is not None:  # every finish from now on must be under this token
            op.lease = ((run.job_id, to_iso(run.due_at)), token)
        sim.effect(run, token, self.owner)
        plan = sim.plans[run.job_id]
        settings = self.deps.settings
        started = sim.clock.now()
        deadline = started + timedelta(seconds=run.timeout_seconds)
        ends = started + timedelta(seconds=plan.duration)
        exit_code = 1 if run.attempt <= plan.fail_attempts else 0
        session = self.session
        while True:
            now = sim.clock.now()
            if now >= ends:
                return TaskOutcome(exit_code=exit_code, timed_out=False, lease_lost=False)
            if now >= deadline:
                return TaskOutcome(exit_code=-15, timed_out=True, lease_lost=False)
            if session.due():
                self.beat_inline()  # a fault of the renewal is retried soon (as Worker does)
            lost = session.lost(run.run_id)
            if lost is not None:
                now_state = sim.rows.get((run.job_id, to_iso(run.due_at)), {})
                sim.note(
                    f"lease lost ({lost.why}): task of {run.run_id} token {token} killed "
                    f"(run is {now_state.get('state')} under token {now_state.get('fencing_token')})"
                )
                sim.stats["tasks_killed_on_lease_loss"] += 1
                return TaskOutcome(exit_code=-15, timed_out=False, lease_lost=True)
            next_beat = datetime.fromtimestamp(session.next_beat, UTC)
            wake = min(ends, deadline, max(next_beat, now + timedelta(milliseconds=1)))
            if sim.faults_on and sim.rng.random() < sim.rates.pause:
                pause = settings.lease_seconds * sim.rng.uniform(1.5, 4.0)
                sim.fault("worker_pause", f"{self.owner} {pause:.1f}s holding {run.run_id} token {token}")
                wake = now + timedelta(seconds=pause)
            sim.sleep_until(wake)


# ---- the world -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobPlan:
    request: CreateJobRequest
    submit_at: float
    duration: float
    fail_attempts: int


@dataclass(frozen=True)
class SimConfig:
    shards: int
    tick_period: float
    tick_margin: float
    tickers: int
    rogue_tick: bool
    sweepers: int
    sweep_period: float
    workers: int
    poll_seconds: float
    lease: float
    heartbeat: float
    grace: float
    operator: bool

    @classmethod
    def draw(cls, rng: random.Random) -> SimConfig:
        lease = rng.choice([4.0, 6.0, 10.0])
        return cls(
            shards=rng.choice([1, 1, 1, 2]),
            tick_period=rng.choice([3.0, 5.0, 10.0, 10.0, 10.0]),
            tick_margin=rng.choice([1.0, 2.0]),
            tickers=rng.choice([1, 1, 1, 2]),
            rogue_tick=rng.random() < 0.3,
            sweepers=rng.choice([1, 1, 2]),
            sweep_period=rng.choice([3.0, 5.0, 5.0, 10.0]),
            workers=rng.choice([1, 2, 2, 3]),
            poll_seconds=rng.choice([0.5, 1.0]),
            lease=lease,
            heartbeat=lease / rng.choice([2.0, 2.0, 3.0]),
            grace=rng.choice([3.0, 5.0, 10.0]),
            operator=rng.random() < 0.5,
        )


def _draw_jobs(rng: random.Random, fault_seconds: float) -> list[JobPlan]:
    plans = []
    count = rng.randint(2, 4)
    submits = sorted(round(rng.uniform(0, fault_seconds * 0.6), 3) for _ in range(count))
    for i, submit_at in enumerate(submits):
        kind = rng.choice(["now", "now", "at", "rate", "rate"])
        schedule = None
        if kind == "at":
            due = (T0 + timedelta(seconds=submit_at + rng.uniform(2, 30))).replace(microsecond=0)
            schedule = ScheduleSpec(expression=f"at({due:%Y-%m-%dT%H:%M:%S})")
        elif kind == "rate":
            end = T0 + timedelta(seconds=submit_at + rng.uniform(25, 50))  # 1-5 fires
            schedule = ScheduleSpec(expression=f"rate({rng.choice([10, 15, 20])} seconds)", end_at=end)
        retry = RetryPolicy(
            max_attempts=rng.choice([1, 2, 3, 4, 4]),
            backoff_seconds=rng.choice([0, 1, 2]),
            backoff_multiplier=rng.choice([1, 2]),
            max_backoff_seconds=5,
            jitter=rng.choice(["equal", "full", "none"]),
        )
        on_timeout = rng.choice(
            [
                OnTimeout(kill_grace_seconds=rng.choice([0, 1, 3])),
                OnTimeout(action="fail", kill_grace_seconds=1),
                OnTimeout(action="trigger", job_id=f"j{rng.randrange(max(1, i))}", kill_grace_seconds=1),
            ]
        )
        overlap = rng.choice(
            [
                OverlapPolicy(),
                OverlapPolicy(),
                OverlapPolicy(policy="skip"),
                OverlapPolicy(policy="buffer_one"),
                OverlapPolicy(policy="cancel_previous"),
                OverlapPolicy(max_concurrency=1),
            ]
        )
        request = CreateJobRequest(
            job_id=f"j{i}",
            name=f"sim {kind}",
            schedule=schedule,
            task=ContainerTask(command=["simulated"]),
            timeout_seconds=rng.choice([60, 60, 60, 5]),
            retry=retry,
            catch_up=CatchUpPolicy(policy=rng.choice(["latest", "latest", "all", "none"]), max_runs=3),
            starting_deadline_seconds=rng.choice([None, None, None, 4, 30]),
            on_timeout=on_timeout,
            overlap=overlap,
        )
        plans.append(
            JobPlan(
                request=request,
                submit_at=submit_at,
                # long tasks only for one-off jobs: a long task every few seconds just queues up
                duration=rng.choice([0.2, 1.0, 3.0] if kind == "rate" else [0.2, 1.0, 3.0, 6.0, 20.0]),
                fail_attempts=rng.choice([0, 0, 0, 1, 2, 99]),
            )
        )
    return plans


@dataclass
class SeedResult:
    seed: int
    backend: str
    violations: list[str]
    faults: Counter[str]
    stats: Counter[str]
    trace_digest: str
    trace: list[str]
    sim_seconds: float
    wall_seconds: float


# ---- botocore hooks (registered once per client; they route to the active simulation) ---------------------
_ACTIVE: Simulation | None = None


class _FakeHttp:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code
        self.headers: dict[str, str] = {}
        self.content = b""


def _before_parameter_build(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    context["sim_params"] = params


def _before_call(model: Any, context: dict[str, Any], **_: Any) -> Any:
    sim = _ACTIVE
    if sim is None:
        return None
    decision = sim.enter_call(
        "dynamodb", model.name, _describe(context.get("sim_params") or {}), raising=False
    )
    if decision == "throttle":
        context["sim_synthetic"] = True
        error = {"Code": "ProvisionedThroughputExceededException", "Message": "simulated throttling"}
        return _FakeHttp(400), {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}
    return None


def _sqs_before_call(model: Any, context: dict[str, Any], **_: Any) -> Any:
    """Core code that calls SQS directly (the timeout handler's plan) reaches the simulated queue too."""
    sim = _ACTIVE
    if sim is None or model.name != "SendMessage":
        return None
    params = context.get("sim_params") or {}
    tier = str(params["QueueUrl"]).rsplit("/", 1)[-1]
    body = str(params["MessageBody"])
    sim.queue.send_body(tier, body, int(params.get("DelaySeconds", 0)), "direct " + body[:60])
    digest = hashlib.md5(body.encode()).hexdigest()  # noqa: S324 - SQS's checksum, not security
    return _FakeHttp(200), {"MessageId": "sim", "MD5OfMessageBody": digest, "ResponseMetadata": {}}


def _after_call(
    http_response: Any, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
) -> None:
    sim = _ACTIVE
    if sim is None or context.get("sim_synthetic"):
        return
    ok = http_response.status_code < 300
    params = context.get("sim_params") or {}
    if ok and model.name in WRITES:
        sim.backend.observe_write(model.name, params, parsed)  # type: ignore[union-attr]
    sim.leave_call("dynamodb", model.name, ok=ok, write=model.name in WRITES)


def _describe(params: dict[str, Any]) -> str:
    key = params.get("Key") or params.get("Item") or {}
    parts = [str(v.get("S") or v.get("N")) for k, v in key.items() if k in ("job_id", "due_at")]
    return " ".join(p for p in parts if p) or str(params.get("IndexName", ""))


def install_hooks() -> None:
    """Register the simulation's hooks on the process's DynamoDB and SQS clients (idempotent)."""
    events = aws.client("dynamodb").meta.events
    events.register("before-parameter-build.dynamodb", _before_parameter_build, unique_id="sim-params")
    events.register("before-call.dynamodb", _before_call, unique_id="sim-before")
    events.register("after-call.dynamodb", _after_call, unique_id="sim-after")
    events = aws.client("sqs").meta.events
    events.register("before-parameter-build.sqs", _before_parameter_build, unique_id="sim-sqs-params")
    events.register("before-call.sqs", _sqs_before_call, unique_id="sim-sqs-before")


#: a DynamoDB client without the hooks: setup, side reads and checks, never faulted or interleaved
_SIDE: Any = None


# ---- the two adapter sets ----------------------------------------------------------------------------------
class AwsBackend:
    """DynamoStore on moto in-process (inside :func:`moto_world`): fresh tables per seed, every AWS call an
    interleaving point through the botocore hooks above, every write of a run observed from its parameters."""

    name = "aws"
    queue_service = "sqs"
    logs_service = "s3"
    #: the only exceptions the harness injects (the core may log and swallow these, nothing else)
    injected: tuple[type[BaseException], ...] = (ClientError,)

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.jobs_table = f"sim{sim.seed}-jobs"
        self.runs_table = f"sim{sim.seed}-runs"

    def throttle_error(self, service: str, operation: str) -> Exception:
        return ClientError({"Error": {"Code": "ThrottlingException", "Message": "simulated"}}, operation)

    def ambiguous_error(self, service: str, operation: str) -> Exception:
        return ClientError({"Error": {"Code": "InternalServerError", "Message": "simulated"}}, operation)

    def open(self) -> Store:
        if _SIDE is None:
            raise RuntimeError("the aws backend runs inside moto_world() (see run_seeds)")
        install_hooks()
        _SIDE.create_table(**jobs_table_definition(self.jobs_table))
        _SIDE.create_table(**runs_table_definition(self.runs_table))
        return DynamoStore(self.jobs_table, self.runs_table)

    def close(self) -> None:
        if _SIDE is not None:
            for table in (self.jobs_table, self.runs_table):
                with suppress(ClientError):
                    _SIDE.delete_table(TableName=table)

    # ---- reads of the stored state (never interleaved, never faulted) ---------------------------------
    def run_images(self) -> list[dict[str, Any]]:
        items = [deserialize(i) for i in _SIDE.scan(TableName=self.runs_table, ConsistentRead=True)["Items"]]
        return [i for i in items if not str(i["job_id"]).startswith(SESSION_PREFIX)]  # (not worker sessions)

    def stored_jobs(self) -> dict[str, Job]:
        items = [deserialize(i) for i in _SIDE.scan(TableName=self.jobs_table, ConsistentRead=True)["Items"]]
        return {i["job_id"]: job_from_item(i) for i in items if "tenant" in i}  # (not counters, not leases)

    def jobs_at_rest(self) -> bool:
        items = _SIDE.scan(TableName=self.jobs_table, ConsistentRead=True)["Items"]
        return all("next_fire_at" not in item for item in items if "tenant" in item)

    def run_of(self, image: dict[str, Any]) -> Run:
        return run_from_item(image)

    # ---- every write of a run -----------------------------------------------------------------------
    def observe_write(self, operation: str, params: dict[str, Any], parsed: dict[str, Any]) -> None:
        if params.get("TableName") != self.runs_table:
            return
        key = deserialize(params.get("Key") or params.get("Item") or {})
        if str(key.get("job_id", "")).startswith(SESSION_PREFIX):
            return  # a worker session's item, not a run's
        sim = self.sim
        if operation == "PutItem":
            sim.observe_run("insert", None, deserialize(params["Item"]), _no_conditions)
        elif operation == "UpdateItem":
            if "Attributes" in parsed:
                image = deserialize(parsed["Attributes"])
            else:  # read what the write left (nothing else runs meanwhile)
                out = _SIDE.get_item(TableName=self.runs_table, Key=params["Key"], ConsistentRead=True)
                image = deserialize(out["Item"])
            sim.observe_run("update", None, image, _dynamo_conditions(params))
        else:
            key = deserialize(params.get("Key") or {})
            sim.observe_run("delete", None, None, _no_conditions, key=(key.get("job_id"), key.get("due_at")))


def _no_conditions(before: Mapping[str, Any]) -> list[str]:
    return []


def _dynamo_conditions(params: dict[str, Any]) -> Callable[[Mapping[str, Any]], list[str]]:
    """Every equality an UpdateItem was conditioned on (its ``:c_<attr>`` values), checked on the state it
    replaced."""

    def check(before: Mapping[str, Any]) -> list[str]:
        out = []
        for placeholder, value in (params.get("ExpressionAttributeValues") or {}).items():
            if placeholder.startswith(":c_"):
                attr = placeholder[3:]
                expected = deserialize({"v": value})["v"]
                if before.get(attr) != expected:
                    out.append(f"write conditioned on {attr}={expected} applied over {before.get(attr)}")
        return out

    return check


class SimulatedThrottle(ThrottledError):
    """What ``Database.transaction`` raises when the write lock stays taken past the busy timeout (a subclass
    only so that the harness tells its own faults from a real one)."""


class SimulatedIOError(sqlite3.OperationalError):
    """A commit that reached the file but reported an error (an fsync failing after the WAL frames were
    written): ``Database.transaction`` re-raises a non-busy ``OperationalError`` as it is."""


#: in the simulation's own database file only: every insert, update and delete of a run copied, with its
#: before and after row, into ``sim_audit`` (drained by :class:`SqliteBackend` after each port call)
AUDIT_SCHEMA = """
CREATE TABLE sim_audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    op TEXT NOT NULL, job_id TEXT NOT NULL, due_at TEXT NOT NULL,
    old_doc TEXT, old_index TEXT, new_doc TEXT, new_index TEXT
);
CREATE TRIGGER sim_audit_insert AFTER INSERT ON runs BEGIN
    INSERT INTO sim_audit (op, job_id, due_at, new_doc, new_index) VALUES ('insert', NEW.job_id, NEW.due_at,
        NEW.doc, json_object('watch_shard', NEW.watch_shard, 'active_job', NEW.active_job,
        'running_tenant', NEW.running_tenant, 'dead_letter_tenant', NEW.dead_letter_tenant));
END;
CREATE TRIGGER sim_audit_update AFTER UPDATE ON runs BEGIN
    INSERT INTO sim_audit (op, job_id, due_at, old_doc, old_index, new_doc, new_index) VALUES ('update',
        NEW.job_id, NEW.due_at,
        OLD.doc, json_object('watch_shard', OLD.watch_shard, 'active_job', OLD.active_job,
        'running_tenant', OLD.running_tenant, 'dead_letter_tenant', OLD.dead_letter_tenant),
        NEW.doc, json_object('watch_shard', NEW.watch_shard, 'active_job', NEW.active_job,
        'running_tenant', NEW.running_tenant, 'dead_letter_tenant', NEW.dead_letter_tenant));
END;
CREATE TRIGGER sim_audit_delete AFTER DELETE ON runs BEGIN
    INSERT INTO sim_audit (op, job_id, due_at, old_doc, old_index) VALUES ('delete', OLD.job_id, OLD.due_at,
        OLD.doc, json_object('watch_shard', OLD.watch_shard, 'active_job', OLD.active_job,
        'running_tenant', OLD.running_tenant, 'dead_letter_tenant', OLD.dead_letter_tenant));
END;
"""


def _sqlite_tmp_root() -> str | None:
    """Where the per-seed database files go: ``DUETIME_SIM_TMPDIR``, else ``/dev/shm`` (a tmpfs: the store
    commits with ``synchronous=FULL``, and a disk's fsyncs would cost a quarter of the time), else the
    system's temporary directory."""
    chosen = os.environ.get("DUETIME_SIM_TMPDIR")
    if chosen:
        return chosen
    shm = Path("/dev/shm")  # noqa: S108 - a private subdirectory is made in it
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _image(doc: str | None, index: str | None) -> dict[str, Any] | None:
    """A run row as the invariants read it: its document and its index columns, absent values left out (as
    a DynamoDB item has no attribute for them)."""
    if doc is None:
        return None
    merged = {**json.loads(doc), **(json.loads(index) if index else {})}
    return {k: v for k, v in merged.items() if v is not None}


class SqliteBackend:
    """SqliteStore on a fresh database file per seed, behind a :class:`PortProxy`: every port call an
    interleaving and fault point, every write of a run observed through :data:`AUDIT_SCHEMA`'s triggers."""

    name = "sqlite"
    queue_service = "queue"
    logs_service = "logs"
    injected: tuple[type[BaseException], ...] = (SimulatedThrottle, SimulatedIOError)

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.dir: str | None = None
        self.store: SqliteStore | None = None
        self.side: sqlite3.Connection | None = None
        self._seen = 0  # the last sim_audit row observed
        self._version = 0  # the side connection's data_version after the last call

    def throttle_error(self, service: str, operation: str) -> Exception:
        return SimulatedThrottle(f"simulated: the write lock stayed taken ({service}.{operation})")

    def ambiguous_error(self, service: str, operation: str) -> Exception:
        return SimulatedIOError(f"disk I/O error (simulated, after {service}.{operation} was applied)")

    def open(self) -> Store:
        self.dir = tempfile.mkdtemp(prefix=f"duetime-sim{self.sim.seed}-", dir=_sqlite_tmp_root())
        path = Path(self.dir) / "sim.sqlite"
        self.store = SqliteStore(path, clock=self.sim.clock)
        # the harness's own connection: the audit triggers, then side reads (one thread runs at a time)
        self.side = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.side.executescript(AUDIT_SCHEMA)
        self._version = self._data_version()
        return PortProxy(self.store, self)  # type: ignore[return-value]

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.side is not None:
            self.side.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.store = self.side = self.dir = None

    def _data_version(self) -> int:
        assert self.side is not None
        return int(self.side.execute("PRAGMA data_version").fetchone()[0])

    # ---- one port call ------------------------------------------------------------------------------
    def call(
        self, name: str, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``store.<name>(*args, **kwargs)`` as an interleaving point: yield, maybe crash, throttle or stall
        before it; observe what it wrote; maybe crash after it, or report an error although it wrote."""
        sim = self.sim
        sim.enter_call("store", name, _describe_call(args, kwargs))
        try:
            result = method(*args, **kwargs)
        except Exception:
            self._observe(name, method, args, kwargs)  # (a refused transition wrote nothing)
            sim.leave_call("store", name, ok=False)
            raise
        wrote = self._observe(name, method, args, kwargs)
        sim.leave_call("store", name, ok=True, write=wrote)
        return result

    def _observe(
        self, name: str, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> bool:
        """Feed the call's writes of runs to the invariants; True if the call changed the file at all."""
        assert self.side is not None
        version = self._data_version()
        if version == self._version:
            return False
        self._version = version
        rows = self.side.execute(
            "SELECT seq, op, job_id, due_at, old_doc, old_index, new_doc, new_index FROM sim_audit"
            " WHERE seq > ? ORDER BY seq",
            (self._seen,),
        ).fetchall()
        check = _port_conditions(name, method, args, kwargs) if rows else _no_conditions
        for seq, op, job_id, due_at, old_doc, old_index, new_doc, new_index in rows:
            self._seen = seq
            self.sim.observe_run(
                op, _image(old_doc, old_index), _image(new_doc, new_index), check, key=(job_id, due_at)
            )
        return True

    # ---- reads of the stored state (never interleaved, never faulted) ---------------------------------
    def run_images(self) -> list[dict[str, Any]]:
        assert self.side is not None
        rows = self.side.execute(
            "SELECT doc, json_object('watch_shard', watch_shard, 'active_job', active_job, 'running_tenant',"
            " running_tenant, 'dead_letter_tenant', dead_letter_tenant) FROM runs"
        ).fetchall()
        return [image for doc, index in rows if (image := _image(doc, index)) is not None]

    def stored_jobs(self) -> dict[str, Job]:
        assert self.side is not None
        rows = self.side.execute("SELECT doc FROM jobs").fetchall()
        jobs = [Job.from_stored(json.loads(doc)) for (doc,) in rows]
        return {job.job_id: job for job in jobs}

    def jobs_at_rest(self) -> bool:
        assert self.side is not None
        return not self.side.execute("SELECT 1 FROM jobs WHERE next_fire_at IS NOT NULL LIMIT 1").fetchall()

    def run_of(self, image: dict[str, Any]) -> Run:
        return Run.from_stored(image)


class PortProxy:
    """A port wrapped so that every call of a public method goes through ``backend.call`` (an interleaving
    and fault point); found by name at call time, so methods added to the port later pass through too.
    Other attributes (and ``_private`` ones) are the target's own."""

    def __init__(self, target: object, backend: SqliteBackend) -> None:
        self._target = target
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name.startswith("_") or not callable(attr):
            return attr
        backend = self._backend

        def call(*args: Any, **kwargs: Any) -> Any:
            return backend.call(name, attr, args, kwargs)

        call.__name__ = name
        return call


def _describe_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A port call's arguments for the trace (deterministic: no object ids, no wall-clock values)."""

    def one(value: Any) -> str:
        if isinstance(value, datetime):
            return to_iso(value)
        if isinstance(value, str | int | float | bool) or value is None:
            return str(value)
        if isinstance(value, Run):
            return f"{value.run_id}/{value.state.value}/t{value.fencing_token}"
        if isinstance(value, Job):
            return value.job_id
        if hasattr(value, "expected_token") and hasattr(value, "job_id"):  # an AttemptEnd
            return f"{value.job_id}@{to_iso(value.due_at)}->{value.state.value}/t{value.expected_token}"
        return type(value).__name__

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return " ".join(parts)[:200]


def _plain(value: Any) -> Any:
    """A condition's value as a stored image holds it."""
    if isinstance(value, datetime):
        return to_iso(value)
    if isinstance(value, Enum):
        return value.value
    return value


_RUNNING, _PENDING, _RETRY_WAIT = RunState.RUNNING.value, RunState.PENDING.value, RunState.RETRY_WAIT.value


def _port_conditions(
    name: str, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[Mapping[str, Any]], list[str]]:
    """What a run transition of the ``RunStore`` port requires of the stored run (ports.py, DESIGN.md section
    5; the equalities DynamoStore writes as its ``:c_`` conditions): an applied write must have found them on
    the row it replaced. Methods not named here (reads, ``record_event``, later additions) require nothing."""
    try:
        bound = inspect.signature(method).bind(*args, **kwargs)
    except TypeError:
        return _no_conditions  # the call itself raised TypeError
    bound.apply_defaults()
    a = bound.arguments
    equal: dict[str, Any] = {}
    other: list[tuple[str, Callable[[Mapping[str, Any]], bool]]] = []
    if name == "end_attempt":
        end = a["end"]
        equal = {"state": _RUNNING, "fencing_token": end.expected_token}
        if end.lease_expired_by is not None:
            by = to_iso(end.lease_expired_by)
            other.append((f"lease_expires_at <= {by}", lambda p: str(p.get("lease_expires_at", "~")) <= by))
    elif name == "start":
        attempt = a["attempt"]
        equal = {"held": None}
        other.append(
            (
                f"PENDING at attempt {attempt} or RETRY_WAIT at {attempt - 1}",
                lambda p: (
                    (p.get("state"), p.get("attempt")) in ((_PENDING, attempt), (_RETRY_WAIT, attempt - 1))
                ),
            )
        )
    elif name == "skip_pending":
        equal = {"state": _PENDING, "attempt": a["attempt"]}
    elif name == "hold":
        equal = {"state": _PENDING, "attempt": 1, "held": None}
    elif name == "release_held":
        run = a["run"]
        equal = {"state": _PENDING, "attempt": run.attempt, "held": run.held}
    elif name == "defer_pending":
        equal = {"state": _PENDING, "attempt": a["attempt"], "held": a["held"]}
        if a["seen_watch_at"] is not None:
            equal["watch_at"] = a["seen_watch_at"]
    elif name == "release_retry":
        equal = {"state": _RETRY_WAIT, "attempt": a["attempt"]}
    elif name == "rewatch_running":
        equal = {"state": _RUNNING, "fencing_token": a["fencing_token"]}
    elif name == "cancel":
        run = a["run"]
        equal = {"state": run.state.value, "fencing_token": run.fencing_token}
    elif name == "redrive":
        run = a["run"]
        equal = {"state": run.state.value, "attempt": run.attempt}
    if not equal and not other:
        return _no_conditions

    def check(before: Mapping[str, Any]) -> list[str]:
        out = []
        for attr, expected in equal.items():
            value = _plain(expected)
            if before.get(attr) != value:
                out.append(f"{name} conditioned on {attr}={value} applied over {before.get(attr)}")
        out.extend(
            f"{name} conditioned on {what} applied over {dict(before)}"
            for what, ok in other
            if not ok(before)
        )
        return out

    return check


Backend = AwsBackend | SqliteBackend
BACKENDS: dict[str, type[AwsBackend] | type[SqliteBackend]] = {"sqlite": SqliteBackend, "aws": AwsBackend}


# ---- the simulation --------------------------------------------------------------------------------------
class Simulation:
    """One seed: draw a world, run it with faults, quiesce without faults, check the invariants.

    Args:
        seed: everything (configuration, jobs, interleaving, faults) follows from it.
        fault_seconds: simulated seconds during which faults are injected.
        max_seconds: simulated deadline by which everything must be at rest (else a violation).
        rates: fault probabilities.
        backend: the adapter set, ``sqlite`` (a fresh database file) or ``aws`` (moto in-process: inside
            :func:`moto_world`); the world, the interleaving, the faults and the invariants are the same.
    """

    def __init__(
        self,
        seed: int,
        *,
        backend: str = "sqlite",
        fault_seconds: float = 30.0,
        max_seconds: float = 1800.0,
        rates: FaultRates | None = None,
        echo: IO[str] | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.rates = rates or FaultRates()
        self.fault_seconds = fault_seconds
        self.max_seconds = max_seconds
        self.echo = echo
        self.clock = FixedClock(T0)
        self.cfg = SimConfig.draw(self.rng)
        self.plans = {p.request.job_id or "": p for p in _draw_jobs(self.rng, fault_seconds)}
        self.faults_on = True
        self.faults: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        #: worker session ids, numbered in the order the workers open them (reproducible)
        self.session_ids = itertools.count(1)
        self.violations: list[str] = []
        self.trace_lines: list[tuple[float, str, str]] = []
        self.ops: list[Op] = []
        self.spawns: list[Spawn] = []
        self._spawn_seq = 0
        self.current: Op | None = None
        self.accepted: list[str] = []
        self.paused: set[str] = set()
        # shadow of the runs table, built from every successful write: latest image, RUNNING versions, and
        # how many times each run became terminal
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}
        self.running_versions: dict[tuple[str, str], set[tuple[int, int]]] = defaultdict(set)
        self.terminal_transitions: Counter[tuple[str, str]] = Counter()
        self.redrives: Counter[tuple[str, str]] = Counter()
        self.born_as: dict[tuple[str, str], str] = {}  # trigger at insert (a re-drive changes it)
        self.effects: list[tuple[str, str, int, int, str]] = []  # (job_id, due_at iso, attempt, token, owner)
        self.backend: Backend = BACKENDS[backend](self)
        self.queue = SimQueue(self)
        self.settings = Settings(
            jobs_table=f"sim{seed}-jobs",
            runs_table=f"sim{seed}-runs",
            logs_bucket="sim-logs",
            queue_urls={tier: f"sim://{tier}" for tier in ALL_TIERS},
            shard_count=self.cfg.shards,
            tick_period_seconds=self.cfg.tick_period,
            tick_margin_seconds=self.cfg.tick_margin,
            # a tick's claims in one thread: the scheduler interleaves only its own actors' threads;
            # concurrent claims of one shard are the ticks and the lease-less rogue tick racing
            claim_concurrency=1,
            lease_seconds=self.cfg.lease,
            heartbeat_seconds=self.cfg.heartbeat,
            pending_grace_seconds=self.cfg.grace,
            kill_grace_seconds=0,
        )
        self.deps: Deps  # made by run(), with the store the backend opens

    def _open(self) -> None:
        self.deps = Deps(
            settings=self.settings,
            store=self.backend.open(),
            queues=self.queue,  # type: ignore[arg-type]
            logs=SimLogs(self),  # type: ignore[arg-type]
            clock=self.clock,
        )

    # ---- time and tracing ----------------------------------------------------------------------------
    def t(self) -> float:
        return (self.clock.now() - T0).total_seconds()

    def note(self, text: str, op: Op | None = None) -> None:
        who = (op or self.current).name if (op or self.current) is not None else "sim"  # type: ignore[union-attr]
        self.trace_lines.append((self.t(), who, text))
        if self.echo is not None:
            print(f"{self.t():9.3f} {who:<14} {text}", file=self.echo)

    def fault(self, kind: str, detail: str = "") -> None:
        self.faults[kind] += 1
        self.note(f"FAULT {kind} {detail}")

    def violation(self, text: str) -> None:
        self.violations.append(f"t={self.t():.3f} {text}")
        self.note(f"VIOLATION {text}")

    # ---- the baton ------------------------------------------------------------------------------------
    def _park(self, op: Op, state: str, wake_at: datetime | None = None) -> None:
        op.state, op.wake_at = state, wake_at
        op.back.release()
        op.go.acquire()
        op.state = "running"
        if op.killed:
            raise SimulatedCrash("the seed ended")

    def _resume(self, op: Op) -> None:
        self.current = op
        if op.state == "new":
            op.thread.start()
        op.go.release()
        op.back.acquire()
        self.current = None
        if op.state == "done":
            op.thread.join()

    def _my_op(self) -> Op | None:
        op = self.current
        return op if op is not None and threading.current_thread() is op.thread else None

    def sleep_until(self, when: datetime) -> None:
        op = self._my_op()
        assert op is not None, "sleep_until outside an actor"
        if op.killed or op.crashed:
            raise SimulatedCrash("the actor is dead")
        self._park(op, "sleep", when)

    def sleep(self, seconds: float) -> None:
        self.sleep_until(self.clock.now() + timedelta(seconds=seconds))

    def enter_call(
        self, service: str, operation: str, detail: str = "", *, raising: bool = True
    ) -> str | None:
        """Before an AWS call: yield to the scheduler, then maybe crash, throttle or stall."""
        op = self._my_op()
        if op is None:
            return None
        if op.killed or op.crashed:
            raise SimulatedCrash("the actor is dead")
        self._park(op, "call")
        self.stats["calls"] += 1
        self.stats[f"call_{operation}"] += 1
        self.note(f"{service}.{operation} {detail}")
        if not self.faults_on:
            return None
        r = self.rng.random()
        if r < self.rates.crash_before:
            self.fault("crash_before", f"{service}.{operation}")
            op.crashed = True
            raise SimulatedCrash(f"before {operation}")
        r -= self.rates.crash_before
        if r < self.rates.throttle:
            self.fault("throttle", f"{service}.{operation}")
            if raising:
                raise self.backend.throttle_error(service, operation)
            return "throttle"
        r -= self.rates.throttle
        if r < self.rates.slow_call:
            stall = self.rng.uniform(0.5, 1.5) * self.cfg.lease
            self.fault("slow_call", f"{service}.{operation} {stall:.1f}s")
            self.clock.advance(stall)
        return None

    def leave_call(self, service: str, operation: str, *, ok: bool, write: bool = False) -> None:
        """After an AWS call (applied or not): maybe crash, or report an error although the write applied."""
        op = self._my_op()
        if op is None or not self.faults_on:
            return
        r = self.rng.random()
        if r < self.rates.crash_after:
            self.fault("crash_after", f"{service}.{operation}")
            op.crashed = True
            raise SimulatedCrash(f"after {operation}")
        r -= self.rates.crash_after
        if ok and write and r < self.rates.ambiguous:
            self.fault("ambiguous_error", f"{service}.{operation}")
            raise self.backend.ambiguous_error(service, operation)

    # ---- actors ---------------------------------------------------------------------------------------
    def _spawn(
        self, delay: float, name: str, fn: Callable[[], None], restart: Callable[[], None] | None
    ) -> None:
        self._spawn_seq += 1
        self.spawns.append(
            Spawn(self.clock.now() + timedelta(seconds=delay), self._spawn_seq, name, fn, restart)
        )

    def _expected(self, exc: Exception, what: str) -> None:
        """An exception reached an actor's top level: only injected errors may do that."""
        if isinstance(exc, self.backend.injected):
            code = exc.response["Error"]["Code"] if isinstance(exc, ClientError) else type(exc).__name__
            self.note(f"{what} failed: {code}")
            return
        self.violation(f"{what}: unexpected {type(exc).__name__}: {exc}\n{traceback.format_exc()}")

    def _tick_actor(self, shard: int, k: int, gen: int) -> Callable[[], None]:
        def loop() -> None:
            owner = f"tick{shard}.{k}.{gen}"
            next_at = self.clock.now()
            while True:
                try:
                    claims.tick(shard, self.deps, owner=owner)
                except Exception as exc:  # noqa: BLE001
                    self._expected(exc, "tick")
                next_at = max(next_at + timedelta(seconds=self.cfg.tick_period), self.clock.now())
                self.sleep_until(next_at)

        return loop

    def _rogue_tick_actor(self, shard: int) -> Callable[[], None]:
        """A tick whose shard lease lapsed while it was slow: it claims without the lease (correctness must
        never depend on the lease)."""

        def loop() -> None:
            while True:
                until = self.clock.now() + timedelta(seconds=self.deps.settings.tick_lookahead_seconds)
                try:
                    for job in self.deps.store.query_due(shard, until):
                        try:
                            claims.claim_until(job, self.deps, until)
                        except Exception as exc:  # noqa: BLE001
                            self._expected(exc, "rogue claim")
                except Exception as exc:  # noqa: BLE001
                    self._expected(exc, "rogue tick")
                self.sleep(self.cfg.tick_period * self.rng.uniform(0.5, 1.5))

        return loop

    def _sweeper_actor(self) -> Callable[[], None]:
        def loop() -> None:
            while True:
                try:
                    for shard in range(self.cfg.shards):
                        sweeper.sweep(shard, self.deps)
                except Exception as exc:  # noqa: BLE001
                    self._expected(exc, "sweep")
                self.sleep(self.cfg.sweep_period)

        return loop

    def _worker_actor(self, idx: int, gen: int) -> Callable[[], None]:
        def loop() -> None:
            worker = SimWorker(self, "small", owner=f"w{idx}.{gen}")
            failures = 0
            while True:  # Worker.run_forever, in simulated time
                try:
                    got = worker.poll_once(wait_seconds=0)
                    failures = 0
                except Exception as exc:  # noqa: BLE001
                    self._expected(exc, "worker poll")
                    failures += 1
                    self.sleep(min(30.0, 0.5 * 2 ** min(failures, 6)))
                    continue
                if not got:
                    self.sleep(self.cfg.poll_seconds)

        return loop

    def _submit_actor(self, plan: JobPlan) -> Callable[[], None]:
        def submit() -> None:
            try:
                job = jobs.create_job(plan.request, tenant="t1", deps=self.deps)
            except self.backend.injected as exc:
                self._expected(exc, "submit")  # type: ignore[arg-type] # the API answered 5xx: not accepted
                return
            except (ScheduleError, RequestFieldError) as exc:
                # a 400: a slow call made the client late (its at(...) is past), or the job its timeout
                # triggers was never accepted
                self.note(f"submit rejected: {exc}")
                return
            self.accepted.append(job.job_id)
            self.note(f"accepted {job.job_id} next_fire_at={job.next_fire_at}")

        return submit

    def _operator_actor(self) -> Callable[[], None]:
        """Someone using the API meanwhile: runs a job now, cancels a run, pauses a job (and resumes it a
        little later), re-drives a dead letter."""

        def act(action: str) -> None:
            job_ids = sorted(self.accepted)
            run_keys = sorted(self.rows)
            if action == "trigger" and job_ids:
                run = jobs.trigger_job(self.rng.choice(job_ids), tenant="t1", deps=self.deps)
                self.note(f"operator triggered {run.run_id}")
            elif action == "cancel" and run_keys:
                job_id, due = self.rng.choice(run_keys)
                run = jobs.cancel_run(f"{job_id}.{to_epoch_ms(from_iso(due))}", tenant="t1", deps=self.deps)
                self.note(f"operator cancelled {run.run_id}")
            elif action == "pause" and job_ids:
                job_id = self.rng.choice(job_ids)
                self.paused.add(job_id)  # first: a pause that failed may still have been applied
                jobs.pause_job(job_id, tenant="t1", deps=self.deps)
                self.note(f"operator paused {job_id}")
            elif action == "resume" and self.paused:
                job_id = sorted(self.paused)[0]
                with suppress(ConflictError):  # it was never paused (the pause failed, or it had completed)
                    jobs.resume_job(job_id, tenant="t1", deps=self.deps)
                self.paused.discard(job_id)
                self.note(f"operator resumed {job_id}")
            elif action == "redrive":
                dead = [
                    k
                    for k in run_keys
                    if self.rows[k].get("dead_lettered") or self.rows[k].get("state") == "TIMED_OUT"
                ]
                if dead:
                    job_id, due = self.rng.choice(dead)
                    run = jobs.redrive(f"{job_id}.{to_epoch_ms(from_iso(due))}", tenant="t1", deps=self.deps)
                    self.note(f"operator re-drove {run.run_id}")

        def loop() -> None:
            while self.faults_on or self.paused:
                self.sleep(self.rng.uniform(1.0, 6.0))
                if self.paused and (not self.faults_on or self.rng.random() < 0.5):
                    action = "resume"  # every pause ends: a job paused for good would keep its slots
                else:
                    action = self.rng.choice(["trigger", "cancel", "pause", "redrive"])
                try:
                    act(action)
                except (ConflictError, NotFoundError) as exc:
                    self.note(f"operator {action}: {type(exc).__name__}")
                except Exception as exc:  # noqa: BLE001
                    self._expected(exc, f"operator {action}")

        return loop

    def _restartable(self, name: str, factory: Callable[[int], Callable[[], None]]) -> None:
        gen = [0]

        def restart() -> None:
            gen[0] += 1
            self.stats["actor_restarts"] += 1
            self._spawn(self.rng.uniform(0.5, 5.0), f"{name}.{gen[0]}", factory(gen[0]), restart)

        self._spawn(self.rng.uniform(0, 1), name, factory(0), restart)

    # ---- shadow of the runs table and per-write invariants ----------------------------------------------
    def observe_run(
        self,
        kind: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        conditions: Callable[[Mapping[str, Any]], list[str]],
        *,
        key: tuple[Any, Any] | None = None,
    ) -> None:
        """One applied write of a run (``kind``: insert, update or delete), from either backend.

        ``after`` is the row the write left; ``before`` the row it replaced where the backend knows it (the
        sqlite triggers do; DynamoDB returns only the new image, so the shadow stands in for it), and
        ``conditions`` lists what the write required of ``before`` that it did not find.
        """
        image = after if after is not None else before
        if image is not None:
            key = (image["job_id"], image["due_at"])
        assert key is not None
        if kind == "insert":
            assert after is not None
            if key in self.rows:
                self.violation(f"run {key} inserted twice")
            self.rows[key] = after
            self.born_as[key] = after.get("trigger", "")
            self._check_image(key, after)
            self.stats["runs_created"] += 1
            return
        if kind == "update":
            assert after is not None
            prev = self.rows.get(key)
            if prev is None:
                self.violation(f"update of a run never inserted: {key}")
            else:
                if before is not None and before != prev:
                    changed = sorted(_changed(prev, before))
                    self.violation(f"{key}: a write the harness never saw changed {changed}")
                for failed in conditions(before if before is not None else prev):
                    self.violation(f"{key}: {failed}")
                self._check_write(key, prev, after)
            self.rows[key] = after
            self._check_image(key, after)
            return
        self.violation(f"unexpected {kind} of run {key}")
        self.rows.pop(key, None)

    def _check_image(self, key: tuple[str, str], image: dict[str, Any]) -> None:
        if image["state"] not in TERMINAL and (WATCH_INDEX_SK not in image or WATCH_INDEX_PK not in image):
            self.violation(f"non-terminal run {key} ({image['state']}) has no watchdog entry")

    def _check_write(self, key: tuple[str, str], p: dict[str, Any], n: dict[str, Any]) -> None:
        """Invariants on one accepted write of a run (``p`` before, ``n`` after); the equalities it was
        conditioned on are checked by :meth:`observe_run` (no stale-token finish, rewatch or expiry
        applied)."""
        ps, ns = p["state"], n["state"]
        pt, nt = int(p.get("fencing_token", 0)), int(n.get("fencing_token", 0))
        op = self._my_op()
        lease_write = ps == "RUNNING" and ns != "CANCELLED" and _changed(p, n) - {"events"}
        # a worker's finish (not a note in the run's events): applied only under the token of
        # the lease the worker holds
        if (
            op is not None
            and op.lease is not None
            and op.lease[0] == key
            and lease_write
            and pt != op.lease[1]
        ):
            self.violation(f"{key}: {op.name} wrote {ps} -> {ns} under stale token {op.lease[1]} (now {pt})")
        if nt < pt:
            self.violation(f"{key}: fencing token went back {pt} -> {nt}")
        # a re-drive: a run that failed for good (dead-lettered, or TIMED_OUT by on_timeout fail/trigger)
        # goes back to PENDING as its next attempt
        failed_for_good = (ps in ("FAILED", "TIMED_OUT") and p.get("dead_lettered")) or ps == "TIMED_OUT"
        redriven = (
            failed_for_good
            and ns == "PENDING"
            and not n.get("dead_lettered")
            and n.get("attempt") == (p.get("attempt") or 0) + 1
        )
        if redriven:
            self.redrives[key] += 1
        elif ps in TERMINAL and (ns, nt, n.get("attempt"), n.get("attempts")) != (
            ps,
            pt,
            p.get("attempt"),
            p.get("attempts"),
        ):
            self.violation(f"{key}: terminal run changed {ps}/{pt} -> {ns}/{nt}")
        if nt > pt:
            if nt != pt + 1:
                self.violation(f"{key}: fencing token jumped {pt} -> {nt}")
            legal = (
                (ns == "RUNNING" and ps in ("PENDING", "RETRY_WAIT"))
                or (ps == "RUNNING" and ns != "RUNNING")
                or ns == "CANCELLED"
            )
            if not legal:
                self.violation(f"{key}: token bumped on {ps} -> {ns}")
        if ns == "RUNNING":
            if ps == "RUNNING" and nt != pt:
                self.violation(f"{key}: RUNNING -> RUNNING under a new token {pt} -> {nt}")
            if ps != "RUNNING":
                if nt == pt:
                    self.violation(f"{key}: started without a new fencing token")
                self.running_versions[key].add((int(n["attempt"]), nt))
                self.stats["starts"] += 1
        old_attempts = p.get("attempts") or []
        if (n.get("attempts") or [])[: len(old_attempts)] != old_attempts:
            self.violation(f"{key}: attempt history rewritten")
        if ns in TERMINAL and ps not in TERMINAL:
            self.terminal_transitions[key] += 1
            if self.terminal_transitions[key] > 1 + self.redrives[key]:
                self.violation(f"{key}: became terminal twice")
        self._check_overlap(key)

    def _check_overlap(self, key: tuple[str, str]) -> None:
        """An overlap policy bounds how many runs of a job are RUNNING at once (counted, not enforced here)."""
        plan = self.plans.get(key[0])
        if plan is None or not plan.request.overlap.enforced:
            return
        running = sum(1 for (j, _), row in self.rows.items() if j == key[0] and row["state"] == "RUNNING")
        if running > plan.request.overlap.limit:
            self.stats["overlap_exceeded"] += 1
            self.note(f"OVERLAP {key[0]}: {running} runs RUNNING, limit {plan.request.overlap.limit}")

    def effect(self, run: Run, token: int, owner: str) -> None:
        """The simulated task's only effect: one line in the effect log."""
        self.effects.append((run.job_id, to_iso(run.due_at), run.attempt, token, owner))
        self.note(f"EFFECT {run.run_id} attempt {run.attempt} token {token}")

    # ---- the scheduler --------------------------------------------------------------------------------
    def _setup(self) -> None:
        for plan in sorted(self.plans.values(), key=lambda p: p.submit_at):
            self._spawn(plan.submit_at, f"submit:{plan.request.job_id}", self._submit_actor(plan), None)
        for shard in range(self.cfg.shards):
            for k in range(self.cfg.tickers):
                self._restartable(f"tick{shard}.{k}", lambda g, s=shard, k=k: self._tick_actor(s, k, g))
            if self.cfg.rogue_tick:
                self._restartable(f"rogue{shard}", lambda g, s=shard: self._rogue_tick_actor(s))
        for k in range(self.cfg.sweepers):
            self._restartable(f"sweep{k}", lambda g: self._sweeper_actor())
        for i in range(self.cfg.workers):
            self._restartable(f"w{i}", lambda g, i=i: self._worker_actor(i, g))
        if self.cfg.operator:
            self._restartable("operator", lambda g: self._operator_actor())

    def _teardown(self) -> None:
        for op in self.ops:
            if op.state != "done":
                op.killed = True
                self._resume(op)

    def _start_due_spawns(self) -> bool:
        now = self.clock.now()
        due = sorted(s for s in self.spawns if s.at <= now)
        for spawn in due:
            self.spawns.remove(spawn)
            op = Op(self, spawn.name, spawn.fn, spawn.restart)
            self.ops.append(op)
            self.note("start", op)
            self._resume(op)
            self._after_step(op)
        return bool(due)

    def _after_step(self, op: Op) -> None:
        if op.state != "done":
            return
        self.ops.remove(op)
        if op.outcome == "crashed":
            self.stats["actor_crashes"] += 1
            self.note("crashed", op)
            if op.restart is not None:
                op.restart()

    def _quiet(self) -> bool:
        """Everything at rest: all submits done, every run terminal, every job without a next fire."""
        if self.paused or any(s.name.startswith("submit:") for s in self.spawns):
            return False
        if any(op.name.startswith("submit:") for op in self.ops):
            return False
        if any(row["state"] not in TERMINAL for row in self.rows.values()):
            return False
        return self.backend.jobs_at_rest()

    def _run_until(self, until: datetime, *, stop_when_quiet: bool) -> bool:
        last_quiet_check = self.clock.now() - timedelta(seconds=60)
        while True:
            if self.clock.now() >= until:  # (a slow call may carry the clock past it mid-step)
                return False
            if self._start_due_spawns():
                continue
            now = self.clock.now()
            ready = [op for op in self.ops if op.ready(now)]
            if ready:
                if self.rng.random() < 0.2:
                    self.clock.advance(self.rng.uniform(0.0, 0.05))  # a little time passes between steps
                op = self.rng.choice(ready)
                self._resume(op)
                self._after_step(op)
                self.stats["steps"] += 1
                if self.stats["steps"] > 400_000:
                    self.violation("no progress: step budget exhausted")
                    return False
                continue
            wakes = [op.wake_at for op in self.ops if op.state == "sleep" and op.wake_at is not None]
            wakes += [s.at for s in self.spawns]
            if stop_when_quiet and now - last_quiet_check >= timedelta(seconds=2):
                last_quiet_check = now
                if self._quiet():
                    return True
            nxt = min(wakes) if wakes else until
            if nxt >= until:
                if until > now:  # (a slow call may have carried the clock past the end already)
                    self.clock.set(until)
                return False
            if nxt > now:
                self.clock.set(nxt)

    def run(self) -> SeedResult:
        global _ACTIVE
        started = time.perf_counter()
        random.seed(self.seed)  # the core's retry jitter draws from the global generator
        std_logger = duetime_logger._logger  # noqa: SLF001 - silence and watch the core's logger
        saved = (std_logger.handlers[:], std_logger.level, std_logger.propagate)
        catcher = _ErrorCatcher(self)
        std_logger.handlers[:] = [catcher]
        std_logger.setLevel(logging.ERROR)
        std_logger.propagate = False
        _ACTIVE = self if isinstance(self.backend, AwsBackend) else None  # the botocore hooks' simulation
        try:
            self._open()
            self._setup()
            self._run_until(T0 + timedelta(seconds=self.fault_seconds), stop_when_quiet=False)
            self.faults_on = False
            self.note("faults off: quiesce")
            if not self._run_until(T0 + timedelta(seconds=self.max_seconds), stop_when_quiet=True):
                self.violation("not at rest by the end of the quiesce phase")
            sim_seconds = self.t()
            self._final_checks()
        finally:
            try:
                self._teardown()
            finally:
                self.backend.close()
                _ACTIVE = None
                std_logger.handlers[:], level, std_logger.propagate = saved
                std_logger.setLevel(level)
        lines = [f"{t:9.3f} {who:<14} {text}" for t, who, text in self.trace_lines]
        digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
        return SeedResult(
            seed=self.seed,
            backend=self.backend.name,
            violations=self.violations,
            faults=self.faults,
            stats=self.stats,
            trace_digest=digest,
            trace=lines,
            sim_seconds=sim_seconds,
            wall_seconds=time.perf_counter() - started,
        )

    # ---- end-of-seed invariants ---------------------------------------------------------------------------
    def _final_checks(self) -> None:
        run_items = self.backend.run_images()
        stored_jobs = self.backend.stored_jobs()
        runs_by_key = {(i["job_id"], i["due_at"]): i for i in run_items}
        effects_by_key: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
        for job_id, due, attempt, token, _owner in self.effects:
            effects_by_key[(job_id, due)].append((attempt, token))

        for job_id in self.accepted:
            if job_id not in stored_jobs:
                self.violation(f"accepted job {job_id} is not stored")
        if set(runs_by_key) != set(self.rows):
            self.violation(f"shadow lost track of runs: {sorted(set(runs_by_key) ^ set(self.rows))}")

        for key, item in runs_by_key.items():
            run = self.backend.run_of(item)
            shadow = self.rows.get(key, {})
            if (shadow.get("state"), shadow.get("fencing_token")) != (
                item["state"],
                item.get("fencing_token"),
            ):
                self.violation(f"{key}: shadow {shadow.get('state')} differs from table {item['state']}")
            # never lost: at rest, every run is terminal, out of the watchdog index
            if not run.state.terminal:
                self.violation(f"{key}: left {run.state.value} at rest")
            elif WATCH_INDEX_PK in item:
                self.violation(f"{key}: terminal but still in the watchdog index")
            # accepted finishes: exactly one transition into a terminal state
            if self.terminal_transitions[key] != 1 + self.redrives[key] and run.state.terminal:
                self.violation(f"{key}: {self.terminal_transitions[key]} terminal transitions")
            # attempt records: one per attempt, tokens strictly increasing
            tokens = [a.fencing_token for a in run.attempts]
            numbers = [a.attempt for a in run.attempts]
            if tokens != sorted(set(tokens)) or numbers != sorted(set(numbers)):
                self.violation(
                    f"{key}: attempt records out of order: {list(zip(numbers, tokens, strict=True))}"
                )
            if len(run.attempts) > run.max_attempts:
                self.violation(f"{key}: {len(run.attempts)} attempts recorded, max {run.max_attempts}")
            # effects match the attempts: each effect ran under a lease that was granted, once per lease
            effects = effects_by_key.get(key, [])
            granted = self.running_versions.get(key, set())
            for attempt, token in effects:
                if (attempt, token) not in granted:
                    self.violation(f"{key}: effect under attempt {attempt} token {token} never granted")
            if len({t for _, t in effects}) != len(effects):
                self.violation(f"{key}: one lease executed twice: {effects}")
            if len(effects) > len(granted):
                self.violation(f"{key}: {len(effects)} effects > {len(granted)} attempts started")
            if len(effects) > 1:
                self.stats["runs_with_repeated_effects"] += 1
            if run.state is RunState.SUCCEEDED:
                final = run.attempts[-1] if run.attempts else None
                if final is None or final.state is not RunState.SUCCEEDED:
                    self.violation(f"{key}: SUCCEEDED without a succeeded attempt record")
                elif final.fencing_token not in {t for _, t in effects}:
                    self.violation(f"{key}: SUCCEEDED under token {final.fencing_token} with no effect")
            elif run.state.terminal and not (run.error or (run.attempts and run.attempts[-1].reason)):
                self.violation(f"{key}: ended {run.state.value} without saying why")
            self.stats[f"final_{run.state.value}"] += 1

        for job_id, job in stored_jobs.items():
            if job.next_fire_at is not None:
                self.violation(f"job {job_id} still has a next fire {job.next_fire_at} at rest")
            scheduled = [
                due
                for (jid, due) in runs_by_key
                if jid == job_id and self.born_as.get((jid, due)) in ("schedule", "backfill")
            ]
            self._check_slots(job, scheduled)
        self.stats["effects"] += len(self.effects)
        self.stats["jobs"] += len(stored_jobs)
        self.stats["runs"] += len(runs_by_key)

    def _check_slots(self, job: Job, run_dues: list[str]) -> None:
        """Never lost: every slot of the job's schedule has a run, or was counted as missed (catch-up)."""
        first = self._first_fire(job)
        if first is None:
            return
        schedule = claims.schedule_of(job)
        slots = [first]
        if schedule is not None:  # every schedule of the simulation ends (an at, or a rate with end_at)
            while len(slots) < 10_000:
                nxt = schedule.next_after(slots[-1])
                if nxt is None:
                    break
                slots.append(truncate_ms(nxt))
        slot_keys = {to_iso(s) for s in slots}
        bogus = set(run_dues) - slot_keys
        if bogus:
            self.violation(f"job {job.job_id}: runs at times not in its schedule: {sorted(bogus)}")
        uncovered = slot_keys - set(run_dues)
        if len(uncovered) > job.missed_slots:
            self.violation(
                f"job {job.job_id}: {len(uncovered)} slots have no run but only {job.missed_slots} were "
                f"counted as missed: {sorted(uncovered)[:5]}"
            )
        self.stats["slots"] += len(slots)
        self.stats["slots_missed"] += len(uncovered)

    def _first_fire(self, job: Job) -> datetime | None:
        """The first fire as ``create_job`` computed it: now for a run-now job, else the first after now."""
        if job.schedule is None:
            return job.created_at
        return claims.next_fire_after(job, job.created_at)


def _changed(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


class _ErrorCatcher(logging.Handler):
    """The core logs and swallows some exceptions (a tick isolates one job's fault): any that is not an
    injected error is a bug."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__(level=logging.ERROR)
        self.sim = sim

    def emit(self, record: logging.LogRecord) -> None:
        if (
            record.exc_info
            and record.exc_info[1] is not None
            and not isinstance(record.exc_info[1], self.sim.backend.injected)
        ):
            exc = record.exc_info[1]
            detail = "".join(traceback.format_exception(exc))
            self.sim.violation(f"core logged {type(exc).__name__}: {exc} ({record.getMessage()})\n{detail}")


# ---- running many seeds ----------------------------------------------------------------------------------
@contextmanager
def moto_world() -> Iterator[None]:
    """moto in-process with fake credentials and fresh clients (the caller's environment is restored)."""
    global _SIDE
    from moto import mock_aws

    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")
    saved = {
        k: os.environ.get(k)
        for k in (*names, "AWS_ENDPOINT_URL", "AWS_PROFILE", "POWERTOOLS_METRICS_DISABLED")
    }
    os.environ.update(dict.fromkeys(names[:3], "testing"), AWS_DEFAULT_REGION="us-east-1")
    os.environ["POWERTOOLS_METRICS_DISABLED"] = "true"  # the core's dead-letter metric would print EMF
    os.environ.pop("AWS_ENDPOINT_URL", None)
    os.environ.pop("AWS_PROFILE", None)
    try:
        with mock_aws(), _cheaper_moto():
            aws.reset_clients()
            for service in ("dynamodb", "sqs"):
                aws.client(service).meta.events.register(
                    f"choose-signer.{service}", _unsigned, unique_id="sim-unsigned"
                )
            _SIDE = boto3.session.Session().client("dynamodb")
            _SIDE.meta.events.register("choose-signer.dynamodb", _unsigned, unique_id="sim-unsigned")
            yield
    finally:
        _SIDE = None
        aws.reset_clients()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _unsigned(**_: Any) -> Any:
    """moto in-process never checks signatures: skip SigV4 (a fifth of each call's time)."""
    import botocore

    return botocore.UNSIGNED


#: DynamoDB operations whose moto result is already the wire-format JSON body
_ITEM_OPERATIONS = frozenset({"GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan"})


@contextmanager
def _cheaper_moto() -> Iterator[None]:
    """Two shortcuts in moto's response path, for the simulation only (undone on exit).

    moto's generic serializer walks the botocore shape of every attribute of every item returned (most of a
    call's time); for item operations its result is already DynamoDB's wire format (``DynamoType.to_json``), so
    ``json.dumps`` yields the same body: set ``DUETIME_SIM_CHECK_MOTO=1`` to compare both on every call. And
    moto lists a response class's methods with ``inspect`` on every request: cached here.
    """
    import moto.core.responses as moto_responses
    from moto.dynamodb.models.dynamo_type import DynamoType

    original_execute = moto_responses.ActionResult.execute_result
    original_names = moto_responses.method_names_from_class
    check = os.environ.get("DUETIME_SIM_CHECK_MOTO") == "1"

    def encode(obj: object) -> object:
        if isinstance(obj, DynamoType):
            return obj.to_json()
        raise TypeError(f"cannot encode {type(obj).__name__}")

    def execute_result(self: Any, context: Any) -> Any:
        if (
            context.service_model.service_name == "dynamodb"
            and context.operation_model.name in _ITEM_OPERATIONS
            and isinstance(self.result, dict)
        ):
            body = json.dumps(self.result, default=encode)
            if check:
                status, headers, slow = original_execute(self, context)
                assert json.loads(slow) == json.loads(body), (context.operation_model.name, slow, body)
                return status, headers, slow
            return 200, {"Content-Type": "application/x-amz-json-1.0"}, body
        return original_execute(self, context)

    names: dict[type, list[str]] = {}

    def method_names_from_class(clazz: Any) -> list[str]:
        if clazz not in names:
            names[clazz] = original_names(clazz)
        return names[clazz]

    moto_responses.ActionResult.execute_result = execute_result  # type: ignore[method-assign]
    moto_responses.method_names_from_class = method_names_from_class
    try:
        yield
    finally:
        moto_responses.ActionResult.execute_result = original_execute  # type: ignore[method-assign]
        moto_responses.method_names_from_class = original_names


def world(backend: str) -> AbstractContextManager[None]:
    """What a batch of ``backend`` seeds runs inside: one moto world for ``aws``; for ``sqlite`` little (each
    seed makes, and deletes, its own database file)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}")
    return moto_world() if backend == "aws" else sqlite_world()


@contextmanager
def sqlite_world() -> Iterator[None]:
    """The sqlite backend's batch: only the core's dead-letter metric silenced (it would print EMF)."""
    saved = os.environ.get("POWERTOOLS_METRICS_DISABLED")
    os.environ["POWERTOOLS_METRICS_DISABLED"] = "true"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("POWERTOOLS_METRICS_DISABLED", None)
        else:
            os.environ["POWERTOOLS_METRICS_DISABLED"] = saved


@dataclass
class BatchResult:
    backend: str = "sqlite"
    seeds: int = 0
    failed: list[SeedResult] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    stats: Counter[str] = field(default_factory=Counter)
    wall_seconds: float = 0.0

    def summary(self) -> str:
        rate = self.seeds / self.wall_seconds if self.wall_seconds else 0.0
        faults = ", ".join(f"{k}={v}" for k, v in sorted(self.faults.items()))
        keys = ("runs", "starts", "effects", "runs_with_repeated_effects", "slots_missed", "actor_crashes")
        stats = ", ".join(f"{k}={self.stats[k]}" for k in keys)
        return (
            f"{self.backend}: {self.seeds} seeds, {len(self.failed)} failing, {rate:.1f} seeds/s; "
            f"faults injected: {sum(self.faults.values())} ({faults}); {stats}"
        )


def run_seeds(
    seeds: Iterator[int] | range | list[int], *, backend: str = "sqlite", **kwargs: Any
) -> BatchResult:
    """Run each seed in its own world (fresh tables, or a fresh database file) and aggregate."""
    batch = BatchResult(backend=backend)
    started = time.perf_counter()
    with world(backend):
        for seed in seeds:
            result = Simulation(seed, backend=backend, **kwargs).run()
            batch.seeds += 1
            batch.faults.update(result.faults)
            batch.stats.update(result.stats)
            if result.violations:
                batch.failed.append(result)
    batch.wall_seconds = time.perf_counter() - started
    return batch


def explain(result: SeedResult, *, tail: int = 150) -> str:
    """A failing seed's violations, the command that replays it, and the end of its trace."""
    head = "\n".join(f"  - {v}" for v in result.violations[:20])
    trace = "\n".join(result.trace[-tail:])
    return (
        f"seed {result.seed} ({result.backend}) violated {len(result.violations)} invariant(s):\n{head}\n"
        f"replay: .venv/bin/python -m tests.sim.simulation --backend {result.backend} --seed {result.seed}"
        f" --trace\nlast {tail} steps:\n{trace}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Duetime's deterministic simulation")
    parser.add_argument(
        "--backend", choices=sorted(BACKENDS), default="sqlite", help="the adapter set (default sqlite)"
    )
    parser.add_argument("--seed", type=int, help="replay one seed")
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds (from --base)")
    parser.add_argument("--base", type=int, default=0)
    parser.add_argument("--trace", action="store_true", help="print every step of --seed")
    args = parser.parse_args(argv)
    if args.seed is not None:
        with world(args.backend):
            echo = sys.stdout if args.trace else None
            result = Simulation(args.seed, backend=args.backend, echo=echo).run()
        print(
            f"seed {args.seed} ({args.backend}): digest {result.trace_digest}, {len(result.trace)} steps, "
            f"{result.sim_seconds:.1f} simulated s in {result.wall_seconds:.2f} s; faults {dict(result.faults)}"
        )
        for v in result.violations:
            print("VIOLATION", v)
        return 1 if result.violations else 0
    batch = run_seeds(range(args.base, args.base + args.seeds), backend=args.backend)
    print(batch.summary())
    for failed in batch.failed:
        print(explain(failed, tail=40))
    return 1 if batch.failed else 0


if __name__ == "__main__":
    sys.exit(main())
