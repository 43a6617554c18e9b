"""Faults of the tick, in-process, on both backends: the AWS adapters against a real moto server (DynamoDB
serialised, as `duetime local` runs it), and the SQLite adapters on a state file of the test's own.

A tick killed between the steps of a claim (DESIGN.md section 4) is repaired by the next tick or by the
sweeper; ticks and lease-less claimers racing on one shard make one run per slot, each executed once.
The crash is a :class:`SimulatedCrash` (a ``BaseException``: the tick's per-job ``except Exception`` cannot
swallow it, as it cannot swallow a process death) raised by a botocore hook at one AWS call (moto,
:class:`Crasher`), or by the port method the claim step calls, patched on ``SqliteStore`` / ``SqliteQueues``
(sqlite, :class:`PortCrasher`); from then on every call of the "dead" process fails the same way, so not even
its ``finally`` runs.
"""

from __future__ import annotations

import functools
import itertools
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.resources import ResourceNames
from duetime.adapters.sqlite.queue import SqliteQueues
from duetime.adapters.sqlite.store import SqliteStore
from duetime.config.deps import Deps, deps_from_settings, sqlite_deps
from duetime.config.settings import Settings
from duetime.domain.api_models import CreateJobRequest, RunResponse
from duetime.domain.clock import FixedClock
from duetime.domain.models import ContainerTask, Job, RunState, ScheduleSpec
from duetime.local.stack import LOCAL_AWS_ENV
from duetime.services import claims, jobs
from duetime.services.sweeper import sweep
from duetime.services.worker import Worker
from tests.conftest import T0, make_settings
from tests.faults.conftest import Effects, run_problems, running_moto
from tests.helpers import drain, queue_counts

pytestmark = pytest.mark.faults

_days = itertools.count()


class SimulatedCrash(BaseException):  # noqa: N818 - a process death, not an error
    """The tick's process died."""


