"""Live logs (DESIGN.md section 7): the worker streams a running task's output to S3 as chunks, so a RUNNING
run's log grows while it runs and a killed attempt keeps what it printed; the final object replaces them."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.dynamodb import Update
from duetime.adapters.aws.resources import ResourceNames
from duetime.adapters.aws.s3_logs import S3Logs, chunk_key, chunk_prefix
from duetime.config.deps import Deps, deps_from_settings
from duetime.config.settings import settings_to_env
from duetime.domain.api_models import CreateJobRequest
from duetime.domain.clock import FixedClock, SystemClock
from duetime.domain.errors import NotFoundError
from duetime.domain.logs import log_key
from duetime.domain.models import ContainerTask, RetryPolicy, Run, RunState
from duetime.local.stack import LOCAL_AWS_ENV
from duetime.services import jobs, runs
from duetime.services.runs import message_for
from duetime.services.sweeper import sweep
from duetime.services.worker import CHUNK_BYTES, FLUSH_SECONDS, LiveLog, Worker
from tests.conftest import make_settings
from tests.faults.conftest import running_moto


def _submit(deps: Deps, command: list[str], **kw: Any) -> str:
    job = jobs.create_job(
        CreateJobRequest(name="t", task=ContainerTask(command=command), **kw), tenant="t1", deps=deps
    )
    return job.job_id


def _chunks_left(deps: Deps, key: str) -> list[str]:
    out = aws.client("s3").list_objects_v2(Bucket=deps.settings.logs_bucket, Prefix=chunk_prefix(key))
    return [o["Key"] for o in out.get("Contents", [])]


def _is_running(deps: Deps, run: Run) -> bool:
    now = deps.store.get_run(run.job_id, run.due_at)
    return now is not None and now.state is RunState.RUNNING


def _wait(what: str, probe: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def fast_deps(aws_mock: None, names: ResourceNames, clock: FixedClock) -> Deps:
    """Heartbeats every 0.3 s, so a fenced-off worker notices at once."""
    return deps_from_settings(make_settings(names, heartbeat_seconds=0.3), clock)


# ---- the store -------------------------------------------------------------------------------------------
def test_the_log_store_serves_the_final_object_else_the_chunks_in_order_else_nothing(deps: Deps) -> None:
    logs: S3Logs = deps.logs
    key = log_key("j", "j.1", 1)
    assert logs.get(key) is None
    # chunks stored out of order (and past 9, 99: key order is number order) read back in order
    for seq in (10, 2, 0, 1, *range(3, 10), 100, *range(11, 100)):
        logs.put_chunk(key, seq, f"<{seq}>".encode())
    assert logs.get(key) == b"".join(f"<{n}>".encode() for n in range(101))
    assert chunk_key(key, 7) == f"{key}.live/000007" and not chunk_key(key, 7).startswith(key + "/")
    # the final object wins over the chunks; another attempt's key sees neither
    logs.put(key, b"final")
    assert logs.get(key) == b"final"
    assert logs.get(log_key("j", "j.1", 2)) is None
    # chunks are deleted by count (no listing) or by listing
    logs.delete_chunks(key, count=50)
    assert len(_chunks_left(deps, key)) == 51
    logs.delete_chunks(key)
    assert _chunks_left(deps, key) == []
    other = log_key("j", "j.1", 3)
    logs.put_chunk(other, 0, b"only chunk")
    assert logs.get(other) == b"only chunk"


# ---- the stream ------------------------------------------------------------------------------------------
class _Recorder:
    def __init__(self, fail: int = 0) -> None:
        self.chunks: list[tuple[int, bytes]] = []
        self.fail = fail

    def put_chunk(self, key: str, seq: int, data: bytes) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError("S3 is down")
        self.chunks.append((seq, data))


def test_the_stream_flushes_new_output_every_5_s_or_64_kb_and_stops_at_the_log_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = _Recorder(fail=1)
    with tempfile.TemporaryFile() as out:
        live = LiveLog(recorder, "k", out, started=100.0)  # type: ignore[arg-type]
        live.poll(110.0)
        assert recorder.chunks == []  # no output: nothing, however long
        os.write(out.fileno(), b"a" * 10)
        live.poll(110.0)  # new output, 10 s since the last chunk: flush, but S3 fails
        assert recorder.chunks == [] and (live.chunks, live.flushed) == (0, 0)
        live.poll(113.0)  # retried after a whole interval, not at every 0.5 s look
        assert recorder.chunks == []
        live.poll(115.0)
        assert recorder.chunks == [(0, b"a" * 10)]
        os.write(out.fileno(), b"b" * 10)
        live.poll(119.9)
        assert len(recorder.chunks) == 1  # less than 5 s and less than 64 KB since the last chunk
        live.poll(120.0)
        assert recorder.chunks[1] == (1, b"b" * 10)
        os.write(out.fileno(), b"c" * CHUNK_BYTES)
        live.poll(120.1)  # 64 KB: at once
        assert recorder.chunks[2] == (2, b"c" * CHUNK_BYTES)
        # a long run flushes at most every 1% of its age (here 2,000 s old: 20 s)
        os.write(out.fileno(), b"d")
        live.poll(2100.0)
        os.write(out.fileno(), b"e")
        live.poll(2100.0 + FLUSH_SECONDS + 1)
        assert recorder.chunks[-1] == (3, b"d")
        live.poll(2121.0)
        assert recorder.chunks[-1] == (4, b"e")
        # past MAX_LOG_BYTES nothing more is streamed (the final object keeps head and tail)
        monkeypatch.setattr("duetime.services.worker.MAX_LOG_BYTES", live.flushed + 5)
        os.write(out.fileno(), b"f" * CHUNK_BYTES)
        live.poll(2200.0)
        live.poll(2300.0)
        assert recorder.chunks[-1] == (5, b"fffff") and live.chunks == 6


# ---- the worker ------------------------------------------------------------------------------------------
def test_a_running_runs_log_grows_while_it_runs_and_ends_as_one_object(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("duetime.services.worker.FLUSH_SECONDS", 0.5)
    # Given a task that prints a line every 0.1 s for 6 s (long enough to be read twice on a loaded machine)
    job_id = _submit(deps, ["sh", "-c", "for i in $(seq 1 60); do echo line $i; sleep 0.1; done"])
    [run] = deps.store.list_runs(job_id)
    worker = threading.Thread(target=Worker(deps, "small", owner="w1").poll_once)
    worker.start()
    try:
        # When its log is read twice while it runs
        first = _wait("a first chunk", lambda: jobs.get_run_log(run.run_id, tenant="t1", deps=deps))
        time.sleep(1.2)
        second = jobs.get_run_log(run.run_id, tenant="t1", deps=deps)
        assert _is_running(deps, run)
    finally:
        worker.join(timeout=20)
    # Then the second read is longer, and what the first showed is where it began
    assert "line 1\n" in first and len(second) > len(first) and second.startswith(first)
    # And once it ended, the log is the final object, every line once, its chunks gone
    [run] = deps.store.list_runs(job_id)
    assert run.state is RunState.SUCCEEDED
    final = jobs.get_run_log(run.run_id, tenant="t1", deps=deps)
    assert final.splitlines() == [f"line {i}" for i in range(1, 61)]
    assert _chunks_left(deps, log_key(job_id, run.run_id, 1)) == []


def test_a_run_shorter_than_the_flush_interval_streams_nothing(deps: Deps) -> None:
    puts: list[int] = []
    real = deps.logs.put_chunk
    deps.logs.put_chunk = lambda key, seq, data: (puts.append(seq), real(key, seq, data))  # type: ignore[method-assign]
    job_id = _submit(deps, ["sh", "-c", "echo hi; sleep 1; echo bye"])
    assert Worker(deps, "small", owner="w1").poll_once() == 1
    [run] = deps.store.list_runs(job_id)
    assert run.state is RunState.SUCCEEDED and puts == []
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps) == "hi\nbye\n"


def test_streaming_stops_at_the_log_limit_and_a_failed_chunk_delete_keeps_the_outcome(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("duetime.services.worker.MAX_LOG_BYTES", 1000)
    monkeypatch.setattr("duetime.services.worker.CHUNK_BYTES", 150)

    def broken_delete(key: str, count: int | None = None) -> None:
        raise OSError("S3 refused the delete")

    monkeypatch.setattr(deps.logs, "delete_chunks", broken_delete)
    # Given a task that prints 101-byte lines, 20 of them over 2 s, then stays 2 s more: a poll of the live log
    # after the limit was printed always comes before the end, however loaded the machine
    job_id = _submit(
        deps, ["sh", "-c", 'for i in $(seq 1 20); do printf "%0100d\\n" $i; sleep 0.1; done; sleep 2']
    )
    # When it runs and deleting its chunks afterwards fails
    assert Worker(deps, "small", owner="w1").poll_once() == 1
    # Then the run still SUCCEEDED with its final log (head and tail of 2,020 bytes)
    [run] = deps.store.list_runs(job_id)
    assert run.state is RunState.SUCCEEDED
    key = log_key(job_id, run.run_id, 1)
    final = jobs.get_run_log(run.run_id, tenant="t1", deps=deps)
    assert "bytes elided by duetime" in final and final.endswith(f"{20:0100d}\n")
    # and what was streamed stopped at the limit: exactly its first 1,000 bytes
    left = sorted(_chunks_left(deps, key))
    assert left  # how many chunks depends on when the live log's polls came (a loaded machine: fewer)
    body = b"".join(
        aws.client("s3").get_object(Bucket=deps.settings.logs_bucket, Key=k)["Body"].read() for k in left
    )
    assert len(body) == 1000 and body == b"".join(f"{i:0100d}\n".encode() for i in range(1, 11))[:1000]


def test_a_cancelled_runs_log_says_it_was_cancelled_and_a_superseded_one_says_lease_lost(
    fast_deps: Deps,
) -> None:
    deps = fast_deps
    cancelled = _submit(deps, ["sh", "-c", "echo started; sleep 10"])
    superseded = _submit(deps, ["sh", "-c", "echo started; sleep 10"])
    for job_id, fence in ((cancelled, "cancel"), (superseded, "token")):
        [run] = deps.store.list_runs(job_id)
        worker = threading.Thread(target=Worker(deps, "small", owner="w1").poll_once)
        worker.start()
        _wait("the run to start", functools.partial(_is_running, deps, run))
        if fence == "cancel":  # POST /runs/{id}/cancel
            jobs.cancel_run(run.run_id, tenant="t1", deps=deps)
        else:  # another party took the lease (the sweeper, the timeout handler): the token moved on
            deps.store._update_run(run.job_id, run.due_at, Update(adds={"fencing_token": 1}))
        worker.join(timeout=10)
        assert not worker.is_alive()
        log = jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1)
        assert log.startswith("started\n")
        if fence == "cancel":
            assert "duetime: run cancelled (cancelled by request); process group killed" in log
            assert "lease lost" not in log
        else:
            assert "duetime: lease lost (fencing token superseded); process group killed" in log
            assert "cancelled" not in log


# ---- reading a run's log ---------------------------------------------------------------------------------
def test_the_log_of_a_running_attempt_and_of_a_lost_workers_attempt_come_from_its_chunks(
    deps: Deps, clock: FixedClock
) -> None:
    # Given a run whose attempt 1 is RUNNING and has streamed nothing yet
    job_id = _submit(deps, ["true"], retry=RetryPolicy(max_attempts=2))
    [run] = deps.store.list_runs(job_id)
    run = runs.start(message_for(run), deps, owner="w1")
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps) == ""
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1) == ""
    # When its worker streams two chunks
    key = log_key(job_id, run.run_id, 1)
    deps.logs.put_chunk(key, 0, b"one\n")
    deps.logs.put_chunk(key, 1, b"two\n")
    # Then the run's log, and attempt 1's, is its output so far
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps) == "one\ntwo\n"
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1) == "one\ntwo\n"
    # And when the worker dies (no final object) and the sweeper fails the attempt worker_lost
    clock.advance(deps.settings.lease_seconds + 1)
    for shard in range(deps.settings.shard_count):
        sweep(shard, deps)
    run = deps.store.get_run(run.job_id, run.due_at)  # type: ignore[assignment]
    assert run.state is RunState.RETRY_WAIT and run.attempts[0].reason == "worker_lost"
    # Then attempt 1's log is still what it streamed, explicitly or as the latest log
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1) == "one\ntwo\n"
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps) == "one\ntwo\n"
    with pytest.raises(NotFoundError):
        jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=2)


def test_an_attempt_that_left_neither_a_final_log_nor_a_chunk_is_a_404(deps: Deps, clock: FixedClock) -> None:
    job_id = _submit(deps, ["true"], retry=RetryPolicy(max_attempts=2))
    [run] = deps.store.list_runs(job_id)
    runs.start(message_for(run), deps, owner="w1")
    clock.advance(deps.settings.lease_seconds + 1)
    for shard in range(deps.settings.shard_count):
        sweep(shard, deps)
    with pytest.raises(NotFoundError):
        jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1)
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps) == ""  # the latest log: there is none


# ---- a real worker process, SIGKILLed --------------------------------------------------------------------
#: 1,000 lines over 10 s, each at its own time (line i at start + i/100 s), then a long sleep
PRINTER = (
    "import sys, time\n"
    "t0 = time.time()\n"
    "for i in range(1000):\n"
    "    time.sleep(max(0.0, t0 + i / 100 - time.time()))\n"
    "    print(f'line {i} {time.time() - t0:.3f}', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def moto_deps(monkeypatch: pytest.MonkeyPatch) -> Iterator[Deps]:
    """Deps on a moto server of its own (a worker process can reach it), short leases, real time."""
    with running_moto() as endpoint:
        for key, value in LOCAL_AWS_ENV.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        aws.reset_clients()
        settings = make_settings(ResourceNames.for_prefix("stream"), lease_seconds=3, heartbeat_seconds=1)
        yield deps_from_settings(settings, SystemClock())
    aws.reset_clients()


def test_a_sigkilled_workers_attempt_keeps_the_output_it_printed_until_its_last_chunk(
    moto_deps: Deps, tmp_path: Path
) -> None:
    deps = moto_deps
    # Given a worker process running a task that prints 1,000 lines over 10 s
    job_id = _submit(deps, [sys.executable, "-c", PRINTER], retry=RetryPolicy(max_attempts=2))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    env.update(settings_to_env(deps.settings), DUETIME_WORKER_STATE_DIR=str(tmp_path))
    worker = subprocess.Popen(
        [sys.executable, "-m", "duetime", "worker", "--tier", "small"],
        cwd=tmp_path,
        env=env,
        start_new_session=True,
    )
    try:
        [run] = deps.store.list_runs(job_id)
        _wait("the run to start", functools.partial(_is_running, deps, run), 30)
        started = time.monotonic()  # the task starts a few ms after the run does
        marker = tmp_path / f"{worker.pid}.task"
        task_group = int(
            _wait("the task's process group", lambda: marker.exists() and marker.read_text(), 10)
        )
        # When the worker dies with its task (SIGKILL to both, as a container's end would) 9.3 s in, shortly
        # before its second chunk (due at 10 s)
        time.sleep(9.3 - (time.monotonic() - started))
        killed_at = time.monotonic() - started
        worker.kill()
        os.killpg(task_group, signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    # Then attempt 1's log holds every line printed until its last chunk, the one at 5 s: the lines of the
    # last ~4.3 s, no more than one flush interval, are lost
    lines = jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1).splitlines()
    assert [line.split()[1] for line in lines] == [str(i) for i in range(len(lines))]
    last_printed_at = float(lines[-1].split()[2])
    print(
        f"killed {killed_at:.2f} s in; log holds {len(lines)} lines, the last printed {last_printed_at:.2f} s in"
    )
    assert FLUSH_SECONDS - 0.5 <= last_printed_at <= FLUSH_SECONDS + 1.5, (killed_at, last_printed_at)
    assert killed_at - last_printed_at <= FLUSH_SECONDS
    assert 100 * (FLUSH_SECONDS - 0.5) <= len(lines) <= 100 * (FLUSH_SECONDS + 1.5)

    # And once the sweeper fails the lost attempt (its worker session's lease ends 3 s after the kill),
    # attempt 1's log is still that output
    def swept() -> Run | None:
        for shard in range(deps.settings.shard_count):
            sweep(shard, deps)
        now = deps.store.get_run(run.job_id, run.due_at)
        return now if now is not None and now.attempts else None

    after = _wait("the sweeper to fail the lost attempt", swept, 10)
    assert after is not None and after.attempts[0].reason == "worker_lost"
    assert jobs.get_run_log(run.run_id, tenant="t1", deps=deps, attempt=1).splitlines() == lines
