"""Start the real local stack (`duetime local`) in a temporary directory and talk to it over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Stack:
    proc: subprocess.Popen[str]
    api: str
    workdir: Path
    output: list[str] = field(default_factory=list)

    def request(
        self, method: str, path: str, body: Any = None, *, token: str | None = None
    ) -> tuple[int, Any]:
        """``method path`` with a JSON ``body``; ``token``: as that tenant (``Authorization: Bearer``)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.api + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                raw, status, ctype = resp.read(), resp.status, resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            raw, status, ctype = exc.read(), exc.code, exc.headers.get("Content-Type", "")
        text = raw.decode()
        return status, (json.loads(text) if ctype.startswith("application/json") else text)

    def wait_run(
        self,
        job_id: str,
        states: set[str],
        *,
        timeout: float = 30.0,
        count: int = 1,
        token: str | None = None,
    ) -> list[dict]:
        """Poll until ``count`` runs of ``job_id`` are in ``states``; returns the runs (newest first)."""
        deadline = time.monotonic() + timeout
        runs: list[dict] = []
        while time.monotonic() < deadline:
            _, body = self.request("GET", f"/jobs/{job_id}/runs?limit=50", token=token)
            runs = body["runs"]
            if sum(r["state"] in states for r in runs) >= count:
                return runs
            time.sleep(0.3)
        raise AssertionError(
            f"runs of {job_id} never reached {states}: {runs}\n" + "".join(self.output[-40:])
        )


def local_argv(*extra: str, backend: str = "sqlite") -> list[str]:
    """``duetime local`` on ``backend`` on a free API port, without demo jobs, then ``extra``."""
    return [
        sys.executable,
        "-m",
        "duetime",
        "local",
        "--api-port",
        "0",
        "--no-demo",
        "--backend",
        backend,
        *extra,
    ]


def stack_env() -> dict[str, str]:
    """This environment without ``AWS_*`` and ``DUETIME_*``: a stack makes its own."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DUETIME_"))}


def start_stack(workdir: Path, *extra: str, backend: str = "sqlite") -> Stack:
    """``duetime local`` in ``workdir`` on ``backend`` (the default one: sqlite; "moto" for the AWS
    adapters), once it says Ready. One API process unless ``extra`` says otherwise (the default, one per
    core, costs each of the suite's stacks another process start; tests/e2e/test_api_processes.py covers
    several)."""
    if "--api-processes" not in extra:
        extra = ("--api-processes", "1", *extra)
    cmd = local_argv(*extra, backend=backend)
    env = stack_env()
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    output: list[str] = []
    api = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError("duetime local exited early:\n" + "".join(output))
        output.append(line)
        if line.startswith("API: "):
            api = line.split()[1]
        if line.startswith("Ready"):
            break
    stack = Stack(proc=proc, api=api, workdir=workdir, output=output)

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            output.append(line)

    threading.Thread(target=pump, daemon=True).start()
    return stack


def stop_stack(stack: Stack) -> int:
    stack.proc.send_signal(signal.SIGTERM)
    try:
        return stack.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(stack.proc.pid, signal.SIGKILL)
        stack.proc.wait()
        raise


#: the e2e stacks' options: a tick a second, one worker per tier, short leases and grace (seconds, not minutes)
FAST = (
    "--tick-seconds",
    "1",
    "--workers",
    "1",
    "--lease-seconds",
    "4",
    "--heartbeat-seconds",
    "1",
    "--pending-grace-seconds",
    "5",
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("stack")
    s = start_stack(workdir, *FAST)
    yield s
    stop_stack(s)
