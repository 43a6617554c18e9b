"""Where a run's log lives: one key per attempt, the same in every log store (DESIGN.md section 7)."""

from __future__ import annotations

#: the key prefix of log packs: one object holding the final logs of several attempts (each attempt's record
#: names its byte range); read by range only, never handed out whole
PACK_PREFIX = "logs/packs/"


def pack_key(day: str, name: str) -> str:
    """The key of a log pack written on ``day`` (``YYYY-MM-DD``, UTC): ``logs/packs/<day>/<name>.log``."""
    return f"{PACK_PREFIX}{day}/{name}.log"


def log_key(job_id: str, run_id: str, attempt: int) -> str:
    """The key of one attempt's combined stdout+stderr: ``logs/<job_id>/<run_id>/attempt-<n>.log``."""
    return f"logs/{job_id}/{run_id}/attempt-{attempt}.log"
