"""``duetime local``'s demo jobs: posted to its own API at start, as tenant 'local' or else the first tenant by name when the stack has
tenants (its API answers 401 without a token), each under its name as job id (a restart finds them)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from duetime.local.stack import LocalOptions, LocalStack


@pytest.fixture
def api() -> Iterator[tuple[str, list[tuple[str | None, dict[str, Any]]]]]:
    """A stand-in for the stack's API: records each POST's Authorization header and body, answers 201."""
    seen: list[tuple[str | None, dict[str, Any]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.headers.get("Authorization"), body))
            reply = json.dumps(
                {"job_id": body["job_id"], "name": body["name"], "next_fire_at": None}
            ).encode()
            self.send_response(201)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


def _demo_file(tmp_path: Path) -> Path:
    path = tmp_path / "demo.json"
    path.write_text(json.dumps([{"name": "demo-a", "task": {"kind": "container", "command": ["true"]}}]))
    return path


def test_with_tenants_the_demo_jobs_are_posted_as_the_first_tenant(
    tmp_path: Path, api: tuple[str, list[Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, seen = api
    options = LocalOptions(demo_file=_demo_file(tmp_path), tenants={"token-b": "bob", "token-a": "alice"})
    LocalStack(options, api_url=url)._submit_demo_jobs()
    assert seen == [
        (
            "Bearer token-a",
            {"name": "demo-a", "task": {"kind": "container", "command": ["true"]}, "job_id": "demo-a"},
        )
    ]
    out = capsys.readouterr().out
    assert "tenant 'alice'" in out and "rejected" not in out


def test_with_tenant_local_among_them_the_demo_jobs_stay_local(
    tmp_path: Path, api: tuple[str, list[Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    # a start without --tenant made the demo jobs tenant 'local's; a start with local and alice keeps them so
    url, seen = api
    options = LocalOptions(demo_file=_demo_file(tmp_path), tenants={"token-a": "alice", "token-l": "local"})
    LocalStack(options, api_url=url)._submit_demo_jobs()
    assert [auth for auth, _ in seen] == ["Bearer token-l"]
    assert "tenant 'local'" in capsys.readouterr().out


def test_without_tenants_the_demo_jobs_carry_no_token(tmp_path: Path, api: tuple[str, list[Any]]) -> None:
    url, seen = api
    LocalStack(LocalOptions(demo_file=_demo_file(tmp_path)), api_url=url)._submit_demo_jobs()
    assert [auth for auth, _ in seen] == [None]
