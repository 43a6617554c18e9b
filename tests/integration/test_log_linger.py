"""Lingering log packs (``log_pack_linger_seconds``, the AWS stages' default): a worker records each end at
once and stores the final logs of the ends of several seconds as one object; until it is stored a reader gets
the run's chunks or a note saying so; a stop stores it; a worker killed in the linger loses only the final
logs of runs that streamed no chunk, and says so. On the embedded (SQLite) adapters with a real clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from duetime.config.deps import Deps, sqlite_deps
from duetime.config.settings import settings_to_env
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.clock import FixedClock
from duetime.domain.errors import NotFoundError
from duetime.domain.logs import log_key
from duetime.domain.models import ContainerTask, RetryPolicy, Run, RunState
from duetime.services import jobs
from duetime.services.runs import Finish
from duetime.services.worker import TaskOutcome, Worker, _Ended, _PendingLog
from tests.helpers import running_worker, wait_for
from tests.integration.test_worker_slots import _settings

#: the linger of the tests that see it pass (long enough that a loaded machine's ends all fall in it)
LINGER = 8.0


def _deps(tmp_path: Path, linger: float) -> Deps:
    """The embedded adapters with short leases (test_worker_slots' settings) and a worker linger of ``linger``."""
    return sqlite_deps(_settings(tmp_path, log_pack_linger_seconds=linger))


def _submit(deps: Deps, command: str, name: str) -> str:
    request = CreateJobRequest(
        name=name, task=ContainerTask(command=["sh", "-c", command]), retry=RetryPolicy(max_attempts=1)
    )
    return jobs.create_job(request, tenant="t1", deps=deps).job_id


def _run(deps: Deps, job_id: str) -> Run:
    [run] = deps.store.list_runs(job_id)
    return run


def _spy_puts(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bytes]]:
    puts: list[tuple[str, bytes]] = []
    real = deps.logs.put
    monkeypatch.setattr(deps.logs, "put", lambda key, data: (puts.append((key, data)), real(key, data))[1])
    return puts


def test_ends_within_the_linger_are_recorded_at_once_and_their_logs_stored_as_one_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker with four slots lingering 8 s over its log packs, and four runs that print a line each:
    # three end after 0.5 s, the fourth 1.5 s later
    deps = _deps(tmp_path, LINGER)
    puts = _spy_puts(deps, monkeypatch)
    job_ids = [_submit(deps, f'echo "log of {i}"; sleep 0.5', f"p{i}") for i in range(3)]
    job_ids.append(_submit(deps, 'echo "log of 3"; sleep 2', "p3"))
    with running_worker(Worker(deps, "small", owner="w1", slots=4)):
        wait_for(
            "the four runs to succeed",
            lambda: all(_run(deps, j).state is RunState.SUCCEEDED for j in job_ids),
        )
        first_end = min(a.finished_at for j in job_ids for a in _run(deps, j).attempts if a.finished_at)
        # Then every end is recorded before any log is stored, each naming its range in one pack
        recorded_before_put = puts == []
        runs = [_run(deps, j) for j in job_ids]
        records = [run.attempts[0] for run in runs]
        [pack] = {r.log_pack for r in records}
        assert pack is not None and pack.startswith("logs/packs/")
        # and meanwhile a reader is told the log is on its way (no chunk streamed: the runs are short)
        if recorded_before_put:
            pending = jobs.read_run_log(runs[3].run_id, tenant="t1", deps=deps)
            assert pending.pending == "note" and "is not stored yet" in pending.text
        # And within the linger the pack is stored, in one PUT for the four logs
        wait_for("the pack to be stored", lambda: bool(puts), LINGER + 10)
        stored_after = (deps.clock.now() - first_end).total_seconds()
    assert recorded_before_put, puts
    assert [key for key, _ in puts] == [pack]
    assert stored_after >= LINGER - 1, stored_after
    assert sorted(r.log_offset or 0 for r in records) == [0, 9, 18, 27]
    for i, run in enumerate(runs):
        assert jobs.read_run_log(run.run_id, tenant="t1", deps=deps) == jobs.RunLog(f"log of {i}\n")
        assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1) == f"log of {i}\n"


