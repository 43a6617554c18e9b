"""OpenAPI ``responses`` entries of the routes: their success status and body, and each error they answer.

Every error is documented in the one error shape (``ErrorResponse``); only statuses the API answers are listed.
"""

from __future__ import annotations

from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import BaseModel

from duetime.domain.api_models import ErrorResponse

ERROR_DESCRIPTIONS = {
    400: "Invalid request: the error names the field",
    404: "No such job or run (or another tenant's)",
    409: "Conflicts with the resource's state, an Idempotency-Key reused with another body, or a quota",
    429: "Too many submits this minute: retry after the Retry-After header's seconds",
    503: "AWS throttled the request: nothing was changed; retry after the Retry-After header's seconds",
}


def errors(*codes: int, aws: bool = True) -> dict[int, OpenAPIResponse]:
    """The error statuses a route can answer, all in the ErrorResponse shape.

    ``aws``: the route calls AWS, so it may also answer 503 when AWS throttles it.
    """
    codes = (*codes, 503) if aws else codes
    return {
        code: {
            "description": ERROR_DESCRIPTIONS[code],
            "content": {"application/json": {"model": ErrorResponse}},
        }
        for code in codes
    }


def ok(code: int, model: type[BaseModel], description: str) -> dict[int, OpenAPIResponse]:
    """A route's success status and body model."""
    return {code: {"description": description, "content": {"application/json": {"model": model}}}}


def text_ok(description: str) -> dict[int, OpenAPIResponse]:
    """A 200 whose body is plain text."""
    return {200: {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}}
