"""The fault-injection harness (issue 4): real local stacks, real worker processes, real faults.

Every scenario's tasks append ``<attempt> <fencing token> <pid>`` to a file named by their run id
(:class:`Effects`), so a test counts what actually ran, and :func:`run_problems` checks the invariants of
DESIGN.md sections 1 and 5 against the runs the API reports: attempt records in token order, every effect
under a lease that was granted, no lease executed twice, a SUCCEEDED run's final token has an effect, every
failure says why.

Every scenario runs on both backends of the local stack (issue 15), ids ``sqlite`` and ``moto``
(:func:`backend_params`). What a scenario needs beyond the HTTP API (a run's stored row, the queue's messages)
goes through :func:`stack_state`: boto3 on the stack's moto server, or the real SQLite adapters on the stack's
state file.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import boto3
import pytest

from duetime.adapters.aws.dynamodb import deserialize, run_from_item
from duetime.adapters.aws.resources import SESSION_PREFIX
from duetime.domain.lifecycle import message_for
from duetime.domain.models import Run, RunMessage
from duetime.local.stack import LOCAL_AWS_ENV
from tests.e2e.conftest import Stack, start_stack, stop_stack

#: short leases so each scenario takes seconds (a session beat every second keeps a 4 s lease on a busy box)
FAST = (
    "--tick-seconds",
    "1",
    "--lease-seconds",
    "4",
    "--heartbeat-seconds",
    "1",
    "--pending-grace-seconds",
    "3",
)
TERMINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"}
#: imported at start-up by every process of a stack started with it on PYTHONPATH (see its docstring)
INJECT_DIR = Path(__file__).parent / "inject"

T = TypeVar("T")

#: `make faults` (DUETIME_FAULTS_FULL=1) also runs the slower variants
FULL = os.environ.get("DUETIME_FAULTS_FULL") == "1"
#: the local stack's backends every scenario runs on
BACKENDS = ("sqlite", "moto")


def backend_params(*, moto_full_only: bool = False) -> list[Any]:
    """``BACKENDS`` as parametrize values (ids ``sqlite``, ``moto``); ``moto_full_only``: a slow scenario whose
    moto variant runs under ``make faults`` only (its sqlite variant always runs)."""
    marks = [pytest.mark.skipif(not FULL, reason="make faults only (moto variant)")] if moto_full_only else []
    return [pytest.param("sqlite", id="sqlite"), pytest.param("moto", id="moto", marks=marks)]


@pytest.fixture(scope="module", params=backend_params())
def backend(request: pytest.FixtureRequest) -> str:
    """The backend of the scenario's stack (module-scoped, so a module's shared stack can depend on it; a test
    narrows it with ``@pytest.mark.parametrize("backend", backend_params(...), indirect=True)``)."""
    return str(request.param)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "faults: fault injection (real stacks and the deterministic simulation); `make faults` runs them alone",
    )


# ---- effects ---------------------------------------------------------------------------------------------
class Effects:
    """The effect log of a scenario: one file per run id, one line per execution of its task."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def command(self, script: str = "sleep 2") -> list[str]:
        """A task that records its run id, attempt, token and pid, then runs ``script`` (sh)."""
        record = f'echo "$DUETIME_ATTEMPT $DUETIME_FENCING_TOKEN $$" >> {self.root}/"$DUETIME_RUN_ID"'
        return ["sh", "-c", f"{record}; {script}"]

    def of(self, run_id: str) -> list[tuple[int, int]]:
        """``(attempt, token)`` of every execution of ``run_id``'s task, in order."""
        path = self.root / run_id
        if not path.exists():
            return []
        return [(int(a), int(t)) for a, t, _pid in (line.split() for line in path.read_text().splitlines())]

    def pids(self, run_id: str) -> list[int]:
        path = self.root / run_id
        return [int(line.split()[2]) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def effects(tmp_path: Path) -> Effects:
    return Effects(tmp_path / "effects")


def run_problems(run: dict[str, Any], executed: list[tuple[int, int]]) -> list[str]:
    """What is wrong with ``run`` (as the API returns it) given the executions its task recorded."""
    problems = []
    records = run["attempts"]
    tokens = [a["fencing_token"] for a in records]
    numbers = [a["attempt"] for a in records]
    if tokens != sorted(set(tokens)) or numbers != sorted(set(numbers)):
        problems.append(f"attempt records out of order: {list(zip(numbers, tokens, strict=True))}")
    granted = {(a["attempt"], a["fencing_token"]) for a in records}
    if run["state"] == "RUNNING":
        granted.add((run["attempt"], run["fencing_token"]))
    for attempt, token in executed:
        if (attempt, token) not in granted:
            problems.append(f"task ran as attempt {attempt} token {token}, a lease never granted")
    if len({t for _, t in executed}) != len(executed):
        problems.append(f"one lease executed twice: {executed}")
    if run["state"] == "SUCCEEDED":
        final = records[-1] if records else {}
        if final.get("state") != "SUCCEEDED" or final.get("fencing_token") not in {t for _, t in executed}:
            problems.append(f"SUCCEEDED but its final attempt {final} has no execution in {executed}")
    elif run["state"] in TERMINAL and not (run.get("error") or (records and records[-1].get("reason"))):
        problems.append(f"ended {run['state']} without saying why")
    return [f"{run['run_id']}: {p}" for p in problems]


# ---- the stack's state, from the test process -----------------------------------------------------------
def _local_state(stack: Stack) -> dict[str, Any]:
    return dict(json.loads((stack.workdir / ".duetime" / "local.json").read_text()))


def stack_state(stack: Stack) -> StackAws | StackSqlite:
    """What the HTTP API does not tell, backend-neutral: every stored run row, a run as stored, and the queue
    (send a message, take the visible ones away), on the stack's moto server or its SQLite file."""
    state = _local_state(stack)
    return StackSqlite(Path(state["database"])) if state["backend"] == "sqlite" else StackAws.of(stack)


@dataclass
class StackAws:
    """boto3 clients on a stack's moto server (never the process-wide ``duetime.adapters.aws.clients`` cache)."""

    endpoint: str
    state: dict[str, Any]

    @classmethod
    def of(cls, stack: Stack) -> StackAws:
        state = _local_state(stack)
        return cls(state["aws_endpoint"], state)

    def client(self, service: str) -> Any:
        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )
        return session.client(service, endpoint_url=self.endpoint)

    def queue_url(self, tier: str = "small") -> str:
        return str(self.state["queues"][tier])

    def runs(self) -> list[dict[str, Any]]:
        """Every run item of the stack, straight from DynamoDB (consistent scan)."""
        ddb = self.client("dynamodb")
        items, kwargs = [], {"TableName": self.state["tables"]["runs"], "ConsistentRead": True}
        while True:
            out = ddb.scan(**kwargs)
            items += [
                item
                for item in (deserialize(i) for i in out["Items"])
                if not str(item["job_id"]).startswith(SESSION_PREFIX)  # (not worker sessions)
            ]
            if "LastEvaluatedKey" not in out:
                return items
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]

    def run(self, job_id: str) -> Run:
        """``job_id``'s only run, as stored."""
        [item] = [i for i in self.runs() if i["job_id"] == job_id]
        return run_from_item(item)

    def send(self, body: str, *, delay: int = 0, tier: str = "small") -> None:
        """Put ``body`` on ``tier``'s queue (a duplicate delivery), visible after ``delay`` seconds."""
        self.client("sqs").send_message(QueueUrl=self.queue_url(tier), MessageBody=body, DelaySeconds=delay)

    def take_visible(self, tier: str = "small") -> list[str]:
        """Receive (waiting up to 1 s) and delete the visible messages of ``tier``; their job ids."""
        sqs = self.client("sqs")
        out = sqs.receive_message(QueueUrl=self.queue_url(tier), MaxNumberOfMessages=10, WaitTimeSeconds=1)
        taken = []
        for m in out.get("Messages", []):
            taken.append(RunMessage.model_validate_json(m["Body"]).job_id)
            sqs.delete_message(QueueUrl=self.queue_url(tier), ReceiptHandle=m["ReceiptHandle"])
        return taken