def test_a_stopping_worker_stores_its_lingering_pack_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker lingering 60 s over its log packs, and two runs it ended
    deps = _deps(tmp_path, 60.0)
    puts = _spy_puts(deps, monkeypatch)
    job_ids = [_submit(deps, f'echo "stop {i}"', f"s{i}") for i in range(2)]
    worker = Worker(deps, "small", owner="w1", slots=2)
    with running_worker(worker):
        wait_for(
            "both runs to succeed", lambda: all(_run(deps, j).state is RunState.SUCCEEDED for j in job_ids)
        )
        assert puts == []
        stopping = time.monotonic()
    # When it is stopped, well within the linger: then the pack is stored on the way out, at once
    took = time.monotonic() - stopping
    assert len(puts) == 1 and puts[0][0].startswith("logs/packs/"), puts
    assert took < 10, took
    for i, job_id in enumerate(job_ids):
        assert jobs.get_run_log(_run(deps, job_id).run_id, tenant="t1", deps=deps) == f"stop {i}\n"


def test_a_failed_pack_upload_stores_each_log_under_its_own_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker lingering 1 s whose object store refuses the pack (and only the pack)
    deps = _deps(tmp_path, 1.0)
    real = deps.logs.put

    def refuse_packs(key: str, data: bytes) -> None:
        if key.startswith("logs/packs/"):
            raise OSError("the object store refused the pack")
        real(key, data)

    monkeypatch.setattr(deps.logs, "put", refuse_packs)
    job_ids = [_submit(deps, f'echo "own {i}"', f"o{i}") for i in range(2)]
    with running_worker(Worker(deps, "small", owner="w1", slots=2)):
        wait_for(
            "both runs to succeed", lambda: all(_run(deps, j).state is RunState.SUCCEEDED for j in job_ids)
        )
        # Then each log lands under the attempt's own key, where a reader looks when the pack is missing
        wait_for(
            "the logs under their own keys",
            lambda: all(deps.logs.get_final(_run(deps, j).attempts[0].log_key or "") for j in job_ids),
            15,
        )
    for i, job_id in enumerate(job_ids):
        run = _run(deps, job_id)
        assert run.attempts[0].log_pack is not None  # recorded before the upload failed
        assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps) == f"own {i}\n"


