"""The same burst on APScheduler 3: its SQLAlchemy job store on SQLite, a thread pool executor.

N ``date`` jobs all due at the same whole second T, each running the trivial command ``true`` in a subprocess
(as Duetime's workers do), with ``misfire_grace_time=None`` so a late job still runs (APScheduler's default
of 1 s would drop late jobs as misfired, which would flatter its lag). The executor's pool has W threads,
the same concurrency as Duetime's W workers. Lag = the instant the job function starts - T.

APScheduler is one process with its store on local disk: no network hop, no leases, no durability beyond
this machine. The ratio measures what Duetime's distribution (HTTP to DynamoDB/SQS emulated by moto,
conditional writes, separate worker processes) costs on one machine.
"""

from __future__ import annotations

import math
import subprocess
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stats import summarize

_starts: dict[int, float] = {}
_finishes: dict[int, float] = {}
_lock = threading.Lock()
_done = threading.Condition(_lock)


def run_task(index: int) -> None:
    """The job function (importable by reference, as the SQLAlchemy store requires): run ``true``."""
    started = time.time()
    subprocess.run(["true"], check=False)  # noqa: S603, S607 - the same trivial task as Duetime's burst
    with _done:
        _starts[index] = started
        _finishes[index] = time.time()
        _done.notify_all()


def _load(url: str, n: int, due: datetime) -> None:
    """Write the ``n`` jobs into the SQLite store ahead of time, with fsync off for the load only.

    (A commit per job with SQLite's default fsync takes minutes for 5,000 jobs; that is the submit path, not
    the burst being measured. The measuring scheduler opens the file with SQLite's defaults.)
    """
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler
    from sqlalchemy import create_engine, event

    engine = create_engine(url)
    event.listen(engine, "connect", lambda conn, _: conn.execute("PRAGMA synchronous=OFF"))
    loader = BackgroundScheduler(jobstores={"default": SQLAlchemyJobStore(engine=engine)}, timezone=UTC)
    for i in range(n):
        loader.add_job(run_task, "date", run_date=due, args=[i], id=f"burst-{i:05d}", misfire_grace_time=None)
    loader.start(paused=True)  # stores the pending jobs
    loader.shutdown(wait=False)
    engine.dispose()


def burst(n: int, *, workers: int = 2, timeout: float = 600.0) -> dict[str, Any]:
    """Schedule ``n`` jobs due at one instant on APScheduler 3 and measure when they start."""
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler

    _starts.clear()
    _finishes.clear()
    with tempfile.TemporaryDirectory(prefix="duetime-bench-aps-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'jobs.sqlite'}"
        due = datetime.fromtimestamp(math.ceil(time.time() + 0.003 * n + 4.0), UTC)
        t_write = time.monotonic()
        _load(url, n, due)
        write_seconds = time.monotonic() - t_write
        if time.time() >= due.timestamp() - 1:
            raise RuntimeError(f"storing {n} jobs took {write_seconds:.1f} s: they were late before T")
        scheduler = BackgroundScheduler(
            jobstores={"default": SQLAlchemyJobStore(url=url)},
            executors={"default": ThreadPoolExecutor(max_workers=workers)},
            job_defaults={"misfire_grace_time": None, "coalesce": False, "max_instances": 1},
            timezone=UTC,
        )
        scheduler.start()
        cpu0 = time.process_time()
        deadline = time.monotonic() + max(0.0, due.timestamp() - time.time()) + timeout
        with _done:
            while len(_finishes) < n and time.monotonic() < deadline:
                _done.wait(1.0)
        cpu1 = time.process_time()
        scheduler.shutdown(wait=True)

    t_due = due.timestamp()
    lags = sorted(s - t_due for s in _starts.values())
    last_start = max(_starts.values(), default=t_due)
    last_finish = max(_finishes.values(), default=t_due)
    return {
        "n": n,
        "workers": workers,
        "completed": len(_finishes) == n,
        "runs_started": len(_starts),
        **summarize(lags),
        "runs_per_s": round(len(_starts) / max(last_start - t_due, 1e-3), 1),
        "burst_finish_s": round(last_finish - t_due, 3),
        "write_s": round(write_seconds, 2),
        # the bench process is APScheduler's own process (scheduler thread + pool threads)
        "cpu_s_per_run": round((cpu1 - cpu0) / max(1, len(_starts)), 5),
    }
