"""Where a run's log lives: one key per attempt, the same in every log store (DESIGN.md section 7)."""

from __future__ import annotations


def log_key(job_id: str, run_id: str, attempt: int) -> str:
    """The key of one attempt's combined stdout+stderr: ``logs/<job_id>/<run_id>/attempt-<n>.log``."""
    return f"logs/{job_id}/{run_id}/attempt-{attempt}.log"
