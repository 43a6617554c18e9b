"""One Powertools router per resource: ``jobs``, ``runs``, ``dead_letters``, ``schedules`` and ``health``.

Each route is tagged with its resource, documented by its handler's docstring (summary, then description),
lists the error statuses it answers, and takes the services' dependencies and the caller's tenant as
``Depends`` parameters (:mod:`duetime.api.dependencies`, :mod:`duetime.api.tenancy`).
"""

from __future__ import annotations

from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter


def new_router() -> APIGatewayHttpRouter:
    """A router for one resource's routes, included into the app by ``functions/api/handler.py``."""
    return APIGatewayHttpRouter()  # type: ignore[no-untyped-call]  # Powertools' Router.__init__ is unannotated
