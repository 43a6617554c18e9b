"""Idempotent actions of the routes (``Idempotency-Key``): run once, answer every retry the same."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.params import Header

from duetime.api import idempotency
from duetime.config.deps import Deps

#: The optional ``Idempotency-Key`` header of a route that changes something.
IdempotencyKey = Annotated[str | None, Header(alias="idempotency-key", max_length=255)]


def once(
    key: str | None,
    *,
    tenant: str,
    route: str,
    body: Any,
    deps: Deps,
    action: Callable[[], dict[str, Any]],
    lambda_context: Any,
) -> Response[str]:
    """The HTTP response of ``action`` (``{"status", "body", "location"?}``), run once per ``(tenant, route,
    key)``: a retry with the same key replays it (:func:`duetime.api.idempotency.once`)."""
    stored = idempotency.once(
        key,
        tenant=tenant,
        route=route,
        body=body,
        deps=deps,
        handler=action,
        lambda_context=lambda_context,
    )
    headers = {"Location": stored["location"]} if stored.get("location") else None
    return Response(
        status_code=stored["status"],
        content_type=content_types.APPLICATION_JSON,
        body=stored["body"],
        headers=headers,
    )
