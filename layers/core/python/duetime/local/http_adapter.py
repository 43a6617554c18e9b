"""Serve a Lambda handler over real HTTP the way API Gateway's HTTP API (payload format 2.0) would.

Every error answer is the API's JSON shape ``{"error": {"code", "message", "field"}}`` with
``content-type: application/json``: the handler's own, a handler crash (500), and, served through
:func:`make_api_server`, those that Python's ``http.server`` sends before a request reaches the app (a
request line over 64 KB: 414; a malformed request line: 400; a header line over 64 KB or more than 100
headers: 431; HTTP/2 or later: 505).
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, urlencode

from werkzeug.exceptions import HTTPException, RequestEntityTooLarge
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from duetime.api.console.render import session_token
from duetime.api.errors import error_body as api_error_body

Invoke = Callable[[dict[str, Any]], Any]

_TEXT_TYPES = ("application/json", "text/", "application/x-www-form-urlencoded", "application/xml")

#: what a client can do about the errors ``http.server`` answers itself (its messages say what, not why)
_HINTS = {
    HTTPStatus.REQUEST_URI_TOO_LONG: "the request line (method, path and query string) is longer than "
    "65,536 bytes; send large input in the request body",
    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE: "a header line is longer than 65,536 bytes, or there are "
    "more than 100 headers",
}
#: longest text of the request echoed in an error message (http.server quotes the bad request line)
_MAX_MESSAGE_CHARS = 512
#: the largest request body, bytes: API Gateway's HTTP API payload limit (10 MB), so the local API refuses
#: what AWS would, before reading it (a 413)
MAX_BODY_BYTES = 10 * 1024 * 1024


def error_body(status: int, message: str, field: str | None = None) -> bytes:
    """The API's error JSON for ``status``; its ``code`` is the status' name (``uri_too_long``...)."""
    try:
        code = HTTPStatus(status).name.lower()
    except ValueError:
        code = "http_error"
    code = {"request_uri_too_long": "uri_too_long"}.get(code, code)
    return api_error_body(code, message, field).encode()  # the same shape and spacing as the API's own


class JsonErrorRequestHandler(WSGIRequestHandler):
    """werkzeug's request handler, but the errors ``http.server`` sends itself are the API's JSON errors
    instead of an HTML page (414, 400, 431, 505...: requests rejected before they reach the app)."""

    error_content_type = "application/json"

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        try:
            status: HTTPStatus | None = HTTPStatus(code)
        except ValueError:
            status = None
        phrase = status.phrase if status is not None else "Error"
        text = message or phrase
        hint = _HINTS.get(status) if status is not None else None
        if hint:
            text = f"{text}: {hint}"
        elif message and status is not None and message != phrase:
            text = f"{phrase}: {message}"
        if len(text) > _MAX_MESSAGE_CHARS:
            text = text[: _MAX_MESSAGE_CHARS - 1] + "…"
        self.log_error("code %d, message %s", code, message or phrase)
        if self.request_version == "HTTP/0.9":  # an unparsed request line: answer with a status line anyway
            self.request_version = "HTTP/1.0"
        self.send_response(code)  # the standard reason phrase: never the request's text in the status line
        self.send_header("Connection", "close")
        body = None
        if code >= 200 and code not in (
            HTTPStatus.NO_CONTENT,
            HTTPStatus.RESET_CONTENT,
            HTTPStatus.NOT_MODIFIED,
        ):
            body = error_body(code, text)
            self.send_header("Content-Type", self.error_content_type)
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)


def make_api_server(
    host: str, port: int, app: Callable[..., Any], *, fd: int | None = None
) -> BaseWSGIServer:
    """A threaded HTTP server for ``app`` whose every error answer is JSON (:class:`JsonErrorRequestHandler`).

    ``duetime local`` serves its API with it: a 414, 431 or malformed request gets the API's error shape.
    With ``fd``, it serves the already listening socket of that descriptor (``host`` and ``port`` unused):
    each of the stack's API processes (:mod:`duetime.local.api_process`) accepts from the one socket.
    """
    return make_server(host, port, app, threaded=True, request_handler=JsonErrorRequestHandler, fd=fd)


def to_http_api_event(request: Request) -> dict[str, Any]:
    """An HTTP API v2 event for ``request`` (headers lower-cased, repeated query values comma-joined)."""
    raw = request.get_data()
    if len(raw) > MAX_BODY_BYTES:
        raise RequestEntityTooLarge(f"over {MAX_BODY_BYTES:,} bytes (API Gateway's payload limit)")
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


#: the console's pages; with tenants, their bearer token may come from the sign-in's session cookie
CONSOLE = "/console"
#: console paths served without a tenant's identity: the sign-in form, the static assets and the AWS shell
#: (``--console-oidc``), as the CDK app's routes without authorization
CONSOLE_PUBLIC = ("/console/sign-in", "/console/static/", "/console/shell")


def _to_sign_in(request: Request, *, failed: bool) -> Response:
    """303 to the sign-in form (``failed``: the cookie's token is no tenant's), coming back to this page
    once signed in; an htmx request is told to load the form as a whole page (``HX-Redirect``)."""
    goal = request.full_path.rstrip("?") if request.method == "GET" else "/console/jobs"
    query = {"next": goal, **({"failed": "1"} if failed else {})}
    location = "/console/sign-in?" + urlencode(query)
    response = Response("", status=303)
    response.headers["Location"] = location
    response.headers["Cache-Control"] = "no-store"
    if request.headers.get("HX-Request"):
        response.headers["HX-Redirect"] = location
    return response


class HttpApiAdapter:
    """WSGI app: request -> HTTP API event -> ``invoke`` -> response. A handler crash is a 500, as in AWS.

    Args:
        invoke: the Lambda handler, ``event -> result``.
        tenants: bearer token -> tenant name. When given, the adapter acts as the HTTP API's JWT authorizer:
            a request needs ``Authorization: Bearer <token>`` of a known tenant (else 401, API Gateway's
            ``{"message": "Unauthorized"}``), and the tenant goes into the event as the ``sub`` claim at
            ``requestContext.authorizer.jwt.claims``, where API Gateway puts a JWT's claims. Console pages
            (``/console...``) may carry the token in the sign-in's session cookie instead
            (:data:`duetime.api.console.render.SESSION_COOKIE`); one without a known token is sent to the
            sign-in form (303), which, with the static assets, needs none.
    """

    def __init__(self, invoke: Invoke, *, tenants: dict[str, str] | None = None) -> None:
        self.invoke = invoke
        self.tenants = dict(tenants or {})

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        request = Request(environ)
        # a body over the limit is refused unread when its length is declared (a chunked one once read)
        if (request.content_length or 0) > MAX_BODY_BYTES:
            refused = Response(
                error_body(
                    413,
                    f"the request body is {request.content_length:,} bytes; the API takes at most "
                    f"{MAX_BODY_BYTES:,} (API Gateway's payload limit)",
                ),
                status=413,
            )
            refused.content_type = "application/json"
            refused.headers["Connection"] = "close"
            return refused(environ, start_response)
        try:
            event = to_http_api_event(request)
        except (HTTPException, OSError, ValueError) as exc:  # a body shorter than its length, bad chunks
            status = (exc.code if isinstance(exc, HTTPException) else None) or 400
            why = exc.description if isinstance(exc, HTTPException) else str(exc)
            refused = Response(error_body(status, f"the request body cannot be read: {why}"), status=status)
            refused.content_type = "application/json"
            return refused(environ, start_response)
        if self.tenants:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            bearer: str | None = (token.strip() or None) if scheme.lower() == "bearer" else None
            console = request.path == CONSOLE or request.path.startswith(CONSOLE + "/")
            if bearer is None and console:
                bearer = session_token(request.cookies)
            tenant = self.tenants.get(bearer) if bearer else None
            if tenant is not None:
                event["requestContext"]["authorizer"] = {"jwt": {"claims": {"sub": tenant}, "scopes": []}}
            elif console and not request.path.startswith(CONSOLE_PUBLIC):
                return _to_sign_in(request, failed=bearer is not None)(environ, start_response)
            elif not console:
                denied = Response('{"message":"Unauthorized"}', status=401, content_type="application/json")
                denied.headers["WWW-Authenticate"] = "Bearer"
                return denied(environ, start_response)
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
