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
import resource
import socket
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
        # moto reads the undecoded path from RAW_URI (gunicorn's and werkzeug's key); waitress gives it as
        # REQUEST_URI only, and without it an S3 key with "%" or "?" was decoded twice ("a%20b" stored as "a b")
        environ.setdefault("RAW_URI", environ.get("REQUEST_URI", ""))
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


#: waitress's request threads: every process of a stack holds SQS long polls (a few seconds each) besides its
#: short calls, and DynamoDB requests wait for :class:`SerializeDynamoDB`'s lock on a thread each; a request
#: beyond the threads waits in waitress's queue (idle threads cost a little memory, nothing else)
SERVER_THREADS = 128
#: open connections at most: each process keeps a pool of them per service (``max_pool_connections``, 32),
#: kept alive; fewer where the process may open fewer files (:func:`_connection_limit`)
SERVER_CONNECTIONS = 2000
#: file descriptors kept for everything but connections (the threads' and moto's own files)
_FD_MARGIN = 64


def _connection_limit() -> int:
    """:data:`SERVER_CONNECTIONS`, or fewer so that every connection has a file descriptor: the soft limit
    on open files is first raised to the hard one. (A server out of descriptors would spin on its listening
    socket, its ``accept()`` failing with EMFILE, and answer nobody.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return SERVER_CONNECTIONS
    return max(1, min(SERVER_CONNECTIONS, soft - _FD_MARGIN))


def make_server(host: str, port: int) -> Any:
    """moto's app (:func:`make_app`) behind waitress, listening on ``host:port`` (port 0: a free one, read
    from the result's ``effective_port``; a host name is resolved to its first address, so that one socket
    listens); ``run()`` serves until :func:`stop_server`.

    waitress, not werkzeug's development server: werkzeug answers every request with ``Connection: close``
    (its handler cannot drain a request body before the next request line), so each AWS call of every
    process paid a new TCP connection and moto a new thread; waitress keeps HTTP/1.1 connections alive, as
    AWS's endpoints do, and serves them from a fixed pool of threads. One difference: waitress drops request
    headers whose names contain ``_`` (werkzeug's handler as moto configures it kept them for S3 user
    metadata, which Duetime does not use).
    """
    from waitress.server import create_server

    address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    return create_server(
        make_app(),
        host=address,
        port=port,
        threads=SERVER_THREADS,
        connection_limit=_connection_limit(),
        asyncore_use_poll=True,  # select() stops at file descriptor 1024
        ident="moto",
    )


def stop_server(server: Any, thread: threading.Thread | None = None) -> None:
    """Stop a server of :func:`make_server` whose ``run()`` is on ``thread`` (or another thread): every
    connection closed, its loop ended (``thread`` joined, up to 5 s), its request threads stopped.
    (waitress's own ``close()`` closes only the listening socket: its loop and threads go on serving the
    connections already open.) Stopping it again does nothing."""
    from waitress import wasyncore

    if getattr(server, "_duetime_stopped", False):
        return
    server._duetime_stopped = True
    server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
    if thread is not None:
        thread.join(5)
    server.task_dispatcher.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    args = parser.parse_args(argv)
    die_with_parent()  # started by `duetime local`: stop with it, even if it is SIGKILLed

    # waitress warns on every queued request when all its threads are busy (a burst's DynamoDB requests)
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    emulate_fair_queues()
    moto_speedups.install()
    server = make_server(args.host, args.port)
    # Step Functions' service integrations inside moto call back into this server on MOTO_PORT
    os.environ["MOTO_PORT"] = str(server.effective_port)
    from moto.moto_api._internal.models import moto_api_backend

    moto_api_backend.set_config({"stepfunctions": {"execute_state_machine": True}})
    print(f"PORT {server.effective_port}", flush=True)
    try:
        server.run()  # until SIGTERM or SIGINT (waitress ends its loop on KeyboardInterrupt)
    finally:
        server.close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
