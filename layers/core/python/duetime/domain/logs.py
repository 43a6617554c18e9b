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


#: the response header of ``GET /runs/{id}/logs`` for an ended attempt whose log pack its worker has not stored
#: yet (``log_pack_linger_seconds``): ``partial`` (the body is the output streamed so far) or ``note`` (the
#: body is :func:`not_stored_note`); a follower (``duetime runs logs -f``) reads it again
LOG_PENDING_HEADER = "Duetime-Log-Pending"


def not_stored_note(attempt: int, linger_seconds: float) -> str:
    """The text of attempt ``attempt``'s log while its log pack may still be on its way and it streamed no
    chunk."""
    return (
        f"duetime: the log of attempt {attempt} is not stored yet (its worker stores the logs of the runs it "
        f"ends within {linger_seconds:g} s as one object); read it again in a few seconds\n"
    )


def lost_note(attempt: int) -> str:
    """The text of attempt ``attempt``'s log when its log pack never came (within a day of its end) and it
    streamed no chunk."""
    return f"duetime: the log of attempt {attempt} was lost: its worker stopped before storing it\n"
