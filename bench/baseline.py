"""The same burst on APScheduler 3: its SQLAlchemy job store on SQLite, a thread pool executor.

N ``date`` jobs all due at the same whole second T, each running the trivial command ``true`` in a subprocess
(as Duetime's workers do), with ``misfire_grace_time=None`` so a late job still runs (APScheduler's default
of 1 s would drop late jobs as misfired, which would flatter its lag). The executor's pool has W threads,
the same concurrency as Duetime's W workers. Lag = the instant the job function starts - T.

APScheduler is one process with its store on local disk: no network hop, no leases, no durability beyond
this machine. The ratio (against Duetime's default backend, SQLite: the same kind of store on the same
disk) measures what Duetime's design (conditional writes, a queue, leases, separate worker processes)
costs on one machine; the moto backend's figures add HTTP to emulated DynamoDB/SQS.

``python -m bench`` runs it through :func:`run_isolated`, in a fresh interpreter holding only APScheduler, so
its CPU and memory (PSS) are APScheduler's own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import sysload
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
        load0 = sysload.snapshot()
        cpu0 = time.process_time()
        deadline = time.monotonic() + max(0.0, due.timestamp() - time.time()) + timeout
        with _done:
            while len(_finishes) < n and time.monotonic() < deadline:
                _done.wait(1.0)
        cpu1 = time.process_time()
        pss = sysload.pss_kib(os.getpid())
        load1 = sysload.snapshot()
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
        # its PSS at the end of the burst (run by run_isolated: a process holding only APScheduler)
        "pss_mb": None if pss is None else round(pss / 1024, 1),
        "machine_before": load0,
        "machine_after": load1,
    }


def run_isolated(n: int, *, workers: int = 2, timeout: float = 600.0) -> dict[str, Any]:
    """:func:`burst` in a fresh interpreter (``python -m bench.baseline``) that imports only APScheduler and
    SQLAlchemy, so its CPU and memory are APScheduler's, not the bench's (boto3, Duetime, ...)."""
    out = subprocess.run(  # noqa: S603 - our own interpreter and module
        [
            sys.executable,
            "-m",
            "bench.baseline",
            str(n),
            "--workers",
            str(workers),
            "--timeout",
            str(timeout),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout + 120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the APScheduler burst of {n} failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline", description="one APScheduler 3 burst")
    parser.add_argument("n", type=int)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    print(json.dumps(burst(args.n, workers=args.workers, timeout=args.timeout)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
