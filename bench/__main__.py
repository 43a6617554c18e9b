"""``python -m bench [PART ...] [--quick]``: Duetime's benchmarks. Measurements, never pass/fail.

Parts (default: all, in this order):
  cost      AWS calls per run on the local stack under a standard workload -> units, requests, USD/M runs;
            and the run history's storage per run per month, hot and archived (``--storage-only``: only
            those, merged into the previous ``cost``)
  lag       top-of-the-minute bursts of N jobs on the local stack, on each backend (--backends: sqlite, the
            default, and moto) -> lag p50/p95/p99/max, runs/s, CPU/run, PSS; each N is followed by the same
            burst on APScheduler 3, the baseline (ratio: the default backend over APScheduler 3)
  baseline  only the APScheduler 3 bursts
  submits   POST /jobs of a cron job from 8 concurrent keep-alive clients, on each backend -> submits/s, p50/p99
  tick      claims/s of one shard's tick against moto's server (--processes 1,2: tick_processes)
  console   the console's jobs page for a tenant with 10,000 jobs, on each backend -> server ms p50/p99
  notify    run lag while a webhook receiver is down for 2 minutes, against the same load without rules;
            then every event delivered, none twice (issue 17)
  model     the scale projection for 100M runs/day, 12K starts/s (from the parts' results)

Results: a compact table on stdout, ``bench/results/latest.json`` (the parts run now merged over the previous
file) and ``bench/results/<UTC time>-<mode>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: the lag part's backends, the default (duetime local's) first (bench.stack.BACKENDS, without importing it)
BACKENDS = ("sqlite", "moto")
PARTS = ("cost", "lag", "baseline", "submits", "tick", "console", "notify", "model")
FULL_SIZES = (100, 1000, 5000)
QUICK_SIZES = (100, 300)
FULL_TICK_M = (1000,)
QUICK_TICK_M = (300,)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        memory_gb = round(psutil.virtual_memory().total / 2**30, 1)
        load = [round(x, 2) for x in psutil.getloadavg()]
    except Exception:  # noqa: BLE001 - informative only
        memory_gb, load = None, None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    from importlib.metadata import version

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": memory_gb,
        "load_average_at_start": load,
        "python": platform.python_version(),
        "moto": version("moto"),
        "os": platform.platform(),
        "commit": commit,
    }


def print_storage(cost: dict[str, Any]) -> None:
    hot, archive = cost.get("storage_hot"), cost.get("storage_archive")
    if not hot or not archive:
        return
    usd = archive["usd_per_million_runs_month"]
    print(f"\n== Run history storage per run ({hot['runs']} runs of the workload) ==")
    rows = [
        ["hot: DynamoDB row (+100 B overhead)", hot["bytes_per_run"], hot["usd_per_million_runs_month"]],
        ["archived: S3 Standard", archive["bytes_per_run"], usd["standard"]],
        ["archived: S3 Standard-IA", archive["bytes_per_run"], usd["infrequent_access"]],
        [
            "archived: S3 Glacier Instant Retrieval",
            archive["bytes_per_run"],
            usd["glacier_instant_retrieval"],
        ],
    ]
    print(table(rows, ["where", "bytes per run", "USD per million runs per month"]))
    print(
        f"archive: {archive['data_bytes_per_run']} B data + {archive['index_bytes_per_run']} B index per run "
        f"(x{archive['compression_ratio']} compression of {archive['uncompressed_bytes_per_run']} B), "
        f"{archive['puts_per_run']} PUTs per run (${archive['put_usd_per_million_runs']}/M runs); data object "
        f"{archive['data_object_bytes_mean']:,} B ({'moves' if archive['data_objects_transition'] else 'under 128 KB: never moves'})"
    )


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_cost(cost: dict[str, Any]) -> None:
    print(
        f"\n== Cost per run (local stack, {cost['runs']} runs of {cost['jobs']} jobs, {cost['attempts']} attempts) =="
    )
    per = cost["per_run"]
    rows = [[k, v] for k, v in per["calls"].items()]
    print(table(rows, ["AWS calls per run", "count"]))
    usd = cost["usd_per_million_runs_by_service"]
    rows = [
        ["DynamoDB WRU", cost["dynamodb_wru_per_run"], usd["dynamodb"]],
        ["DynamoDB RRU", cost["dynamodb_rru_per_run"], ""],
        ["SQS requests", cost["sqs_requests_per_run"], usd["sqs"]],
        ["Lambda invocations (API)", cost["lambda_invocations_per_run"], usd["lambda"]],
        ["Lambda GB-s", cost["lambda_gb_seconds_per_run"], ""],
        ["API Gateway requests", cost["lambda_invocations_per_run"], usd["api_gateway"]],
        ["S3 PUT / GET", f"{cost['s3_puts_per_run']} / {cost['s3_gets_per_run']}", usd["s3"]],
        ["Step Functions transitions", 0, usd["step_functions"]],
        ["total", "", cost["usd_per_million_runs"]],
        [
            "30 days of storage (run row, logs in S3 Standard)",
            "",
            cost["storage_30d"]["usd_per_million_runs"],
        ],
        ["total with 30 days of storage", "", cost["usd_per_million_runs_with_storage"]],
        [
            "the same, logs in S3 Express One Zone",
            "log_storage: express",
            cost["log_storage_express"]["usd_per_million_runs_with_storage"],
        ],
        [
            "EventBridge Scheduler, for reference",
            "1 invocation",
            cost["eventbridge_scheduler_usd_per_million"],
        ],
    ]
    print(table(rows, ["per run", "units", "USD per million runs"]))
    fixed = cost["fixed"]

    def calls(t: dict[str, Any]) -> str:
        return ", ".join(f"{k} x{v:g}" for k, v in t["calls"].items())

    tick, sweep = fixed["per_tick"], fixed["per_sweep"]
    print(
        "fixed, not per run (amortised separately):\n"
        f"  each tick (one per shard per minute in AWS): {calls(tick)} = {tick['dynamodb_rru']} RRU + "
        f"{tick['dynamodb_wru']} WRU; all shards' ticks ${fixed['usd_per_month_ticks']}/month with their Lambda "
        "and Scheduler invocations\n"
        f"  each sweep (one per minute): {calls(sweep)} = {sweep['dynamodb_rru']} RRU; "
        f"${fixed['usd_per_month_sweeper']}/month\n"
        f"  each idle worker: {fixed['idle_polls_per_worker_minute']} empty long polls/min = "
        f"${fixed['usd_per_month_per_idle_worker']}/month"
    )


SCHEDULERS = (("sqlite", "Duetime sqlite"), ("moto", "Duetime moto"), ("apscheduler3", "APScheduler 3"))


def _ms(seconds: Any) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _machine(load: dict[str, Any] | None) -> str | None:
    """``load 1m / CPU pressure % / IO pressure %`` of :func:`bench.sysload.snapshot`."""
    if not load:
        return None
    return " / ".join(_fmt(load.get(k), 1) for k in ("load_1m", "cpu_pressure_pct", "io_pressure_pct"))


def _per_run_ms(burst: dict[str, Any], role: str) -> float | None:
    """CPU ms per started run of one role of the stack's processes ("local", "api", "worker")."""
    seconds = (burst.get("cpu_s_by_role") or {}).get(role)
    return None if seconds is None else _ms(seconds / max(1, burst.get("runs_started") or 0))


