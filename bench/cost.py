"""Cost per run: count every AWS call the local stack makes while a standard workload runs.

The stack runs with ``DUETIME_CALL_COUNT_DIR`` set, so every process (``duetime local`` with the API and the
clock loop, and every worker) appends its calls to a per-pid file (:mod:`duetime.local.callcount`). The bench first
records an idle window (nothing submitted) to measure the fixed cost of a clock-loop iteration, then submits
the workload over HTTP, as a user would, and waits until every run is terminal:

- one-off jobs that run now, with logs of a few KB;
- one-off ``at(...)`` jobs due a few seconds later;
- repeating ``rate(...)`` jobs that fire K times each (``end_at`` stops them);

(the stack ticks at AWS's cadence, once a minute with a 75 s lookahead, so the submit claims the slots due
within the lookahead, as the API does on AWS, the one-offs' and the short repeating jobs' all at once);
- jobs that fail their first attempt and succeed on the retry;
- one long job (60 s; 20 s in quick mode), held by its worker session (beats every 10 s).

When every run has ended, the runs' rows and the archive objects the archiver writes for them are measured
(:mod:`bench.history`: ``storage_hot``, ``storage_archive``).

From the per-run calls it prices each service at :mod:`bench.prices`. Lambda invocations per run are the API
invocations (one per submit); the tick's and sweeper's invocations are fixed per minute and reported apart,
with their DynamoDB reads and the idle workers' empty polls.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import calls as callsmod
from bench import history
from bench import stack as stackmod
from bench.lag import scan_all
from bench.prices import LAMBDA_MEMORY_MB, price
from infra.config import StageConfig

TERMINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"}


@dataclass(frozen=True)
class Workload:
    run_now: int = 10
    at_jobs: int = 5
    at_delay_s: int = 15
    failing_once: int = 5
    repeating: int = 4
    repeat_every_s: int = 10
    repeat_fires: int = 5
    long_jobs: int = 1
    long_seconds: int = 60
    log_bytes: int = 3000
    workers: int = 2
    shards: int = 4
    #: the idle window holds one tick round of every shard and one sweep (one each per TICK_SECONDS)
    idle_seconds: float = 62.0

    @property
    def expected_runs(self) -> int:
        return (
            self.run_now
            + self.at_jobs
            + self.failing_once
            + self.repeating * self.repeat_fires
            + self.long_jobs
        )

    @property
    def jobs(self) -> int:
        return self.run_now + self.at_jobs + self.failing_once + self.repeating + self.long_jobs


FULL = Workload()
QUICK = Workload(
    run_now=5, at_jobs=3, failing_once=3, repeating=2, repeat_every_s=10, repeat_fires=3, long_seconds=20
)


#: the local stack's tick (and sweep) period in the bench, seconds: AWS's (``Settings.tick_period_seconds``,
#: one tick per shard and one sweep a minute, lookahead 75 s), so a claim takes the slots it would on AWS (a
#: ``rate(10 seconds)`` job's slots of a lookahead in one claim); a 1 s tick would claim each slot apart
TICK_SECONDS = 60.0
AWS_SWEEP_SECONDS = 60.0
#: the workers' log pack linger, seconds: the AWS stages' (``infra.config.StageConfig.log_pack_linger_seconds``),
#: so the final-log PUTs are those a deployed worker makes
LOG_PACK_LINGER_SECONDS = StageConfig().log_pack_linger_seconds


def _log_command(n_bytes: int, then: str = "") -> list[str]:
    return ["sh", "-c", f'yes "duetime bench log line $DUETIME_RUN_ID" | head -c {n_bytes}{then}']


def job_bodies(w: Workload, now: datetime) -> list[dict[str, Any]]:
    """The ``POST /jobs`` bodies of the workload, submitted at ``now``."""
    bodies: list[dict[str, Any]] = []
    task = {"kind": "container", "command": _log_command(w.log_bytes)}
    for i in range(w.run_now):
        bodies.append({"name": f"now-{i}", "task": task})
    at = (now + timedelta(seconds=w.at_delay_s)).strftime("%Y-%m-%dT%H:%M:%S")
    for i in range(w.at_jobs):
        bodies.append({"name": f"at-{i}", "schedule": {"expression": f"at({at})"}, "task": task})
    fail_once = _log_command(w.log_bytes, '; test "$DUETIME_ATTEMPT" -ge 2')
    for i in range(w.failing_once):
        bodies.append(
            {
                "name": f"fails-once-{i}",
                "task": {"kind": "container", "command": fail_once},
                "retry": {"max_attempts": 3, "backoff_seconds": 1, "jitter": "none"},
            }
        )
    end = now + timedelta(seconds=w.repeat_every_s * w.repeat_fires + w.repeat_every_s / 2)
    for i in range(w.repeating):
        bodies.append(
            {
                "name": f"every-{w.repeat_every_s}s-{i}",
                "schedule": {
                    "expression": f"rate({w.repeat_every_s} seconds)",
                    "end_at": end.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
                },
                "task": task,
            }
        )
    for i in range(w.long_jobs):
        bodies.append(
            {
                "name": f"long-{i}",
                "task": {
                    "kind": "container",
                    "command": _log_command(w.log_bytes, f"; sleep {w.long_seconds}"),
                },
            }
        )
    return bodies


def post(api: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
    """POST /jobs; returns (status, body, seconds)."""
    request = urllib.request.Request(
        f"{api}/jobs",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        data = json.loads(response.read())
        return response.status, data, time.perf_counter() - t0


def run_workload(w: Workload, *, timeout: float = 300.0) -> dict[str, Any]:
    """Run ``w`` on a counting local stack; returns the raw split and the workload's facts."""
    with tempfile.TemporaryDirectory(prefix="duetime-bench-calls-") as tmp:
        count_dir = Path(tmp)
        with stackmod.running(
            tick_seconds=TICK_SECONDS,
            workers=w.workers,
            shards=w.shards,
            count_dir=count_dir,
            extra=("--log-pack-linger-seconds", f"{LOG_PACK_LINGER_SECONDS:g}"),
        ) as stack:
            t_idle = time.time()
            time.sleep(w.idle_seconds)
            t_submit = time.time()
            job_ids, api_seconds = [], []
            for index in range(w.jobs):
                body = job_bodies(w, datetime.now(UTC))[index]  # times relative to this submit
                status, job, seconds = post(stack.api, body)
                if status != 201:
                    raise RuntimeError(f"submit failed: {status} {job}")
                job_ids.append(job["job_id"])
                api_seconds.append(seconds)
            ddb = stack.client("dynamodb")
            tables = stack.state["tables"]
            deadline = time.monotonic() + timeout
            runs: list[dict[str, Any]] = []
            mine = set(job_ids)
            while time.monotonic() < deadline:
                time.sleep(2.0)
                states = {
                    j["job_id"]: j.get("state") for j in scan_all(ddb, tables["jobs"], ("job_id", "state"))
                }
                runs = [r for r in scan_all(ddb, tables["runs"]) if r["job_id"] in mine]
                if all(states.get(j) == "COMPLETED" for j in mine) and all(
                    r.get("state") in TERMINAL for r in runs
                ):
                    break
            else:
                raise RuntimeError(f"the workload did not finish in {timeout:.0f} s")
            t_end = time.time()
            time.sleep(0.5)  # let the last calls land in the files
            # the runs' rows and their archive objects (uncounted: after the window)
            stored = history.measure(stack, mine)
        records = callsmod.load(count_dir)
    idle = [r for r in records if t_idle <= r["t"] < t_submit]
    window = [r for r in records if t_submit <= r["t"] <= t_end]
    split = callsmod.split(idle, window, shards=w.shards, sweep_weight=TICK_SECONDS / AWS_SWEEP_SECONDS)
    attempts = sum(len(r.get("attempts") or []) or 1 for r in runs)
    names = dict(zip(job_ids, (b["name"] for b in job_bodies(w, datetime.now(UTC))), strict=True))
    return {
        "workload": asdict(w),
        "jobs": len(job_ids),
        "runs": len(runs),
        "attempts": attempts,
        "states": {
            s: sum(r.get("state") == s for r in runs) for s in sorted({str(r.get("state")) for r in runs})
        },
        "window_s": round(t_end - t_submit, 1),
        "idle_s": round(t_submit - t_idle, 1),
        "api_seconds_mean": sum(api_seconds) / max(1, len(api_seconds)),
        "split": split,
        "workers_total": 3 * w.workers,
        "by_run": per_run_rows(window, runs, names, runs_table=tables["runs"]),
        "history": stored,
    }


