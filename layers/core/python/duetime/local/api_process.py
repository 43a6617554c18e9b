"""One process of the local stack's HTTP API: ``python -m duetime.local.api_process --fd N``.

`duetime local` binds the API's listening socket itself and starts ``--api-processes`` of these (default
:data:`DEFAULT_API_PROCESSES`), each inheriting the socket and accepting from it (the pre-fork model of
classic web servers: the kernel hands each connection to one of them; the socket is non-blocking, so a
process that lost the race for a connection goes back to waiting). Why processes and not threads: the
API handler is served one event at a time per process (Powertools' resolver keeps the request on a class
attribute, see :func:`duetime.local.lambda_runtime.handler`), so one process serves about one request per
handler time whatever the number of clients; two processes use both cores of a small machine (issue 15's
target: 300 submits/s from 8 concurrent clients).

Each process serves exactly what the in-process API serves (:class:`~duetime.local.http_adapter.HttpApiAdapter`
over the real ``functions/api`` handler, the same JSON error bodies), with the stack's settings from the
environment (``DUETIME_*``) and its tenants' bearer tokens from ``DUETIME_LOCAL_TENANTS`` (JSON, token ->
tenant). It dies with the stack (:mod:`duetime.local.lifeline`); SIGTERM or SIGINT stop it after the
requests in flight.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from duetime.local import lifeline

#: the variable that carries the stack's tenants (bearer token -> tenant, JSON) to its API processes
TENANTS_ENV = "DUETIME_LOCAL_TENANTS"
#: API processes a stack starts unless told otherwise (``--api-processes``): one per core, at most 2
DEFAULT_API_PROCESSES = max(1, min(2, os.cpu_count() or 1))
#: how long a stopping API process waits for the requests it is serving, seconds
DRAIN_SECONDS = 10.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m duetime.local.api_process", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the inherited listening socket's descriptor")
    parser.add_argument("--verbose", action="store_true", help="log every request (werkzeug's access log)")
    args = parser.parse_args(argv)
    lifeline.die_with_parent()
    stopping = False

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True  # only a flag: any number of signals at any moment are harmless

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if os.environ.get("DUETIME_CALL_COUNT_DIR"):  # bench/: count this process's AWS calls too
        from duetime.local import callcount

        callcount.install_from_env()
    from duetime.local.http_adapter import HttpApiAdapter, make_api_server
    from duetime.local.lambda_runtime import handler

    tenants = json.loads(os.environ.get(TENANTS_ENV) or "{}")
    app = InFlight(HttpApiAdapter(handler("api"), tenants=tenants or None))
    server = make_api_server("127.0.0.1", 0, app, fd=args.fd)
    accept = server.get_request

    def get_request() -> tuple[socket.socket, Any]:
        conn, address = accept()
        conn.setblocking(True)  # not inherited from the listening socket everywhere (BSD, macOS)
        return conn, address

    server.get_request = get_request  # type: ignore[method-assign]
    logging.getLogger("werkzeug").setLevel(logging.INFO if args.verbose else logging.WARNING)
    serving = threading.Thread(target=server.serve_forever, name="api", daemon=True)
    serving.start()
    while not stopping and serving.is_alive():
        time.sleep(0.2)
    server.shutdown()  # the socket is non-blocking: a connection another process took never blocks us
    serving.join(timeout=5)
    app.drain(DRAIN_SECONDS)  # the requests being served finish (their writes are not cut half way)
    return 0


class InFlight:
    """A WSGI app counting the requests it is serving, so a stopping process can wait for them."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.serving = 0
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with self._lock:
            self.serving += 1
        try:
            return list(self.app(environ, start_response))
        finally:
            with self._lock:
                self.serving -= 1

    def drain(self, seconds: float) -> bool:
        """Wait up to ``seconds`` until no request is being served; whether none is."""
        deadline = time.monotonic() + seconds
        while self.serving and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.serving


if __name__ == "__main__":
    sys.exit(main())
