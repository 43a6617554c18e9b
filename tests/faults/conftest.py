"""The fault-injection harness (issue 4): real local stacks, real worker processes, real faults.

Every scenario's tasks append ``<attempt> <fencing token> <pid>`` to a file named by their run id
(:class:`Effects`), so a test counts what actually ran, and :func:`run_problems` checks the invariants of
DESIGN.md sections 1 and 5 against the runs the API reports: attempt records in token order, every effect
under a lease that was granted, no lease executed twice, a SUCCEEDED run's final token has an effect, every
failure says why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import boto3
import pytest

from duetime.adapters.aws.dynamodb import deserialize
from duetime.local.stack import LOCAL_AWS_ENV
from tests.e2e.conftest import Stack, start_stack, stop_stack

#: short leases so each scenario takes seconds (a heartbeat every second keeps a 4 s lease on a busy box)
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


# ---- the stack's AWS, from the test process -------------------------------------------------------------
@dataclass
class StackAws:
    """boto3 clients on a stack's moto server (never the process-wide ``duetime.adapters.aws.clients`` cache)."""

    endpoint: str
    state: dict[str, Any]

    @classmethod
    def of(cls, stack: Stack) -> StackAws:
        state = json.loads((stack.workdir / ".duetime" / "local.json").read_text())
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
            items += [deserialize(i) for i in out["Items"]]
            if "LastEvaluatedKey" not in out:
                return items
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]


def unwatched(items: list[dict[str, Any]]) -> list[str]:
    """Non-terminal runs missing from the watchdog index: nothing would ever look at them again."""
    return [
        f"{i['job_id']}@{i['due_at']} {i['state']}"
        for i in items
        if i["state"] not in TERMINAL and not ("watch_at" in i and "watch_shard" in i)
    ]


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
    """``stacks(workdir, *args)`` starts a local stack that is stopped after the test whatever happens (and
    SIGKILLed with everything below it if it will not stop)."""
    started: list[Stack] = []

    def start(workdir: Path, *args: str) -> Stack:
        workdir.mkdir(parents=True, exist_ok=True)
        stack = start_stack(workdir, *args, backend="moto")  # faults are injected into the AWS SDK's calls
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
    "FAST",
    "Effects",
    "Stack",
    "StackAws",
    "alive",
    "descendants",
    "faulty_env",
    "kill_stack_hard",
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
