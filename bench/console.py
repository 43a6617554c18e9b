"""The console's jobs page for a tenant with 10,000 jobs: its server time on each backend.

Issue 18's targets: at most 300 ms of server time on the default backend (SQLite) and 1 s on moto. A fresh
stack per backend (no workers, a 60 s tick), 10,000 cron jobs submitted through ``POST /jobs`` from 8
clients (:mod:`bench.submits`), then ``GET /console/jobs`` (its first page of 25 jobs, each with the one
Query of its recent runs that draws its sparkline), its second page (``next_token``) and a name filter,
each :data:`SAMPLES` times one after another. Measured per page: the handler's own time (the
``Server-Timing: app;dur=`` header the console sets) and the client's whole request, p50/p99/max in ms.
"""

from __future__ import annotations

import http.client
import re
import time
from typing import Any
from urllib.parse import urlsplit

from bench import stack as stackmod
from bench import submits

JOBS = 10_000
SAMPLES = 30
_DURATION = re.compile(r"app;dur=([0-9.]+)")
_NEXT = re.compile(r'href="(/console/jobs\?next_token=[^"]+)" rel="next"')


def _get(api: str, path: str) -> tuple[int, float, float, str]:
    """(status, server ms from Server-Timing, client ms, body) of one GET."""
    parts = urlsplit(api)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    try:
        started = time.perf_counter()
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read().decode()
        client_ms = (time.perf_counter() - started) * 1000
    finally:
        conn.close()
    found = _DURATION.search(response.headers.get("Server-Timing", ""))
    return response.status, float(found.group(1)) if found else float("nan"), client_ms, body


def _stats(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "p50_ms": round(values[len(values) // 2], 1),
        "p99_ms": round(values[min(len(values) - 1, int(len(values) * 0.99))], 1),
        "max_ms": round(values[-1], 1),
    }


def measure(*, backend: str = "sqlite", jobs: int = JOBS, samples: int = SAMPLES) -> dict[str, Any]:
    """One fresh stack on ``backend`` holding ``jobs`` jobs of one tenant; the jobs page timed."""
    with stackmod.running(tick_seconds=60.0, workers=0, backend=backend, extra=submits.QUOTAS) as stack:
        seeded_at = time.perf_counter()
        _, _, refused = submits._drive(stack.api, jobs, submits.CLIENTS, 0)
        seed_s = time.perf_counter() - seeded_at
        status, _, _, first = _get(stack.api, "/console/jobs")
        assert status == 200, status
        next_path = _NEXT.search(first)
        assert next_path is not None, "the jobs page has no next page"
        pages = {
            "first": "/console/jobs",
            "second": next_path.group(1).replace("&amp;", "&"),
            "name_filter": "/console/jobs?name=nightly+report+99",
        }
        out: dict[str, Any] = {}
        for name, path in pages.items():
            server, client = [], []
            for _ in range(samples):
                status, server_ms, client_ms, body = _get(stack.api, path)
                assert status == 200, (name, status)
                server.append(server_ms)
                client.append(client_ms)
            out[name] = {
                "rows": body.count("<tr>") - 1,
                "server": _stats(server),
                "client": _stats(client),
            }
    return {
        "backend": backend,
        "jobs": jobs,
        "jobs_refused": len(refused),
        "seed_s": round(seed_s, 1),
        "samples": samples,
        "pages": out,
        "target_ms": 300 if backend == "sqlite" else 1000,
    }
