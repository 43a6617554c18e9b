"""Serve a Lambda handler over real HTTP the way API Gateway's HTTP API (payload format 2.0) would."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

from werkzeug.wrappers import Request, Response

Invoke = Callable[[dict[str, Any]], Any]

_TEXT_TYPES = ("application/json", "text/", "application/x-www-form-urlencoded", "application/xml")


def to_http_api_event(request: Request) -> dict[str, Any]:
    """An HTTP API v2 event for ``request`` (headers lower-cased, repeated query values comma-joined)."""
    raw = request.get_data()
    content_type = request.headers.get("Content-Type", "")
    is_text = not raw or any(content_type.startswith(t) for t in _TEXT_TYPES) or not content_type
    try:
        body: str | None = raw.decode("utf-8") if is_text else None
    except UnicodeDecodeError:
        body = None
    is_b64 = body is None and bool(raw)
    if is_b64:
        body = base64.b64encode(raw).decode()
    query: dict[str, list[str]] = {}
    raw_qs = request.query_string.decode("latin-1")
    for key, value in parse_qsl(raw_qs, keep_blank_values=True):
        query.setdefault(key, []).append(value)
    now = datetime.now(UTC)
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": request.path,
        "rawQueryString": raw_qs,
        "headers": {k.lower(): v for k, v in request.headers.items()},
        "queryStringParameters": {k: ",".join(v) for k, v in query.items()} or None,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": request.host,
            "domainPrefix": "local",
            "http": {
                "method": request.method,
                "path": request.path,
                "protocol": request.environ.get("SERVER_PROTOCOL", "HTTP/1.1"),
                "sourceIp": request.remote_addr or "127.0.0.1",
                "userAgent": request.headers.get("User-Agent", ""),
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(time.time() * 1000),
        },
        "body": body if raw else None,
        "isBase64Encoded": is_b64,
    }


def from_http_api_result(result: dict[str, Any]) -> Response:
    """A werkzeug response from a handler's HTTP API v2 result."""
    body = result.get("body") or ""
    data = base64.b64decode(body) if result.get("isBase64Encoded") else body.encode("utf-8")
    response = Response(data, status=int(result.get("statusCode", 200)))
    for key, value in (result.get("headers") or {}).items():
        response.headers[key] = value
    for key, values in (result.get("multiValueHeaders") or {}).items():
        for value in values:
            response.headers.add(key, value)
    for cookie in result.get("cookies") or []:
        response.headers.add("Set-Cookie", cookie)
    return response


class HttpApiAdapter:
    """WSGI app: request -> HTTP API event -> ``invoke`` -> response. A handler crash is a 500, as in AWS.

    Args:
        invoke: the Lambda handler, ``event -> result``.
        tenants: bearer token -> tenant name. When given, the adapter acts as the HTTP API's JWT authorizer:
            a request needs ``Authorization: Bearer <token>`` of a known tenant (else 401, API Gateway's
            ``{"message": "Unauthorized"}``), and the tenant goes into the event as the ``sub`` claim at
            ``requestContext.authorizer.jwt.claims``, where API Gateway puts a JWT's claims.
    """

    def __init__(self, invoke: Invoke, *, tenants: dict[str, str] | None = None) -> None:
        self.invoke = invoke
        self.tenants = dict(tenants or {})

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        request = Request(environ)
        event = to_http_api_event(request)
        if self.tenants:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            tenant = self.tenants.get(token.strip()) if scheme.lower() == "bearer" else None
            if tenant is None:
                denied = Response('{"message":"Unauthorized"}', status=401, content_type="application/json")
                denied.headers["WWW-Authenticate"] = "Bearer"
                return denied(environ, start_response)
            event["requestContext"]["authorizer"] = {"jwt": {"claims": {"sub": tenant}, "scopes": []}}
        try:
            result = self.invoke(event)
            response = from_http_api_result(result)
        except Exception:  # noqa: BLE001 - mirror API Gateway: an invocation error is a 500
            import traceback

            traceback.print_exc()
            response = Response(
                '{"error": {"code": "internal_error", "message": "Internal Server Error", "field": null}}',
                status=500,
                content_type="application/json",
            )
        return response(environ, start_response)
