"""Write a Lambda task's function in Python: read Duetime's envelope, call your code, return its result.

::

    from duetime.lambda_target import RunInfo, run_task

    @run_task
    def lambda_handler(payload: dict, run: RunInfo) -> dict:
        # run.idempotency_key (the run id) is stable across retries and redeliveries: pass it to anything
        # you change, so a repeated attempt does its work once
        return {"greeting": f"hello {payload['name']}", "run": run.run_id}

The dispatcher invokes the function with ``{"duetime": {run_id, job_id, attempt, fencing_token, due_at,
timeout_seconds}, "payload": {...}}``. The decorated function gets the payload and a :class:`RunInfo`; what it
returns (any JSON value) becomes the run's ``result``; an exception it raises fails the attempt, and the
job's retry policy decides what follows. The wrapper returns ``{"duetime": {"run_id", "attempt",
"fencing_token"}, "result": ...}``, the shape the finish handler unwraps.

Standard library only, so it adds nothing to a function's cold start beyond this module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

R = TypeVar("R")


class EnvelopeError(ValueError):
    """The event is not a Duetime run envelope (the function was invoked by something else)."""


@dataclass(frozen=True)
class RunInfo:
    """The run an invocation belongs to."""

    run_id: str
    job_id: str
    attempt: int
    fencing_token: int
    due_at: datetime
    timeout_seconds: int | None
    #: Lambda's context object (``get_remaining_time_in_millis()``, ``aws_request_id``...)
    lambda_context: Any = None

    @property
    def idempotency_key(self) -> str:
        """The key to make effects happen once: the run id (the same for every attempt of the run)."""
        return self.run_id


def read_envelope(event: Any, context: Any = None) -> tuple[RunInfo, dict[str, Any]]:
    """Split an invocation event into the run's identity and the task's payload.

    Raises:
        EnvelopeError: the event has no valid ``duetime`` section.
    """
    ids = event.get("duetime") if isinstance(event, Mapping) else None
    if not isinstance(ids, Mapping):
        raise EnvelopeError("not a Duetime run envelope: no `duetime` object in the event")
    try:
        info = RunInfo(
            run_id=str(ids["run_id"]),
            job_id=str(ids["job_id"]),
            attempt=int(ids["attempt"]),
            fencing_token=int(ids["fencing_token"]),
            due_at=datetime.fromisoformat(str(ids["due_at"]).replace("Z", "+00:00")),
            timeout_seconds=int(ids["timeout_seconds"]) if ids.get("timeout_seconds") is not None else None,
            lambda_context=context,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EnvelopeError(f"not a Duetime run envelope: {exc!r}") from None
    payload = event.get("payload") or {}
    if not isinstance(payload, dict):
        raise EnvelopeError("not a Duetime run envelope: `payload` is not an object")
    return info, payload


def run_task(fn: Callable[[dict[str, Any], RunInfo], R]) -> Callable[[Any, Any], dict[str, Any]]:
    """Decorate ``fn(payload, run)`` into a Lambda handler ``(event, context)`` for a Duetime Lambda task."""

    @functools.wraps(fn)
    def handler(event: Any, context: Any = None) -> dict[str, Any]:
        info, payload = read_envelope(event, context)
        result = fn(payload, info)
        return {
            "duetime": {"run_id": info.run_id, "attempt": info.attempt, "fencing_token": info.fencing_token},
            "result": result,
        }

    return handler


__all__ = ["EnvelopeError", "RunInfo", "read_envelope", "run_task"]