def test_a_sigkilled_worker_loses_only_the_lingering_logs_of_runs_that_streamed_no_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker process lingering 60 s over its log packs, streaming chunks every 1 s
    deps = _deps(tmp_path, 60.0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUETIME_", "AWS_"))}
    env.update(
        settings_to_env(deps.settings), POWERTOOLS_LOG_LEVEL="WARNING", POWERTOOLS_METRICS_DISABLED="true"
    )
    env["DUETIME_TEST_FLUSH_SECONDS"] = "1"
    output = (tmp_path / "worker.out").open("wb")
    code = (
        "import os, sys, duetime.services.worker as w; "
        "w.FLUSH_SECONDS = float(os.environ['DUETIME_TEST_FLUSH_SECONDS']); "
        "from duetime.cli.main import main; sys.argv = ['duetime', 'worker', '--tier', 'small', '--slots', '2']; "
        "main()"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # and two runs it ends: a quick one, and one that prints for 3 s (its chunks streamed meanwhile)
        quick = _submit(deps, 'echo "quick"', "quick")
        slow = _submit(deps, 'for i in 1 2 3; do echo "slow $i"; sleep 1; done', "slow")
        wait_for(
            "both runs to succeed",
            lambda: all(_run(deps, j).state is RunState.SUCCEEDED for j in (quick, slow)),
            30,
        )
        # When it is killed with SIGKILL inside the linger, before it stored the pack
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        output.close()
    quick_run, slow_run = _run(deps, quick), _run(deps, slow)
    assert quick_run.attempts[0].log_pack is not None and slow_run.attempts[0].log_pack is not None
    # Then the run that streamed chunks keeps its output up to its last chunk (what it printed after that, at
    # most one chunk interval, went with the worker), read from them: marked pending while the linger may
    # still hold its pack, then as it is
    full = "slow 1\nslow 2\nslow 3\n"
    streamed = jobs.read_run_log(slow_run.run_id, tenant="t1", deps=deps)
    assert streamed.pending == "partial" and streamed.text.startswith("slow 1\n"), streamed
    assert full.startswith(streamed.text), streamed
    # And the quick run's log reads as on its way while the linger may hold it, then as lost: never another
    # attempt's log, never an error
    assert "is not stored yet" in jobs.get_run_log(quick_run.run_id, tenant="t1", deps=deps)
    ended = quick_run.attempts[0].finished_at
    assert ended is not None
    later = replace(deps, clock=FixedClock(ended + timedelta(seconds=60 + jobs.PACK_LOST_AFTER_SECONDS + 1)))
    assert jobs.get_run_log(quick_run.run_id, tenant="t1", deps=later) == (
        "duetime: the log of attempt 1 was lost: its worker stopped before storing it\n"
    )
    hour_later = replace(deps, clock=FixedClock(ended + timedelta(hours=1)))
    assert jobs.read_run_log(slow_run.run_id, tenant="t1", deps=hour_later) == jobs.RunLog(streamed.text)


def test_chunks_stay_when_the_pack_and_the_own_key_failed_before_the_end_was_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a lingering worker and an attempt that streamed one chunk, whose end joins the pack
    deps = _deps(tmp_path, 60.0)
    job_id = _submit(deps, "true", "a")
    run = _run(deps, job_id)
    key = log_key(run.job_id, run.run_id, run.attempt)
    deps.logs.put_chunk(key, 0, b"streamed part\n")
    worker = Worker(deps, "small", owner="w1")
    finish = Finish(run, run.fencing_token, RunState.SUCCEEDED, log_key=key, log_bytes=20)
    log = _PendingLog(key, b"streamed part\ntail\n", 1)
    ended = _Ended(None, finish, TaskOutcome(0, False, False), log=log)  # type: ignore[arg-type]
    worker._linger_logs([ended])
    # When the object store refuses every PUT as the pack is stored (the worker's stop: its finally stores
    # the pack before the session has recorded the last ends), and the end's record comes after

    def refuse(key: str, data: bytes) -> None:
        raise OSError("store unreachable")

    monkeypatch.setattr(deps.logs, "put", refuse)
    worker._store_lingering(due_only=False)
    ended.recorded = run  # the worker's record stands
    worker._settle_logs([ended], [])  # the log thread is gone: _clean runs here
    # Then the chunks are still the attempt's log (they are the only copy of its output)
    assert deps.logs.get(key) == b"streamed part\n"


def test_a_pack_expired_by_the_logs_lifecycle_is_not_reported_as_lost_with_its_worker(tmp_path: Path) -> None:
    # Given a run whose log was stored in a pack (linger 1 s), long ago
    deps = _deps(tmp_path, 1.0)
    job_id = _submit(deps, "echo hello", "x")
    with running_worker(Worker(deps, "small", owner="w1")):
        wait_for("the run to succeed", lambda: _run(deps, job_id).state is RunState.SUCCEEDED)
        wait_for(
            "its log",
            lambda: jobs.get_run_log(_run(deps, job_id).run_id, tenant="t1", deps=deps) == "hello\n",
        )
    run = _run(deps, job_id)
    record = run.attempts[0]
    assert record.log_pack is not None and record.finished_at is not None
    # When the logs bucket's lifecycle expired the pack (an archived run's log over 128 KB goes this way)
    deps.logs.path(record.log_pack).unlink()
    later = replace(deps, clock=FixedClock(record.finished_at + timedelta(days=400)))
    # Then the log is not found, as for any expired log: no claim that its worker stopped before storing it
    with pytest.raises(NotFoundError):
        jobs.get_run_log(run.run_id, tenant="t1", deps=later, attempt=1)
