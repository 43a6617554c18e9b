"""The local stack's API is served by several processes sharing one listening socket (issue 15)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack

pytestmark = pytest.mark.e2e

CRON_JOB = {"schedule": {"expression": "cron(0 3 * * ? *)"}, "task": {"command": ["true"]}}


def _api_processes(stack: Stack) -> list[int]:
    """Pids of the stack's API processes (its children running duetime.local.api_process)."""
    out = subprocess.run(
        ["pgrep", "-P", str(stack.proc.pid), "-f", "duetime.local.api_process"],
        capture_output=True,
        text=True,
        check=False,
    )
    return sorted(int(p) for p in out.stdout.split())


def test_two_api_processes_serve_concurrent_clients_and_a_killed_one_is_replaced(tmp_path: Path) -> None:
    # Given a stack with two API processes
    stack = start_stack(tmp_path, "--api-processes", "2")
    try:
        first = _api_processes(stack)
        assert len(first) == 2
        # When 8 clients submit 80 jobs at once
        with ThreadPoolExecutor(8) as pool:
            answers = list(
                pool.map(lambda i: stack.request("POST", "/jobs", {**CRON_JOB, "name": f"c{i}"}), range(80))
            )
        # Then every submit is stored once
        assert [status for status, _ in answers] == [201] * 80
        _, listed = stack.request("GET", "/jobs?limit=100")
        assert len({j["job_id"] for j in listed["jobs"]}) == 80

        # When one API process is SIGKILLed, the other keeps answering every request meanwhile
        os.kill(first[0], signal.SIGKILL)
        statuses = [stack.request("GET", "/healthz")[0] for _ in range(30)]
        assert statuses == [200] * 30
        # and the stack starts a replacement within a few seconds
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            now = _api_processes(stack)
            if len(now) == 2 and first[0] not in now:
                break
            time.sleep(0.3)
        assert len(now) == 2 and first[0] not in now, now
        assert any(f"API process {first[0]} exited" in line for line in stack.output)
        # and the replacement answers too (both processes take connections from the one socket)
        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(lambda _: stack.request("GET", "/healthz")[0], range(40))) == {200}
    finally:
        assert stop_stack(stack) == 0
    # When the stack stops, no API process is left behind
    for pid in first:
        assert (
            not Path(f"/proc/{pid}").exists()
            or b"api_process" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        )


def test_api_processes_zero_serves_the_api_from_the_stack_process(tmp_path: Path) -> None:
    stack = start_stack(tmp_path, "--api-processes", "0")
    try:
        assert _api_processes(stack) == []
        status, job = stack.request("POST", "/jobs", {**CRON_JOB, "name": "in-thread"})
        assert status == 201 and job["name"] == "in-thread"
    finally:
        assert stop_stack(stack) == 0


@pytest.mark.parametrize("processes", ["2", "0"])
def test_an_api_port_in_use_is_a_clear_error_naming_it(tmp_path: Path, processes: str) -> None:
    # Given a port another program listens on
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        # When a stack is asked to serve its API there
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DUETIME_"))}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "duetime",
                "local",
                "--no-demo",
                "--api-port",
                str(port),
                "--api-processes",
                processes,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        taken.close()
    # Then it exits 1 naming the port and what to do, without a traceback
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "--api-port" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
