"""The local moto server (:mod:`duetime.local.moto_server`) as its clients see it over HTTP: connections kept
alive, S3 keys stored as sent, and a stop that ends its loop and refuses new connections."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from duetime.adapters.aws import clients as aws
from duetime.local.moto_server import stop_server
from tests.helpers import moto_server_thread

#: DynamoDB's ListTables as botocore sends it (moto checks no signature)
LIST_TABLES = {
    "X-Amz-Target": "DynamoDB_20120810.ListTables",
    "Content-Type": "application/x-amz-json-1.0",
    "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20261206/us-east-1/dynamodb/aws4_request, "
    "SignedHeaders=host, Signature=0",
}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, threading.Thread]]:
    """moto's server on a thread of this process, every client pointed at it; stopped after the test."""
    with moto_server_thread(monkeypatch, host="localhost") as served:  # a name: resolved to one socket
        yield served


def test_two_requests_share_one_connection(served: tuple[Any, threading.Thread]) -> None:
    # Given one HTTP/1.1 connection to the server
    server, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", server.effective_port, timeout=10)
    answers = []
    sockets = []
    # When two requests are sent on it, one after the other
    for _ in range(2):
        conn.request("POST", "/", body=b"{}", headers=LIST_TABLES)
        response = conn.getresponse()
        answers.append((response.status, response.getheader("Connection"), response.read()))
        sockets.append(conn.sock)
    conn.close()
    # Then both are answered and the connection stays open between them (werkzeug's server closed it)
    assert [status for status, _, _ in answers] == [200, 200]
    assert all(header is None or header.lower() != "close" for _, header, _ in answers)
    assert answers[0][2] == b'{"TableNames": []}'
    assert sockets[0] is not None and sockets[0] is sockets[1]


def test_s3_keys_with_percent_and_question_marks_are_stored_as_sent(
    served: tuple[Any, threading.Thread],
) -> None:
    # Given keys that a tenant name could put in a path ("%" and "?" are sent percent-encoded)
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="kept-keys")
    keys = [
        "tenant=a%20b/x.log",
        "tenant=q?mark/y.log",
        "tenant=a?x/z.log",
        "tenant=a?y/z.log",
        "plain/one.log",
    ]
    # When each is written with its own body
    for key in keys:
        s3.put_object(Bucket="kept-keys", Key=key, Body=key.encode())
    # Then the listing holds exactly those keys, and each reads back its own body
    listed = [item["Key"] for item in s3.list_objects_v2(Bucket="kept-keys")["Contents"]]
    assert sorted(listed) == sorted(keys)
    assert [s3.get_object(Bucket="kept-keys", Key=key)["Body"].read() for key in keys] == [
        k.encode() for k in keys
    ]


def test_a_stopped_server_ends_its_loop_and_refuses_connections(served: tuple[Any, threading.Thread]) -> None:
    # Given a server with a client connection kept open
    server, thread = served
    port = server.effective_port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/", body=b"{}", headers=LIST_TABLES)
    assert conn.getresponse().read() == b'{"TableNames": []}'
    # When it is stopped
    stop_server(server, thread)
    # Then its loop has ended, the open connection is closed and a new one is refused
    assert not thread.is_alive()
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        conn.request("POST", "/", body=b"{}", headers=LIST_TABLES)
        conn.getresponse().read()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
