"""HTTP API (API Gateway HTTP API, payload v2) -> Powertools resolver with validation and OpenAPI.

Thin: the app (``duetime.api.resolver``), one router per resource (``duetime.api.routers``), each route
calling one service in ``duetime.services.jobs``. Errors are JSON ``{"error": {"code", "message", "field"}}``; bad
input is a 4xx naming the field, never a 500 (``duetime.api.errors``).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from duetime.api.console import routes as console
from duetime.api.resolver import create_app
from duetime.api.routers import dead_letters, health, jobs, notifications, runs, schedules
from duetime.config.observability import logger

app = create_app()
app.include_router(health.router)
app.include_router(jobs.router)
app.include_router(runs.router)
app.include_router(dead_letters.router)
app.include_router(schedules.router)
app.include_router(notifications.router)
app.include_router(console.router)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
