"""Worker slots: one worker process runs several tasks at once (``--slots N``), receiving up to its free slots
per poll; each slot has its own run and log (one worker session holds them all), a run lost on one kills only
that task, and a SIGTERM hands every running run back. On the embedded (SQLite) adapters with a real clock."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import duetime.services.worker as worker_module
from duetime.config.deps import Deps, sqlite_deps
from duetime.config.settings import Settings, settings_to_env
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.logs import pack_key
from duetime.domain.models import ContainerTask, RetryPolicy, Run, RunState
from duetime.local.stack import LocalOptions, LocalStack
from duetime.services import jobs
from duetime.services.runs import Finish, start_and_finish
from duetime.services.worker import DEFAULT_SLOTS, STOP_BUDGET_ENV, Worker, default_slots, task_marker_name
from tests.helpers import running_worker as _running
from tests.helpers import wait_for as _wait

#: the stop budget of the SIGTERMed worker process, seconds
STOP_BUDGET = 3.0


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "state_dir": str(tmp_path / "state"),
        "lease_seconds": 5,
        "heartbeat_seconds": 0.3,
        "kill_grace_seconds": 1,
        "pending_grace_seconds": 60,
    }
    return Settings(**(values | overrides))


@pytest.fixture
def deps(tmp_path: Path) -> Deps:
    """The embedded adapters in a fresh state directory, real time, session beats every 0.3 s."""
    return sqlite_deps(_settings(tmp_path))


def _submit(deps: Deps, command: list[str], name: str = "t", **kw: Any) -> str:
    job = jobs.create_job(
        CreateJobRequest(name=name, task=ContainerTask(command=command), **kw), tenant="t1", deps=deps
    )
    return job.job_id


def _run(deps: Deps, job_id: str) -> Run:
    [run] = deps.store.list_runs(job_id)
    return run


def _all_in(deps: Deps, job_ids: list[str], states: set[RunState]) -> bool:
    return all(_run(deps, j).state in states for j in job_ids)


def _spy_receives(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Records ``(max_messages, received)`` of every receive of the worker."""
    calls: list[tuple[int, int]] = []
    real = deps.queues.receive

    def receive(tier: str, **kw: Any) -> Any:
        got = real(tier, **kw)
        calls.append((kw["max_messages"], len(got)))
        return got

    monkeypatch.setattr(deps.queues, "receive", receive)
    return calls


def _max_overlap(runs: list[Run]) -> int:
    """The most attempts that were running at one instant (from their recorded start and end)."""
    edges: list[tuple[datetime, int]] = []
    for run in runs:
        for attempt in run.attempts:
            assert attempt.started_at is not None and attempt.finished_at is not None
            edges += [(attempt.started_at, 1), (attempt.finished_at, -1)]
    most = now = 0
    for _, step in sorted(edges):  # an end sorts before a start at the same instant
        now += step
        most = max(most, now)
    return most


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in the process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def test_the_default_slots_per_tier() -> None:
    assert DEFAULT_SLOTS == {"small": 8, "medium": 2, "large": 1}
    assert [Worker(None, tier, owner="w").slots for tier in ("small", "medium", "large")] == [8, 2, 1]  # type: ignore[arg-type]
    assert Worker(None, "small", owner="w", slots=0).slots == default_slots("small") == 8  # type: ignore[arg-type]
    assert Worker(None, "large", owner="w", slots=3).slots == 3  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Worker(None, "small", owner="w", slots=-1)  # type: ignore[arg-type]
    assert (task_marker_name(42, 0), task_marker_name(42, 2)) == ("42.task", "42.2.task")


def test_three_sleeps_on_three_slots_run_at_the_same_time(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three run-now jobs of 2 s each, waiting in the queue, and a worker with three slots
    job_ids = [
        _submit(deps, ["sh", "-c", 'echo "run $DUETIME_RUN_ID"; sleep 2'], name=f"s{i}") for i in range(3)
    ]
    receives = _spy_receives(deps, monkeypatch)
    worker = Worker(deps, "small", owner="w1", slots=3)
    began = time.monotonic()
    # When it runs
    with _running(worker):
        _wait("the three runs to succeed", lambda: _all_in(deps, job_ids, {RunState.SUCCEEDED}))
        took = time.monotonic() - began
    print(f"three 2 s tasks on three slots: {took:.2f} s; receives {receives[:4]}")
    # Then they ran at the same time: well under the 6 s they take one after the other, started within 1 s
    assert took < 4.5, took
    runs = [_run(deps, j) for j in job_ids]
    starts = [r.attempts[0].started_at for r in runs]
    assert all(s is not None for s in starts)
    assert (max(starts) - min(starts)).total_seconds() < 1.0, starts  # type: ignore[type-var,operator]
    assert _max_overlap(runs) == 3
    # asked for up to its free slots: 3 at first, all three in one receive
    assert receives[0] == (3, 3), receives
    # And each run is one SUCCEEDED attempt, leased by the worker, with its own log
    for run in runs:
        assert [(a.attempt, a.state, a.worker) for a in run.attempts] == [(1, RunState.SUCCEEDED, "w1")]
        assert (run.state, run.exit_code) == (RunState.SUCCEEDED, 0)
        assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps) == f"run {run.run_id}\n"


