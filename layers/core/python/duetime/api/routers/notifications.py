"""Notifications: a tenant's default rules (``/tenants/me/notifications``) and a job's events and deliveries
(``/jobs/{id}/deliveries``). Webhook secrets are write-only: answers show ``"secret": "set"``."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Query

from duetime.api.dependencies import ServiceDeps
from duetime.api.responses import errors, ok
from duetime.api.routers import new_router
from duetime.api.tenancy import Tenant
from duetime.domain.api_models import (
    DeliveryListResponse,
    DeliveryResponse,
    NotificationEventResponse,
    TenantNotificationsRequest,
    TenantNotificationsResponse,
)
from duetime.services import notifier

router = new_router()
TAGS = ["notifications"]


@router.get(
    "/tenants/me/notifications",
    tags=TAGS,
    responses=ok(200, TenantNotificationsResponse, "The tenant's default rules"),
)
def get_tenant_notifications(deps: ServiceDeps, tenant: Tenant) -> TenantNotificationsResponse:
    """Read your tenant's default notification rules.

    Every job that does not say `inherit_tenant_notifications: false` uses them besides its own. Webhook
    secrets are shown as `"set"`.
    """
    rules, updated_at = notifier.get_tenant_rules(tenant, deps)
    return TenantNotificationsResponse(
        tenant=tenant, notifications=[rule.shown() for rule in rules], updated_at=updated_at
    )


@router.put(
    "/tenants/me/notifications",
    tags=TAGS,
    responses=ok(200, TenantNotificationsResponse, "The tenant's rules, as stored") | errors(400),
)
def put_tenant_notifications(
    body: TenantNotificationsRequest, deps: ServiceDeps, tenant: Tenant
) -> TenantNotificationsResponse:
    """Replace your tenant's default notification rules.

    A webhook's secret sent as `"set"` keeps the stored one; a new secret rotates it (the previous one still
    signs deliveries, as a second `v1=`, for 24 h).
    """
    rules = notifier.put_tenant_rules(tenant, body.notifications, deps)
    _, updated_at = notifier.get_tenant_rules(tenant, deps)
    return TenantNotificationsResponse(
        tenant=tenant, notifications=[rule.shown() for rule in rules], updated_at=updated_at
    )


@router.get(
    "/jobs/<job_id>/deliveries",
    tags=TAGS,
    responses=ok(200, DeliveryListResponse, "A page of the job's events, newest first") | errors(400, 404),
)
def list_deliveries(
    job_id: str,
    deps: ServiceDeps,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> DeliveryListResponse:
    """List a job's notification events and their deliveries.

    Newest first: every event (muted or suppressed ones too), each with its deliveries, their tries and
    outcomes. Pass the answer's `next_token` for the next page.
    """
    found, token = notifier.list_deliveries(
        job_id, tenant=tenant, deps=deps, limit=limit, next_token=next_token
    )
    return DeliveryListResponse(
        events=[
            NotificationEventResponse(
                event_id=event.event_id,
                type=event.type.value,
                run_id=event.run_id,
                attempt=event.attempt,
                state=event.state,
                reason=event.reason,
                occurred_at=event.occurred_at,
                notified=event.notified,
                deliveries=[
                    DeliveryResponse.model_validate(d.model_dump(exclude={"body"})) for d in deliveries
                ],
            )
            for event, deliveries in found
        ],
        next_token=token,
    )