class Crasher:
    """Kills "the process" at one AWS call: before or after the first call of an operation of ``operations``
    (the step's: ``SendMessage`` or ``SendMessageBatch`` for step 3) whose parameters mention ``mark`` (a table
    or queue name, a key)."""

    def __init__(self, when: str, operations: tuple[str, ...], mark: str) -> None:
        self.when, self.operations, self.mark = when, operations, mark
        self.dead = False

    def _params(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["faults_params"] = params

    def _match(self, model: Any, context: dict[str, Any]) -> bool:
        return model.name in self.operations and self.mark in repr(context.get("faults_params"))

    def before(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        if self.dead or (self.when == "before" and self._match(model, context)):
            self.dead = True
            raise SimulatedCrash(f"before {model.name}")

    def after(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        if self.when == "after" and not self.dead and self._match(model, context):
            self.dead = True
            raise SimulatedCrash(f"after {model.name}")

    def install(self) -> None:
        for service in ("dynamodb", "sqs"):
            events = aws.client(service).meta.events
            events.register(f"before-parameter-build.{service}", self._params, unique_id=f"crash-p-{service}")
            events.register(f"before-call.{service}", self.before, unique_id=f"crash-b-{service}")
            events.register(f"after-call.{service}", self.after, unique_id=f"crash-a-{service}")

    def uninstall(self) -> None:
        for service in ("dynamodb", "sqs"):
            events = aws.client(service).meta.events
            for stage in ("before-parameter-build", "before-call", "after-call"):
                suffix = {"before-parameter-build": "p", "before-call": "b", "after-call": "a"}[stage]
                events.unregister(f"{stage}.{service}", unique_id=f"crash-{suffix}-{service}")


class PortCrasher:
    """Kills "the process" at one port call of the SQLite adapters: before or after the first call of a method
    of ``methods`` (the claim step's, one at a time or for a batch: ``SqliteStore.put_new_run(s)``,
    ``SqliteStore.advance(_many)``, ``SqliteQueues.send(_batch)``). While installed, every public method of both
    adapter classes is wrapped; once dead, each raises."""

    def __init__(self, when: str, methods: tuple[str, ...]) -> None:
        self.when, self.methods = when, methods
        self.dead = False
        self._saved: list[tuple[type, str, Any]] = []

    def _wrap(self, cls: type, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        qualified = f"{cls.__name__}.{name}"

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead or (self.when == "before" and qualified in self.methods):
                self.dead = True
                raise SimulatedCrash(f"before {qualified}")
            result = fn(*args, **kwargs)
            if self.when == "after" and qualified in self.methods and not self.dead:
                self.dead = True
                raise SimulatedCrash(f"after {qualified}")
            return result

        return call

    def install(self) -> None:
        for cls in (SqliteStore, SqliteQueues):
            for name, fn in list(vars(cls).items()):
                if isinstance(fn, types.FunctionType) and not name.startswith("_") and name != "close":
                    self._saved.append((cls, name, fn))
                    setattr(cls, name, self._wrap(cls, name, fn))

    def uninstall(self) -> None:
        for cls, name, fn in self._saved:
            setattr(cls, name, fn)
        self._saved.clear()


@pytest.fixture(scope="module")
def resources() -> Iterator[tuple[str, Settings]]:
    """One moto server and one set of tables and queues for the module (creating them takes seconds)."""
    with running_moto() as endpoint, pytest.MonkeyPatch.context() as mp:
        for key, value in LOCAL_AWS_ENV.items():
            mp.setenv(key, value)
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        aws.reset_clients()
        settings = make_settings(ResourceNames.for_prefix("claims"), shard_count=1)
        aws.reset_clients()
        yield endpoint, settings


@pytest.fixture
def deps(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deps]:
    """The backend's adapters with one shard and 60 s ticks: on moto the module's tables and queues, with a
    fixed clock a day further on for each test (so the shard lease a previous test's dead tick left behind has
    long lapsed); on sqlite a fresh state file (the same settings, the same clock)."""
    if backend == "moto":
        yield from _moto_deps(request.getfixturevalue("resources"), request.getfixturevalue("monkeypatch"))
        return
    settings = Settings(
        state_dir=str(tmp_path / "state"),
        shard_count=1,
        tick_period_seconds=60,
        tick_margin_seconds=15,
        lease_seconds=30,
        heartbeat_seconds=10,
        pending_grace_seconds=60,
        kill_grace_seconds=1,
    )
    deps = sqlite_deps(settings, FixedClock(T0 + timedelta(days=next(_days))))
    yield deps
    deps.store.close()  # type: ignore[attr-defined]
    deps.queues.close()  # type: ignore[attr-defined]


def _moto_deps(resources: tuple[str, Settings], monkeypatch: pytest.MonkeyPatch) -> Iterator[Deps]:
    endpoint, settings = resources
    for key, value in LOCAL_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    aws.reset_clients()
    yield deps_from_settings(settings, FixedClock(T0 + timedelta(days=next(_days))))
    _empty(settings)
    aws.reset_clients()


def _empty(settings: Settings) -> None:
    """Delete every item and message a test left (a job left in the due index would be due in the next)."""
    ddb = aws.client("dynamodb")
    for table, keys in ((settings.jobs_table, ("job_id",)), (settings.runs_table, ("job_id", "due_at"))):
        for item in ddb.scan(TableName=table, ConsistentRead=True)["Items"]:
            ddb.delete_item(TableName=table, Key={k: item[k] for k in keys})
    drain(settings.queue_url("small"))


def _queued(deps: Deps) -> dict[str, int]:
    """``{"visible", "delayed", "in_flight"}`` message counts of the small tier's queue."""
    if deps.settings.backend == "sqlite":
        counts = deps.queues.counts("small")  # type: ignore[attr-defined]
        return {k: int(counts[k]) for k in ("visible", "delayed", "in_flight")}
    return queue_counts(deps.settings.queue_url("small"))


def _rate_job(deps: Deps, job_id: str, command: list[str]) -> Job:
    """A rate(5 minutes) job created now: its first slot, 5 minutes on, is beyond the submit's lookahead."""
    request = CreateJobRequest(
        job_id=job_id,
        name="claims",
        schedule=ScheduleSpec(expression="rate(5 minutes)"),
        task=ContainerTask(command=command),
    )
    return jobs.create_job(request, tenant="t1", deps=deps)


def _drain(deps: Deps, *, workers: int = 1) -> None:
    """Workers (in-process, real task subprocesses) take messages until the queue is empty."""

    def work(n: int) -> None:
        worker = Worker(deps, "small", owner=f"w{n}")
        while worker.poll_once(wait_seconds=1):
            pass

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@dataclass(frozen=True)
class Step:
    """A claim step: the AWS operations it calls (moto) and the port methods (sqlite), one at a time or for a
    batch; ``mark``: what the crashing call's parameters mention (None: the job's id)."""

    name: str
    operations: tuple[str, ...]
    methods: tuple[str, ...]
    mark: str | None = None


PUT_RUN = Step("put-run", ("PutItem",), ("SqliteStore.put_new_run", "SqliteStore.put_new_runs"), "-runs")
ADVANCE = Step("advance-job", ("UpdateItem",), ("SqliteStore.advance", "SqliteStore.advance_many"))
SEND = Step("send", ("SendMessage", "SendMessageBatch"), ("SqliteQueues.send", "SqliteQueues.send_batch"))


@pytest.mark.parametrize(
    ("when", "step", "repaired_by"),
    [
        ("before", PUT_RUN, "tick"),  # nothing written yet
        ("after", PUT_RUN, "tick"),  # the run exists; the job was not advanced, nothing sent
        ("after", ADVANCE, "sweeper"),  # run + advanced job, but no message
        ("after", SEND, "nobody"),  # all done but the lease release
    ],
    ids=["before-put-run", "after-put-run", "after-advance-job", "after-send"],
)
def test_a_tick_killed_between_the_claim_steps_is_repaired(
    deps: Deps, effects: Effects, when: str, step: Step, repaired_by: str
) -> None:
    clock: FixedClock = deps.clock  # type: ignore[assignment]
    start = deps.clock.now()
    job = _rate_job(deps, f"crashy-{when}-{step.name}", effects.command("true"))
    slot = start + timedelta(minutes=5)
    clock.set(slot + timedelta(seconds=1))
    # Given a tick whose process dies at one AWS call (moto) or port call (sqlite) of the claim, and makes no
    # call after it
    if deps.settings.backend == "sqlite":
        crasher: Crasher | PortCrasher = PortCrasher(when, step.methods)
    else:
        crasher = Crasher(when, step.operations, step.mark or job.job_id)
    crasher.install()
    try:
        with pytest.raises(SimulatedCrash):
            claims.tick(0, deps, owner="doomed")
    finally:
        crasher.uninstall()
    # Then the dead tick still holds the shard lease (it took it first, the job being due): another tick
    # cannot take it for one tick period
    lease = deps.settings.tick_period_seconds
    assert not deps.store.acquire_shard_lease(0, owner="next", now=clock.now(), lease_seconds=lease)
    clock.advance(61)
    # When ticks run again, and then the sweeper once the run is past its grace period
    claims.tick(0, deps, owner="next")
    if repaired_by == "sweeper":
        assert _queued(deps)["visible"] == 0, "the tick cannot see it"
        clock.advance(deps.settings.pending_grace_seconds)
        assert sweep(0, deps).resent == 1
    _drain(deps)
    # Then the slot has exactly one run, executed once, and the job moved on by exactly one slot
    [run] = deps.store.list_runs(job.job_id)
    assert (run.due_at, run.state, run.attempt, run.fencing_token) == (slot, RunState.SUCCEEDED, 1, 1)
    assert effects.of(run.run_id) == [(1, 1)]
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and stored.next_fire_at == slot + timedelta(minutes=5)
    assert run_problems(RunResponse.of(run).model_dump(mode="json"), effects.of(run.run_id)) == []


def test_ticks_and_lease_less_claimers_racing_on_one_shard_make_one_run_per_slot(
    deps: Deps, effects: Effects
) -> None:
    clock: FixedClock = deps.clock  # type: ignore[assignment]
    start = clock.now()
    jobs_ = [_rate_job(deps, f"race{i:02d}", effects.command("true")) for i in range(12)]

    def until() -> Any:
        return clock.now() + timedelta(seconds=deps.settings.tick_lookahead_seconds)

    slots = []
    for rnd in range(2):
        # Given every job due now, and two claimers that read the due index before anyone claimed
        slot = start + timedelta(minutes=5 * (rnd + 1))
        slots.append(slot)
        clock.set(slot + timedelta(seconds=1))
        snapshots = [list(deps.store.query_due(0, until())) for _ in range(2)]
        assert all(len(s) == len(jobs_) for s in snapshots)
        errors: list[BaseException] = []
        barrier = threading.Barrier(4)

        def guarded(
            fn: Any, barrier: threading.Barrier = barrier, errors: list[BaseException] = errors
        ) -> Any:
            def run() -> None:
                barrier.wait()
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            return run

        def rogue(snapshot: list[Job]) -> None:  # a tick whose shard lease lapsed while it was slow
            for job in snapshot:
                claims.claim_until(job, deps, until())

        # When two ticks (with the shard lease) and the two lease-less claimers all run at once
        threads = [
            threading.Thread(target=guarded(lambda n=n: claims.tick(0, deps, owner=f"tick{n}")))
            for n in range(2)
        ] + [threading.Thread(target=guarded(lambda s=s: rogue(s))) for s in snapshots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
    sent = sum(_queued(deps).values())
    _drain(deps, workers=3)
    # Then each job has exactly one run per slot, each executed exactly once, and sits on its next slot
    for job in jobs_:
        runs = sorted(deps.store.list_runs(job.job_id, limit=10), key=lambda r: r.due_at)
        assert [r.due_at for r in runs] == slots
        for run in runs:
            assert (run.state, run.attempt, run.fencing_token) == (RunState.SUCCEEDED, 1, 1), run.run_id
            assert effects.of(run.run_id) == [(1, 1)]
        stored = deps.store.get_job(job.job_id)
        assert stored is not None and stored.next_fire_at == slots[-1] + timedelta(minutes=5)
    # (the race sends duplicate wake-ups, harmlessly: a claimer that inserted the run and one that advanced
    # the job both send)
    assert len(jobs_) * len(slots) <= sent <= 2 * len(jobs_) * len(slots)
