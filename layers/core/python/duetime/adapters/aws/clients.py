"""Cached boto3 clients, created lazily (never at import time: that breaks moto and costs cold starts).

Endpoints come from the standard ``AWS_ENDPOINT_URL`` variable (boto3 >= 1.28), which is how the local
stack points every process at its moto server.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

_lock = threading.Lock()
_clients: dict[str, Any] = {}

#: Standard retry mode: SDK retries throttling and 5xx with backoff ([S0] backoff applies to us too).
_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=32)


def client(service: str) -> Any:
    """A process-wide boto3 client for ``service`` (thread-safe to share, created once)."""
    found = _clients.get(service)
    if found is not None:
        return found
    with _lock:
        if service not in _clients:
            made = boto3.session.Session().client(service, config=_CONFIG)
            if os.environ.get("DUETIME_CALL_COUNT_DIR"):  # bench/: count every call (duetime.local.callcount)
                from duetime.local import callcount

                callcount.register(made, os.environ["DUETIME_CALL_COUNT_DIR"])
            _clients[service] = made
        return _clients[service]


def reset_clients() -> None:
    """Forget cached clients (tests that start a fresh moto mock call this)."""
    with _lock:
        _clients.clear()


def unreachable(exc: BaseException) -> bool:
    """True when ``exc`` says the AWS endpoint could not be reached at all (connection refused or dropped,
    read timed out): nothing was learned from AWS, so one line says it better than a traceback."""
    return isinstance(exc, EndpointConnectionError | ConnectionClosedError | ReadTimeoutError)
