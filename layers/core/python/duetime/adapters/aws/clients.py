"""Cached boto3 clients, created lazily (never at import time: that breaks moto and costs cold starts).

Endpoints come from the standard ``AWS_ENDPOINT_URL`` variable (boto3 >= 1.28), which is how the local
stack points every process at its moto server.

:func:`add_client_hook` registers a function called on every client created from then on (``bench/`` counts
every AWS call this way: :func:`duetime.local.callcount.install_from_env`), so no adapter depends on what
observes it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

_lock = threading.Lock()
_clients: dict[str, Any] = {}

#: Called with each new client, before anyone uses it (under the clients' lock: it must not call :func:`client`).
ClientHook = Callable[[Any], None]
_hooks: list[ClientHook] = []

#: Standard retry mode: SDK retries throttling and 5xx with backoff ([S0] backoff applies to us too).
#: No client-side parameter validation: the requests are Duetime's own, never a user's, and every service
#: validates them again; botocore's walk of each request's shape was about a tenth of a tick's CPU per claim.
_CONFIG = Config(
    retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=32, parameter_validation=False
)


def client(service: str) -> Any:
    """A process-wide boto3 client for ``service`` (thread-safe to share, created once)."""
    found = _clients.get(service)
    if found is not None:
        return found
    with _lock:
        if service not in _clients:
            made = boto3.session.Session().client(service, config=_CONFIG)
            for hook in _hooks:
                hook(made)
            _clients[service] = made
        return _clients[service]


def warm(*services: str) -> None:
    """Create the clients of ``services`` now (:func:`client`), for a long-lived process that will use them:
    a worker at its start, so its first runs do not pay for them (about 60 ms of CPU each: botocore loads
    and builds the service model). Lambda handlers never call it (a cold start pays only for what it uses)."""
    for service in services:
        client(service)


def add_client_hook(hook: ClientHook) -> None:
    """Call ``hook(client)`` on every client :func:`client` creates from now on (clients already cached are
    not revisited: :func:`reset_clients` first for that). Adding the same hook again changes nothing."""
    with _lock:
        if hook not in _hooks:
            _hooks.append(hook)


def remove_client_hook(hook: ClientHook) -> None:
    """Stop calling ``hook`` on new clients (nothing happens if it was not added)."""
    with _lock:
        if hook in _hooks:
            _hooks.remove(hook)


def reset_clients() -> None:
    """Forget cached clients (tests that start a fresh moto mock call this)."""
    with _lock:
        _clients.clear()


def _forget_in_child() -> None:
    """After ``fork``: the child creates its own clients (a parent's connection pool is not the child's to
    use) and its own lock (another thread of the parent may have held it at the fork)."""
    global _lock
    _lock = threading.Lock()
    _clients.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def unreachable(exc: BaseException) -> bool:
    """True when ``exc`` says the AWS endpoint could not be reached at all (connection refused or dropped,
    read timed out): nothing was learned from AWS, so one line says it better than a traceback."""
    return isinstance(exc, EndpointConnectionError | ConnectionClosedError | ReadTimeoutError)