def per_run_rows(
    window: list[dict[str, Any]], runs: list[dict[str, Any]], names: dict[str, str], *, runs_table: str
) -> dict[str, Any]:
    """Per run: the write units of its own row (every write of the runs table to its key, GSI writes
    included), its row's largest size, its final logs' and its live-log chunks' bytes and PUTs; with the
    name of the job it belongs to (``now-3``, ``long-0``...)."""
    rows: dict[str, dict[str, Any]] = {}
    for run in runs:
        key = f"{run['due_at']}|{run['job_id']}"  # callcount's key text: the key's values, sorted by name
        rows[key] = {
            "job": names.get(run["job_id"], ""),
            "attempts": len(run.get("attempts") or []),
            "wru": 0,
            "writes": 0,
            "row_bytes": 0,
            "prefix": f"logs/{run['job_id']}/{run['job_id']}.",
        }
    chunks = final = 0
    chunk_bytes = final_bytes = 0
    for record in window:
        if (
            record.get("svc") == "dynamodb"
            and record.get("table") == runs_table
            and record.get("key") in rows
        ):
            row = rows[record["key"]]
            if record.get("wru"):
                row["wru"] += int(record["wru"])
                row["writes"] += 1
            row["row_bytes"] = max(row["row_bytes"], int(record.get("new_bytes") or 0))
        elif record.get("svc") == "s3" and record.get("op") == "PutObject":
            key = str(record.get("key", ""))
            if ".live/" in key:
                chunks += 1
                chunk_bytes += int(record.get("bytes") or 0)
            else:
                final += 1
                final_bytes += int(record.get("bytes") or 0)
    # the final logs' bytes as the attempts recorded them (the PUT's body size is not always known to the hook)
    final_bytes = sum(int(a.get("log_bytes") or 0) for run in runs for a in run.get("attempts") or [])
    return {
        "rows": list(rows.values()),
        "log_chunk_puts": chunks,
        "log_chunk_bytes": chunk_bytes,
        "final_log_puts": final,
        "final_log_bytes": final_bytes,
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def by_duration(by_run: dict[str, Any], runs: int, long_seconds: int) -> dict[str, Any]:
    """``cost.wru_by_duration``, ``log_chunk_puts_per_run`` and ``storage_30d`` from :func:`per_run_rows`."""
    rows = by_run["rows"]
    short = [r for r in rows if r["job"].startswith("now-") and r["attempts"] == 1]
    long = [r for r in rows if r["job"].startswith("long-")]
    row_bytes = _median([r["row_bytes"] for r in rows]) or 0
    log_bytes = by_run["final_log_bytes"] / max(1, runs)
    # 30 days of one run's row (item + DynamoDB's 100 bytes of overhead) and its final logs
    storage_usd = (row_bytes + 100) / 1e9 * price("dynamodb_storage_gb_month") + log_bytes / 1e9 * price(
        "s3_storage_gb_month"
    )
    return {
        "wru_by_duration": {
            "1s": _median([r["wru"] for r in short]),
            f"{long_seconds}s": _median([r["wru"] for r in long]),
            "note": (
                "write units of the run's own row (runs table and its GSIs, every write to its key), median of "
                "the one-attempt run-now runs and of the long run; the job's writes are apart"
            ),
        },
        "log_chunk_puts_per_run": round(by_run["log_chunk_puts"] / max(1, runs), 3),
        "final_log_puts_per_run": round(by_run["final_log_puts"] / max(1, runs), 3),
        "storage_30d": {
            "run_row_bytes_median": row_bytes,
            "final_log_bytes_per_run": round(log_bytes, 1),
            "usd_per_million_runs": round(storage_usd * 1e6, 2),
        },
    }


def price_it(raw: dict[str, Any]) -> dict[str, Any]:
    """Per-run figures, fixed per-minute figures and USD per million runs from a :func:`run_workload` result."""
    split: callsmod.Split = raw["split"]
    runs = max(1, raw["runs"])
    per_run = split.variable.scaled(1 / runs)
    w = raw["workload"]
    gb = LAMBDA_MEMORY_MB / 1024
    # Lambda: one API invocation per submit; the claim work a tick does per run is its per-run call time
    api_invocations = raw["jobs"] / runs
    clock_ms_per_run = _clock_ms_per_run(split, runs)
    lambda_gb_s = gb * (api_invocations * raw["api_seconds_mean"] + clock_ms_per_run / 1000)
    usd = {
        "dynamodb": per_run.wru * price("dynamodb_wru") + per_run.rru * price("dynamodb_rru"),
        "sqs": per_run.sqs_requests * price("sqs_request"),
        "lambda": api_invocations * price("lambda_request") + lambda_gb_s * price("lambda_gb_second_arm64"),
        "api_gateway": api_invocations * price("apigw_http_request"),
        "s3": per_run.s3_puts * price("s3_put") + per_run.s3_gets * price("s3_get"),
        "step_functions": 0.0 * price("sfn_transition"),
    }
    usd_per_million = {k: round(v * 1e6, 2) for k, v in usd.items()}
    total = round(sum(usd.values()) * 1e6, 2)

    # fixed, measured in the idle window: per tick (one per shard per minute in AWS), per sweep (one per
    # minute), per idle worker (its empty long polls)
    tick, sweep = split.per_tick, split.per_sweep
    shards = w["shards"]
    polls_per_worker_minute = _idle_polls_per_worker_minute(raw)

    def monthly(per_invocation: callsmod.Tally, invocations_per_minute: float) -> float:
        t = per_invocation
        per_minute = invocations_per_minute * (
            t.wru * price("dynamodb_wru")
            + t.rru * price("dynamodb_rru")
            + price("lambda_request")
            + price("eventbridge_scheduler_invocation")
            + gb * t.ms / 1000 * price("lambda_gb_second_arm64")
        )
        return per_minute * 60 * 24 * 30

    return {
        "runs": raw["runs"],
        "attempts": raw["attempts"],
        "jobs": raw["jobs"],
        "states": raw["states"],
        "workload": w,
        "window_s": raw["window_s"],
        "per_run": per_run.as_dict(),
        "dynamodb_wru_per_run": round(per_run.wru, 3),
        "dynamodb_rru_per_run": round(per_run.rru, 3),
        "sqs_requests_per_run": round(per_run.sqs_requests, 3),
        "s3_puts_per_run": round(per_run.s3_puts, 3),
        "s3_gets_per_run": round(per_run.s3_gets, 3),
        "lambda_invocations_per_run": round(api_invocations, 3),
        "lambda_gb_seconds_per_run": round(lambda_gb_s, 5),
        "sfn_transitions_per_run": 0,
        "usd_per_million_runs": total,
        **by_duration(
            raw.get("by_run") or {"rows": [], "log_chunk_puts": 0, "final_log_puts": 0, "final_log_bytes": 0},
            runs,
            w["long_seconds"],
        ),
        "usd_per_million_runs_by_service": usd_per_million,
        **_with_storage(total, usd["s3"], per_run, raw, runs),
        "eventbridge_scheduler_usd_per_million": round(price("eventbridge_scheduler_invocation") * 1e6, 2),
        "fixed": {
            "note": (
                "not per run: every tick (one per shard per minute in AWS) queries its shard's due index "
                "(per_tick: an idle tick); one that finds something due also takes and releases its shard "
                "lease, 2 write units per tick whatever it claims; every sweep (one per minute) queries each "
                "shard's watchdog index; idle workers long-poll their queue"
            ),
            "per_tick": tick.as_dict(),
            "per_sweep": sweep.as_dict(),
            "usd_per_month_ticks": round(monthly(tick, shards), 2),
            "usd_per_month_sweeper": round(monthly(sweep, 1), 2),
            "idle_polls_per_worker_minute": round(polls_per_worker_minute, 1),
            "usd_per_month_per_idle_worker": round(
                polls_per_worker_minute * 60 * 24 * 30 * price("sqs_request"), 3
            ),
            "ticks_in_window": split.ticks,
            "sweeps_in_window": split.sweeps,
            "fixed_in_window": split.fixed.as_dict(),
        },
        "count_errors": split.errors[:5],
        # run history: a run's storage per month, hot and archived (bench/history.py)
        **(history.price_it(raw["history"]) if raw.get("history") else {}),
    }


def _with_storage(
    total: float, s3_usd: float, per_run: callsmod.Tally, raw: dict[str, Any], runs: int
) -> dict[str, Any]:
    """The total with 30 days of storage (issue 16's figure), for the logs in S3 Standard (the default) and
    in S3 Express One Zone (the stage setting ``log_storage: express``): the same requests and bytes at the
    directory bucket's prices (USD per million runs)."""
    stored = by_duration(
        raw.get("by_run") or {"rows": [], "log_chunk_puts": 0, "final_log_puts": 0, "final_log_bytes": 0},
        runs,
        raw["workload"]["long_seconds"],
    )["storage_30d"]
    log_gb = stored["final_log_bytes_per_run"] / 1e9
    row_usd = (stored["run_row_bytes_median"] + 100) / 1e9 * price("dynamodb_storage_gb_month")
    standard = stored["usd_per_million_runs"]
    express_s3 = (
        per_run.s3_puts * price("s3express_put")
        + per_run.s3_gets * price("s3express_get")
        + log_gb * price("s3express_upload_gb")
    )
    express_storage = row_usd + log_gb * price("s3express_storage_gb_month")
    return {
        "usd_per_million_runs_with_storage": round(total + standard, 2),
        "log_storage_express": {
            "s3_usd_per_million_runs": round(express_s3 * 1e6, 2),
            "storage_30d_usd_per_million_runs": round(express_storage * 1e6, 2),
            "usd_per_million_runs_with_storage": round(
                total + (express_s3 - s3_usd + express_storage) * 1e6, 2
            ),
        },
    }


def _clock_ms_per_run(split: callsmod.Split, runs: int) -> float:
    """AWS call time the clock thread spent per run beyond its idle profile (the ticks' claim work), ms."""
    return split.variable_clock_ms / runs


def _idle_polls_per_worker_minute(raw: dict[str, Any]) -> float:
    """Empty long polls per idle worker per minute, from the idle window (every worker idle)."""
    split: callsmod.Split = raw["split"]
    seconds = raw["idle_s"] * raw["workers_total"]
    return split.idle_window_polls / seconds * 60 if seconds else 0.0
