"""A small client of Duetime's HTTP API, for the CLI: the local stack by default, or a deployed API.

Authentication: a bearer token (a JWT authorizer, or the local stack's ``--tenant NAME:TOKEN``), or AWS
SigV4 (``execute-api``) with credentials from the usual AWS chain, for the IAM-authorized HTTP API.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: where `duetime local` writes its state
LOCAL_STATE = Path(".duetime/local.json")


class ApiError(Exception):
    """The API answered an error (``status`` >= 400) or could not be reached (``status`` 0)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        prefix = f"{status} {code}" if status else code  # status 0: no HTTP answer at all
        super().__init__(f"{prefix}: {message}" + (f" (field {field})" if field else ""))
        self.status, self.code, self.message, self.field = status, code, message, field


@dataclass
class Client:
    """``base_url`` like ``http://127.0.0.1:8765``; ``token`` for bearer auth; ``sigv4_region`` to sign."""

    base_url: str
    token: str | None = None
    sigv4_region: str | None = None
    timeout: float = 30.0

    @classmethod
    def resolve(cls, api: str | None, token: str | None, sigv4: bool, state: Path = LOCAL_STATE) -> Client:
        """``api`` or ``$DUETIME_API_URL`` or the local stack's URL from its state file: ``state``, which is
        ``.duetime/local.json`` by default, or ``$DUETIME_STATE_DIR/local.json`` when that variable names the
        state directory of a stack started with ``--state-dir`` (as ``duetime worker`` finds it).

        Raises:
            ApiError: (status 0) when none of them is available.
        """
        url = api or os.environ.get("DUETIME_API_URL")
        state_dir = os.environ.get("DUETIME_STATE_DIR")
        if state == LOCAL_STATE and state_dir:
            state = Path(state_dir) / "local.json"
        if not url and state.is_file():
            url = json.loads(state.read_text()).get("api_url")
        if not url:
            raise ApiError(
                0, "no_api", f"no --api, no DUETIME_API_URL and no {state}: is `duetime local` running?"
            )
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ApiError(0, "bad_api_url", f"{url!r} is not an http:// or https:// URL")
        region = None
        if sigv4:
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        return cls(url.rstrip("/"), token or os.environ.get("DUETIME_TOKEN"), region)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> Any:
        """Send one request; returns parsed JSON (or text for text responses). ``response_headers``, if
        given, is filled with the response's headers (names lower-cased).

        Raises:
            ApiError: on an HTTP error (with the API's error code, message and field) or no connection.
        """
        params = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.base_url + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        data = json.dumps(body).encode() if body is not None else None
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if self.token:
            all_headers["Authorization"] = f"Bearer {self.token}"
        if self.sigv4_region:
            all_headers.update(self._sign(method, url, data, all_headers))
        req = urllib.request.Request(url, data=data, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                if response_headers is not None:
                    response_headers.update((k.lower(), v) for k, v in resp.headers.items())
                return _parse(resp.read(), resp.headers.get("Content-Type", ""))
        except urllib.error.HTTPError as exc:
            parsed = _parse(exc.read(), exc.headers.get("Content-Type", ""))
            err = parsed.get("error", {}) if isinstance(parsed, dict) else {}
            message = err.get("message") or (parsed.get("message") if isinstance(parsed, dict) else None)
            raise ApiError(
                exc.code, err.get("code", "http_error"), message or str(parsed), err.get("field")
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(0, "unreachable", f"cannot reach {self.base_url}: {exc}") from None
        except http.client.HTTPException as exc:  # something answered, but not in HTTP (a wrong port?)
            said = " ".join(str(exc).split())[:200]  # one line: the first bytes that came back
            raise ApiError(
                0, "unreachable", f"no HTTP answer from {self.base_url}: {type(exc).__name__} {said!r}"
            ) from None

    def _sign(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> dict[str, str]:
        import boto3
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        credentials = boto3.session.Session().get_credentials()
        if credentials is None:
            raise ApiError(
                0, "no_credentials", "--sigv4 needs AWS credentials (the usual AWS credential chain)"
            )
        aws_request = AWSRequest(method=method, url=url, data=data, headers=headers)
        SigV4Auth(credentials.get_frozen_credentials(), "execute-api", self.sigv4_region).add_auth(
            aws_request
        )
        return dict(aws_request.headers.items())


def _parse(raw: bytes, content_type: str) -> Any:
    text = raw.decode("utf-8", errors="replace")
    if content_type.startswith("application/json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text
