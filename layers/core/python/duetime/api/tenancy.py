"""The caller's tenant, from what API Gateway's authorizer put in the request context.

In AWS the HTTP API's authorizer (JWT or IAM, ``infra/constructs/api.py``) identifies the caller; locally,
``duetime local --tenant NAME:TOKEN`` has the HTTP adapter play the JWT authorizer: a known bearer token
becomes the ``sub`` claim. A request without an authorizer identity is the single-tenant local stack's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Depends, Request

#: Tenant of requests that carry no authorizer identity (the single-tenant local stack).
DEFAULT_TENANT = "local"


def tenant_of(event: Mapping[str, Any]) -> str:
    """The tenant of an HTTP API (payload 2.0) event: the JWT's ``tenant`` (else ``sub``) claim, the IAM
    principal's ARN, or a Lambda authorizer's ``tenant``; :data:`DEFAULT_TENANT` when there is none."""
    authorizer: dict[str, Any] = (event.get("requestContext") or {}).get("authorizer") or {}
    claims = (authorizer.get("jwt") or {}).get("claims") or {}
    if claims.get("tenant") or claims.get("sub"):
        return str(claims.get("tenant") or claims["sub"])
    iam = authorizer.get("iam") or {}
    if iam.get("userArn"):
        return str(iam["userArn"])
    lam = authorizer.get("lambda") or {}
    if lam.get("tenant"):
        return str(lam["tenant"])
    return DEFAULT_TENANT


def current_tenant(request: Request) -> str:
    """The dependency behind :data:`Tenant`: the tenant of the request being served."""
    return tenant_of(request.resolved_event.raw_event)


#: A route parameter holding the caller's tenant (``tenant: Tenant``).
Tenant = Annotated[str, Depends(current_tenant)]
