"""Stopping under faults: `duetime local` SIGKILLed over and over with every tier busy, and a worker told to
stop while its AWS hangs (its stop deadline, not its loop, ends it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from duetime.services.worker import LOOP_STUCK_SECONDS, STOP_BUDGET_ENV
from tests.e2e.test_signals import MARK_ENV, kill9_with_every_tier_busy, stack_processes
from tests.faults.conftest import FAST, Stack, alive, wait_for

pytestmark = pytest.mark.faults

#: `make faults` (DUETIME_FAULTS_FULL=1) also runs the slower variants
FULL = os.environ.get("DUETIME_FAULTS_FULL") == "1"


@pytest.mark.skipif(not FULL, reason="make faults only")
def test_a_stack_sigkilled_twenty_times_in_a_row_never_leaves_a_process_behind(tmp_path: Path) -> None:
    took = [kill9_with_every_tier_busy(tmp_path / f"round{i}") for i in range(20)]
    print(f"last process gone after: max {max(took):.1f} s, mean {sum(took) / len(took):.1f} s")


@pytest.mark.skipif(not FULL, reason="make faults only")
def test_a_worker_told_to_stop_while_its_aws_hangs_kills_its_task_and_exits_after_its_budget(
    stacks: Callable[..., Stack], tmp_path: Path
) -> None:
    # Given a stack without workers of its own, and a worker started by hand (stop budget 2 s)
    stack = stacks(tmp_path / "stack", *FAST, "--workers", "0")
    state = json.loads((stack.workdir / ".duetime" / "local.json").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DUETIME_"))}
    env.update(state["env"], DUETIME_WORKER_STATE_DIR=str(tmp_path))
    env[STOP_BUDGET_ENV] = "2"
    worker = subprocess.Popen(
        [sys.executable, "-m", "duetime", "worker", "--tier", "small"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    moto = [p for p in stack_processes(stack.proc.pid, "-") if b"moto_server" in _cmdline(p)]
    assert len(moto) == 1, moto
    try:
        # running a task
        body = {
            "name": "hang",
            "task": {"kind": "container", "command": ["sleep", "300"], "env": {MARK_ENV: "h"}},
        }
        status, job = stack.request("POST", "/jobs", body)
        assert status == 201, job
        [run] = stack.wait_run(job["job_id"], {"RUNNING"}, timeout=30)
        assert int(run["lease_owner"].split(":")[1]) == worker.pid
        marker = tmp_path / f"{worker.pid}.task"
        task = int(wait_for("the task's marker", lambda: marker.exists() and marker.read_text(), timeout=10))
        # When AWS stops answering (moto's server frozen: the worker session's next beat hangs) and the worker
        # is told to stop
        os.kill(moto[0], signal.SIGSTOP)
        time.sleep(1.5)
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=20)
        took = time.monotonic() - sent
        # Then the task is stopped (by its slot at once: the hanging beat is the session thread's, not the
        # slot's; else by the stop deadline LOOP_STUCK_SECONDS after the stop) and the worker exits once its
        # 2 s budget for the hand-back, which the hanging store never lets finish, is up after that
        assert not alive(task), "the task outlived its worker"
        print(f"worker exited {took:.1f} s after SIGTERM with {code}")
        assert code == 1 and 2 - 0.5 <= took <= LOOP_STUCK_SECONDS + 2 + 3, (code, took)
        assert worker.stderr is not None and b"not stopped 2 s after its task" in worker.stderr.read()
    finally:
        os.kill(moto[0], signal.SIGCONT)
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
