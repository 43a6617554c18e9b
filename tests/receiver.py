"""A real HTTP receiver for webhook tests: records every POST; can be taken down (connections refused) and
brought back on the same port."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from duetime.domain.notifications import verify_signature


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    #: what the receiver answered
    status: int = 204

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """``url`` accepts POSTs (answering ``status``) while up; ``down()`` closes its socket. Given a
    ``secret``, it verifies each POST's ``Duetime-Signature`` as a receiver should and answers 401 (recording
    nothing) when it does not verify."""

    status: int = 204
    secret: str | None = None
    #: POSTs refused for a bad signature
    refused: int = 0
    received: list[Received] = field(default_factory=list)
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self) -> Receiver:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if owner.secret is not None and not verify_signature(
                    self.headers.get("Duetime-Signature") or "", body, owner.secret, now=int(time.time())
                ):
                    owner.refused += 1
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                owner.received.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, owner.status)
                )
                self.send_response(owner.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def events(self) -> list[dict[str, Any]]:
        return [r.json for r in self.received]

    def accepted(self) -> list[dict[str, Any]]:
        """The bodies of the POSTs it answered with a 2xx (delivered)."""
        return [r.json for r in self.received if 200 <= r.status < 300]
