"""The API's resolver: Powertools' HTTP API resolver with validation, strict JSON bodies and OpenAPI.

:func:`create_app` builds one (each Lambda execution environment its own); the routes come from the
routers in :mod:`duetime.api.routers`, included by ``functions/api/handler.py``.
"""

from __future__ import annotations

import inspect
import re
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Route
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware
from aws_lambda_powertools.event_handler.openapi.compat import is_scalar_sequence_field
from aws_lambda_powertools.event_handler.openapi.models import Tag
from aws_lambda_powertools.event_handler.openapi.params import get_flat_dependant
from aws_lambda_powertools.utilities.typing import LambdaContext

from duetime import __version__
from duetime.api.errors import error_response, error_result, register_error_handlers
from duetime.api.strict_json import as_json, read_json_body, unreadable_body

F = TypeVar("F", bound=Callable[..., Any])

TITLE = "Duetime"
SUMMARY = "Submit jobs to run now, at a set time or on a schedule; read their runs and logs."

#: The resource tags of the routes, in Swagger UI's order.
TAGS: list[Tag] = [
    Tag(name="jobs", description="Submit, change, pause, resume, trigger and delete jobs"),
    Tag(name="runs", description="A job's runs, one run, its logs; cancel or re-drive a run"),
    Tag(name="dead-letters", description="Runs that used up their attempts"),
    Tag(name="schedules", description="Preview a schedule's fire times"),
    Tag(name="notifications", description="Tenant notification rules; a job's events and deliveries"),
    Tag(name="health", description="Liveness"),
]

#: A path parameter's characters in a route rule ``<name>``: those Powertools' routing matches (RFC 3986's
#: unreserved and sub-delimiters, ``:@``, the unsafe ``%<> []{}|^``, and word characters), never ``/``.
_SEGMENT = r"[-._~()'!*:@,;=+&$%<> \[\]{}|^\w]+"
_PARAMETER = re.compile(r"<(\w+)>")


def rule_pattern(rule: str) -> re.Pattern[str]:
    """The paths a route rule such as ``/jobs/<job_id>`` matches."""
    parts = _PARAMETER.split(rule)  # literal, name, literal, name, ..., literal
    regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{_SEGMENT})" for i, p in enumerate(parts))
    return re.compile(f"^{regex}$")


def docstring_parts(func: Callable[..., Any]) -> tuple[str | None, str | None]:
    """A route handler's OpenAPI summary (its docstring's first paragraph) and description (the rest)."""
    doc = inspect.getdoc(func)
    if not doc:
        return None, None
    first, _, rest = doc.partition("\n\n")
    return " ".join(first.split()), (rest.strip() or None)


