"""Webhook deliveries over HTTP(S), SSRF-checked at delivery time (docs/design/notifications.md).

The host is resolved once per try; every address it resolves to is checked
(:func:`~duetime.domain.notifications.address_refusal`) and the connection goes to the checked address (the
TLS handshake still names the host), so a name that resolves to a forbidden address, or that changes between
the check and the connection (DNS rebinding), is never reached. Redirects are not followed: a 3xx is a
failed try.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import urlsplit

from duetime.domain.notifications import DeliveryAttempt, address_refusal

#: the prefix of a try's error when the address is forbidden (the delivery is dead-lettered at once)
REFUSED = "refused: "
#: most bytes of a receiver's answer read (it is not kept)
MAX_ANSWER_BYTES = 4096


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int | None, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int | None, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


class HttpWebhooks:
    """:class:`~duetime.domain.ports.WebhookSender` with ``http.client``.

    Args:
        allow_private: loopback and private addresses may be reached (the local stack).
    """

    def __init__(self, *, allow_private: bool = False) -> None:
        self.allow_private = allow_private

    def post(self, url: str, body: bytes, headers: Mapping[str, str], *, timeout: float) -> DeliveryAttempt:
        started = time.monotonic()
        at = datetime.now(UTC)

        def outcome(ok: bool, status: int | None = None, error: str | None = None) -> DeliveryAttempt:
            return DeliveryAttempt(
                at=at,
                ok=ok,
                status_code=status,
                error=error,
                duration_ms=int((time.monotonic() - started) * 1000),
            )

        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            return outcome(False, error=f"cannot resolve {host}: {exc}")
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in addresses:
            why = address_refusal(address, allow_private=self.allow_private)
            if why is not None:
                return outcome(False, error=REFUSED + why)
        if parts.scheme == "http" and not self.allow_private:
            return outcome(False, error=REFUSED + "plain http")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        last_error = "no address"
        for address in addresses:
            kind = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
            connection = kind(host, port, address, timeout)
            try:
                connection.request("POST", path, body=body, headers=dict(headers))
                answer = connection.getresponse()
                answer.read(MAX_ANSWER_BYTES)
                status = answer.status
                if 200 <= status < 300:
                    return outcome(True, status)
                why = "redirect not followed" if 300 <= status < 400 else f"HTTP {status}"
                return outcome(False, status, why)
            except (OSError, http.client.HTTPException) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            finally:
                connection.close()
        return outcome(False, error=last_error)
