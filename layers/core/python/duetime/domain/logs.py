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


#: how the log of an attempt whose log pack is not stored yet reads (its worker lingers over the pack,
#: ``log_pack_linger_seconds``): a follower (``duetime runs logs --follow``) waits for the real log
NOT_STORED_YET = "is not stored yet"


def not_stored_note(attempt: int, linger_seconds: float) -> str:
    """The text of attempt ``attempt``'s log while its log pack may still be on its way."""
    return (
        f"duetime: the log of attempt {attempt} {NOT_STORED_YET} (its worker stores the logs of the runs it "
        f"ends within {linger_seconds:g} s as one object); read it again in a few seconds\n"
    )


def lost_note(attempt: int) -> str:
    """The text of attempt ``attempt``'s log when its log pack never came and it left no chunk."""
    return f"duetime: the log of attempt {attempt} was lost: its worker stopped before storing it\n"


def is_not_stored_note(text: str) -> bool:
    """Whether ``text`` is a :func:`not_stored_note` (not a log)."""
    return text.startswith("duetime: the log of attempt ") and NOT_STORED_YET in text.split("\n", 1)[0]
