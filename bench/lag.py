"""Lag and throughput of a top-of-the-minute burst on the real local stack, on either backend.

N one-off jobs, ``at(T)`` with the same whole second T and the trivial command ``true``, are built by the real
submit code (:func:`duetime.services.jobs.create_job`) and written to the store ahead of time, before T enters
the tick's lookahead, so the stack's own clock loop (tick every second) claims them and its workers run them:

- ``sqlite`` (the default backend): each job inserted by the store's own ``SqliteStore.put_new_job`` (one
  transaction per job, as the API's submit does; ~0.6 ms each here) into the stack's state file;
- ``moto``: BatchWriteItem of the items ``job_to_item`` makes, 25 at a time, to moto's jobs table.

Measured from the runs' records (the runs table, or the runs' documents in the state file): lag =
``started_at - due_at`` (p50/p95/p99/max), start throughput = N / (last start - T), and the time until the
last run finished. CPU seconds of Duetime's processes (``duetime local`` + workers, split by role) and of
moto's server (moto only) are sampled from just before the first claim to the end; the stack's memory is the
PSS summed over those processes when the last run has finished.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bench import stack as stackmod
from bench import sysload
from bench.stack import scan_all
from bench.stats import summarize

__all__ = ["BACKENDS", "batch_write", "build_jobs", "burst", "scan_all"]

#: the backends a burst runs on, the default (``duetime local``'s) first
BACKENDS = stackmod.BACKENDS

#: seconds between the end of the writes and T, beyond the tick's lookahead (1 s period + 2 s margin)
LEAD_SECONDS = 6.0


@dataclass
class _CaptureStore:
    """A store that only remembers the job ``create_job`` would insert (so the bench can batch-write it)."""

    job: Any = None

    def put_new_job(self, job: Any) -> None:
        self.job = job

    def __getattr__(self, name: str) -> Any:
        # quota counters and the like: admit everything (the bench writes the jobs itself)
        return lambda *args, **kwargs: True


def build_jobs(n: int, due: datetime, settings: Any, *, command: list[str], prefix: str) -> list[Any]:
    """``n`` jobs exactly as ``POST /jobs`` would store them: ``at(due)``, ``command``, default policies."""
    from duetime.config.deps import Deps
    from duetime.domain.api_models import CreateJobRequest
    from duetime.domain.clock import SystemClock
    from duetime.domain.models import ContainerTask, ScheduleSpec
    from duetime.services.jobs import create_job

    capture = _CaptureStore()
    # a lookahead of ~0 so create_job never claims: the jobs are stored as submitted, for a tick to claim
    # and no per-tenant quotas: the bench's bursts are bigger than a tenant's default per-minute quota
    updates: dict[str, Any] = {"tick_period_seconds": 0.001, "tick_margin_seconds": 0.0}
    for quota in ("idempotency_table", "tenant_max_active_jobs", "tenant_submits_per_minute"):
        if quota in type(settings).model_fields:
            updates[quota] = None
    settings = settings.model_copy(update=updates)
    deps = Deps(settings=settings, store=capture, queues=None, logs=None, clock=SystemClock())  # type: ignore[arg-type]
    spec = ScheduleSpec(expression=f"at({due:%Y-%m-%dT%H:%M:%S})", timezone="UTC")
    built = []
    for i in range(n):
        request = CreateJobRequest(
            job_id=f"{prefix}-{i:05d}", name=f"burst {i}", schedule=spec, task=ContainerTask(command=command)
        )
        create_job(request, tenant="bench", deps=deps)
        built.append(capture.job)
    return built


def batch_write(ddb: Any, table: str, items: list[dict[str, Any]]) -> None:
    """BatchWriteItem in groups of 25, retrying unprocessed items."""
    for start in range(0, len(items), 25):
        pending = {table: [{"PutRequest": {"Item": i}} for i in items[start : start + 25]]}
        while pending:
            out = ddb.batch_write_item(RequestItems=pending)
            pending = out.get("UnprocessedItems") or {}


def _ts(value: Any) -> float:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


_CLAIM_LINE = re.compile(r"tick: shard \d+ claimed (\d+) run")


def claims_timeline(output: list[str], t_due: float) -> dict[str, Any]:
    """From the stack's timestamped output: runs claimed by its ticks from ``t_due - 10`` s on, and when
    the last of those ticks printed (seconds after ``t_due``; a tick prints when its shard's claims end)."""
    claimed, last = 0, None
    for line in output:
        stamp, _, text = line.partition(" ")  # _pump's timestamp, then the line (maybe several, glued)
        counts = _CLAIM_LINE.findall(text)
        try:
            at = float(stamp)
        except ValueError:
            continue  # printed before the stack was ready
        if counts and at >= t_due - 10:
            claimed += sum(int(c) for c in counts)
            last = at
    return {"claimed": claimed, "claims_end_s": None if last is None else round(last - t_due, 3)}


def _write_jobs(stack: stackmod.RunningStack, settings: Any, jobs: list[Any]) -> None:
    """Store ``jobs`` as submitted: in the stack's state file (sqlite) or moto's jobs table."""
    if stack.backend == "sqlite":
        from duetime.adapters.sqlite.store import SqliteStore

        store = SqliteStore(stack.database)
        try:
            for job in jobs:
                store.put_new_job(job)
        finally:
            store.close()
    else:
        from duetime.adapters.aws.dynamodb import job_to_item, serialize

        batch_write(stack.client("dynamodb"), settings.jobs_table, [serialize(job_to_item(j)) for j in jobs])


def burst(n: int, *, backend: str = "sqlite", workers: int = 2, timeout: float = 600.0) -> dict[str, Any]:
    """Run one burst of ``n`` jobs on a fresh local stack on ``backend``; returns its figures (seconds)."""
    from duetime.config.settings import settings_from_env

    with stackmod.running(tick_seconds=1.0, workers=workers, backend=backend) as stack:
        settings = settings_from_env(stack.state["env"])
        # time one batch of far-future jobs, then pick T beyond the whole write and the lookahead
        far = datetime.fromtimestamp(math.ceil(time.time() + 86400), UTC)
        probe = build_jobs(100, far, settings, command=["true"], prefix=f"probe{n}")
        t_probe = time.monotonic()
        _write_jobs(stack, settings, probe)
        per_item = (time.monotonic() - t_probe) / 100
        write_estimate = 1.4 * n * per_item + 2.0  # moto slows a little as the table grows
        due = datetime.fromtimestamp(
            math.ceil(time.time() + write_estimate + LEAD_SECONDS + settings.tick_lookahead_seconds), UTC
        )
        jobs = build_jobs(n, due, settings, command=["true"], prefix=f"burst{n}")
        t_write = time.monotonic()
        _write_jobs(stack, settings, jobs)
        write_seconds = time.monotonic() - t_write
        lead = due.timestamp() - time.time()
        if lead < settings.tick_lookahead_seconds:
            raise RuntimeError(f"writing {n} jobs took {write_seconds:.1f} s: T is already in the lookahead")
        # CPU from just before the first tick can see the burst, to the end
        time.sleep(max(0.0, lead - settings.tick_lookahead_seconds - 1.5))
        load0 = sysload.snapshot()
        cpu0, wall0 = stack.cpu(), time.monotonic()
        done = stack.wait_finished(n, timeout=timeout)
        cpu1, wall1 = stack.cpu(), time.monotonic()
        load1 = sysload.snapshot()
        memory = stack.memory()
        prefix = f"burst{n}-"
        runs = stack.runs(prefix, ("job_id", "due_at", "started_at", "finished_at", "state"))
        output = list(stack.output)

    started = [r for r in runs if r.get("started_at")]
    lags = sorted(_ts(r["started_at"]) - _ts(r["due_at"]) for r in started)
    t_due = due.timestamp()
    last_start = max((_ts(r["started_at"]) for r in started), default=t_due)
    last_finish = max((_ts(r["finished_at"]) for r in runs if r.get("finished_at")), default=t_due)
    roles0, roles1 = cpu0.by_role(), cpu1.by_role()
    cpu_by_role = {role: round(roles1[role] - roles0.get(role, 0.0), 3) for role in sorted(roles1)}
    result: dict[str, Any] = {
        "n": n,
        "backend": backend,
        "workers": workers,
        "completed": done,
        "runs_found": len(runs),
        "runs_started": len(started),
        "runs_finished": sum(1 for r in runs if r.get("finished_at")),
        "succeeded": sum(r.get("state") == "SUCCEEDED" for r in runs),
        **summarize(lags),
        "runs_per_s": round(len(started) / max(last_start - t_due, 1e-3), 1),
        "burst_finish_s": round(last_finish - t_due, 3),
        **claims_timeline(output, t_due),
        "write_s": round(write_seconds, 2),
        "window_s": round(wall1 - wall0, 2),
        "cpu_duetime_s": round(cpu1.duetime - cpu0.duetime, 3),
        "cpu_moto_s": round(cpu1.moto - cpu0.moto, 3) if backend == "moto" else None,
        # "local": duetime local (tick and sweeper in its clock thread); "api": its API processes; "worker":
        # all workers together
        "cpu_s_by_role": cpu_by_role,
        "pss_mb": memory.total_mb,
        "pss_mb_by_role": memory.by_role,
        "processes": memory.processes,
        # the machine around the burst (other work on it: the figures are only comparable at similar load)
        "machine_before": load0,
        "machine_after": load1,
    }
    result["cpu_duetime_s_per_run"] = round(result["cpu_duetime_s"] / max(1, len(started)), 5)
    if result["cpu_moto_s"] is not None:
        result["cpu_moto_s_per_run"] = round(result["cpu_moto_s"] / max(1, len(started)), 5)
    return result
