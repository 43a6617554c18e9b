"""Duetime's own errors. Adapters translate SDK errors into these in one place (``store.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class DuetimeError(Exception):
    """Base class of every error Duetime raises on purpose."""


class ScheduleError(DuetimeError, ValueError):
    """A schedule expression or time zone is invalid, or can never fire.

    ``field`` names the offending request field (``schedule.expression`` or ``schedule.timezone``).
    """

    def __init__(self, message: str, field: str = "schedule.expression") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFoundError(DuetimeError):
    """A job or run does not exist (or belongs to another tenant: the caller is told the same)."""

    def __init__(self, kind: str, ident: str) -> None:
        super().__init__(f"{kind} {ident!r} not found")
        self.kind = kind
        self.ident = ident


class JobExistsError(DuetimeError):
    """A job with this id already exists (a submit with a taken ``job_id``: HTTP 409)."""


class AlreadyClaimedError(DuetimeError):
    """The run ``(job_id, due_at)`` already exists: an earlier or overlapping claim made it."""


class StaleClaimError(DuetimeError):
    """The job's ``next_fire_at`` moved on since we read it: another tick advanced it."""


class StartRejectedError(DuetimeError):
    """A start (PENDING -> RUNNING) failed its condition: duplicate or stale message."""


class LeaseLostError(DuetimeError):
    """A finish (or another write of the run) carried a fencing token that is no longer current.

    The worker holding that token has lost the run and must stop its task.
    """


class ConflictError(DuetimeError):
    """The request conflicts with the resource's current state (HTTP 409)."""


class RequestInProgressError(ConflictError):
    """A request with the same ``Idempotency-Key`` is still being handled (HTTP 409 with ``Retry-After``):
    retrying it shortly gets that request's response."""

    #: seconds a client should wait before retrying (the ``Retry-After`` header)
    retry_after = 1


class ChangedMeanwhileError(ConflictError):
    """A conditional write of a job found it changed since it was read (another request, a tick's claim):
    the service reads it again and re-applies the request (:func:`duetime.services.jobs.update_job`); HTTP
    409 only if it keeps changing."""


class RequestFieldError(DuetimeError, ValueError):
    """A request field is well-formed but refers to something that does not hold (HTTP 400).

    ``field`` names it (dotted path, e.g. ``on_timeout.job_id``).
    """

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvokeError(DuetimeError):
    """Lambda refused or failed an asynchronous invocation of a task's function (after the SDK's retries).

    ``code`` is Lambda's error code (e.g. ``ResourceNotFoundException``, ``AccessDeniedException``).
    """

    def __init__(self, message: str, code: str = "InvokeError") -> None:
        super().__init__(message)
        self.code = code


class QuotaExceededError(DuetimeError):
    """A tenant quota is used up. ``retry_after`` (seconds) is set when waiting will help (HTTP 429), and
    None when the tenant must first free something, e.g. delete a job (HTTP 409)."""

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ThrottledError(DuetimeError):
    """AWS kept refusing a request for capacity (DynamoDB throttling, after the SDK's and Duetime's own
    retries). Nothing was changed by the refused part; the caller may try again later (HTTP 503)."""


class PageTokenError(RequestFieldError):
    """A ``next_token`` that is not one the store issued for this listing (forged, corrupted, or from
    another tenant's or job's list): HTTP 400 on field ``next_token``."""

    def __init__(
        self, message: str = "next_token: not a token from this list; start again without it"
    ) -> None:
        super().__init__(message, "next_token")


class LogStoreError(DuetimeError):
    """The log store refused part of a request (e.g. some chunks were not deleted); nothing is lost: the
    caller may try again."""


class QueueSendError(DuetimeError):
    """Some messages of a batch send were not sent (the message says how many and why); the rest were.

    ``unsent`` holds the entries not sent (as given: ``(message, delay seconds)`` pairs), for the caller
    to send again one by one or leave to the sweeper."""

    def __init__(self, message: str, unsent: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.unsent = list(unsent)


class PartialBatchError(DuetimeError):
    """A batch of conditional writes (``put_new_runs``, ``advance_many`` on DynamoDB: one request per item)
    failed part way. ``results`` holds each item's outcome in order, as the method returns them (True
    applied, False its condition failed), and None for each item whose write raised (whether it was applied
    is unknown); ``error`` is the first of those errors. Every other item was tried."""

    def __init__(self, results: Sequence[bool | None], error: BaseException) -> None:
        super().__init__(f"{sum(r is None for r in results)} of {len(results)} writes failed: {error!r}")
        self.results = list(results)
        self.error = error
