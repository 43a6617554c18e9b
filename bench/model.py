"""Scale model: what 100M runs/day with 12K starts/s peaks needs, from the measured calls per run.

``python -m bench model`` reads ``bench/results/latest.json`` (the cost, tick and lag parts) and projects
shards, Lambda concurrency, queue consumers and DynamoDB partitions. Every input is either measured by the
bench or one of AWS's published limits below; the few assumptions (AWS call latencies) are named as such.

AWS limits used (all per region, default quotas; most are adjustable):

- DynamoDB: each partition serves at most 1,000 write units/s and 3,000 read units/s, whatever the table's
  capacity mode, and a GSI's partitions are split by the GSI's own partition key. Source: DynamoDB Developer
  Guide, "Understanding DynamoDB warm throughput" / "Partitions and data distribution"
  (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/warm-throughput-scenarios.html).
- DynamoDB on-demand: 40,000 read and 40,000 write request units/s per table by default (adjustable). Source:
  "Quotas in Amazon DynamoDB" (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html).
- Lambda: 1,000 concurrent executions per account by default (adjustable to tens of thousands); each function
  scales by at most 1,000 execution environments every 10 seconds. Source: "Lambda scaling behavior"
  (https://docs.aws.amazon.com/lambda/latest/dg/scaling-behavior.html) and "Lambda quotas"
  (https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html).
- SQS standard queues: nearly unlimited API calls per second; about 120,000 in-flight messages per queue.
  Source: "Amazon SQS quotas" (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html).
- EventBridge Scheduler (the tick's trigger): 1,000 invocations/s by default; one schedule per shard needs
  shards/60 per second. Source: "Quotas for EventBridge Scheduler"
  (https://docs.aws.amazon.com/scheduler/latest/UserGuide/scheduler-quotas.html).
- Lambda's CPU: 1 vCPU per 1,769 MB of memory, up to 6 vCPUs at 10,240 MB. Source: "Memory and computing
  power", AWS Lambda Developer Guide (https://docs.aws.amazon.com/lambda/latest/dg/configuration-memory.html).
  The ``prod`` stage's tick claims with ``tick_processes`` processes on that many vCPUs (cdk.json).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench import capacity
from duetime.adapters.aws.resources import DUE_KEYS_PER_SHARD, WATCH_KEYS_PER_SHARD

#: the CDK app's stage presets: the ``prod`` stage's ``tick_processes`` sizes the tick
CDK_JSON = Path(__file__).resolve().parents[1] / "cdk.json"

#: due-index write units of one tick claim of a repeating job (its entry deleted and put at the next fire)
DUE_MOVE_WRU_PER_CLAIM = 2.0

PARTITION_WCU = 1000
PARTITION_RCU = 3000
TABLE_ONDEMAND_DEFAULT_UNITS = 40_000
LAMBDA_ACCOUNT_CONCURRENCY = 1000
LAMBDA_SCALE_PER_10S = 1000
SQS_INFLIGHT_PER_QUEUE = 120_000

RUNS_PER_DAY = 100_000_000
PEAK_STARTS_PER_S = 12_000
#: assumption, not measured here: in-region latency of one DynamoDB write / one SQS send from Lambda, ms
AWS_DYNAMODB_WRITE_MS = 6.0
AWS_SQS_SEND_MS = 10.0
#: task durations shown for the worker count (seconds of the user's own work per run)
TASK_SECONDS = (0.0, 1.0, 10.0)
#: assumption, not measured: the share of runs that end FAILED, TIMED_OUT or dead-lettered (kept hot longer)
ASSUMED_FAILED_SHARE = 0.01
#: S3's lifecycle: days in Standard, then in Standard-IA, before Glacier Instant Retrieval (the stage
#: defaults, infra/config.py LifecycleConfig); objects under 128 KB never move
LIFECYCLE_STANDARD_DAYS = 30
LIFECYCLE_IA_DAYS = 60
MIN_TRANSITION_BYTES = 128 * 1024


def prod_tick_processes() -> int:
    """The ``prod`` stage's ``tick_processes`` (cdk.json's preset over the stage defaults)."""
    from infra.config import stage_from_context

    context = json.loads(CDK_JSON.read_text())["context"]
    values = {"stage": "prod", "stages": context.get("stages", {})}
    return stage_from_context(values.get).tick_processes


def tick_cpu_ms_per_claim(tick: dict[str, Any]) -> tuple[float, int]:
    """The measured Duetime CPU per claim of a tick, ms, and the processes it was measured with: the run
    with the most claiming processes (its figure has the parent's part and the forks in it), the highest of
    its kind; (0, 1) with no runs."""
    runs = [r for r in tick.get("runs", []) if r.get("cpu_duetime_ms_per_claim")]
    if not runs:
        return 0.0, 1
    most = max(int(r.get("processes") or 1) for r in runs)
    return (
        max(float(r["cpu_duetime_ms_per_claim"]) for r in runs if int(r.get("processes") or 1) == most),
        most,
    )


def project(results: dict[str, Any], *, tick_processes: int | None = None) -> dict[str, Any]:
    """The projection from ``latest.json``-shaped ``results`` (needs ``cost``; uses ``tick`` and ``lag``),
    for ticks of ``tick_processes`` processes (default: the ``prod`` stage's, :func:`prod_tick_processes`)."""
    processes = prod_tick_processes() if tick_processes is None else tick_processes
    cost = results["cost"]
    per_run = cost["per_run"]
    gsi = dict(per_run.get("gsi_wru", {}))
    # the peak is cron's top of the hour: every start a tick's claim of a repeating job, whose advance moves
    # the job's due-index entry (a delete and a put, one write unit each for a keys-and-few-attributes item
    # under 1 KB) on its shard's one key value, even where the cost workload's submits claim everything
    gsi["due"] = max(float(gsi.get("due", 0.0)), DUE_MOVE_WRU_PER_CLAIM)
    table_wru = per_run.get("table_wru", {})
    avg_runs_per_s = RUNS_PER_DAY / 86400
    peak = PEAK_STARTS_PER_S

    # --- DynamoDB throughput and partitions ---------------------------------------------------------
    wru, rru = cost["dynamodb_wru_per_run"], cost["dynamodb_rru_per_run"]
    peak_wru_s, peak_rru_s = peak * wru, peak * rru
    by_table = {t: round(peak * u) for t, u in sorted(table_wru.items())}
    partitions_for_throughput = max(
        math.ceil(peak_wru_s / PARTITION_WCU), math.ceil(peak_rru_s / PARTITION_RCU)
    )
    # GSIs whose partition key has few values: every write of a shard's runs lands on one partition
    hot = {}
    for index, units in sorted(gsi.items()):
        max_per_key = PARTITION_WCU / units if units else math.inf
        hot[index] = {
            "wru_per_run": round(units, 3),
            "max_runs_per_s_per_key": round(max_per_key, 1),
            "keys_needed_at_peak": math.ceil(peak / max_per_key) if units else 0,
        }
    # the due index has DUE_KEYS_PER_SHARD key values per shard, the watchdog WATCH_KEYS_PER_SHARD
    per_shard = {"due": DUE_KEYS_PER_SHARD, "watchdog": WATCH_KEYS_PER_SHARD}
    shards_for_gsi = max(
        (math.ceil(h["keys_needed_at_peak"] / per_shard[i]) for i, h in hot.items() if i in per_shard),
        default=0,
    )

    # --- ticks: claims per second per shard ------------------------------------------------------------
    tick = results.get("tick", {})
    local_claims_per_s = tick.get("claims_per_s")
    claim_calls = tick.get("calls_per_claim", {})
    ddb_writes_per_claim = sum(
        v for k, v in claim_calls.items() if k.startswith("dynamodb") and "Query" not in k
    )
    sqs_per_claim = sum(v for k, v in claim_calls.items() if k.startswith("sqs"))
    aws_ms_per_claim = ddb_writes_per_claim * AWS_DYNAMODB_WRITE_MS + sqs_per_claim * AWS_SQS_SEND_MS
    # each of a tick's processes claims `claim_concurrency` jobs at once (threads), each claim's calls one
    # after the other
    concurrency = int(tick.get("claim_concurrency") or 1)
    aws_claims_per_s = processes * concurrency * 1000 / aws_ms_per_claim if aws_ms_per_claim else None
    # and at most what its processes' vCPUs do at the measured Duetime CPU per claim (a process's threads
    # share one core through the GIL; botocore's serialising and signing is most of it), each process on a
    # vCPU of its own (the tick function's memory buys them: infra StageConfig.tick_memory_mb)
    cpu_ms_per_claim, measured_processes = tick_cpu_ms_per_claim(tick)
    cpu_claims_per_s = processes * 1000 / cpu_ms_per_claim if cpu_ms_per_claim else None
    if aws_claims_per_s and cpu_claims_per_s:
        aws_claims_per_s = min(aws_claims_per_s, cpu_claims_per_s)
    shards_for_ticks_aws = math.ceil(peak / aws_claims_per_s) if aws_claims_per_s else None
    shards_for_ticks_local = math.ceil(peak / local_claims_per_s) if local_claims_per_s else None
    shards = max(shards_for_gsi, shards_for_ticks_aws or 0)

    # --- workers (queue consumers): Little's law -------------------------------------------------------
    worker_calls = ("ReceiveMessage", "DeleteMessage", "PutObject", "UpdateItem runs")
    calls = per_run["calls"]
    worker_call_count = sum(v for k, v in calls.items() if any(w in k for w in worker_calls))
    worker_overhead_s = worker_call_count * AWS_DYNAMODB_WRITE_MS / 1000 * 1.5  # SQS/S3 a bit slower
    # the AWS adapters' pipeline: the moto backend's bursts (an older file's flat N -> burst layout was moto's)
    lag = results.get("lag") or {}
    if "moto" in lag or "sqlite" in lag:
        lag = lag.get("moto") or {}
    local_service_s = None
    if lag:
        biggest = lag[max(lag, key=int)]
        if biggest.get("runs_per_s"):
            local_service_s = biggest.get("workers", 2) / biggest["runs_per_s"]
    workers = {
        f"task_{d:g}s": {
            "concurrent_runs": math.ceil(peak * (worker_overhead_s + d)),
            "queues_needed_for_inflight_limit": math.ceil(
                peak * (worker_overhead_s + d) / SQS_INFLIGHT_PER_QUEUE
            ),
        }
        for d in TASK_SECONDS
    }

    # --- Lambda --------------------------------------------------------------------------------------
    tick_concurrency = shards  # one tick per shard, each up to a minute long
    api_per_s = avg_runs_per_s * cost.get("lambda_invocations_per_run", 0)
    lambda_concurrency = tick_concurrency + 1 + math.ceil(api_per_s * 0.05)

    usd_day = cost["usd_per_million_runs"] * RUNS_PER_DAY / 1e6
    return {
        **history(cost),
        "targets": {
            "runs_per_day": RUNS_PER_DAY,
            "average_runs_per_s": round(avg_runs_per_s),
            "peak_starts_per_s": peak,
        },
        "dynamodb": {
            "peak_wru_per_s": round(peak_wru_s),
            "peak_rru_per_s": round(peak_rru_s),
            "peak_wru_per_s_by_table": by_table,
            "partitions_for_peak_throughput": partitions_for_throughput,
            "over_default_table_quota": {t: u > TABLE_ONDEMAND_DEFAULT_UNITS for t, u in by_table.items()},
            "gsi_hot_keys": hot,
        },
        "ticks": {
            "local_claims_per_s_per_shard": local_claims_per_s,
            "tick_processes": processes,
            "claim_concurrency": concurrency,
            "assumed_aws_ms_per_claim": round(aws_ms_per_claim, 1),
            "assumed_aws_claims_per_s_per_shard": round(aws_claims_per_s, 1) if aws_claims_per_s else None,
            "cpu_ms_per_claim": cpu_ms_per_claim or None,
            "cpu_ms_per_claim_measured_with_processes": measured_processes,
            "cpu_bound_claims_per_s_per_shard": round(cpu_claims_per_s, 1) if cpu_claims_per_s else None,
            "due_keys_per_shard": DUE_KEYS_PER_SHARD,
            "due_gsi_bound_claims_per_s_per_shard": round(DUE_KEYS_PER_SHARD * PARTITION_WCU / gsi["due"], 1),
            "shards_for_peak_claims_aws": shards_for_ticks_aws,
            "shards_for_peak_claims_at_local_speed": shards_for_ticks_local,
            "shards_for_gsi_partitions": shards_for_gsi,
            "shards": shards,
        },
        "workers": {
            "assumed_aws_overhead_s_per_run": round(worker_overhead_s, 3),
            "local_service_s_per_run": round(local_service_s, 3) if local_service_s else None,
            **workers,
        },
        "lambda": {
            "concurrency": lambda_concurrency,
            "within_default_account_limit": lambda_concurrency <= LAMBDA_ACCOUNT_CONCURRENCY,
            "eventbridge_scheduler_invocations_per_s": round((shards + 1) / 60, 2),
        },
        "usd_per_day": round(usd_day),
        "usd_per_month": round(usd_day * 30),
        # DynamoDB throughput in each capacity mode at this load shape (bench/capacity.py)
        "capacity": capacity.price_modes(wru, rru),
    }


def history(cost: dict[str, Any]) -> dict[str, Any]:
    """``history_*``: the run history at ``RUNS_PER_DAY`` from the measured bytes per run (``cost.storage_*``,
    bench/history.py) and the default hot window's tiers (``Settings``): the hot table's steady size, a
    year of archive, and what each costs a month. Empty without the storage figures."""
    hot, archive = cost.get("storage_hot"), cost.get("storage_archive")
    if not hot or not archive:
        return {}
    from bench.prices import price
    from duetime.config.settings import Settings

    fields = Settings.model_fields
    hot_days = float(fields["run_retention_days"].default)
    failed_days = float(fields["failed_run_retention_days"].default)
    # steady state: every day adds RUNS_PER_DAY rows and the TTL removes the day's leaving its tier
    hot_rows = RUNS_PER_DAY * ((1 - ASSUMED_FAILED_SHARE) * hot_days + ASSUMED_FAILED_SHARE * failed_days)
    hot_bytes = hot_rows * hot["bytes_per_run"]
    runs_year = RUNS_PER_DAY * 365
    year_bytes = runs_year * archive["bytes_per_run"]
    per_day = RUNS_PER_DAY * archive["bytes_per_run"]
    gb = 1e9
    standard_all = year_bytes / gb * price("s3_storage_gb_month")
    ia_days = LIFECYCLE_IA_DAYS
    glacier_days = 365 - LIFECYCLE_STANDARD_DAYS - ia_days
    tiered = (
        per_day
        / gb
        * (
            LIFECYCLE_STANDARD_DAYS * price("s3_storage_gb_month")
            + ia_days * price("s3_ia_storage_gb_month")
            + glacier_days * price("s3_glacier_ir_storage_gb_month")
        )
    )
    data_per_run = archive["data_bytes_per_run"]
    return {
        "history_hot": {
            "assumed_failed_share": ASSUMED_FAILED_SHARE,
            "hot_days": hot_days,
            "failed_days": failed_days,
            "rows": round(hot_rows),
            "tb": round(hot_bytes / 1e12, 2),
            "usd_per_month": round(hot_bytes / gb * price("dynamodb_storage_gb_month")),
            "note": "steady state: the same size every year; the keep-last rule adds rows only for jobs that "
            "run fewer than 20 times in a hot window",
        },
        "history_archive_per_year": {
            "runs": runs_year,
            "tb": round(year_bytes / 1e12, 2),
            "usd_per_month_after_a_year_standard": round(standard_all),
            "usd_per_month_after_a_year_tiered": round(tiered),
            "put_usd_per_year": round(runs_year / 1e6 * archive["put_usd_per_million_runs"]),
            "runs_per_data_object_to_transition": math.ceil(MIN_TRANSITION_BYTES / data_per_run)
            if data_per_run
            else None,
            "note": "a year of runs at the measured archived bytes per run; tiered: 30 days in Standard, 60 in "
            "IA, the rest in Glacier IR, which needs data objects of 128 KB or more (lifecycle transitions "
            "skip smaller ones); index objects are small and stay in Standard",
        },
    }


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def render(p: dict[str, Any]) -> str:
    """A short text report of :func:`project`."""
    d, t, w, lam = p["dynamodb"], p["ticks"], p["workers"], p["lambda"]
    lines = [
        f"Scale model: {p['targets']['runs_per_day']:,} runs/day (avg {p['targets']['average_runs_per_s']:,}/s), "
        f"peak {p['targets']['peak_starts_per_s']:,} starts/s",
        f"  DynamoDB at peak: {d['peak_wru_per_s']:,} WRU/s, {d['peak_rru_per_s']:,} RRU/s -> at least "
        f"{d['partitions_for_peak_throughput']} partitions (1,000 WCU / 3,000 RCU each)",
    ]
    for table, units in d["peak_wru_per_s_by_table"].items():
        flag = (
            "  (over the 40,000/s default table quota: raise it)"
            if d["over_default_table_quota"][table]
            else ""
        )
        lines.append(f"    {table}: {units:,} WRU/s{flag}")
    for index, h in d["gsi_hot_keys"].items():
        lines.append(
            f"    GSI {index}: {h['wru_per_run']} WRU/run on one key -> <= {h['max_runs_per_s_per_key']:,}/s per key "
            f"value; {h['keys_needed_at_peak']} key values needed at peak"
        )
    lines += [
        f"  Ticks: {t['local_claims_per_s_per_shard']} claims/s per shard measured on moto; "
        f"~{t['assumed_aws_claims_per_s_per_shard']}/s assumed on AWS ({t['assumed_aws_ms_per_claim']} ms/claim, "
        f"{t['claim_concurrency']} at once in each of {t['tick_processes']} processes; at most "
        f"{t['cpu_bound_claims_per_s_per_shard']}/s on {t['tick_processes']} vCPUs at {t['cpu_ms_per_claim']} ms "
        f"of Duetime CPU per claim; the due index at most {t['due_gsi_bound_claims_per_s_per_shard']}/s over "
        f"its {t['due_keys_per_shard']} keys per shard)",
        f"    shards needed: {t['shards']} (claims: {t['shards_for_peak_claims_aws']} on AWS, "
        f"{t['shards_for_peak_claims_at_local_speed']} at local speed; GSI partitions: {t['shards_for_gsi_partitions']})",
        f"  Workers (concurrent runs at peak, assumed {w['assumed_aws_overhead_s_per_run']} s overhead/run): "
        + ", ".join(
            f"{k.removeprefix('task_')} task -> {v['concurrent_runs']:,}"
            for k, v in w.items()
            if k.startswith("task_")
        ),
        f"  Lambda concurrency: ~{lam['concurrency']} (default account limit 1,000: "
        f"{'ok' if lam['within_default_account_limit'] else 'raise it'}); "
        f"EventBridge Scheduler {lam['eventbridge_scheduler_invocations_per_s']}/s",
        f"  Cost: ~${p['usd_per_day']:,}/day, ~${p['usd_per_month']:,}/month (AWS services, excluding Fargate workers)",
    ]
    hot, year = p.get("history_hot"), p.get("history_archive_per_year")
    if hot and year:
        lines.append(
            f"  Run history: hot {hot['rows']:,} rows = {hot['tb']} TB (${hot['usd_per_month']:,}/month, steady); "
            f"a year of archive {year['tb']} TB (${year['usd_per_month_after_a_year_standard']:,}/month in "
            f"Standard, ${year['usd_per_month_after_a_year_tiered']:,} tiered, which needs "
            f"{year['runs_per_data_object_to_transition']:,}+ runs per data object); archive PUTs "
            f"${year['put_usd_per_year']:,}/year"
        )
    cap = p.get("capacity")
    if cap:
        load = cap["load"]
        lines.append(
            f"  DynamoDB throughput by capacity mode (USD/day; a {load['peak_runs_per_s']:,.0f}/s peak "
            f"{load['peak_seconds_per_hour']:.0f} s an hour, {load['base_runs_per_s']:,.0f}/s otherwise):"
        )
        for name, mode in cap["modes"].items():
            units = f" ({mode['wcu']:,} WCU, {mode['rcu']:,} RCU)" if mode["wcu"] is not None else ""
            lines.append(f"    {name}: ${mode['usd_per_day']:,}{units}; at the peak: {mode['at_peak']}")
        steady = cap["steady_load_same_total"]
        lines.append(
            f"    a steady load of the same total: on-demand ${steady['on_demand_usd_per_day']:,}, provisioned "
            f"with auto scaling ${steady['provisioned_autoscaling_usd_per_day']:,}"
        )
    return "\n".join(lines)
