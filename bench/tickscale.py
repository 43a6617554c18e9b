"""How many claims per second one shard's tick sustains: ``duetime.services.claims.tick`` against moto's server.

A moto server (the local stack's, with DynamoDB serialised) and the stack's resources; M jobs in one shard all
due within the lookahead (``at(now + 30 s)``: the claims send delayed messages, as a tick working ahead of the
top of the minute does); then one ``tick(0)`` in this process, timed. Claims/s = M / the tick's wall time.
Every AWS call of the tick is counted and timed (:mod:`duetime.local.callcount`, light mode) so the time splits by
operation; CPU seconds are split between this process (Duetime's code + boto3) and moto's server.

With ``processes`` P above 1 (``tick_processes``), the tick forks P claiming processes: Duetime's CPU is this
process's (the parent: the lease, the forks, the results) plus its children's (``os.times``' reaped
children: the claiming processes are joined inside the tick, moto's server only after the measurement).
moto's server shares the machine's cores with them, so on a 2-core machine P = 2 is bounded by the cores
moto leaves, not by the tick.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.lag import batch_write, build_jobs
from bench.stack import FAKE_CREDENTIALS

#: seconds ahead of now the M jobs are due (inside the 75 s lookahead of a 60 s tick)
DUE_IN_SECONDS = 30


def _start_moto() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "duetime.local.moto_server", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"moto server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its reaped children (user + system)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def measure(m: int, processes: int = 1) -> dict[str, Any]:
    """Time one tick claiming ``m`` due jobs of one shard with ``processes`` claiming processes; returns
    claims/s, the call split and CPU (Duetime's: the tick's parent and children)."""
    import psutil

    from bench import calls as callsmod
    from duetime.adapters.aws import clients as aws
    from duetime.adapters.aws.dynamodb import job_to_item, serialize
    from duetime.adapters.aws.resources import ResourceNames, create_all
    from duetime.config.deps import deps_from_settings
    from duetime.config.settings import Settings
    from duetime.domain.clock import SystemClock
    from duetime.local import callcount
    from duetime.services.claims import tick

    moto, endpoint = _start_moto()
    saved = {
        k: os.environ.get(k)
        for k in (
            "AWS_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_DEFAULT_REGION",
            "DUETIME_CALL_COUNT_DIR",
            "DUETIME_CALL_COUNT_MODE",
        )
    }
    tmp = tempfile.TemporaryDirectory(prefix="duetime-bench-tick-")
    try:
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID=FAKE_CREDENTIALS["aws_access_key_id"],
            AWS_SECRET_ACCESS_KEY=FAKE_CREDENTIALS["aws_secret_access_key"],
            AWS_SESSION_TOKEN=FAKE_CREDENTIALS["aws_session_token"],
            AWS_DEFAULT_REGION=FAKE_CREDENTIALS["region_name"],
        )
        aws.reset_clients()
        names = ResourceNames.for_prefix("bench")
        urls = create_all(names)
        settings = Settings(
            jobs_table=names.jobs_table,
            runs_table=names.runs_table,
            logs_bucket=names.logs_bucket,
            queue_urls=urls,
            shard_count=1,
            tick_period_seconds=60,
            tick_margin_seconds=15,
            tick_processes=processes,
        )
        deps = deps_from_settings(settings, SystemClock())
        due = datetime.fromtimestamp(math.ceil(time.time() + DUE_IN_SECONDS), UTC)
        jobs = build_jobs(m, due, settings, command=["true"], prefix="tick")
        batch_write(aws.client("dynamodb"), settings.jobs_table, [serialize(job_to_item(j)) for j in jobs])

        os.environ["DUETIME_CALL_COUNT_DIR"] = tmp.name
        os.environ["DUETIME_CALL_COUNT_MODE"] = "light"
        aws.reset_clients()
        callcount.reset()
        callcount.install_from_env()
        moto_ps = psutil.Process(moto.pid)
        moto_cpu0, my_cpu0 = sum(moto_ps.cpu_times()[:2]), _own_cpu_s()
        t0 = time.perf_counter()
        result = tick(0, deps)
        wall = time.perf_counter() - t0
        moto_cpu = sum(moto_ps.cpu_times()[:2]) - moto_cpu0
        my_cpu = _own_cpu_s() - my_cpu0
        callcount.flush()
        records = callsmod.load(Path(tmp.name))
    finally:
        callcount.uninstall()
        callcount.reset()
        aws.reset_clients()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        moto.terminate()
        moto.wait(timeout=10)
        tmp.cleanup()

    by_op: dict[str, list[float]] = defaultdict(list)
    for r in records:
        by_op[callsmod.op_key(r)].append(float(r["ms"]))
    claimed = max(1, result.claimed)
    return {
        "m": m,
        "processes": processes,
        "claim_concurrency": settings.claim_concurrency,
        "claimed": result.claimed,
        "errors": result.errors,
        "tick_s": round(wall, 3),
        "claims_per_s": round(result.claimed / wall, 1),
        "ms_per_claim": round(wall * 1000 / claimed, 2),
        "calls_per_claim": {k: round(len(v) / claimed, 3) for k, v in sorted(by_op.items())},
        "call_ms_mean": {k: round(sum(v) / len(v), 2) for k, v in sorted(by_op.items())},
        "call_ms_per_claim": round(sum(sum(v) for v in by_op.values()) / claimed, 2),
        "cpu_duetime_ms_per_claim": round(my_cpu * 1000 / claimed, 2),
        "cpu_moto_ms_per_claim": round(moto_cpu * 1000 / claimed, 2),
    }
