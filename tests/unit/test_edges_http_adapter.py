"""The local HTTP API's own errors: what http.server refuses before the app sees it is JSON in the API's shape."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from duetime.local.http_adapter import HttpApiAdapter, make_api_server


def _ok(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "statusCode": 200,
        "headers": {"content-type": "application/json"},
        "body": json.dumps({"path": event["rawPath"]}),
    }


@pytest.fixture
def port() -> Iterator[int]:
    server = make_api_server("127.0.0.1", 0, HttpApiAdapter(_ok))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port
    server.shutdown()
    thread.join(timeout=5)


def exchange(port: int, request: bytes, close_write: bool = False) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes (then end the stream if ``close_write``), read the whole answer: (status, headers
    lower-cased, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), {k.lower(): v for k, v in headers.items()}, body


def assert_api_error(headers: dict[str, str], body: bytes, code: str) -> str:
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert set(error) == {"code", "message", "field"}
    assert error["code"] == code and error["field"] is None
    message: str = error["message"]
    return message


def test_a_100_kb_query_string_is_a_json_414(port: int) -> None:
    status, headers, body = exchange(
        port, b"GET /jobs?name_prefix=" + b"x" * 100_000 + b" HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    assert status == 414
    message = assert_api_error(headers, body, "uri_too_long")
    assert message == (
        "Request-URI Too Long: the request line (method, path and query string) is longer than 65,536 bytes; "
        "send large input in the request body"
    )


def test_a_malformed_request_line_is_a_json_400_with_a_status_line(port: int) -> None:
    status, headers, body = exchange(port, b"GET /jobs with spaces HTTP/1.1\r\nHost: a\r\n\r\n")
    assert status == 400
    message = assert_api_error(headers, body, "bad_request")
    assert message == "Bad Request: Bad request syntax ('GET /jobs with spaces HTTP/1.1')"


def test_a_one_word_request_line_still_gets_a_status_line_and_json(port: int) -> None:
    status, headers, body = exchange(port, b"GARBAGE\r\n\r\n")
    assert status == 400
    assert_api_error(headers, body, "bad_request")


def test_a_header_line_over_64_kb_is_a_json_431(port: int) -> None:
    status, headers, body = exchange(port, b"GET /jobs HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
    assert status == 431
    message = assert_api_error(headers, body, "request_header_fields_too_large")
    assert message.startswith("Line too long: a header line is longer than 65,536 bytes")


def test_more_than_100_headers_is_a_json_431(port: int) -> None:
    many = b"".join(b"X-H%d: 1\r\n" % i for i in range(120))
    status, headers, body = exchange(port, b"GET /jobs HTTP/1.1\r\n" + many + b"\r\n")
    assert status == 431
    assert assert_api_error(headers, body, "request_header_fields_too_large").startswith("Too many headers")


def test_an_unsupported_http_version_is_a_json_505(port: int) -> None:
    status, headers, body = exchange(port, b"GET /jobs HTTP/2.0\r\n\r\n")
    assert status == 505
    assert assert_api_error(headers, body, "http_version_not_supported").endswith(
        "Invalid HTTP version (2.0)"
    )


def test_a_malformed_chunked_body_is_a_json_400_not_an_html_500(port: int) -> None:
    request = b"POST /jobs HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n"
    status, headers, body = exchange(port, request, close_write=True)
    assert status == 400
    message = assert_api_error(headers, body, "bad_request")
    assert message == "the request body cannot be read: Invalid chunk header"


def test_a_body_shorter_than_its_content_length_is_a_json_400(port: int) -> None:
    request = b"POST /jobs HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nabc"
    status, headers, body = exchange(port, request, close_write=True)
    assert status == 400
    assert assert_api_error(headers, body, "bad_request").startswith("the request body cannot be read: ")


def test_a_well_formed_request_still_reaches_the_handler(port: int) -> None:
    status, headers, body = exchange(
        port, b"GET /jobs?limit=5 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    assert status == 200 and json.loads(body) == {"path": "/jobs"}


def test_a_body_over_10_mb_is_a_json_413_before_it_is_read(port: int) -> None:
    # Given a request that declares 11 MB and sends only the first bytes
    request = b"POST /jobs HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: 11534336\r\n\r\n{"
    status, headers, body = exchange(port, request, close_write=True)
    # Then it is refused at once with the API's error shape, naming both sizes
    assert status == 413
    message = assert_api_error(headers, body, "request_entity_too_large")
    assert "11,534,336 bytes" in message and "10,485,760" in message
    # written as the API writes its own errors (compact JSON, the same key order)
    assert body.startswith(b'{"error":{"code":"request_entity_too_large","message":"the request body is ')


def test_a_chunked_body_over_10_mb_is_a_json_413(port: int) -> None:
    chunk = b"a" * (1024 * 1024)
    request = b"POST /jobs HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    request += b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(11)) + b"0\r\n\r\n"
    status, headers, body = exchange(port, request, close_write=True)
    assert status == 413
    assert assert_api_error(headers, body, "request_entity_too_large").startswith(
        "the request body cannot be read"
    )


def test_a_body_of_exactly_10_mb_still_reaches_the_handler(port: int) -> None:
    size = 10 * 1024 * 1024
    request = b"POST /jobs HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % size
    status, _, body = exchange(port, request + b" " * size)
    assert status == 200 and json.loads(body) == {"path": "/jobs"}
