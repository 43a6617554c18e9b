"""Start the real local stack (``duetime local``) in a temporary directory, watch it, and stop it.

The stack runs as it does for a user: one ``duetime local`` process (HTTP API, clock loop with tick and
sweeper in-process) and ``duetime worker`` processes, on either backend:

- ``moto`` (:func:`start`'s default: the cost part counts AWS calls): the AWS adapters on moto's server, a
  child of ``duetime local``. The bench talks to moto with its own uncounted boto3 clients.
- ``sqlite`` (``duetime local``'s default): the embedded adapter set, every process sharing
  ``<workdir>/.duetime/duetime.sqlite``. The bench reads that file with its own read-only connection.

Either way progress comes from the workers' echo lines on the stack's stdout, so watching the stack costs it
nothing while it works; the runs are read from the store once, at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
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

from bench.sysload import pss_kib

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


#: the backends :func:`start` can run the stack on (``duetime local --backend``)
BACKENDS = ("sqlite", "moto")


def scan_all(ddb: Any, table: str, attributes: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every item of ``table`` (only ``attributes`` if given), deserialised."""
    from duetime.adapters.aws.dynamodb import deserialize

    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table}
    if attributes:
        kwargs["ProjectionExpression"] = ", ".join(f"#a{i}" for i in range(len(attributes)))
        kwargs["ExpressionAttributeNames"] = {f"#a{i}": a for i, a in enumerate(attributes)}
    while True:
        out = ddb.scan(**kwargs)
        items += [deserialize(i) for i in out.get("Items", [])]
        if "LastEvaluatedKey" not in out:
            return items
        kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]


@dataclass
class CpuSample:
    """CPU seconds (user + system, own threads only) of the stack's processes at one instant."""

    duetime: float
    moto: float
    #: pid -> (role: "local", "api", "worker" or "moto"; CPU seconds)
    processes: dict[int, tuple[str, float]] = field(default_factory=dict)

    def by_role(self) -> dict[str, float]:
        """CPU seconds summed per role."""
        roles: dict[str, float] = {}
        for role, seconds in self.processes.values():
            roles[role] = roles.get(role, 0.0) + seconds
        return roles


@dataclass
class MemorySample:
    """Proportional set size (PSS, ``/proc/<pid>/smaps_rollup``) of the stack's processes, MiB.

    PSS shares each page among the processes that map it, so the sum over processes is what the stack adds
    to the machine's memory (RSS would count the workers' shared interpreter pages once per worker).
    """

    total_mb: float
    by_role: dict[str, float] = field(default_factory=dict)
    processes: int = 0


def _role(proc: Any, root_pid: int) -> str | None:
    """``"local"``, ``"api"``, ``"worker"`` or ``"moto"`` for a process of the stack's tree; None for a
    task's."""
    cmd = " ".join(proc.cmdline())
    if "duetime.local.moto_server" in cmd:
        return "moto"
    if "duetime.local.api_process" in cmd:
        return "api"
    if proc.pid == root_pid:
        return "local"
    if " worker" in cmd:
        return "worker"
    return None  # a task's process: the user's work, not the stack's