@dataclass
class StackSqlite:
    """The real SQLite adapters (``SqliteStore``, ``SqliteQueues``) on a stack's state file, opened per call and
    closed after it (the file is the stack's to lock: nothing here holds a transaction open)."""

    path: Path

    def runs(self) -> list[dict[str, Any]]:
        """Every run row of the stack: the stored document, with the watchdog index's columns as stored."""
        from duetime.adapters.sqlite.store import SqliteStore

        store = SqliteStore(self.path)
        try:
            rows = store.db.read("SELECT watch_shard, watch_at, doc FROM runs")
        finally:
            store.close()
        items = []
        for watch_shard, watch_at, doc in rows:
            item = {k: v for k, v in json.loads(doc).items() if k not in ("watch_at", "watch_shard")}
            item.update(
                {k: v for k, v in (("watch_shard", watch_shard), ("watch_at", watch_at)) if v is not None}
            )
            items.append(item)
        return items

    def run(self, job_id: str) -> Run:
        """``job_id``'s only run, as stored."""
        from duetime.adapters.sqlite.store import SqliteStore

        store = SqliteStore(self.path)
        try:
            [run] = store.list_runs(job_id)
        finally:
            store.close()
        return run

    def send(self, body: str, *, delay: int = 0, tier: str = "small") -> None:
        """Put ``body`` on ``tier``'s queue (a duplicate delivery), visible after ``delay`` seconds."""
        from duetime.adapters.sqlite.queue import SqliteQueues

        queues = SqliteQueues(self.path)
        try:
            queues.send(tier, RunMessage.model_validate_json(body), delay=delay)
        finally:
            queues.close()

    def take_visible(self, tier: str = "small") -> list[str]:
        """Receive (waiting up to 1 s) and delete the visible messages of ``tier``; their job ids."""
        from duetime.adapters.sqlite.queue import SqliteQueues

        queues = SqliteQueues(self.path)
        try:
            taken = []
            for m in queues.receive(tier, max_messages=10, wait_seconds=1):
                taken.append(RunMessage.model_validate_json(m.body).job_id)
                queues.delete(tier, m.receipt_handle)
            return taken
        finally:
            queues.close()