def _spy_deletes(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records how many messages each ``delete_batch`` of the worker deletes."""
    calls: list[int] = []
    real = deps.queues.delete_batch

    def delete_batch(tier: str, handles: Any) -> None:
        calls.append(len(list(handles)))
        real(tier, handles)

    monkeypatch.setattr(deps.queues, "delete_batch", delete_batch)
    return calls


def test_the_messages_of_runs_started_apart_are_deleted_in_one_request_and_at_the_stop(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker with one slot and three quick runs, started one after the other (a linger of 60 s, so a
    # slow machine's runs still fall in it)
    monkeypatch.setattr(worker_module, "DELETE_LINGER_SECONDS", 60.0)
    deletes = _spy_deletes(deps, monkeypatch)
    job_ids = [_submit(deps, ["true"], name=f"q{i}") for i in range(3)]
    worker = Worker(deps, "small", owner="w1", slots=1)
    # When they all succeed, and the worker is then stopped well within the delete linger
    with _running(worker):
        _wait("the three runs to succeed", lambda: _all_in(deps, job_ids, {RunState.SUCCEEDED}))
        assert deletes == []  # each start's message waits for the others (or the linger), not for its end
        assert deps.queues.counts("small")["in_flight"] == 3  # type: ignore[attr-defined]
    # Then the three messages went in one request, at the stop
    assert deletes == [3]
    assert deps.queues.counts("small") == {"visible": 0, "delayed": 0, "in_flight": 0, "dead": 0}  # type: ignore[attr-defined]


def _three_printing(deps: Deps) -> list[str]:
    return [
        _submit(deps, ["sh", "-c", f'printf "log of {i} %s\\n" "$DUETIME_RUN_ID"; sleep 0.5'], name=f"p{i}")
        for i in range(3)
    ]


def test_runs_that_end_together_store_their_logs_as_one_pack_read_back_by_range(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three run-now jobs that print a line each and end at about the same time, and a lone one later
    job_ids = _three_printing(deps)
    puts: list[str] = []
    real_put = deps.logs.put
    monkeypatch.setattr(deps.logs, "put", lambda key, data: (puts.append(key), real_put(key, data))[1])
    with _running(Worker(deps, "small", owner="w1", slots=3)):
        _wait("the three runs to succeed", lambda: _all_in(deps, job_ids, {RunState.SUCCEEDED}))
        lone = _submit(deps, ["echo", "alone"], name="lone")
        _wait("the lone run to succeed", lambda: _all_in(deps, [lone], {RunState.SUCCEEDED}))
    # Then the three logs went out as one object, a log pack, each attempt naming its byte range in it and
    # keeping its own key (where a reader that knows no packs finds nothing, never the whole pack)
    runs = [_run(deps, j) for j in job_ids]
    records = [run.attempts[0] for run in runs]
    [pack] = {r.log_pack for r in records}
    assert pack is not None and pack.startswith("logs/packs/") and pack in puts
    assert sorted(r.log_offset for r in records) == [0, records[0].log_bytes, 2 * records[0].log_bytes]
    assert all(r.log_key is not None and "/packs/" not in r.log_key for r in records)
    assert all(deps.logs.get(r.log_key) is None for r in records if r.log_key)
    # And each run's log is its own bytes only, through the API's read
    for i, run in enumerate(runs):
        text = jobs.get_run_log(run.run_id, tenant="t1", deps=deps)
        assert text == f"log of {i} {run.run_id}\n"
        assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1) == text
    # And a run that ended alone has its log under its own key, as before
    [alone] = _run(deps, lone).attempts
    assert alone.log_pack is None and alone.log_key is not None
    assert jobs.get_run_log(_run(deps, lone).run_id, tenant="t1", deps=deps) == "alone\n"
    assert len(puts) == 2, puts


def test_a_packed_log_whose_end_another_party_recorded_is_kept_under_the_attempts_own_key(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    import duetime.services.worker as worker_module
    from duetime.services import runs as runs_service

    # Given three runs ending together whose ends a cancel beats to the record (the log is packed by then)
    job_ids = _three_printing(deps)
    real = worker_module.start_and_finish

    def cancel_first(messages: Any, finishes: Any, deps_: Any, **kw: Any) -> Any:
        for finish in finishes:
            runs_service.cancel(finish.run.job_id, finish.run.due_at, deps, reason="user")
        return real(messages, finishes, deps_, **kw)

    monkeypatch.setattr(worker_module, "start_and_finish", cancel_first)
    with _running(Worker(deps, "small", owner="w1", slots=3)):
        _wait("the runs to be cancelled", lambda: _all_in(deps, job_ids, {RunState.CANCELLED}))
        _wait(
            "their logs to be settled",
            lambda: all(deps.logs.get_final(_run(deps, j).attempts[0].log_key or "") for j in job_ids),
        )
    # Then each run's log is its own output, read under the key the cancel recorded
    for i, job_id in enumerate(job_ids):
        run = _run(deps, job_id)
        assert run.attempts[0].log_pack is None
        assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps) == f"log of {i} {run.run_id}\n"


def test_a_slow_log_upload_holds_back_no_start(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker with two slots whose log uploads take 3 s, and a run whose log it is uploading
    putting = threading.Event()
    real_put = deps.logs.put

    def slow_put(key: str, data: bytes) -> None:
        putting.set()
        time.sleep(3.0)
        real_put(key, data)

    monkeypatch.setattr(deps.logs, "put", slow_put)
    with _running(Worker(deps, "small", owner="w1", slots=2)):
        first = _submit(deps, ["echo", "a"], name="a")
        assert putting.wait(10)
        # When a second run comes for the free slot meanwhile
        second = _submit(deps, ["sleep", "0.1"], name="b")
        _wait("both to succeed", lambda: _all_in(deps, [first, second], {RunState.SUCCEEDED}))
    # Then it started at once, not after the upload
    run = _run(deps, second)
    started = run.attempts[0].started_at
    assert started is not None and (started - run.due_at).total_seconds() < 1.5


def test_a_6ea295a_packed_record_is_read_as_its_range_not_the_whole_pack(deps: Deps) -> None:  # noqa: F811
    # Given two runs whose ends were recorded the way 6ea295a's workers recorded packed logs (log_key = the
    # pack, log_offset = the range's start; no log_pack): rows that exist wherever 6ea295a ran
    job_ids = [_submit(deps, ["true"], name=f"legacy{i}") for i in range(2)]
    received = deps.queues.receive("small", max_messages=2, wait_seconds=0)
    started, _ = start_and_finish([m.message for m in received if m.message], [], deps, owner="old-worker")
    pack = pack_key("2026-11-30", "120000-legacy")
    deps.logs.put(pack, b"log of A\nlog of B\n")
    finishes = [
        Finish(
            run,
            run.fencing_token,
            RunState.SUCCEEDED,
            exit_code=0,
            log_key=pack,
            log_bytes=9,
            log_offset=9 * i,
        )
        for i, run in enumerate(r for r in started if not isinstance(r, Exception))
    ]
    start_and_finish([], finishes, deps, owner="old-worker")
    # Then each run's log is its own 9 bytes (HEAD~1's reader: get_range(log_key, log_offset, log_bytes))
    texts = sorted(jobs.get_run_log(_run(deps, j).run_id, tenant="t1", deps=deps) for j in job_ids)
    assert texts == ["log of A\n", "log of B\n"], texts  # HEAD: both get "log of A\nlog of B\n"


def test_ends_are_recorded_before_their_leases_expire_when_the_store_is_slow(
    deps: Deps,
    monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    # Given 24 runs of 12 tenants (one log object each per batch) on a worker with 2 slots, and final log
    # uploads that take 0.6 s each (a slow or throttled object store); leases of 5 s (the fixture)
    real_put = deps.logs.put
    monkeypatch.setattr(deps.logs, "put", lambda key, data: (time.sleep(0.6), real_put(key, data))[1])
    late: list[tuple[str, float]] = []
    real = worker_module.start_and_finish

    def spy(messages: Any, finishes: Any, deps_: Any, **kw: Any) -> Any:
        for finish in finishes:
            now = deps.store.get_run(finish.run.job_id, finish.run.due_at)
            assert now is not None
            if now.lease_expires_at is not None and now.lease_expires_at < deps.clock.now():
                late.append((now.run_id, (deps.clock.now() - now.lease_expires_at).total_seconds()))
        return real(messages, finishes, deps_, **kw)

    monkeypatch.setattr(worker_module, "start_and_finish", spy)
    job_ids = [
        jobs.create_job(
            CreateJobRequest(name=f"q{i}", task=ContainerTask(command=["echo", f"run {i}"])),
            tenant=f"tenant{i % 12}",
            deps=deps,
        ).job_id
        for i in range(24)
    ]
    with _running(Worker(deps, "small", owner="w1", slots=2)):
        _wait("all to succeed", lambda: _all_in(deps, job_ids, {RunState.SUCCEEDED}), timeout=60)
    # Then every end was recorded while its lease still held (else the sweeper fails it worker_lost and
    # runs a task that succeeded again)
    assert not late, f"{len(late)} ends recorded after their lease expired: {late}"


def test_an_exception_in_the_log_thread_loses_no_end(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    # Given a log thread whose store step raises once (any unforeseen fault: the loop has no guard)
    real = Worker._store_logs
    calls = {"n": 0}

    def flaky(self: Worker, batch: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("unforeseen")
        real(self, batch)

    monkeypatch.setattr(Worker, "_store_logs", flaky)
    first = _submit(deps, ["echo", "a"], name="a")
    worker = Worker(deps, "small", owner="w1", slots=1)
    with _running(worker):
        time.sleep(2.0)
        second = _submit(deps, ["echo", "b"], name="b")
        time.sleep(3.0)
        states = [_run(deps, j).state for j in (first, second)]
        alive = worker._log_thread is not None and worker._log_thread.is_alive()
    # Then the ends are still recorded
    assert alive and states == [RunState.SUCCEEDED, RunState.SUCCEEDED], (alive, states)


def test_a_worker_with_two_slots_never_runs_more_than_two(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three run-now jobs of 1.5 s each and a worker with two slots
    job_ids = [_submit(deps, ["sleep", "1.5"], name=f"s{i}") for i in range(3)]
    receives = _spy_receives(deps, monkeypatch)
    worker = Worker(deps, "small", owner="w1", slots=2)
    running: list[int] = []
    began = time.monotonic()
    # When it runs them, the runs RUNNING counted every 50 ms
    with _running(worker):
        while not _all_in(deps, job_ids, {RunState.SUCCEEDED}):
            assert time.monotonic() - began < 20, "the runs did not succeed"
            running.append(sum(_run(deps, j).state is RunState.RUNNING for j in job_ids))
            time.sleep(0.05)
        took = time.monotonic() - began
    print(f"three 1.5 s tasks on two slots: {took:.2f} s; most RUNNING at once {max(running)}")
    # Then never more than two ran at once (as sampled, and as recorded), and two did
    runs = [_run(deps, j) for j in job_ids]
    assert max(running) == 2 and _max_overlap(runs) == 2
    assert took >= 3.0  # two rounds
    # and no receive asked for more than the free slots, nor got more
    assert receives[0] == (2, 2) and all(asked <= 2 and got <= asked for asked, got in receives), receives
    # the third came in a later poll, once a slot (or both, ending together) freed up
    assert [got for _, got in receives if got] == [2, 1], receives
    assert all([(a.attempt, a.state) for a in r.attempts] == [(1, RunState.SUCCEEDED)] for r in runs)


def test_a_lease_lost_on_one_slot_kills_only_that_task(
    deps: Deps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    markers = tmp_path / "workers"
    markers.mkdir()
    monkeypatch.setenv("DUETIME_WORKER_STATE_DIR", str(markers))
    # Given a worker with two slots running two tasks: A (10 s) and B (2.5 s)
    a = _submit(deps, ["sh", "-c", "echo a; sleep 10"], name="a")
    b = _submit(deps, ["sh", "-c", "echo b; sleep 2.5; echo b done"], name="b")
    worker = Worker(deps, "small", owner="w1", slots=2)
    with _running(worker):
        _wait("both runs to run", lambda: _all_in(deps, [a, b], {RunState.RUNNING}))
        # each slot noted its own task's process group
        names = {task_marker_name(os.getpid(), 0), task_marker_name(os.getpid(), 1)}
        _wait("both markers", lambda: {p.name for p in markers.iterdir()} == names, 5)
        groups = {int(p.read_text()) for p in markers.iterdir()}
        assert len(groups) == 2 and all(_group_alive(g) for g in groups)
        # When A is cancelled (the session's next beat finds it cancelled)
        cancelled_at = time.monotonic()
        jobs.cancel_run(_run(deps, a).run_id, tenant="t1", deps=deps)
        # Then A's task is killed at once, B's goes on
        _wait("A's task to die", lambda: sum(_group_alive(g) for g in groups) == 1, 5)
        killed = time.monotonic() - cancelled_at
        assert _run(deps, b).state is RunState.RUNNING
        # And B runs to its end and SUCCEEDS
        _wait("B to succeed", lambda: _run(deps, b).state is RunState.SUCCEEDED, 10)
    print(f"cancelled task killed {killed:.2f} s after the cancel")
    assert killed < 2.0
    run_a, run_b = _run(deps, a), _run(deps, b)
    assert run_a.state is RunState.CANCELLED
    log_a = jobs.get_run_log(run_a.run_id, tenant="t1", deps=deps, attempt=1)
    assert log_a.startswith("a\n") and "run cancelled (cancelled by request); process group killed" in log_a
    assert [(x.attempt, x.state) for x in run_b.attempts] == [(1, RunState.SUCCEEDED)]
    assert jobs.get_run_log(run_b.run_id, tenant="t1", deps=deps) == "b\nb done\n"
    assert not any(_group_alive(g) for g in groups) and list(markers.iterdir()) == []


def test_the_local_stacks_reaper_kills_every_slots_task_of_a_dead_worker(tmp_path: Path) -> None:
    # Given the markers of a dead worker's three slots, and one of another worker whose pid it prefixes
    stack = LocalStack(LocalOptions(state_file=tmp_path / ".duetime" / "local.json"))
    workers = tmp_path / ".duetime" / "workers"
    tasks = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(4)]
    try:
        for slot, task in enumerate(tasks[:3]):
            (workers / task_marker_name(4242, slot)).parent.mkdir(parents=True, exist_ok=True)
            (workers / task_marker_name(4242, slot)).write_text(str(task.pid))
        (workers / task_marker_name(42420, 0)).write_text(str(tasks[3].pid))
        # When the supervisor reaps the dead worker's tasks
        stack._reap_task_of(4242)
        # Then all three of its tasks are killed and their markers gone; the other worker's task lives
        assert [t.wait(timeout=5) for t in tasks[:3]] == [-signal.SIGKILL] * 3
        assert tasks[3].poll() is None
        assert sorted(p.name for p in workers.iterdir()) == ["42420.task"]
    finally:
        for task in tasks:
            if task.poll() is None:
                task.kill()
                task.wait()


def test_a_new_stack_kills_the_tasks_a_killed_stack_left_running_and_only_those(tmp_path: Path) -> None:
    # Given the markers a SIGKILLed stack's workers left: two groups of running Duetime tasks (one whose
    # leader already exited, its child still running), and one marker whose group id now belongs to a
    # process that is not a task (no DUETIME_RUN_ID: a reused id)
    stack = LocalStack(LocalOptions(state_file=tmp_path / ".duetime" / "local.json"))
    workers = tmp_path / ".duetime" / "workers"
    workers.mkdir(parents=True)
    env = {**os.environ, "DUETIME_RUN_ID": "job.1"}
    task = subprocess.Popen(["sleep", "60"], start_new_session=True, env=env)
    grandchild_pid = tmp_path / "grandchild.pid"
    leaderless = subprocess.Popen(
        ["sh", "-c", f"sleep 60 & echo $! > {grandchild_pid}"], start_new_session=True, env=env
    )
    leaderless.wait()
    orphan = int(_wait("the grandchild's pid", lambda: grandchild_pid.read_text().strip()))
    stranger = subprocess.Popen(
        ["sleep", "60"], start_new_session=True, env={k: v for k, v in env.items() if k != "DUETIME_RUN_ID"}
    )
    try:
        (workers / "101.task").write_text(str(task.pid))
        (workers / "102.1.task").write_text(str(leaderless.pid))
        (workers / "103.task").write_text(str(stranger.pid))
        (workers / "104.task").write_text("not a pid")
        # When the new stack starts (before its workers)
        assert stack._reap_leftover_tasks() == 2
        # Then both task groups are dead, the stranger lives, and every marker is gone
        assert task.wait(timeout=5) == -signal.SIGKILL
        _wait(
            "the orphaned grandchild to die", lambda: not Path(f"/proc/{orphan}").exists() or _zombie(orphan)
        )
        assert stranger.poll() is None
        assert list(workers.iterdir()) == []
    finally:
        for proc in (task, stranger):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_sigtermed_worker_process_hands_back_every_running_run_and_exits_0(
    deps: Deps, tmp_path: Path
) -> None:
    # Given a worker process with two slots (`duetime worker --tier small --slots 2`) on the state directory
    markers = tmp_path / "workers"
    markers.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUETIME_", "AWS_"))}
    env.update(
        settings_to_env(deps.settings),
        DUETIME_WORKER_STATE_DIR=str(markers),
        POWERTOOLS_LOG_LEVEL="WARNING",
        POWERTOOLS_METRICS_DISABLED="true",
    )
    env[STOP_BUDGET_ENV] = str(STOP_BUDGET)
    output = (tmp_path / "worker.out").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "duetime", "worker", "--tier", "small", "--slots", "2"],
        cwd=tmp_path,
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    groups: set[int] = set()
    try:
        # running two tasks allowed one attempt each, with a third run waiting for a slot
        once = RetryPolicy(max_attempts=1)
        busy = [
            _submit(deps, ["sh", "-c", "echo begun; sleep 30"], name=f"b{i}", retry=once) for i in range(2)
        ]
        _wait("both runs to run", lambda: _all_in(deps, busy, {RunState.RUNNING}), 30)
        waiting = _submit(deps, ["sh", "-c", "echo third"], name="third", retry=once)
        for job_id in busy:
            owner = _run(deps, job_id).lease_owner or ""
            assert owner.split(":")[1] == str(worker.pid), owner
        names = {task_marker_name(worker.pid, 0), task_marker_name(worker.pid, 1)}
        _wait("both markers", lambda: {p.name for p in markers.iterdir()} == names, 10)
        groups = {int(p.read_text()) for p in markers.iterdir()}
        time.sleep(0.5)
        assert _run(deps, waiting).state is RunState.PENDING  # no slot free: not received
        # When it gets SIGTERM
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=deps.settings.kill_grace_seconds + STOP_BUDGET + 10)
        took = time.monotonic() - sent
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        output.close()
    print(f"worker with two busy slots exited {took:.2f} s after SIGTERM with {code}")
    # Then it exited 0 within its grace and stop budget, both tasks dead, their markers gone
    assert code == 0, (tmp_path / "worker.out").read_text()
    assert took < deps.settings.kill_grace_seconds + STOP_BUDGET, took
    assert not any(_group_alive(g) for g in groups) and list(markers.iterdir()) == []
    # And both runs went back without using up their one attempt (worker_stopped), logs saying why
    for job_id in busy:
        run = _run(deps, job_id)
        assert (run.state, run.dead_lettered, run.max_attempts) == (RunState.RETRY_WAIT, False, 2)
        assert [(a.attempt, a.state, a.reason) for a in run.attempts] == [
            (1, RunState.FAILED, "worker_stopped")
        ]
        log = jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1)
        assert log.startswith("begun\n") and "worker stopping (SIGTERM)" in log
    # and the third, never received, still waits for a worker, untouched
    third = _run(deps, waiting)
    assert (third.state, third.attempts) == (RunState.PENDING, [])


def test_ends_whose_write_failed_are_recorded_on_a_later_try_and_their_tasks_not_run_again(
    deps: Deps, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from duetime.domain.errors import ThrottledError

    # Given four run-now jobs that each append a line to a file (how many times each task ran)
    ran = tmp_path / "ran"
    job_ids = [_submit(deps, ["sh", "-c", f"echo {i} >> {ran}"], name=f"j{i}") for i in range(4)]
    # and a store whose first two writes of attempt ends only fail as if the file stayed locked
    failures = {"left": 2}
    real = deps.store.end_attempts

    def flaky(ends: Any) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise ThrottledError("duetime.sqlite: the write lock stayed taken (injected)")
        return real(ends)

    # (four jobs, four slots: the poll's starts are written first, the ends alone, through end_attempts)
    monkeypatch.setattr(deps.store, "end_attempts", flaky)
    # When a four-slot worker runs them
    with _running(Worker(deps, "small", slots=4)):
        _wait("every run SUCCEEDED", lambda: _all_in(deps, job_ids, {RunState.SUCCEEDED}))
    # Then the ends were tried again and recorded: one attempt each, and each task ran exactly once
    assert failures["left"] == 0
    assert all(len(_run(deps, j).attempts) == 1 for j in job_ids)
    assert sorted(ran.read_text().split()) == ["0", "1", "2", "3"]
