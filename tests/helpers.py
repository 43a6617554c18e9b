"""Small helpers for tests: API Gateway events, queue inspection."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from duetime.adapters.aws import clients as aws
from duetime.local.lambda_runtime import LocalLambdaContext

if TYPE_CHECKING:
    from duetime.services.worker import Worker


def http_event(
    method: str,
    path: str,
    body: Any = None,
    query: dict[str, str] | list[tuple[str, str]] | None = None,
    raw_body: str | None = None,
    headers: dict[str, str] | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """An API Gateway HTTP API (payload 2.0) event; ``tenant`` puts a JWT authorizer's ``sub`` claim in it."""
    text = raw_body if raw_body is not None else (json.dumps(body) if body is not None else None)
    event = _event(method, path, text, query, headers)
    if tenant is not None:
        event["requestContext"]["authorizer"] = {"jwt": {"claims": {"sub": tenant}, "scopes": []}}
    return event


def _event(
    method: str,
    path: str,
    text: str | None,
    query: dict[str, str] | list[tuple[str, str]] | None,
    headers: dict[str, str] | None,
) -> dict[str, Any]:
    # a list of pairs may repeat a name: API Gateway joins its values with commas in queryStringParameters
    pairs = list(query.items()) if isinstance(query, dict) else list(query or [])
    joined: dict[str, str] = {}
    for name, value in pairs:
        joined[name] = f"{joined[name]},{value}" if name in joined else value
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "&".join(f"{k}={v}" for k, v in pairs),
        "headers": {"content-type": "application/json", **(headers or {})},
        "queryStringParameters": joined if query is not None else None,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "test",
            "domainName": "test",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": "pytest",
            },
            "requestId": "req-1",
            "routeKey": "$default",
            "stage": "$default",
            "timeEpoch": 0,
        },
        "body": text,
        "isBase64Encoded": False,
    }


def call(
    api: ModuleType, method: str, path: str, body: Any = None, **kw: Any
) -> tuple[int, Any, dict[str, str]]:
    """Invoke the API handler; returns (status, parsed JSON or text, headers)."""
    result = api.lambda_handler(http_event(method, path, body, **kw), LocalLambdaContext("api"))
    headers = {k.lower(): v for k, v in (result.get("headers") or {}).items()}
    text = result.get("body") or ""
    parsed: Any = json.loads(text) if headers.get("content-type", "").startswith("application/json") else text
    return result["statusCode"], parsed, headers


def queue_counts(queue_url: str) -> dict[str, int]:
    """``{"visible", "delayed", "in_flight"}`` message counts of a queue."""
    attrs = aws.client("sqs").get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesDelayed",
            "ApproximateNumberOfMessagesNotVisible",
        ],
    )["Attributes"]
    return {
        "visible": int(attrs["ApproximateNumberOfMessages"]),
        "delayed": int(attrs["ApproximateNumberOfMessagesDelayed"]),
        "in_flight": int(attrs["ApproximateNumberOfMessagesNotVisible"]),
    }


def drain(queue_url: str) -> list[dict[str, Any]]:
    """Receive and delete every visible message; returns their parsed bodies (simulates a lost message)."""
    sqs = aws.client("sqs")
    bodies = []
    while True:
        out = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        if not out.get("Messages"):
            return bodies
        for m in out["Messages"]:
            bodies.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 20.0) -> Any:
    """``probe()``'s first truthy value, looking every 50 ms for up to ``timeout`` seconds (AssertionError
    naming ``what`` past it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def running_worker(worker: Worker) -> Iterator[threading.Thread]:
    """``worker.run_forever()`` in a thread, stopped (and joined) on the way out."""
    thread = threading.Thread(target=worker.run_forever, kwargs={"wait_seconds": 1}, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(timeout=20)
        assert not thread.is_alive(), "the worker did not stop"


@contextlib.contextmanager
def moto_server_thread(monkeypatch: Any, host: str = "127.0.0.1") -> Iterator[tuple[Any, threading.Thread]]:
    """moto's server as the local stack runs it (:func:`duetime.local.moto_server.make_server`: DynamoDB
    serialised, connections kept alive) on a thread of this process, every client of
    :mod:`duetime.adapters.aws.clients` pointed at it with fake credentials; yields the server (its port:
    ``effective_port``) and its thread. Stopped, and moto's state reset, on exit."""
    import logging

    from duetime.local.moto_server import make_server, stop_server
    from duetime.local.stack import LOCAL_AWS_ENV

    monkeypatch.setattr(
        logging.getLogger("waitress.queue"), "level", logging.ERROR
    )  # no line per queued request
    server = make_server(host, 0)
    thread = threading.Thread(target=server.run, name="moto-server", daemon=True)
    thread.start()
    for key, value in LOCAL_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.effective_port}")
    aws.reset_clients()
    try:
        yield server, thread
    finally:
        aws.reset_clients()
        stop_server(server, thread)
        from moto.moto_api._internal.models import moto_api_backend  # the tables and queues it held

        moto_api_backend.reset()