def stored_message(state: StackAws | StackSqlite, job_id: str, attempt: int) -> str:
    """The body of a run message of ``job_id``'s (only) run at ``attempt``, as the claim would send it."""
    return message_for(state.run(job_id), attempt=attempt).model_dump_json()


# ---- sqlite's write lock, held by another process -----------------------------------------------------------
class WriteLockHolder:
    """Another writer on a stack's SQLite file: a thread of the test process that takes the file's one write lock
    (``BEGIN IMMEDIATE``) and holds it for each of ``holds`` seconds in turn, ``gap`` seconds apart; every write
    of every process of the stack waits meanwhile (up to the adapter's busy timeout, then fails). ``held`` lists
    ``(waited, held)`` seconds of each hold once it is over."""

    def __init__(self, path: Path, holds: list[float], *, gap: float = 0.5) -> None:
        self.path, self.holds, self.gap = path, holds, gap
        self.held: list[tuple[float, float]] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="write-lock-holder", daemon=True)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=60)
            try:
                for seconds in self.holds:
                    asked = time.monotonic()
                    conn.execute("BEGIN IMMEDIATE")
                    got = time.monotonic()
                    time.sleep(seconds)
                    conn.execute("ROLLBACK")
                    self.held.append((got - asked, time.monotonic() - got))
                    time.sleep(self.gap)
            finally:
                conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def start(self) -> WriteLockHolder:
        self._thread.start()
        return self

    def join(self) -> list[tuple[float, float]]:
        self._thread.join()
        if self.error is not None:
            raise AssertionError(f"the lock holder failed: {self.error!r}")
        return self.held


def unwatched(items: list[dict[str, Any]]) -> list[str]:
    """Non-terminal runs missing from the watchdog index: nothing would ever look at them again."""
    return [
        f"{i['job_id']}@{i['due_at']} {i['state']}"
        for i in items
        if i["state"] not in TERMINAL and not ("watch_at" in i and "watch_shard" in i)
    ]


