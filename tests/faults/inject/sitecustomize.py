"""Fault injection inside every Python process of a local stack (the stack itself, its workers, moto's server),
and, on the embedded backend, a count of what another process's hold on the SQLite write lock did to them.

The fault tests start ``duetime local`` with ``PYTHONPATH`` pointing here and ``FAULTS_CONTROL_FILE`` naming a
JSON file; Python then imports this module at start-up, and every boto3 client the process creates afterwards
(``duetime.adapters.aws.clients.client`` makes them all) carries two botocore hooks:

- ``before-send.dynamodb``: with probability ``rate`` answers an HTTP attempt of an operation in ``ops`` with a
  400 ``ProvisionedThroughputExceededException`` instead of sending it. botocore's standard retry mode then
  backs off and retries (up to 5 attempts), so most calls still get through, a few fail for good.
- ``after-call.dynamodb``: counts calls that succeeded after being throttled, and calls that gave up.

The control file is re-read whenever it changes, so a test turns throttling on and off while the stack runs:
``{"rate": 0.3, "ops": ["PutItem", "UpdateItem"]}``; ``{"rate": 0}`` stops it. Each process appends what it
did to ``<control file>.<pid>.log``, one word per event: ``throttled``, ``recovered``, ``gave_up``.

On the embedded backend the fault is not injected here but real: the test holds the state file's write lock from
its own process. What this module adds is a wrapper of ``duetime.adapters.sqlite.db.Database.transaction`` (the
one way every SQLite adapter writes) that logs, in the same file, ``lock_waited`` for a transaction that got the
lock after waiting 0.5 s or more and ``lock_gave_up`` for one refused with ``ThrottledError`` (the busy timeout
ran out).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_CONTROL = os.environ.get("FAULTS_CONTROL_FILE")


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Any:
        yield self._body


class _Throttle:
    def __init__(self, control: str) -> None:
        self.control = control
        self.mtime = -1.0
        self.rate = 0.0
        self.ops: set[str] = set()
        self.rng = random.Random(os.getpid())
        self.log = f"{control}.{os.getpid()}.log"

    def _reload(self) -> None:
        try:
            mtime = os.stat(self.control).st_mtime
        except OSError:
            self.rate = 0.0
            return
        if mtime != self.mtime:
            self.mtime = mtime
            try:
                data = json.loads(open(self.control).read() or "{}")  # noqa: SIM115 - tiny file
            except ValueError:
                return  # caught mid-write: keep the previous settings
            self.rate = float(data.get("rate", 0.0))
            self.ops = set(data.get("ops", ["PutItem", "UpdateItem", "GetItem", "Query"]))

    def _note(self, word: str) -> None:
        with open(self.log, "a") as fh:
            fh.write(word + "\n")

    def before_send(self, request: Any, **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        self._reload()
        target = request.headers.get("X-Amz-Target", "")
        if isinstance(target, bytes):
            target = target.decode()
        operation = str(target).rsplit(".", 1)[-1]
        if self.rate <= 0 or operation not in self.ops or self.rng.random() >= self.rate:
            return None
        self._note("throttled")
        body = json.dumps(
            {
                "__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                "message": "injected by tests/faults: throughput exceeded",
            }
        ).encode()
        headers = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-RequestId": "faults"}
        return AWSResponse(request.url, 400, headers, _Raw(body))

    def after_call(self, http_response: Any, parsed: dict[str, Any], **_: Any) -> None:
        retries = parsed.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        code = parsed.get("Error", {}).get("Code")
        if code == "ProvisionedThroughputExceededException":
            self._note("gave_up")
        elif retries and http_response.status_code < 300:
            self._note("recovered")


def _count_lock_waits(log: str) -> None:
    """Wrap the SQLite adapters' write transaction to log how long it waited for the write lock."""
    from duetime.adapters.sqlite import db
    from duetime.domain.errors import ThrottledError

    begin = db.Database.transaction

    def note(word: str) -> None:
        with open(log, "a") as fh:
            fh.write(word + "\n")

    @contextmanager
    def transaction(self: Any, **options: Any) -> Iterator[Any]:
        asked = time.monotonic()
        entered = False
        try:
            with begin(self, **options) as conn:
                entered = True
                if time.monotonic() - asked >= 0.5:
                    note("lock_waited")
                yield conn
        except ThrottledError:
            note("lock_gave_up" if not entered else "commit_refused")
            raise

    db.Database.transaction = transaction  # type: ignore[method-assign]


if _CONTROL:
    import botocore.handlers

    _hooks = _Throttle(_CONTROL)
    botocore.handlers.BUILTIN_HANDLERS.append(("before-send.dynamodb", _hooks.before_send))
    botocore.handlers.BUILTIN_HANDLERS.append(("after-call.dynamodb", _hooks.after_call))
    try:
        _count_lock_waits(_hooks.log)
    except ImportError:  # a process without duetime on its path
        pass
