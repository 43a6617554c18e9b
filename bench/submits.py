"""Submit throughput of the local stack's API: ``POST /jobs`` of a cron job body from concurrent clients.

Issue 15's target: at least 300 submits/s with 8 concurrent clients on the default backend (nothing due at
once: ``cron(0 3 * * ? *)``, so each submit is the API's work only: validation, the tenant's submit counter
and active-jobs counter, the job's write, its response). Each client is a thread of this process holding
one HTTP/1.1 keep-alive connection (as ``requests.Session`` or any SDK would), sending the next request as
soon as the last one is answered (the local API's werkzeug server closes every connection after its
response: ``http.client`` then reconnects, so each request is a new connection and a new server thread).
The per-tenant quotas are raised for the bench (the defaults allow 600 submits a minute). Measured:
submits/s over the measured window (after a warm-up), latency p50/p99 in milliseconds, and every non-201
answer (there must be none).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from bench import stack as stackmod
from bench import sysload

#: concurrent clients (issue 15)
CLIENTS = 8
#: submits before the measured window (imports, first connections, the file's first pages)
WARMUP = 200
#: the measured submits
MEASURED = 3000
QUOTAS = ("--tenant-submits-per-minute", "10000000", "--tenant-max-active-jobs", "10000000")


def body(i: int) -> bytes:
    return json.dumps(
        {
            "name": f"nightly report {i}",
            "schedule": {"expression": "cron(0 3 * * ? *)", "timezone": "Europe/Paris"},
            "task": {"command": ["sh", "-c", "echo report"], "tier": "small"},
        }
    ).encode()


def _drive(api: str, count: int, clients: int, first: int) -> tuple[float, list[float], list[int]]:
    """``count`` submits from ``clients`` threads; (wall seconds, latencies in seconds, non-201 statuses)."""
    parts = urlsplit(api)
    lock = threading.Lock()
    numbers = iter(range(first, first + count))
    latencies: list[float] = []
    refused: list[int] = []

    def client() -> None:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
        try:
            while True:
                with lock:
                    i = next(numbers, None)
                if i is None:
                    return
                started = time.perf_counter()
                conn.request("POST", "/jobs", body=body(i), headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                took = time.perf_counter() - started
                with lock:
                    latencies.append(took)
                    if response.status != 201:
                        refused.append(response.status)
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started, latencies, refused


def measure(*, backend: str = "sqlite", clients: int = CLIENTS, measured: int = MEASURED) -> dict[str, Any]:
    """One fresh stack on ``backend``: warm-up, then ``measured`` submits from ``clients`` clients."""
    with stackmod.running(tick_seconds=60.0, workers=1, backend=backend, extra=QUOTAS) as stack:
        _drive(stack.api, WARMUP, clients, 0)
        load0 = sysload.snapshot()
        cpu0 = stack.cpu()
        wall, latencies, refused = _drive(stack.api, measured, clients, WARMUP)
        cpu1 = stack.cpu()
        load1 = sysload.snapshot()
        processes = stack.memory().processes
    latencies.sort()
    return {
        "backend": backend,
        "clients": clients,
        "submits": measured,
        "submits_per_s": round(measured / wall, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 1),
        "refused": len(refused),
        "refused_statuses": sorted(set(refused)),
        "cpu_stack_ms_per_submit": round((cpu1.duetime - cpu0.duetime) / measured * 1000, 2),
        "processes": processes,
        "machine_before": load0,
        "machine_after": load1,
    }
