"""The caller's tenant, from what API Gateway's authorizer put in the request context."""

from __future__ import annotations

from typing import Any

import pytest

from duetime.api.tenancy import DEFAULT_TENANT, tenant_of


def _with(authorizer: dict[str, Any] | None) -> dict[str, Any]:
    return {"requestContext": {"authorizer": authorizer} if authorizer is not None else {}}


@pytest.mark.parametrize(
    ("authorizer", "tenant"),
    [
        ({"jwt": {"claims": {"sub": "alice"}}}, "alice"),
        ({"jwt": {"claims": {"sub": "user-1", "tenant": "acme"}}}, "acme"),
        ({"iam": {"userArn": "arn:aws:iam::123456789012:user/ci"}}, "arn:aws:iam::123456789012:user/ci"),
        ({"lambda": {"tenant": "beta"}}, "beta"),
        ({"jwt": {"claims": {}}, "lambda": {"tenant": "beta"}}, "beta"),
        ({}, DEFAULT_TENANT),
        (None, DEFAULT_TENANT),
    ],
)
def test_the_tenant_is_the_authorizers_identity(authorizer: dict[str, Any] | None, tenant: str) -> None:
    assert tenant_of(_with(authorizer)) == tenant


def test_an_event_without_a_request_context_is_the_local_stacks_tenant() -> None:
    assert tenant_of({}) == "local"