@dataclass
class RunningStack:
    proc: subprocess.Popen[str]
    workdir: Path
    api: str
    #: moto's endpoint ("" on sqlite)
    endpoint: str
    #: ``.duetime/local.json``
    state: dict[str, Any]
    output: list[str] = field(default_factory=list)
    finished_lines: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def wait_finished(self, count: int, *, timeout: float) -> bool:
        """Block until ``count`` worker finish lines have been printed (or ``timeout`` s); True if reached.

        The workers print one line per finished attempt on either backend (``DUETIME_WORKER_ECHO``), so
        waiting reads nothing from the store while the stack works; :meth:`finished_runs` then counts the
        finished runs in the store itself."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.finished_lines < count:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    @property
    def backend(self) -> str:
        return str(self.state.get("backend", "moto"))

    @property
    def database(self) -> Path:
        """The SQLite state file (sqlite backend only)."""
        if self.backend != "sqlite":
            raise RuntimeError(f"the {self.backend} backend has no database file")
        return Path(self.state["database"])

    def client(self, service: str) -> Any:
        """An uncounted boto3 client on moto (moto backend only)."""
        if not self.endpoint:
            raise RuntimeError(f"the {self.backend} backend has no AWS endpoint")
        return aws_client(service, self.endpoint)

    def read_sql(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of one read-only statement on the state file (sqlite backend), outside the stack's own
        connections (a WAL reader: it never blocks the stack's writers)."""
        conn = sqlite3.connect(f"file:{self.database}?mode=ro", uri=True, timeout=30)
        try:
            return list(conn.execute(sql, params).fetchall())
        finally:
            conn.close()

    def runs(self, job_id_prefix: str, fields: tuple[str, ...]) -> list[dict[str, Any]]:
        """The stored runs of the jobs whose id starts with ``job_id_prefix``: ``fields`` of each (absent
        ones left out), from the runs table (moto) or the runs' documents in the state file (sqlite)."""
        if self.backend == "sqlite":
            for name in fields:
                if not re.fullmatch(r"\w+", name):
                    raise ValueError(f"not a field name: {name!r}")
            columns = ", ".join(f"json_extract(doc, '$.{name}')" for name in fields)
            rows = self.read_sql(
                f"SELECT {columns} FROM runs WHERE substr(job_id, 1, ?) = ?",  # noqa: S608 - names checked
                (len(job_id_prefix), job_id_prefix),
            )
            return [{k: v for k, v in zip(fields, row, strict=True) if v is not None} for row in rows]
        table = self.state["tables"]["runs"]
        return [
            r
            for r in scan_all(self.client("dynamodb"), table, tuple(dict.fromkeys(("job_id", *fields))))
            if str(r["job_id"]).startswith(job_id_prefix)
        ]

    def finished_runs(self, job_id_prefix: str) -> int:
        """How many runs of the jobs whose id starts with ``job_id_prefix`` have a ``finished_at``."""
        if self.backend == "sqlite":
            rows = self.read_sql(
                "SELECT count(*) FROM runs WHERE substr(job_id, 1, ?) = ?"
                " AND json_extract(doc, '$.finished_at') IS NOT NULL",
                (len(job_id_prefix), job_id_prefix),
            )
            return int(rows[0][0])
        return sum(1 for r in self.runs(job_id_prefix, ("finished_at",)) if r.get("finished_at"))

    def _processes(self) -> list[tuple[Any, str]]:
        """(psutil process, role) of the stack's own processes: ``duetime local``, its API processes, workers,
        moto's server."""
        import psutil

        root = psutil.Process(self.proc.pid)
        found = []
        for p in [root, *root.children(recursive=True)]:
            try:
                role = _role(p, root.pid)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            if role is not None:
                found.append((p, role))
        return found

    def cpu(self) -> CpuSample:
        """CPU seconds of the stack's own processes (``duetime local`` and workers) and of moto's server
        (none on sqlite: the store is in-process, a library in each of the stack's processes).

        Tasks (the jobs' commands) are neither: they are the user's work. A process's children's CPU is
        not counted in the parent's own times, so workers' task processes never leak into them.
        """
        import psutil

        duetime = moto = 0.0
        seen: dict[int, tuple[str, float]] = {}
        for p, role in self._processes():
            try:
                t = p.cpu_times()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            seconds = t.user + t.system
            if role == "moto":
                moto += seconds
            else:
                duetime += seconds
            seen[p.pid] = (role, seconds)
        return CpuSample(duetime=duetime, moto=moto, processes=seen)

    def memory(self) -> MemorySample:
        """PSS summed over the stack's own processes (moto's server included; tasks excluded), MiB."""
        by_role: dict[str, float] = {}
        count = 0
        for p, role in self._processes():
            kib = pss_kib(p.pid)
            if kib is None:
                continue
            count += 1
            by_role[role] = by_role.get(role, 0.0) + kib / 1024
        return MemorySample(
            total_mb=round(sum(by_role.values()), 1),
            by_role={k: round(v, 1) for k, v in sorted(by_role.items())},
            processes=count,
        )


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
    backend: str = "moto",
) -> RunningStack:
    """Start ``duetime local --backend backend`` in ``workdir``; with ``count_dir``, every process counts its
    AWS calls there (moto: the calls-per-run figures count AWS calls, hence the default)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    cmd = [
        sys.executable,
        "-m",
        "duetime",
        "local",
        "--api-port",
        "0",
        "--no-demo",
        "--backend",
        backend,
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