class DuetimeResolver(APIGatewayHttpResolver):
    """Powertools' HTTP API resolver, plus:

    - bodies are strict JSON (:mod:`duetime.api.strict_json`): one that cannot be read is a 400 naming
      ``body``, whatever its declared content type;
    - each route's OpenAPI summary and description default to its handler's docstring;
    - :meth:`allowed_methods` knows each path's methods, for a 405 with ``Allow`` (the resolver itself
      answers 404 for a known path with another method);
    - the OpenAPI document lists only the statuses the API answers. Powertools adds a 422
      ``HTTPValidationError`` response to every operation (its request validation's default status,
      aws-powertools/powertools-lambda-python#3995); Duetime turns every validation error into a 400
      ``ErrorResponse`` naming the field, so the 422 entries and their schemas are removed.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._methods_by_rule: dict[str, tuple[re.Pattern[str], set[str]]] = {}
        validate = getattr(self, "_request_validation_middleware", None)
        if validate is None:  # a Powertools without it: the check runs as a middleware (after validation)
            self.use(middlewares=[reject_unknown_query])
        else:
            # Powertools runs its request validation before every middleware of ``use``; the query check
            # must come first, or a repeated ``?limit=1&limit=2`` (a list to the validator) is reported as
            # "Input should be a valid integer"
            def query_then_validate(
                app: APIGatewayHttpResolver, next_middleware: NextMiddleware
            ) -> Response[Any]:
                return reject_unknown_query(app, lambda checked: validate(checked, next_middleware))

            self._request_validation_middleware = query_then_validate  # type: ignore[assignment]

    def route(
        self,
        rule: str,
        method: str | list[str] | tuple[str],
        cors: bool | None = None,
        compress: bool = False,
        cache_control: str | None = None,
        summary: str | None = None,
        description: str | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Callable[[F], F]:
        methods = [method] if isinstance(method, str) else list(method)
        _, known = self._methods_by_rule.setdefault(rule, (rule_pattern(rule), set()))
        known.update(m.upper() for m in methods)
        register = super().route

        def documented(func: F) -> F:
            doc_summary, doc_description = docstring_parts(func)
            return register(
                rule,
                method,
                cors,
                compress,
                cache_control,
                summary or doc_summary,
                description or doc_description,
                *args,
                **kwargs,
            )(func)

        return documented

    def is_registered(self, rule: str, method: str) -> bool:
        """Whether a route of ``method`` was registered for ``rule`` (not the resolver's not-found route,
        which Powertools builds for the request's own method and path)."""
        known = self._methods_by_rule.get(rule)
        return known is not None and method.upper() in known[1]

    def allowed_methods(self, path: str) -> list[str]:
        """The methods of the routes whose rule matches ``path``, sorted; empty for an unknown path."""
        return sorted(
            {m for pattern, methods in self._methods_by_rule.values() if pattern.match(path) for m in methods}
        )

    def resolve(self, event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
        problem = unreadable_body(event)
        if problem is not None:
            return error_result(400, "invalid_json", problem, "body")
        return super().resolve(as_json(event), context)

    def get_openapi_schema(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 (see the class)
        schema = super().get_openapi_schema(*args, **kwargs)
        for item in (schema.paths or {}).values():
            for method in ("get", "put", "post", "delete", "options", "head", "patch", "trace"):
                operation = getattr(item, method, None)
                if operation is not None and operation.responses:
                    operation.responses.pop(422, None)
                    operation.responses.pop("422", None)
        if schema.components is not None and schema.components.schemas:
            for name in ("HTTPValidationError", "ValidationError", "ResponseValidationError"):
                schema.components.schemas.pop(name, None)
        return schema


def documented_route(app: APIGatewayHttpResolver) -> Route | None:
    """The route of the request being resolved if it is one of the API's documented routes
    (``include_in_schema``), else None: the console's pages and Swagger UI read their own query strings and
    bodies, and the resolver's not-found route (built for the request's own method and path) answers 404
    or 405 whatever was sent. The strict-input middlewares below check only documented routes."""
    route = app.context.get("_route")
    if not isinstance(route, Route) or not route.include_in_schema:
        return None
    if isinstance(app, DuetimeResolver) and not app.is_registered(route.path, route.method):
        return None
    return route


def reject_unknown_query(
    app: APIGatewayHttpResolver, next_middleware: Callable[[APIGatewayHttpResolver], Response[Any]]
) -> Response[Any]:
    """Run before the request validation (:class:`DuetimeResolver`): a query parameter the route does not declare is a 400 ``validation_error``
    naming it (Powertools' validation ignores it, so a misspelt ``?cuont=3`` would silently fall back to
    the default), and so is a parameter that takes one value given more than once (``?limit=1&limit=2``).
    Only the API's documented routes are held to it (``include_in_schema``); the console's
    pages and Swagger UI read their own query strings."""
    given = app.current_event.query_string_parameters or {}
    route = documented_route(app) if given else None
    if route is None:
        return next_middleware(app)
    fields = get_flat_dependant(route.dependant).query_params
    known = {field.alias for field in fields}
    unknown = sorted(set(given) - known)
    if unknown:
        name = unknown[0]
        allowed = ", ".join(sorted(known)) or "none"
        message = (
            f"{name}: unknown query parameter of {route.method} {route.openapi_path} (it takes: {allowed})"
        )
        return error_response(400, "validation_error", message, name)
    # API Gateway (payload 2.0) joins a repeated parameter's values with commas, which Powertools then splits
    # into a list: `?limit=1&limit=2` would read as "Input should be a valid integer"; only rawQueryString
    # still shows it was given twice
    single = {field.alias for field in fields if not is_scalar_sequence_field(field)}
    times = Counter(
        name for name, _ in parse_qsl(app.current_event.raw_query_string or "", keep_blank_values=True)
    )
    repeated = sorted(name for name in single if times[name] > 1)
    if repeated:
        name = repeated[0]
        return error_response(
            400, "validation_error", f"{name}: given {times[name]} times; give it once", name
        )
    return next_middleware(app)


def create_app() -> DuetimeResolver:
    """A resolver with the error handlers, Swagger UI at ``/docs`` and the schema at ``/openapi.json``; the
    caller includes the routers."""
    app = DuetimeResolver(enable_validation=True, json_body_deserializer=read_json_body)
    app.enable_swagger(path="/docs", title=TITLE, version=__version__, summary=SUMMARY, tags=[*TAGS])
    register_error_handlers(app)
    app.use(middlewares=[reject_unexpected_body])

    def no_route(_: Exception) -> Response[str]:
        method, path = app.current_event.http_method, app.current_event.path
        allowed = [m for m in app.allowed_methods(path) if m != method]
        if allowed:  # the resource exists; the method does not (RFC 9110 section 15.5.6)
            message = f"{method} is not allowed on {path}; use {', '.join(allowed)}"
            response = error_response(405, "method_not_allowed", message)
            response.headers["Allow"] = ", ".join(allowed)
            return response
        return error_response(404, "no_such_route", f"no route {method} {path}")

    app.not_found(no_route)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi_json() -> Response[str]:
        schema = app.get_openapi_json_schema(title=TITLE, version=__version__, tags=[*TAGS])
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=schema)

    return app


#: bodies a route that takes none accepts anyway (clients that always send JSON send these for an action)
_EMPTY_BODIES = frozenset({"", "{}", "null"})


def reject_unexpected_body(app: APIGatewayHttpResolver, next_middleware: NextMiddleware) -> Response[Any]:
    """A global middleware: a body sent to a documented route that takes none (``POST /jobs/{job_id}/pause``,
    ``/trigger``...) is a 400 naming ``body``, as an unknown field of a body is: it would otherwise be
    dropped unread. An empty body, ``{}`` and ``null`` are taken as none."""
    body = app.current_event.body
    sent = body is not None and "".join(body.split()) not in _EMPTY_BODIES
    route = documented_route(app) if sent else None
    if route is None or get_flat_dependant(route.dependant).body_params:
        return next_middleware(app)
    message = f"body: {route.method} {route.openapi_path} takes no body (send none, or {{}})"
    return error_response(400, "validation_error", message, "body")