def logged_failures(stack: Stack) -> Counter[str]:
    """What the stack's processes logged at WARNING and above, counted by what it says: ``LEVEL message
    (exception)`` for a handler's JSON log line, the line itself for the stack's own ``... failed: ...``."""
    found: Counter[str] = Counter()
    for line in list(stack.output):
        text = line.strip()
        if text.startswith("{"):
            try:
                entry = json.loads(text)
            except ValueError:
                continue
            if entry.get("level") in ("WARNING", "ERROR", "CRITICAL"):
                cause = f" ({entry['exception_name']})" if entry.get("exception_name") else ""
                found[f"{entry['level']} {entry.get('message')}{cause}"] += 1
        elif " failed: " in text or text.startswith("Traceback"):
            found[text.split(": ", 1)[0] + ": " + text.rsplit(": ", 1)[-1][:80]] += 1
    return found


# ---- waiting and processes --------------------------------------------------------------------------------
def wait_for(what: str, probe: Callable[[], T | None], *, timeout: float = 30.0, every: float = 0.25) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


def runs_of(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    status, body = stack.request("GET", f"/jobs/{job_id}/runs?limit=100")
    assert status == 200, body
    return list(body["runs"])


def settled(stack: Stack, job_id: str, count: int = 1) -> list[dict[str, Any]] | None:
    """The job's runs once at least ``count`` exist and all are terminal, else None."""
    runs = runs_of(stack, job_id)
    return runs if len(runs) >= count and all(r["state"] in TERMINAL for r in runs) else None


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (through /proc), across sessions."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def worker_pid(run: dict[str, Any]) -> int:
    """The pid of the worker holding ``run``'s lease (``lease_owner`` is ``host:pid:random``)."""
    return int(run["lease_owner"].split(":")[1])


# ---- stacks -----------------------------------------------------------------------------------------------
def faulty_env(monkeypatch: pytest.MonkeyPatch, control: Path) -> None:
    """Make the next stack started load ``inject/sitecustomize.py`` with ``control`` as its control file."""
    monkeypatch.setenv("PYTHONPATH", str(INJECT_DIR))
    monkeypatch.setenv("FAULTS_CONTROL_FILE", str(control))


@contextmanager
def running_moto() -> Iterator[str]:
    """A moto server (DynamoDB serialised, as the local stack runs it) owned by the caller; yields its URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DUETIME_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "duetime.local.moto_server", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**env, **LOCAL_AWS_ENV},
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("PORT "), f"moto server said {line!r}"
    try:
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def moto_endpoint() -> Iterator[str]:
    """A moto server owned by the test, so its state outlives the stacks started on it."""
    with running_moto() as endpoint:
        yield endpoint


@pytest.fixture
def stacks() -> Iterator[Callable[..., Stack]]:
    """``stacks(workdir, *args, backend="moto")`` starts a local stack that is stopped after the test whatever
    happens (and SIGKILLed with everything below it if it will not stop)."""
    started: list[Stack] = []

    def start(workdir: Path, *args: str, backend: str = "moto") -> Stack:
        workdir.mkdir(parents=True, exist_ok=True)
        stack = start_stack(workdir, *args, backend=backend)
        started.append(stack)
        return stack

    yield start
    for stack in started:
        if stack.proc.poll() is None:
            try:
                stop_stack(stack)
            except subprocess.TimeoutExpired:
                kill_stack_hard(stack)


def kill_stack_hard(stack: Stack) -> None:
    """SIGKILL the stack and every process below it (workers and their tasks live in other sessions)."""
    below = descendants(stack.proc.pid)
    for pid in [stack.proc.pid, *below]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    stack.proc.wait()


__all__ = [
    "BACKENDS",
    "FAST",
    "FULL",
    "Effects",
    "Stack",
    "StackAws",
    "StackSqlite",
    "WriteLockHolder",
    "backend_params",
    "stack_state",
    "stored_message",
    "alive",
    "descendants",
    "faulty_env",
    "kill_stack_hard",
    "logged_failures",
    "run_problems",
    "running_moto",
    "runs_of",
    "settled",
    "start_stack",
    "stop_stack",
    "unwatched",
    "wait_for",
    "worker_pid",
]
