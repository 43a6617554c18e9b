"""Lambda functions for tests of Lambda tasks (run by the local stack's Lambda runtime in child processes)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from duetime.lambda_target import RunInfo, run_task


@run_task
def echo(payload: dict[str, Any], run: RunInfo) -> dict[str, Any]:
    """Returns what it was given; prints a line for the run's log."""
    print(f"echo: run {run.run_id} attempt {run.attempt} token {run.fencing_token} payload {payload}")
    return {
        "payload": payload,
        "run_id": run.run_id,
        "job_id": run.job_id,
        "attempt": run.attempt,
        "fencing_token": run.fencing_token,
        "due_at": run.due_at.isoformat(),
        "timeout_seconds": run.timeout_seconds,
    }


def raw(event: dict[str, Any], context: Any) -> Any:
    """A function written without the helper: its whole response is the result."""
    return {"event": event, "request_id": context.aws_request_id}


@run_task
def fail(payload: dict[str, Any], run: RunInfo) -> None:
    print(f"fail: attempt {run.attempt} is about to raise")
    raise ValueError(f"boom on attempt {run.attempt}")


@run_task
def sleepy(payload: dict[str, Any], run: RunInfo) -> str:
    print("sleepy: going to sleep", flush=True)
    time.sleep(float(payload.get("seconds", 60)))
    return "woke up"


@run_task
def count(payload: dict[str, Any], run: RunInfo) -> int:
    """Appends one line per invocation to ``payload["path"]``: how many times the function really ran."""
    path = Path(str(payload["path"]))
    with path.open("a") as f:
        f.write(f"{run.run_id} {run.attempt} {run.fencing_token}\n")
    return len(path.read_text().splitlines())
