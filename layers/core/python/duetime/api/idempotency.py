"""``Idempotency-Key`` requests (Powertools idempotency over the persistence port): a retried request returns the first response (Powertools idempotency).

The key is scoped by tenant and route; the request body is the payload Powertools validates, so the same key
with a different body is refused (:class:`IdempotencyKeyReusedError`) instead of silently answering the
first body's result. Records live in the deployment's idempotency persistence layer (``deps.idempotency``:
Powertools' DynamoDB layer on AWS) for ``idempotency_ttl_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from aws_lambda_powertools.utilities.idempotency import (
    BasePersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyValidationError,
)

from duetime.domain.errors import ConflictError, RequestFieldError, RequestInProgressError
from duetime.services.deps import Deps

#: Longest accepted Idempotency-Key header (AWS's own ClientToken limit is 64; Stripe's is 255).
MAX_KEY_LENGTH = 255


class IdempotencyKeyReusedError(ConflictError):
    """The same Idempotency-Key came with a different request body (HTTP 409)."""


Response = dict[str, Any]


@lru_cache(maxsize=8)
def _runner(
    persistence: BasePersistenceLayer, ttl_seconds: int
) -> tuple[Callable[..., Response], IdempotencyConfig]:
    config = IdempotencyConfig(
        event_key_jmespath="key", payload_validation_jmespath="body", expires_after_seconds=ttl_seconds
    )

    @idempotent_function(  # type: ignore[untyped-decorator]
        data_keyword_argument="request", persistence_store=persistence, config=config
    )
    def run(*, request: dict[str, Any], handler: Callable[[], Response]) -> Response:
        return handler()

    return run, config


def once(
    key: str | None,
    *,
    tenant: str,
    route: str,
    body: Any,
    deps: Deps,
    handler: Callable[[], Response],
    lambda_context: Any = None,
) -> Response:
    """Call ``handler`` once per ``(tenant, route, key)``; later calls with that key replay its response.

    Without a key, ``handler`` simply runs. ``handler`` returns a JSON-able dict (status, headers, body).

    Raises:
        RequestFieldError: the key is empty or too long, or the deployment keeps no idempotency records.
        IdempotencyKeyReusedError: the key was used with a different body.
        RequestInProgressError: the first request with this key is still being processed (409, Retry-After).
    """
    if key is None:
        return handler()
    if not key.strip() or len(key) > MAX_KEY_LENGTH:
        raise RequestFieldError(f"Idempotency-Key: 1 to {MAX_KEY_LENGTH} characters", "Idempotency-Key")
    if deps.idempotency is None:
        raise RequestFieldError(
            "Idempotency-Key: this deployment has no idempotency table", "Idempotency-Key"
        )
    request = {"key": f"{tenant}#{route}#{key}", "body": body}
    try:
        run, config = _runner(deps.idempotency(), deps.settings.idempotency_ttl_seconds)
        if lambda_context is not None:
            config.register_lambda_context(lambda_context)  # in-progress records expire with the invocation
        return run(request=request, handler=handler)
    except IdempotencyValidationError:
        raise IdempotencyKeyReusedError(
            f"Idempotency-Key {key!r} was already used with a different request body"
        ) from None
    except IdempotencyAlreadyInProgressError:
        raise RequestInProgressError(
            f"a request with Idempotency-Key {key!r} is still in progress; retry shortly"
        ) from None