def lag_rows(row: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """The side-by-side rows of one N: ``row`` maps a scheduler of :data:`SCHEDULERS` to its burst."""
    figures: list[tuple[str, Any]] = [
        ("p50 lag s", lambda r: r.get("p50_s")),
        ("p95 lag s", lambda r: r.get("p95_s")),
        ("p99 lag s", lambda r: r.get("p99_s")),
        ("max lag s", lambda r: r.get("max_s")),
        ("starts/s", lambda r: r.get("runs_per_s")),
        ("last finish s", lambda r: r.get("burst_finish_s")),
        ("CPU ms/run (scheduler)", lambda r: _ms(r.get("cpu_duetime_s_per_run", r.get("cpu_s_per_run")))),
        ("  of which duetime local", lambda r: _per_run_ms(r, "local")),
        ("  of which API processes", lambda r: _per_run_ms(r, "api")),
        ("  of which workers", lambda r: _per_run_ms(r, "worker")),
        ("CPU ms/run (moto)", lambda r: _ms(r.get("cpu_moto_s_per_run"))),
        ("PSS MB at end", lambda r: r.get("pss_mb")),
        ("all ran", lambda r: {True: "yes", False: "NO"}.get(r.get("completed"))),
        ("machine after: load, CPU/IO wait %", lambda r: _machine(r.get("machine_after"))),
    ]
    present = [key for key, _ in SCHEDULERS if key in row]
    return [[name, *(get(row[key]) for key in present)] for name, get in figures]


def print_lag(lag: dict[str, Any], baseline: dict[str, Any], ratio: dict[str, Any]) -> None:
    """One table per N: the backends and APScheduler 3 side by side."""
    print("\n== Burst lag: N runs due at the same second (lag = started_at - due_at) ==")
    sizes = {n for runs in lag.values() for n in runs} | set(baseline)
    for n in sorted(sizes, key=int):
        row = {b: lag[b][n] for b in lag if n in lag[b]}
        if n in baseline:
            row["apscheduler3"] = baseline[n]
        header = [f"N = {int(n):,}", *(title for key, title in SCHEDULERS if key in row)]
        print()
        print(table(lag_rows(row), header))
        if n in ratio:
            print("default backend / APScheduler 3: " + ", ".join(f"{k} x{v:g}" for k, v in ratio[n].items()))


def lag_results(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``results["lag"]`` as backend -> N -> burst (an older file's flat N -> burst was the moto backend's)."""
    lag = results.get("lag") or {}
    if lag and all(k.isdigit() for k in lag):
        return {"moto": lag}
    return {b: runs for b, runs in lag.items() if isinstance(runs, dict)}


def ratios(
    lag: dict[str, dict[str, Any]], baseline: dict[str, Any], backend: str = "sqlite"
) -> dict[str, Any]:
    """``backend``'s p50, p99 and starts/s over APScheduler 3's, per N."""
    runs = lag.get(backend, {})
    return {
        n: {
            key: round(runs[n][key] / baseline[n][key], 2)
            for key in ("p50_s", "p99_s", "runs_per_s")
            if baseline[n].get(key) and runs[n].get(key) is not None
        }
        for n in runs
        if n in baseline
    }


def print_submits(found: dict[str, Any]) -> None:
    print("\n== POST /jobs (a cron job, nothing due) from concurrent keep-alive clients ==")
    rows = [
        [
            backend,
            r["clients"],
            r["submits_per_s"],
            r["p50_ms"],
            r["p99_ms"],
            r["cpu_stack_ms_per_submit"],
            r["refused"],
            _machine(r.get("machine_after")),
        ]
        for backend, r in found.items()
    ]
    print(
        table(
            rows,
            [
                "backend",
                "clients",
                "submits/s",
                "p50 ms",
                "p99 ms",
                "stack CPU ms",
                "non-201",
                "machine after",
            ],
        )
    )


def print_tick(tick: dict[str, Any]) -> None:
    print("\n== One shard's tick against moto's server ==")
    rows = [
        [
            r["m"],
            r.get("processes", 1),
            r["claims_per_s"],
            r["ms_per_claim"],
            r["call_ms_per_claim"],
            r["cpu_duetime_ms_per_claim"],
            r["cpu_moto_ms_per_claim"],
        ]
        for r in tick["runs"]
    ]
    print(
        table(
            rows,
            [
                "M due",
                "processes",
                "claims/s",
                "ms/claim",
                "AWS call ms/claim",
                "Duetime CPU ms",
                "moto CPU ms",
            ],
        )
    )
    print("calls per claim: " + ", ".join(f"{k} x{v:g}" for k, v in tick["calls_per_claim"].items()))


def print_console(found: dict[str, Any]) -> None:
    rows = [
        [
            f"{backend} {name}",
            r["jobs"],
            page["rows"],
            page["server"]["p50_ms"],
            page["server"]["p99_ms"],
            page["client"]["p50_ms"],
            r["target_ms"],
        ]
        for backend, r in found.items()
        for name, page in r["pages"].items()
    ]
    print("\n== Console jobs page (server time from Server-Timing) ==")
    print(
        table(
            rows,
            ["backend page", "jobs", "rows", "server p50 ms", "server p99 ms", "client p50 ms", "target ms"],
        )
    )


def print_notify(found: dict[str, Any]) -> None:
    quiet, down = found["quiet"], found["receiver_down"]
    print("\n== Notifications off the hot path: run lag (s), the same load with and without rules ==")
    rows = [
        [label, phase["runs"], phase["p50_s"], phase["p99_s"], phase["max_s"]]
        for label, phase in (("no rules", quiet), (f"receiver down {down['receiver_down_s']:g} s", down))
    ]
    print(table(rows, ["", "runs", "p50", "p99", "max"]))
    print(
        f"events: {down['events_received']} of {down['events_expected']} delivered "
        f"{down['all_delivered_s_after_up']} s after the receiver came up; "
        f"{down['event_ids_received_twice']} event ids twice, {down['bad_signatures']} bad signatures"
    )


def _save(results: dict[str, Any], path: Path) -> None:
    """Write what is measured so far (a later part failing keeps the earlier parts' figures)."""
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("parts", nargs="*", choices=[*PARTS, "all", []], default=[], metavar="PART")
    parser.add_argument("--quick", action="store_true", help="the small workload (under 3 minutes)")
    parser.add_argument(
        "--workers", type=int, default=2, help="worker processes per tier (and APScheduler threads)"
    )
    parser.add_argument("--sizes", type=str, default=None, help="burst sizes, e.g. 100,1000,5000")
    parser.add_argument(
        "--backends",
        type=str,
        default=",".join(BACKENDS),
        help=f"the lag part's backends, e.g. sqlite (default: {','.join(BACKENDS)})",
    )
    parser.add_argument(
        "--storage-only",
        action="store_true",
        help="cost: measure only the run history's storage (cost.storage_*), keeping the other cost figures",
    )
    parser.add_argument(
        "--processes",
        type=str,
        default="1,2",
        help="the tick part's claiming processes (tick_processes), each measured, e.g. 1,2 (default)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    parts = [p for p in PARTS if not args.parts or "all" in args.parts or p in args.parts]
    mode = "quick" if args.quick else "full"
    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else list(QUICK_SIZES if args.quick else FULL_SIZES)
    )
    if args.storage_only and parts != ["cost"]:
        parser.error(
            "--storage-only measures the cost part's storage figures only: `python -m bench cost --storage-only`"
        )
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}: choose from {', '.join(BACKENDS)}")

    args.out.mkdir(parents=True, exist_ok=True)
    latest_path = args.out / "latest.json"
    results: dict[str, Any] = json.loads(latest_path.read_text()) if latest_path.is_file() else {}
    started = time.monotonic()
    now = datetime.now(UTC)
    results["meta"] = {
        "measured_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mode": mode,
        "parts": parts,
        "machine": machine(),
        # only cost.storage_* were measured by this invocation: the other figures are from earlier ones
        **({"storage_only": True} if args.storage_only else {}),
    }
    print(
        f"duetime bench ({mode}): {', '.join(parts)} on {results['meta']['machine']['cpu']}, "
        f"{results['meta']['machine']['cores']} cores",
        flush=True,
    )

    if "cost" in parts:
        from bench import cost

        print("cost: running the standard workload on a counting local stack...", flush=True)
        raw = cost.run_workload(cost.QUICK if args.quick else cost.FULL)
        if args.storage_only:
            from bench import history

            results["cost"] = {**(results.get("cost") or {}), **history.price_it(raw["history"])}
            measured = {k: results["meta"][k] for k in ("measured_at", "mode")}
            results["cost"]["storage_measured"] = {**measured, "commit": results["meta"]["machine"]["commit"]}
        else:
            results["cost"] = cost.price_it(raw)
            print_cost(results["cost"])
        print_storage(results["cost"])
    _save(results, latest_path)
    if "lag" in parts or "baseline" in parts:
        from bench import baseline, lag

        # the backends not measured now keep their earlier figures (each burst records its commit)
        results["lag"] = lag_results(results)
        results["baseline_apscheduler"] = dict(results.get("baseline_apscheduler") or {})
        for n in sizes:
            if "lag" in parts:
                for backend in backends:
                    print(
                        f"lag: burst of {n} on the local stack, {backend} backend "
                        f"({args.workers} workers per tier)...",
                        flush=True,
                    )
                    results["lag"].setdefault(backend, {})[str(n)] = {
                        **lag.burst(n, backend=backend, workers=args.workers),
                        "commit": results["meta"]["machine"]["commit"],
                        "measured_at": results["meta"]["measured_at"],
                    }
                    _save(results, latest_path)
            print(f"baseline: burst of {n} on APScheduler 3 ({args.workers} threads)...", flush=True)
            results["baseline_apscheduler"][str(n)] = baseline.run_isolated(n, workers=args.workers)
            _save(results, latest_path)
        # the default backend's (sqlite) figures over APScheduler 3's
        results["ratio_duetime_over_apscheduler"] = ratios(results["lag"], results["baseline_apscheduler"])
        print_lag(results["lag"], results["baseline_apscheduler"], results["ratio_duetime_over_apscheduler"])
    _save(results, latest_path)
    if "submits" in parts:
        from bench import submits

        results.setdefault("submits", {})
        for backend in backends:
            print(f"submits: {submits.CLIENTS} clients posting cron jobs, {backend} backend...", flush=True)
            results["submits"][backend] = {
                **submits.measure(backend=backend, measured=600 if args.quick else submits.MEASURED),
                "commit": results["meta"]["machine"]["commit"],
            }
            _save(results, latest_path)
        print_submits(results["submits"])
    if "tick" in parts:
        from bench import tickscale

        runs = []
        for processes in [int(p) for p in args.processes.split(",") if p.strip()]:
            for m in QUICK_TICK_M if args.quick else FULL_TICK_M:
                print(
                    f"tick: one tick of {processes} process(es) claiming {m} due jobs of one shard...",
                    flush=True,
                )
                runs.append(tickscale.measure(m, processes=processes))
        # the one-process run's figures (the local stack's tick); every run's in `runs`
        best = next((r for r in reversed(runs) if r["processes"] == 1), runs[-1])
        results["tick"] = {
            "runs": runs,
            "claims_per_s": best["claims_per_s"],
            "calls_per_claim": best["calls_per_claim"],
            "claim_concurrency": best["claim_concurrency"],
        }
        print_tick(results["tick"])
    if "console" in parts:
        from bench import console

        results.setdefault("console", {})
        for backend in backends:
            jobs = 1000 if args.quick else console.JOBS
            print(f"console: the jobs page of a tenant with {jobs:,} jobs, {backend} backend...", flush=True)
            results["console"][backend] = {
                **console.measure(backend=backend, jobs=jobs),
                "commit": results["meta"]["machine"]["commit"],
            }
            _save(results, latest_path)
        print_console(results["console"])
    if "notify" in parts:
        from bench import notify

        print(
            "notify: run lag with a webhook receiver down, against the same load without rules...", flush=True
        )
        results["notify"] = {
            **notify.measure(quick=args.quick),
            "commit": results["meta"]["machine"]["commit"],
        }
        _save(results, latest_path)
        print_notify(results["notify"])
    if "model" in parts:
        from bench import model

        if "cost" not in results:
            print("model: no cost results yet; run `python -m bench cost` first", file=sys.stderr)
        else:
            results["model"] = model.project(results)
            print("\n" + model.render(results["model"]))

    results["meta"]["duration_s"] = round(time.monotonic() - started, 1)
    text = json.dumps(results, indent=2, sort_keys=False, default=str) + "\n"
    latest_path.write_text(text)
    (args.out / f"{now:%Y%m%dT%H%M%SZ}-{mode}.json").write_text(text)
    print(f"\nwrote {latest_path} ({results['meta']['duration_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
