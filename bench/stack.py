"""Start the real local stack (``duetime local``) in a temporary directory, watch it, and stop it.

The stack runs as it does for a user: one ``duetime local`` process (HTTP API, clock loop with tick and
sweeper in-process), moto's server as its child, and ``duetime worker`` processes. The bench talks to moto
with its own uncounted boto3 clients and reads progress from the workers' echo lines on the stack's stdout,
so watching the stack costs it nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

#: fake credentials for the bench's own clients (moto accepts anything)
FAKE_CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "aws_session_token": "testing",
    "region_name": "us-east-1",
}


def aws_client(service: str, endpoint: str) -> Any:
    """An uncounted boto3 client on ``endpoint`` (never :func:`duetime.adapters.aws.clients.client`)."""
    return boto3.session.Session().client(
        service,
        endpoint_url=endpoint,
        config=Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=16),
        **FAKE_CREDENTIALS,
    )


@dataclass
class CpuSample:
    """CPU seconds (user + system, own threads only) of the stack's processes at one instant."""

    duetime: float
    moto: float
    processes: dict[int, tuple[str, float]] = field(default_factory=dict)


@dataclass
class RunningStack:
    proc: subprocess.Popen[str]
    workdir: Path
    api: str
    endpoint: str
    state: dict[str, Any]
    output: list[str] = field(default_factory=list)
    finished_lines: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def wait_finished(self, count: int, *, timeout: float) -> bool:
        """Block until ``count`` worker finish lines have been printed (or ``timeout`` s); True if reached."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.finished_lines < count:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    def client(self, service: str) -> Any:
        return aws_client(service, self.endpoint)

    def cpu(self) -> CpuSample:
        """CPU seconds of the stack's own processes (``duetime local`` and workers) and of moto's server.

        Tasks (the jobs' commands) are neither: they are the user's work. A process's children's CPU is
        not counted in the parent's own times, so workers' task processes never leak into them.
        """
        import psutil

        root = psutil.Process(self.proc.pid)
        duetime = moto = 0.0
        seen: dict[int, tuple[str, float]] = {}
        for p in [root, *root.children(recursive=True)]:
            try:
                cmd = " ".join(p.cmdline())
                t = p.cpu_times()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            seconds = t.user + t.system
            if "duetime.local.moto_server" in cmd:
                role = "moto"
                moto += seconds
            elif p.pid == root.pid:
                role = "local"
                duetime += seconds
            elif " worker" in cmd:
                role = "worker"
                duetime += seconds
            else:
                continue  # a task's process
            seen[p.pid] = (role, seconds)
        return CpuSample(duetime=duetime, moto=moto, processes=seen)


#: what a worker prints when it finishes an attempt (DUETIME_WORKER_ECHO, set by the local stack)
_FINISH_LINE = re.compile(r"worker\[\w+\]: run \S+ attempt \d+ -> ")


def _pump(stack: RunningStack) -> None:
    assert stack.proc.stdout is not None
    for line in stack.proc.stdout:
        stack.output.append(f"{time.time():.3f} {line}")
        finished = len(_FINISH_LINE.findall(line))  # lines of several processes may be glued together
        if finished:
            with stack._cond:
                stack.finished_lines += finished
                stack._cond.notify_all()
    with stack._cond:
        stack._cond.notify_all()


def start(
    workdir: Path,
    *,
    tick_seconds: float = 1.0,
    workers: int = 2,
    shards: int = 4,
    count_dir: Path | None = None,
    count_mode: str = "full",
    extra: tuple[str, ...] = (),
) -> RunningStack:
    """Start ``duetime local`` in ``workdir``; with ``count_dir``, every process counts its AWS calls there."""
    cmd = [
        sys.executable,
        "-m",
        "duetime",
        "local",
        "--api-port",
        "0",
        "--no-demo",
        "--tick-seconds",
        f"{tick_seconds:g}",
        "--workers",
        str(workers),
        "--shards",
        str(shards),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DUETIME_"))}
    if count_dir is not None:
        env["DUETIME_CALL_COUNT_DIR"] = str(count_dir)
        env["DUETIME_CALL_COUNT_MODE"] = count_mode
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
    deadline = time.monotonic() + 60
    api = endpoint = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("duetime local exited early:\n" + "".join(output))
        output.append(line)
        if line.startswith("API: "):
            api = line.split()[1]
        elif line.startswith("AWS endpoint: "):
            endpoint = line.split()[2]
        elif line.startswith("Ready"):
            break
    else:
        proc.kill()
        raise RuntimeError("duetime local did not become ready in 60 s:\n" + "".join(output))
    state = json.loads((workdir / ".duetime" / "local.json").read_text())
    stack = RunningStack(proc=proc, workdir=workdir, api=api, endpoint=endpoint, state=state, output=output)
    threading.Thread(target=_pump, args=(stack,), daemon=True).start()
    return stack


def stop(stack: RunningStack) -> None:
    """SIGTERM the stack (it stops its workers and moto); then end whatever of its tree is left, by pid."""
    import psutil

    try:
        children = psutil.Process(stack.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    if stack.proc.poll() is None:
        stack.proc.send_signal(signal.SIGTERM)
    try:
        stack.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        stack.proc.kill()
        stack.proc.wait()
    left = [c for c in children if c.is_running()]
    for child in left:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(left, timeout=10)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


@contextmanager
def running(**kwargs: Any) -> Iterator[RunningStack]:
    """A stack in a fresh temporary directory for the duration of the block."""
    with tempfile.TemporaryDirectory(prefix="duetime-bench-") as tmp:
        stack = start(Path(tmp), **kwargs)
        try:
            yield stack
        finally:
            stop(stack)
