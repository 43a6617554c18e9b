"""One Powertools router per resource: ``jobs``, ``runs``, ``dead_letters``, ``schedules`` and ``health``.

Each route is tagged with its resource, documented by its handler's docstring (summary, then description),
lists the error statuses it answers, and takes the services' dependencies and the caller's tenant as
``Depends`` parameters (:mod:`duetime.api.dependencies`, :mod:`duetime.api.tenancy`).
"""

from __future__ import annotations

from datetime import datetime

from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter

from duetime.domain.errors import RequestFieldError
from duetime.domain.models import in_supported_range


def new_router() -> APIGatewayHttpRouter:
    """A router for one resource's routes, included into the app by ``functions/api/handler.py``."""
    return APIGatewayHttpRouter()  # type: ignore[no-untyped-call]  # Powertools' Router.__init__ is unannotated


def check_instant(name: str, value: datetime | None) -> None:
    """A query instant must carry its UTC offset and be in the supported range.

    Raises:
        RequestFieldError: (a 400 naming ``name``) it has no offset or is out of range.
    """
    if value is None:
        return
    if value.tzinfo is None:
        raise RequestFieldError(f"{name}: needs a UTC offset, e.g. 2026-12-01T10:00:00Z", name)
    try:
        in_supported_range(value)
    except ValueError as exc:
        raise RequestFieldError(f"{name}: {exc}", name) from None
