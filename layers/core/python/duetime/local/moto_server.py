"""moto's server on 127.0.0.1 with DynamoDB requests serialised.

moto's DynamoDB has no locking: concurrent writers lose updates and a failed transaction restores a table
snapshot over concurrent writes (DESIGN.md section 9). One lock in front of every DynamoDB request restores
the per-item atomicity that Duetime's conditional writes rely on. Other services (SQS long polls!) are not
serialised. moto's key ordering is made cheaper, with the same answers (:mod:`duetime.local.moto_speedups`:
its Query of an index sorted the whole table by comparing ``DynamoType`` objects, 500 ms at 10,000 jobs).

Run as ``python -m duetime.local.moto_server [--host H] [--port P]``; it prints ``PORT <n>`` once listening.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from duetime.local import moto_speedups
from duetime.local.lifeline import die_with_parent

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class SerializeDynamoDB:
    """WSGI middleware: one DynamoDB request at a time; the whole response is produced under the lock."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target.startswith("DynamoDB_"):
            with self.lock:
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


def emulate_fair_queues() -> None:
    """Make moto's standard queues deliver like SQS fair queues: among visible messages, those of message
    groups (tenants) with fewer messages in flight and waiting come first, so one tenant's burst does not
    hold back another tenant's run. FIFO queues keep moto's own order. (AWS: "Amazon SQS fair queues", standard
    queues with a MessageGroupId.)"""
    from collections import Counter

    from moto.sqs.models import Message, Queue

    def fair_messages(self: Queue) -> list[Message]:
        visible = [m for m in self._messages if m.visible and not m.delayed]
        if self.fifo_queue or len(visible) < 2:
            return visible
        # a group's load: its messages in flight plus those waiting; the least loaded group goes first
        load = Counter(m.group_id for m in self.pending_messages)
        load.update(m.group_id for m in visible)
        return sorted(visible, key=lambda m: load[m.group_id])  # stable: oldest first within a rank

    Queue.messages = property(fair_messages)  # type: ignore[assignment,method-assign]


def make_app() -> WSGIApp:
    """moto's multi-service WSGI app wrapped in :class:`SerializeDynamoDB`."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    return SerializeDynamoDB(DomainDispatcherApplication(create_backend_app))


#: waitress's request threads: every process of a stack holds SQS long polls (up to 20 s each) besides its
#: short calls, and a request beyond the threads waits in waitress's queue
SERVER_THREADS = 64
#: open connections at once: each process keeps a pool of them (``max_pool_connections``), kept alive
SERVER_CONNECTIONS = 2000


def make_server(host: str, port: int) -> Any:
    """moto's app (:func:`make_app`) behind waitress, listening on ``host:port`` (port 0: a free one, read
    from the result's ``effective_port``); ``run()`` serves until ``close()``.

    waitress, not werkzeug's development server: werkzeug answers every request with ``Connection: close``
    (its handler cannot drain a request body before the next request line), so each AWS call of every
    process paid a new TCP connection and moto a new thread; waitress keeps HTTP/1.1 connections alive, as
    AWS's endpoints do, and serves them from a fixed pool of threads. One difference: waitress drops request
    headers whose names contain ``_`` (werkzeug's handler as moto configures it kept them for S3 user
    metadata, which Duetime does not use).
    """
    from waitress.server import create_server

    return create_server(
        make_app(),
        host=host,
        port=port,
        threads=SERVER_THREADS,
        connection_limit=SERVER_CONNECTIONS,
        asyncore_use_poll=True,  # select() stops at file descriptor 1024
        ident="moto",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    args = parser.parse_args(argv)
    die_with_parent()  # started by `duetime local`: stop with it, even if it is SIGKILLed

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    # waitress warns on every queued request when all its threads are busy (a burst's long polls)
    logging.getLogger("waitress").setLevel(logging.ERROR)
    emulate_fair_queues()
    moto_speedups.install()
    server = make_server(args.host, args.port)
    # Step Functions' service integrations inside moto call back into this server on MOTO_PORT
    os.environ["MOTO_PORT"] = str(server.effective_port)
    from moto.moto_api._internal.models import moto_api_backend

    moto_api_backend.set_config({"stepfunctions": {"execute_state_machine": True}})
    print(f"PORT {server.effective_port}", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
