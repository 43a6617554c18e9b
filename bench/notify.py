"""Notifications stay off the hot path (issue 17): run lag while a webhook receiver is down, against the same
load without notification rules; then every event arrives once the receiver is back, none twice.

Two local stacks in turn (the default backend), the same steady load on each: every ``PERIOD_S`` seconds for
the phase's window, ``BATCH`` run-now jobs are submitted over the API, half of them failing at once
(``exit 1``, one attempt: each gives a ``failed`` and a ``dead_lettered`` event), half succeeding.

- ``quiet``: the jobs carry no notification rules (the lag nothing else touches);
- ``receiver_down``: each failing job has a webhook rule on ``failed`` and ``dead_lettered`` to a receiver
  that is down (nothing listens on its port: every try is refused) for the whole window, ``DOWN_S`` (2
  minutes, the issue's figure); then it listens, and the bench waits until every expected event has arrived
  (the stack's ``--notify-max-backoff-seconds`` is cut to ``MAX_BACKOFF_S`` so a try comes soon after).

Lag is ``started_at - due_at`` of every run of the window (a run-now job is due at its submit). The receiver
checks each delivery's ``Duetime-Signature`` with the secret and counts event ids it got more than once.
Measurements, never pass/fail.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import socket
import threading
import time
import urllib.request
from collections import Counter
from datetime import datetime
from typing import Any

from bench import stack as stackmod
from bench.stats import summarize

#: seconds between two batches of submits, the jobs of a batch, and the two phases' windows
PERIOD_S = 2.0
BATCH = 4
QUIET_S = 60.0
DOWN_S = 120.0
#: the longest backoff between two tries of a delivery on the bench's stack, seconds
MAX_BACKOFF_S = 5
#: how long the bench waits for the last event once the receiver is up, seconds
DRAIN_TIMEOUT_S = 120.0
SECRET = "bench-webhook-secret-0123456789"


class Receiver:
    """A webhook receiver on a port chosen now, down (not listening) until :meth:`up`."""

    def __init__(self) -> None:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()  # nothing listens on it until up(): each try is refused
        self.events: list[dict[str, Any]] = []
        self.bad_signatures = 0
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self) -> None:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ok = _verify(self.headers.get("Duetime-Signature", ""), body)
                with receiver._lock:
                    receiver.events.append(json.loads(body))
                    receiver.bad_signatures += 0 if ok else 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _verify(header: str, body: bytes) -> bool:
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    good = hmac.new(SECRET.encode(), f"{parts.get('t', '')}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(parts.get("v1", ""), good)


def _submit(api: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        f"{api}/jobs",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        if response.status != 201:
            raise RuntimeError(f"submit answered {response.status}")


def _load(api: str, prefix: str, window_s: float, hook: str | None) -> int:
    """Submit the steady load for ``window_s``; returns how many failing jobs it submitted."""
    failing = 0
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < window_s:
        for k in range(BATCH):
            fails = k % 2 == 0
            body: dict[str, Any] = {
                "job_id": f"{prefix}-{i:05d}",
                "name": f"{prefix} {i}",
                "task": {"kind": "container", "command": ["sh", "-c", "exit 1" if fails else "true"]},
                "retry": {"max_attempts": 1},
            }
            if fails and hook is not None:
                body["notifications"] = [
                    {"on": ["failed", "dead_lettered"], "webhook": {"url": hook, "secret": SECRET}}
                ]
            _submit(api, body)
            failing += fails
            i += 1
        time.sleep(max(0.0, start + (i // BATCH) * PERIOD_S - time.monotonic()))
    return failing


def _lags(stack: stackmod.RunningStack, prefix: str) -> list[float]:
    rows = stack.runs(prefix, ("due_at", "started_at"))
    return [
        (datetime.fromisoformat(r["started_at"]) - datetime.fromisoformat(r["due_at"])).total_seconds()
        for r in rows
        if r.get("started_at")
    ]


def _phase(name: str, window_s: float, *, notify: bool) -> dict[str, Any]:
    receiver = Receiver() if notify else None
    extra = ("--notify-max-backoff-seconds", str(MAX_BACKOFF_S))
    with stackmod.running(backend="sqlite", extra=extra) as stack:
        failing = _load(stack.api, name, window_s, receiver.url if receiver else None)
        submitted = int(window_s / PERIOD_S) * BATCH
        stack.wait_finished(submitted, timeout=120)
        out: dict[str, Any] = {
            "window_s": window_s,
            **summarize(_lags(stack, name)),
            "runs": len(_lags(stack, name)),
        }
        if receiver is not None:
            receiver.up()
            up_at = time.monotonic()
            expected = 2 * failing
            while len(receiver.events) < expected and time.monotonic() - up_at < DRAIN_TIMEOUT_S:
                time.sleep(0.5)
            drained = time.monotonic() - up_at
            time.sleep(3)  # anything sent twice would come now
            ids = Counter(e["event_id"] for e in receiver.events)
            out.update(
                receiver_down_s=window_s,
                events_expected=expected,
                events_received=len(ids),
                event_ids_received_twice=sum(1 for n in ids.values() if n > 1),
                bad_signatures=receiver.bad_signatures,
                all_delivered_s_after_up=round(drained, 1),
                by_type=dict(Counter(e["type"] for e in receiver.events)),
            )
            receiver.close()
    return out


def measure(*, quick: bool = False) -> dict[str, Any]:
    """Both phases (``quick``: a fifth of each window); the lag figures of each and the deliveries'."""
    scale = 0.2 if quick else 1.0
    quiet = _phase("quiet", QUIET_S * scale, notify=False)
    down = _phase("down", DOWN_S * scale, notify=True)
    return {"quiet": quiet, "receiver_down": down, "load": {"period_s": PERIOD_S, "batch": BATCH}}
